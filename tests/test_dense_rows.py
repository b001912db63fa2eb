"""Dense rows (``jaxdrive.models.dense``): the policy's encoder runs only on the rows that
count, and everything that counts equals the padded path: the gather/scatter itself,
``Policy.step`` (outputs and the memory it writes) and ``Policy.sequence`` (outputs and
gradients) with few, many, all and more-than-capacity rows selected, and one whole PPO
training run (metrics and parameters) with the overflow fallback counted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from policy_inputs import random_obs, random_params

from jaxdrive.config import ConfigError
from jaxdrive.models.dense import (
    DenseRows,
    capacities_for,
    capacity_for,
    dense_apply,
    dense_indices,
    overflowed,
    row_step_buffers,
    take_rows,
    which_row_step_buffer,
)
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.runs.config import RunConfig, TrainConfig
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env

ATOL = 1e-6
N = 16
CAPACITY = 8
MASKS = {  # (N,) row selections: few, many (= capacity), all (fallback), none
    "few": np.arange(N) % 5 == 1,
    "many": np.isin(np.arange(N), [0, 2, 3, 7, 8, 11, 12, 15]),
    "all": np.ones(N, bool),
    "none": np.zeros(N, bool),
}


def test_capacity_rounds_up_to_multiples_and_never_exceeds_the_rows():
    assert capacity_for(None, 100) == 100
    assert capacity_for(0.5, 100) == 56  # 50 -> next multiple of 8
    assert capacity_for(0.01, 100) == 8
    assert capacity_for(1.0, 100) == 100
    assert capacity_for(0.99, 12) == 12
    assert capacities_for((0.25, 0.5, 0.75), 64) == (16, 32, 48)
    assert capacities_for(None, 64) == (64,)
    assert DenseRows(jnp.zeros(64, bool), (48, 16, 64, 80)).sizes == (16, 48)


def test_row_step_buffers_form_one_ladder_ascending_in_rows_and_steps():
    assert row_step_buffers((0.25, 0.5, 0.75), 256, 32) == (
        (64, 2048), (128, 2048), (128, 4096), (192, 4096), (192, 6144), (256, 6144))
    assert row_step_buffers((0.5,), 16, 7) == ((8, 56), (16, 56))
    # Without a per-row pass only steps are packed; duplicates go.
    assert row_step_buffers((0.25, 0.5), 64, 4, pack_rows=False) == ((64, 64), (64, 128))
    assert row_step_buffers(None, 64, 4) == ()


@pytest.mark.parametrize("rows,steps_per_row,want", [
    (3, 7, 0),    # 3 rows, 21 steps
    (8, 7, 0),    # 8 rows, 56 steps: both exactly at the first buffer
    (10, 1, 1),   # 10 rows > 8, 10 steps
    (16, 3, 1),   # every row, 48 steps
    (16, 4, 2),   # 64 steps > 56: the padded minibatch
])
def test_which_row_step_buffer_is_the_first_that_holds_rows_and_steps(rows, steps_per_row,
                                                                       want):
    buffers = ((8, 56), (16, 56))
    mask = np.zeros((16, 7), bool)
    picked = np.random.default_rng(rows).choice(16, rows, replace=False)
    for r in picked:  # steps from a random start, as episodes that begin mid-segment
        start = np.random.default_rng(r).integers(0, 8 - steps_per_row)
        mask[r, start:start + steps_per_row] = True
    brute = next((k for k, (rc, sc) in enumerate(buffers)
                  if rows <= rc and rows * steps_per_row <= sc), len(buffers))
    assert brute == want
    assert int(which_row_step_buffer(jnp.asarray(mask), buffers)) == want


def _rowwise(t):
    """A per-row function; "size" tells which buffer ran: the batch size it saw."""
    return {"a": t * 2.0 + 1.0, "b": jnp.sum(t, axis=1).astype(jnp.int32),
            "size": jnp.full(t.shape[0], t.shape[0])}


# One compile per capacities setting: the mask is traced.
_DENSE_APPLY = jax.jit(lambda t, m, capacities: dense_apply(_rowwise, t,
                                                            DenseRows(m, capacities)),
                       static_argnums=2)


@pytest.mark.parametrize("capacities", [CAPACITY, (2, 4, CAPACITY)])
@pytest.mark.parametrize("name", sorted(MASKS))
def test_dense_apply_equals_the_full_batch_on_selected_rows(name, capacities):
    mask = jnp.asarray(MASKS[name])
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    got = _DENSE_APPLY(jnp.asarray(x), mask, capacities)
    # The full batch, by hand (NumPy): a = 2x + 1, b = row sums, size = N.
    want = {"a": x * 2.0 + 1.0, "b": x.sum(axis=1).astype(np.int32)}
    sel = MASKS[name]
    for k in ("a", "b"):
        np.testing.assert_array_equal(np.asarray(got[k])[sel], np.asarray(want[k])[sel])
    count = int(sel.sum())
    fits = [c for c in np.atleast_1d(capacities) if c >= count]
    ran = min(fits) if fits else N  # the smallest buffer that holds the selection
    assert np.all(np.asarray(got["size"])[sel] == ran)
    assert bool(overflowed(DenseRows(mask, capacities))) == (not fits)
    if not fits:  # the whole batch ran: every row is fn's
        np.testing.assert_array_equal(np.asarray(got["a"]), np.asarray(want["a"]))
    else:  # a dense buffer ran: unselected rows are zeros
        assert not np.asarray(got["a"])[~sel].any()


_GROUPED = jax.jit(lambda t, m: dense_apply(_rowwise, t, DenseRows(m, (4, CAPACITY), groups=4)))


@pytest.mark.parametrize("selected,ran", [
    ([1, 5, 9, 13], 4),              # one row a block: every block fits its share of 4
    ([0, 1, 8], 8),                  # block 0 holds 2 > 4 / 4: the buffer of 8 (2 a block)
    ([4, 5, 6], N),                  # block 1 holds 3 > 8 / 4: no buffer holds it, all run
    ([], 4),
])
def test_grouped_rows_pack_each_block_into_its_own_share(selected, ran):
    """Rows split over G devices pack block by block (``groups``): each of the 4 blocks
    of 4 rows into its own quarter of a buffer, the smallest buffer that holds every
    block's selection runs, and selected rows equal the full batch (NumPy, by hand)."""
    sel = np.isin(np.arange(N), selected)
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    got = _GROUPED(jnp.asarray(x), jnp.asarray(sel))
    np.testing.assert_array_equal(np.asarray(got["a"])[sel], (x * 2.0 + 1.0)[sel])
    np.testing.assert_array_equal(np.asarray(got["b"])[sel], x.sum(axis=1)[sel])
    assert np.all(np.asarray(got["size"])[sel] == ran)
    if ran < N:
        assert not np.asarray(got["a"])[~sel].any()
    idx, used = dense_indices(jnp.asarray(sel), 8, groups=4)
    blocks = [np.flatnonzero(sel[4 * g:4 * g + 4]) for g in range(4)]  # within each block
    want_used = np.concatenate([np.arange(2) < min(len(b), 2) for b in blocks])
    np.testing.assert_array_equal(np.asarray(used), want_used)
    for g, b in enumerate(blocks):
        np.testing.assert_array_equal(np.asarray(idx)[2 * g:2 * g + len(b[:2])], b[:2])
    with pytest.raises(ValueError, match="multiples of the groups"):
        _ = DenseRows(jnp.asarray(sel), (6,), groups=4).sizes


def tiny_observation(n, seed):
    return random_obs(jax.random.key(seed), (n,), num_road=8)


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _params(policy, seed):
    """Initialiser-like parameters drawn on the host (no initialiser to compile; they do
    not depend on the example's row count: N rows here for every test)."""
    return random_params(policy, tiny_observation(N, seed=0), jax.random.key(seed),
                         scale=0.0)


def _policy(kind):
    cfg = PolicyConfig(kind=kind, model_dim=16, token_dim=8, horizon=4, road_group=4)
    return Policy(cfg, num_actions=5)


@pytest.fixture(scope="module", params=["transformer", "mlp"])
def stepper(request):
    policy = _policy(request.param)
    params = _params(policy, 0)

    @jax.jit
    def run(obs_seq, first, removed, mask):
        """Six steps with and without dense rows; outputs and caches of both."""
        def body(caches, xs):
            o, f, r = xs
            dense, full = caches
            out_d, dense = policy.step(params, dense, o, f, r, rows=DenseRows(mask, CAPACITY))
            out_f, full = policy.step(params, full, o, f, r)
            return (dense, full), (out_d, out_f)
        caches = (policy.init_cache(N), policy.init_cache(N))
        return jax.lax.scan(body, caches, (obs_seq, first, removed))

    return policy, params, run


@pytest.mark.parametrize("name", ["few", "many", "all"])
def test_step_equals_padded_outputs_and_memory_on_selected_rows(stepper, name):
    policy, params, run = stepper
    t = 6
    obs = jax.tree.map(lambda *x: np.stack(x), *[_host(tiny_observation(N, seed=s))
                                                 for s in range(t)])
    first = np.zeros((t, N), bool)
    first[0] = True
    first[4, :3] = True
    removed = np.zeros((t, N), bool)
    removed[2:4, 1] = True  # removed, then back
    sel = MASKS[name]
    (dense, full), (out_d, out_f) = run(obs, first, removed, sel)
    np.testing.assert_allclose(np.asarray(out_d.dist)[:, sel], np.asarray(out_f.dist)[:, sel],
                               atol=ATOL)
    np.testing.assert_allclose(np.asarray(out_d.value)[:, sel],
                               np.asarray(out_f.value)[:, sel], atol=ATOL)
    np.testing.assert_array_equal(np.asarray(dense.next_pos), np.asarray(full.next_pos))
    np.testing.assert_array_equal(np.asarray(dense.pos), np.asarray(full.pos))
    np.testing.assert_array_equal(np.asarray(dense.garbage), np.asarray(full.garbage))
    np.testing.assert_allclose(np.asarray(dense.k)[:, sel], np.asarray(full.k)[:, sel],
                               atol=ATOL)


# The two gradient checks below share one compiled program: the padded segment's loss
# and gradients, the dense-rows ones and the packed decoder's (two row capacities), for
# a (B, T) segment given as arguments; each test reads the parts it checks.
B, T = 6, 5
# (row capacity, groups): packed rows, every row, and rows split in 2 blocks of 3 (as
# over 2 devices: each block packs into its own half of 4 rows and 16 steps).
ROW_CAPACITIES = ((3, 1), (None, 1), (4, 2))


def _padded(policy, params, cache, obs, first, removed, weights, sel):
    out = policy.sequence(params, cache, obs, first, removed)
    keep = sel.reshape(-1)
    return (jnp.sum(jnp.where(keep[:, None], out.dist.reshape(B * T, -1) * weights, 0.0))
            + jnp.sum(jnp.where(keep, out.value.reshape(-1), 0.0))), out


def _dense(policy, params, cache, obs, first, removed, weights, sel):
    rows = DenseRows(sel, 12)
    out = policy.sequence(params, cache, obs, first, removed, rows=rows)
    keep = rows.mask.reshape(-1)
    return (jnp.sum(jnp.where(keep[:, None], out.dist.reshape(B * T, -1) * weights, 0.0))
            + jnp.sum(jnp.where(keep, out.value.reshape(-1), 0.0)))


def _packed(policy, params, cache, obs, first, removed, weights, sel, row_capacity, groups):
    out, idx, used = policy.sequence_at(params, cache, obs, first, removed, sel, 16,
                                        row_capacity=row_capacity, groups=groups)
    return (jnp.sum(jnp.where(used[:, None], out.dist * take_rows(weights, idx, groups),
                              0.0))
            + jnp.sum(jnp.where(used, out.value, 0.0))), (out, idx, used)


@pytest.fixture(scope="module")
def segment_grads():
    """``grads(params, cache, obs, first, removed, weights, sel)`` -> (padded, dense,
    packed): each a loss's ``value_and_grad`` (padded and packed with their outputs; one
    packing per ``ROW_CAPACITIES``), one compile for both tests."""
    policy = _policy("transformer")

    @jax.jit
    def grads(params, cache, obs, first, removed, weights, sel):
        args = (policy, params, cache, obs, first, removed, weights, sel)
        vg = lambda f, **kw: jax.value_and_grad(  # noqa: E731
            lambda p: f(policy, p, *args[2:], **kw), has_aux=f is not _dense)(params)
        return vg(_padded), vg(_dense), [vg(_packed, row_capacity=rc, groups=g)
                                         for rc, g in ROW_CAPACITIES]

    return policy, grads


def _segment(seed):
    """A (B, T) segment of random observations and (B * T, 5) loss weights."""
    obs = jax.tree.map(lambda x: x.reshape((B, T) + x.shape[1:]),
                       _host(tiny_observation(B * T, seed=seed)))
    weights = np.random.default_rng(seed - 1).standard_normal((B * T, 5), np.float32)
    return obs, weights


def test_sequence_outputs_and_gradients_equal_padded_on_selected_steps(segment_grads):
    policy, grads = segment_grads
    obs, weights = _segment(3)
    params = _params(policy, 1)
    first = np.zeros((B, T), bool)
    first[:, 0] = True
    removed = np.zeros((B, T), bool)
    removed[1, 3:] = True
    cache = policy.init_cache(B)
    # The dense-rows loss and gradients against the padded path's (the same loss, the
    # selected steps kept by ``where``).
    # The selection must hold every step a selected step attends to (its row's earlier
    # steps in the episode): whole rows here, as PPO selects ego agents.
    # (The fallback to the full segment: test_dense_apply_* and the PPO run below.)
    for picked in ([0, 2], [1, 3], [2]):  # 10, 10 and 5 of 12 steps
        sel = np.zeros((B, T), bool)
        sel[picked] = True
        assert not bool(overflowed(DenseRows(sel.reshape(-1), 12)))
        ((v_f, _), g_f), (v_d, g_d), _ = grads(params, cache, obs, first, removed, weights,
                                               sel)
        np.testing.assert_allclose(float(v_d), float(v_f), atol=1e-5)  # a sum of 50 terms
        for a, c in zip(jax.tree.leaves(g_d), jax.tree.leaves(g_f), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=1e-5, rtol=1e-5)


def test_sequence_at_on_packed_rows_equals_padded_outputs_and_gradients(segment_grads):
    """The decoder on the rows holding a selected step, packed (row_capacity), on
    every row (None), and packed block by block (groups 2, as rows split over 2
    devices): outputs and gradients at the selected steps equal the padded segment's."""
    policy, grads = segment_grads
    obs, weights = _segment(4)
    params = _params(policy, 1)
    first = np.zeros((B, T), bool)
    first[:, 0] = True
    first[4, 2] = True
    removed = np.zeros((B, T), bool)
    removed[3, 3:] = True
    # A cache with history: the segment's first steps attend to it.
    step = jax.jit(lambda c, o, f: policy.step(params, c, o, f, jnp.zeros(B, bool))[1])
    cache = policy.init_cache(B)
    for k in range(3):
        cache = step(cache, jax.tree.map(lambda x, k=k: x[:, k], obs), first[:, 0] & (k == 0))
    first[:, 0] = False
    first[5, 0] = True
    sel = np.zeros((B, T), bool)
    sel[1] = True          # a whole row
    sel[4, 2:] = True      # an episode that starts mid-segment
    sel[5, :3] = True      # one that ends (later steps not needed)
    # 11 steps of 3 rows
    ((v_f, out_f), g_f), _, packings = grads(params, cache, obs, first, removed, weights, sel)
    for rc, ((v_d, (out_d, idx, used)), g_d) in zip(ROW_CAPACITIES, packings, strict=True):
        np.testing.assert_allclose(float(v_d), float(v_f), atol=1e-5, err_msg=str(rc))
        for a, c in zip(jax.tree.leaves(g_d), jax.tree.leaves(g_f), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=1e-5, rtol=1e-5,
                                       err_msg=str(rc))
        # The packed outputs themselves, slot by slot.
        used = np.asarray(used)
        assert used.sum() == sel.sum() == 11
        rc, g = rc
        # Slot indices are within each block of B / g rows' steps (3 * 5 with 2 blocks).
        block = np.repeat(np.arange(g), 16 // g) * (B // g * T)
        np.testing.assert_array_equal((np.asarray(idx) + block)[used], np.flatnonzero(sel))
        np.testing.assert_allclose(np.asarray(out_d.dist)[used],
                                   np.asarray(out_f.dist).reshape(B * T, -1)[sel.reshape(-1)],
                                   atol=ATOL, err_msg=str(rc))


# ------------------------------------------------------------------ a whole PPO run
BASE = {
    "env": {"scenario": {"max_agents": 4}, "collision_behavior": "remove",
            "goal_behavior": "trial", "num_trials": 2, "trial_timeout": 6,
            "observation": {"num_partners": 3, "num_road": 20},
            "road_index": {"road_per_cell": 20, "grid_size": 8}},
    "procedural": {"num_agents": [1, 4], "topology": {"straight": 1.0, "curve": 1.0,
                                                      "t_junction": 0.0, "intersection": 0.0}},
    # The MLP keeps this run's compile short: the transformer's dense sequence path is
    # checked above; this checks PPO's packing, buffer switch and overflow counts. The
    # auxiliary goal head too: its targets are packed with the other step fields.
    "policy": {"kind": "mlp", "model_dim": 16, "token_dim": 8, "aux_goal": True},
    "train": {"seed": 5, "num_scenes": 4, "num_envs": 4, "rollout_steps": 7, "epochs": 2,
              "minibatches": 2, "aux_goal_coef": 0.5},
    "validation": {"every": 0},
}


def _train(dense_rows, env, env_params, state0, iterations=2, record_computed=False):
    config = RunConfig.from_dict({**BASE, "train": {**BASE["train"], "dense_rows": dense_rows}})
    ppo = PPO(config, env, Policy.for_env(config.policy, env))
    state = state0
    step = jax.jit(ppo.train_step)
    metrics, computed = [], []
    rollout = jax.jit(lambda s: ppo._rollout(s, env_params)[1].computed)
    for _ in range(iterations):
        if record_computed:  # what this iteration's rollout runs on
            computed.append(np.asarray(rollout(state)))
        state, m = step(state, env_params)
        metrics.append(jax.device_get(m))
    return ppo, state, metrics, computed, step


@pytest.fixture(scope="module")
def runs():
    # One env and one initial state for both: dense_rows changes neither.
    config = RunConfig.from_dict({**BASE, "train": {**BASE["train"], "dense_rows": "off"}})
    env, env_params = build_env(config, 0, 4)
    state0 = PPO(config, env, Policy.for_env(config.policy, env)).init(jax.random.key(0),
                                                                      env_params)
    return (_train("off", env, env_params, state0),
            _train(0.5, env, env_params, state0, record_computed=True))


def test_ppo_with_dense_rows_trains_the_same_parameters(runs):
    (padded, s_p, m_p, _, _), (dense, s_d, m_d, _, _) = runs
    assert not padded.dense and dense.dense
    assert dense.rollout_capacities == (8,) and dense.num_rows == 16
    assert dense.update_capacities == (32,)
    for a, b in zip(jax.tree.leaves(s_p.params), jax.tree.leaves(s_d.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    for it, (mp, md) in enumerate(zip(m_p, m_d, strict=True)):
        assert set(md) - set(mp) == {"loss/dense_overflow_minibatches",
                                     "rollout/dense_overflow_steps"}
        for k in mp:
            np.testing.assert_allclose(md[k], mp[k], atol=1e-5, rtol=1e-5,
                                       err_msg=f"iteration {it}: {k}")


def test_overflow_is_counted_and_runs_the_whole_batch(runs):
    _, (dense, _, metrics, computed, step) = runs
    counts = [c.sum(axis=1) for c in computed]  # (T,) learner rows per rollout step
    want = [float((c > 8).sum()) for c in counts]
    got = [m["rollout/dense_overflow_steps"] for m in metrics]
    assert got == want
    assert 0 < sum(want) < sum(len(c) for c in counts)  # both paths ran
    over = [m["loss/dense_overflow_minibatches"] for m in metrics]
    assert all(0 <= o <= 4 for o in over)  # 2 epochs x 2 minibatches
    assert step._cache_size() == 1  # no retrace across iterations


def test_dense_rows_config_errors_name_the_key():
    assert TrainConfig(dense_rows=False).dense_rows == "off"  # YAML's bare off
    assert TrainConfig(dense_rows=0.6).dense_rows == 0.6
    for bad in (0, 1.5, "sometimes", True):
        with pytest.raises(ConfigError, match="dense_rows"):
            TrainConfig(dense_rows=bad)


@pytest.mark.slow  # two transformer PPO programs to compile (~1 min)
def test_ppo_transformer_with_packed_decoder_rows_trains_the_same_parameters():
    """The transformer's minibatches on (rows, steps) buffers: the decoder on the rows
    holding computed steps. Two iterations' parameters and metrics equal the padded
    run's."""
    base = {**BASE, "policy": {"kind": "transformer", "model_dim": 16, "token_dim": 8,
                               "horizon": 8},
            "train": {**BASE["train"], "num_envs": 8, "aux_goal_coef": 0.0}}
    runs = []
    for setting in ("off", 0.5):
        config = RunConfig.from_dict({**base, "train": {**base["train"],
                                                        "dense_rows": setting}})
        env, env_params = build_env(config, 0, 4)
        ppo = PPO(config, env, Policy.for_env(config.policy, env))
        state = ppo.init(jax.random.key(0), env_params)
        step = jax.jit(ppo.train_step)
        metrics = []
        for _ in range(2):
            state, m = step(state, env_params)
            metrics.append(jax.device_get(m))
        runs.append((ppo, state, metrics))
    (_, s_p, m_p), (dense, s_d, m_d) = runs
    assert dense.update_buffers == ((8, 56), (16, 56))  # 16 rows x 7 steps a minibatch
    for a, b in zip(jax.tree.leaves(s_p.params), jax.tree.leaves(s_d.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    for it, (mp, md) in enumerate(zip(m_p, m_d, strict=True)):
        for k in mp:
            np.testing.assert_allclose(md[k], mp[k], atol=1e-5, rtol=1e-5,
                                       err_msg=f"iteration {it}: {k}")
    # Some minibatches ran on a dense buffer (2 iterations x 2 epochs x 2 minibatches).
    assert sum(m["loss/dense_overflow_minibatches"] for m in m_d) < 8

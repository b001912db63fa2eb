"""``python -m jaxdrive.inspect`` and the policy's attention option behind it.

A tiny run directory (random parameters, trial mode) is inspected end to end; the
weights it records are checked against the cache rule (rows sum to 1 over the
attendable slots, exactly 0 on garbage and empty ones) and against the env's removals;
on the temporal decoder itself, weights @ V through the rest of the layer reproduces
its output, and the step without the option is unchanged bit for bit. Parameters are
drawn on the host from ``jax.eval_shape`` shapes, so no initialiser is compiled.
"""

import contextlib
import io
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.bench.policy import random_observation
from jaxdrive.env import Env
from jaxdrive.inspect import cli
from jaxdrive.models.kv_cache import KVCache
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.models.transformer import TemporalDecoder, sinusoid
from jaxdrive.runs.checkpoint import Checkpointer
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import save_config

TRIALS, TIMEOUT, HORIZON = 3, 6, 12
TINY = {
    "env": {"scenario": {"max_agents": 4}, "collision_behavior": "remove",
            "observation": {"num_partners": 3, "num_road": 20},
            "road_index": {"road_per_cell": 20, "grid_size": 8}, "episode_length": 12,
            "goal_behavior": "trial", "num_trials": TRIALS, "trial_timeout": TIMEOUT},
    "procedural": {"num_agents": [2, 4], "topology": {"straight": 1.0, "curve": 0.0,
                                                      "t_junction": 0.0, "intersection": 0.0}},
    "policy": {"model_dim": 16, "token_dim": 8, "num_layers": 2, "heads": 2,
               "horizon": HORIZON},
    "validation": {"num_scenes": 2},
}
# Scene 0 of TINY's validation seed: the SDC starts 10.6 m from its goal and agent 1
# 18.6 m from its. With this radius the SDC reaches its goal on a trial's first step and
# stays removed while agent 1 drives on until the timeout, so its memory fills with
# garbage slots.
GOAL_RADIUS = "env.goal_radius=10"


def _random_params(policy, o, seed):
    """Parameters of ``policy`` drawn on the host (normal, scale 0.3) for observations
    with ``o``'s token counts: ``init``'s shapes come from ``jax.eval_shape``, so no
    initialiser is compiled."""
    obs = jax.eval_shape(lambda k: random_observation(k, (2,), o.num_partners, o.num_road,
                                                      o.num_lights), jax.random.key(1))
    shapes = jax.eval_shape(policy.module.init, jax.random.key(0), obs)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


def _run_dir(root, kind):
    root.mkdir(parents=True, exist_ok=True)
    config = RunConfig.from_dict({**TINY, "policy": {**TINY["policy"], "kind": kind}})
    save_config(config, root / "config.yaml")
    policy = Policy.for_env(config.policy, Env(config.env))
    with Checkpointer(root / "checkpoints") as ckpt:
        ckpt.save(40, {"params": _random_params(policy, config.env.observation, 0)}, {"step": 40})
    return root


@pytest.fixture(scope="module")
def run_t(tmp_path_factory):
    """A transformer run directory (TINY, random parameters)."""
    return _run_dir(tmp_path_factory.mktemp("run"), "transformer")


@pytest.fixture(scope="module")
def inspected(run_t, tmp_path_factory):
    """(output directory, printed text) of the transformer run inspected on scene 0."""
    out = tmp_path_factory.mktemp("inspect")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(["--checkpoint", str(run_t), "--out", str(out), "--set", GOAL_RADIUS])
    assert rc == 0, buf.getvalue()
    return out, buf.getvalue()


def test_inspect_writes_plots_trace_and_arrays(inspected):
    out, printed = inspected
    for name in ("attention.png", "cache.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = (out / "trace.txt").read_text()
    # Three trials that time out after TIMEOUT steps; the SDC (agent 0, inspected by
    # default) reaches its goal at each trial's first step and is removed.
    for k in range(TRIALS):
        assert f"trial {k} ended after {TIMEOUT} steps (timeout)" in trace
        assert (f"step {k * TIMEOUT:4d}  trial {k}  t_in_trial    0  | agent 0 (ego, sdc, "
                "inspected): goal reached") in trace
    assert "episode ended" in trace and "ego goals per trial: [1, 1, 1]" in trace
    assert "ego goals per trial: [1, 1, 1]" in printed and str(out / "cache.png") in printed


def test_attention_rows_sum_to_one_and_garbage_gets_zero(inspected):
    out, _ = inspected
    p = np.load(out / "probe.npz")
    w, pos, garbage, q = p["attention"], p["slot_pos"], p["slot_garbage"], p["query_pos"]
    removed = p["removed"][:, int(p["agent"])]
    t_len = TRIALS * TIMEOUT
    assert w.shape == (t_len, 2, 2, HORIZON) and np.array_equal(q, np.arange(t_len))
    n_garbage = 0
    for t in range(t_len):
        for s in range(HORIZON):
            held = pos[t, s] >= 0
            if held:
                # The cache marks exactly the steps the env observed the agent removed
                # (the query's own slot too: garbage for later queries).
                assert garbage[t, s] == removed[pos[t, s]]
            own = pos[t, s] == t
            ok = own or (held and pos[t, s] <= t and t - pos[t, s] < HORIZON
                         and not garbage[t, s])
            n_garbage += held and garbage[t, s] and not own
            if not ok:
                assert np.all(w[t, :, :, s] == 0.0), (t, s)  # exactly zero
            else:
                assert np.all(w[t, :, :, s] > 0.0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
    assert n_garbage > 50  # the scene does fill the memory with garbage
    assert np.any(pos == -1)  # and the early steps see empty slots


def test_mlp_run_says_it_has_no_memory_and_writes_the_trace(tmp_path, capsys):
    run = _run_dir(tmp_path / "mlp", "mlp")
    rc = cli.main(["--checkpoint", str(run), "--trials", "2"])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "has no memory" in printed
    out = run / "inspect"
    trace = (out / "trace.txt").read_text()
    assert "trial 1 ended" in trace and "trials: 2 x 6 steps" in trace
    assert not (out / "attention.png").exists() and not (out / "cache.png").exists()
    with pytest.raises(ValueError, match="has no memory"):
        policy = Policy(PolicyConfig(kind="mlp"), num_actions=3)
        policy.step(None, policy.init_cache(1), None, jnp.zeros(1, bool),
                    jnp.zeros(1, bool), return_attention=True)


def test_agent_choice():
    state = SimpleNamespace(controlled=np.array([False, True, True, False]),
                            ego=np.array([False, False, True, False]))
    sdc = np.array([False, True, False, False])
    # The SDC is controlled but a co-player: the first controlled ego agent instead.
    assert cli.pick_agent(SimpleNamespace(agent=None), state, sdc) == 2
    assert cli.pick_agent(SimpleNamespace(agent=1), state, sdc) == 1
    with pytest.raises(ValueError, match="--agent 3 is not a controlled agent"):
        cli.pick_agent(SimpleNamespace(agent=3), state, sdc)


def _reconstruct(decoder, x, attended, pos):
    """The decoder's step after its attention (one layer): residual and MLP."""
    return decoder.layers[0].finish(x + sinusoid(pos, decoder.model_dim), attended)


def test_attention_weights_reproduce_the_decoder_output():
    n, s, d, heads, steps = 3, 3, 16, 2, 6
    decoder = TemporalDecoder(d, heads, num_layers=1)
    shapes = jax.eval_shape(decoder.init, jax.random.key(0), jnp.zeros((n, d)))
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(a.dtype), shapes)
    xs = rng.standard_normal((steps, n, d)).astype(np.float32)

    def both(cache_a, cache_b, x, removed):
        """The plain step, the step with weights, and the output rebuilt from them."""
        y_a, cache_a = decoder.apply(params, x, cache_a, removed, method=TemporalDecoder.step)
        y_b, cache_b, w = decoder.apply(params, x, cache_b, removed, True,
                                        method=TemporalDecoder.step)
        # weights @ V (the updated cache's values), then the rest of the layer.
        attended = jnp.einsum("nhs,nhsd->nhd", w[0], cache_b.v[0])
        rebuilt = decoder.apply(params, x, attended, cache_b.next_pos - 1,
                                method=_reconstruct)
        return y_a, cache_a, y_b, cache_b, w, rebuilt

    both = jax.jit(both)
    # Agent 1 removed at steps 1-2, agent 2 at step 0; 6 steps over 3 slots wrap the ring.
    removed = np.zeros((steps, n), bool)
    removed[1:3, 1] = True
    removed[0, 2] = True
    cache_a = cache_b = KVCache.create(n, 1, s, heads, d // heads)
    checked = 0
    for t in range(steps):
        y_a, cache_a, y_b, cache_b, w, rebuilt = both(cache_a, cache_b, xs[t], removed[t])
        # The option changes nothing: outputs and cache bit for bit.
        for a, b in zip(jax.tree.leaves((y_a, cache_a)), jax.tree.leaves((y_b, cache_b)),
                        strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        assert w.shape == (1, n, heads, s)
        np.testing.assert_allclose(rebuilt, y_b, atol=1e-5)
        # Garbage slots of earlier steps get exactly 0 (agent 1's steps 1-2 and agent 2's
        # step 0, while the 3-slot ring holds them).
        for agent, pos in ((1, 1), (1, 2), (2, 0)):
            held = np.flatnonzero(np.asarray(cache_b.pos[agent]) == pos)
            if held.size and pos < t:
                assert np.all(np.asarray(w[0, agent, :, held[0]]) == 0.0)
                checked += 1
    assert checked == 6  # each of the 3 garbage steps, at the 2 later steps it stays held

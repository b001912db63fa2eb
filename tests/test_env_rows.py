"""Packed agent rows (``EnvConfig.max_controlled``): the env steps, observes and rewards
only its controlled agents, and every other object stays in the scene as background.

Checked against the env with one row per object slot (``max_controlled`` unset), run
side by side from the same keys and actions: on every packed row, every per-agent
output (observation, reward, flags, metrics, episode and trial statistics, state) equals
the padded env's at the row's object slot, through resets, removals, co-players and
trials; the rows are exactly the padded env's controlled slots; and when more objects
are controllable than there are rows, the SDC keeps its row and the rest replay their
log, as a host count of the same rule says.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden_cases import PROCEDURAL_AS_RECORDED

from jaxdrive.env import Env, EnvConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch
from jaxdrive.types import EntityKind

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA = SHARED / "womd_json"
# The plain scenes and the one with traffic lights (its light tokens went NaN once).
REAL = (sorted(DATA.glob("*.json")) + sorted((SHARED / "womd_json_traffic_lights").glob("*.json"))
        if DATA.is_dir() else [])

NUM_ENVS, NUM_STEPS = 3, 24
FLOAT_RTOL, FLOAT_ATOL = 1e-5, 1e-5
SMALL_OBS = {"num_partners": 6, "num_road": 16, "num_lights": 2}
ROAD_INDEX = {"road_per_cell": 16, "chunk_size": 8, "grid_size": 8}

# Procedural: 16 object slots, a quarter of the controllable vehicles driven (the rest
# replay or stand), trials with co-players and removals; 12 rows.
PROCEDURAL_ENV = {
    "scenario": {"max_agents": 16, "num_steps": 40},
    "observation": SMALL_OBS, "road_index": ROAD_INDEX,
    "control_mode": "fraction", "controlled_fraction": 0.4,
    "collision_behavior": "remove", "goal_behavior": "trial", "num_trials": 2,
    "trial_timeout": 7, "co_player_fraction": 0.5, "goal_radius": 6.0,
}
# Real scenes: every vehicle driven, the others replayed; short episodes (auto-resets).
REAL_ENV = {
    "scenario": {"max_agents": 96, "num_steps": 91, "max_road_points": 2048,
                 "max_lanes": 128, "max_traffic_lights": 32},
    "observation": {**SMALL_OBS, "num_lights": 4}, "road_index": ROAD_INDEX,
    "collision_behavior": "remove", "goal_behavior": "remove", "episode_length": 9,
}


def _rollouts(config: dict, rows: int, scenes):
    """Both envs' ``NUM_STEPS`` steps from the same keys and per-object actions: per
    step (padded state, timestep), (packed state, timestep) and the packed rows' object
    slots before the step."""
    padded = Env(EnvConfig.from_dict(config))
    packed = Env(EnvConfig.from_dict({**config, "max_controlled": rows}))
    pool = make_pool(scenes, padded.config.road_index)
    params = padded.make_params(pool)
    n = padded.config.scenario.max_agents

    def run(key):
        k_reset, k_act = jax.random.split(key)
        keys = jax.random.split(k_reset, NUM_ENVS)
        start_a = jax.vmap(padded.reset, in_axes=(None, 0))(params, keys)
        start_b = jax.vmap(packed.reset, in_axes=(None, 0))(params, keys)

        def body(carry, k):
            (sa, _), (sb, _) = carry
            act = jax.random.randint(k, (NUM_ENVS, n), 0, padded.num_actions, jnp.int32)
            row_act = jnp.take_along_axis(act, jnp.minimum(sb.obj_index, n - 1), axis=1)
            out_a = padded.step_batch(params, sa, act)
            out_b = packed.step_batch(params, sb, row_act)
            return (out_a, out_b), (out_a, out_b, sb.obj_index)

        _, (out_a, out_b, before) = jax.lax.scan(body, (start_a, start_b),
                                                 jax.random.split(k_act, NUM_STEPS))
        return start_a, start_b, out_a, out_b, before

    return jax.device_get(jax.jit(run)(jax.random.key(3))), n


def _gather_rows(padded, obj_index, n):
    """Per-agent leaves (..., A, ...) of ``padded`` at ``obj_index`` (..., C)."""
    idx = np.minimum(obj_index, n - 1)
    return np.take_along_axis(padded, idx.reshape(idx.shape + (1,) * (padded.ndim
                                                                     - idx.ndim)),
                              axis=idx.ndim - 1)


def _compare(padded_tree, packed_tree, obj_index, n, rows, where: str):
    """Every leaf: per-agent leaves equal on the used rows, per-env leaves equal."""
    used = obj_index < n
    flat_a = jax.tree_util.tree_flatten_with_path(padded_tree)[0]
    flat_b = jax.tree.leaves(packed_tree)
    assert len(flat_a) == len(flat_b), where
    compared = 0
    for (path, a), b in zip(flat_a, flat_b, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        name = f"{where}{jax.tree_util.keystr(path)}"
        per_agent = a.ndim > used.ndim - 1 and a.shape[used.ndim - 1] == n
        if not per_agent:
            np.testing.assert_array_equal(b, a, err_msg=name)
            continue
        assert b.shape[used.ndim - 1] == rows, name
        want = _gather_rows(a, obj_index, n)
        mask = used.reshape(used.shape + (1,) * (a.ndim - used.ndim))
        mask = np.broadcast_to(mask, want.shape)
        if a.dtype.kind == "f":
            # The rows are computed in buffers of another size: XLA vectorises them
            # differently, so floats may differ in the last bits (goal distances of tens
            # of metres: a few 1e-6 m).
            np.testing.assert_allclose(b[mask], want[mask], rtol=FLOAT_RTOL, atol=FLOAT_ATOL,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(b[mask], want[mask], err_msg=name)
        compared += 1
    assert compared > 0, where


def _present_only(info):
    """``info`` with its distance metrics zeroed where the agent is not present."""
    present = info.terminal.valid
    return info.replace(metrics=info.metrics.replace(**{
        name: np.where(present, info.metrics[name], 0.0)
        for name in ("goal_distance", "progress")}))


def _check_equal_on_rows(out, n, rows):
    start_a, start_b, (sa, ta), (sb, tb), before = out
    # Resets: the first state and observation.
    _compare((start_a[0].agents, start_a[0].goal, start_a[0].kind, start_a[0].role),
             (start_b[0].agents, start_b[0].goal, start_b[0].kind, start_b[0].role),
             start_b[0].obj_index, n, rows, "reset state")
    _compare(start_a[1].obs, start_b[1].obs, start_b[0].obj_index, n, rows, "reset obs")
    after = sb.obj_index
    # Observations are finite on both sides (a NaN would compare equal to a NaN).
    for tree in (start_a[1].obs, start_b[1].obs, ta.obs, tb.obs):
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
            assert np.isfinite(x).all(), jax.tree_util.keystr(path)
    # What the step reached (its rewards, flags, metrics, the ended episode's stats):
    # the rows as they were before the step; what the next action reads (observation,
    # activity, the state after any auto-reset): the rows after it.
    # A removed agent is parked 1e5 m away: its goal distance and progress are
    # rounding noise of that distance (no reward reads them); compare them where present.
    ta_info, tb_info = _present_only(ta.info), _present_only(tb.info)
    _compare((ta.reward, ta.terminated, ta.truncated, ta_info),
             (tb.reward, tb.terminated, tb.truncated, tb_info), before, n, rows, "step")
    _compare((ta.obs, ta.active, ta.removed, ta.first), (tb.obs, tb.active, tb.removed,
                                                         tb.first), after, n, rows, "next")
    state_a = sa.replace(key=None)
    state_b = sb.replace(background=None, key=None)
    _compare(state_a, state_b, after, n, rows, "state")
    # The rows are exactly the padded env's controlled slots, at every step.
    for t in range(NUM_STEPS):
        for e in range(NUM_ENVS):
            ctrl = np.flatnonzero(sa.kind[t, e] == EntityKind.CONTROLLED)
            held = after[t, e][after[t, e] < n]
            assert sorted(held.tolist()) == ctrl.tolist(), (t, e)
            assert np.all(sb.kind[t, e][after[t, e] >= n] == EntityKind.INVALID)
            bg = sb.background.kind[t, e]
            np.testing.assert_array_equal(bg, sa.kind[t, e], err_msg=f"bg_kind {t} {e}")
    return ta, sa


def test_packed_rows_equal_padded_slots_on_procedural_scenes_with_trials():
    proc = ProceduralConfig.from_dict({"num_agents": [8, 16], "goal_distance": [20.0, 30.0],
                                       **PROCEDURAL_AS_RECORDED})
    cfg = EnvConfig.from_dict(PROCEDURAL_ENV)
    scenes = generate_batch(jax.random.key(0), 4, proc, cfg.scenario)
    out, n = _rollouts(PROCEDURAL_ENV, 12, scenes)
    ta, sa = _check_equal_on_rows(out, n, 12)
    # The run exercised what it claims: background objects, removals, co-players,
    # trial ends and episode ends.
    assert np.any(sa.kind == EntityKind.EXPERT) | np.any(sa.kind == EntityKind.STATIC)
    assert np.any(ta.removed) and np.any(sa.co_player)
    assert np.any(ta.info.trial_done) and np.any(ta.info.episode_done)


@pytest.mark.skipif(not REAL, reason=f"real JSON scenes not found in {DATA}")
def test_packed_rows_equal_padded_slots_on_real_scenes():
    from jaxdrive.data import load_scenarios
    from jaxdrive.data.convert import ConvertConfig

    cfg = EnvConfig.from_dict(REAL_ENV)
    scenes, _ = load_scenarios([str(p) for p in REAL], cfg.scenario, ConvertConfig())
    out, n = _rollouts(REAL_ENV, 16, jax.tree.map(jnp.asarray, scenes))
    ta, sa = _check_equal_on_rows(out, n, 16)
    assert np.any(ta.info.episode_done)
    # Most object slots are background here: the rows are what pays.
    assert (sa.kind == EntityKind.CONTROLLED).sum() < 0.3 * (sa.kind != EntityKind.INVALID).sum()


def test_more_controllable_than_rows_keeps_the_sdc_and_replays_the_rest():
    proc = ProceduralConfig.from_dict({"num_agents": [8, 8], "goal_distance": [20.0, 30.0],
                                       **PROCEDURAL_AS_RECORDED})
    config = {**PROCEDURAL_ENV, "control_mode": "all", "goal_behavior": "stop",
              "num_trials": 1, "trial_timeout": None, "co_player_fraction": 0.0}
    cfg = EnvConfig.from_dict(config)
    scenes = generate_batch(jax.random.key(1), 4, proc, cfg.scenario)
    # Make the last vehicle of each scene the SDC, so that it would not fit by slot order.
    n = cfg.scenario.max_agents
    is_sdc = np.zeros((4, n), bool)
    last = np.asarray(scenes.objects.valid[:, :, cfg.init_step]).cumsum(axis=1).argmax(axis=1)
    is_sdc[np.arange(4), last] = True
    scenes = scenes.replace(objects=scenes.objects.replace(is_sdc=jnp.asarray(is_sdc)))
    padded = Env(cfg)
    packed = Env(EnvConfig.from_dict({**config, "max_controlled": 3}))
    params = padded.make_params(make_pool(scenes, cfg.road_index))
    reset = jax.jit(jax.vmap(lambda e, sid: e.reset_to(params, sid, jax.random.key(0)),
                             in_axes=(None, 0)), static_argnums=0)
    sa, _ = jax.device_get(reset(padded, jnp.arange(4)))
    sb, tb = jax.device_get(reset(packed, jnp.arange(4)))
    # The count the trainer's overflow note reads: the padded reset's controlled slots.
    np.testing.assert_array_equal(np.asarray(packed.controlled_per_scene(params)),
                                  (sa.kind == EntityKind.CONTROLLED).sum(axis=1))
    for s in range(4):
        ctrl = np.flatnonzero(sa.kind[s] == EntityKind.CONTROLLED)
        assert len(ctrl) > 3  # more controllable vehicles than rows
        sdc = int(last[s])
        assert sdc in ctrl
        want = [sdc] + [i for i in ctrl if i != sdc][:2]  # the SDC, then slot order
        assert sorted(sb.obj_index[s].tolist()) == sorted(want)
        kinds = sa.kind[s].copy()
        kinds[np.setdiff1d(ctrl, want)] = EntityKind.EXPERT  # beyond the rows: replay
        np.testing.assert_array_equal(sb.background.kind[s], kinds)
        assert tb.active[s].sum() == 3

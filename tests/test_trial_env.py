"""Multi-trial episodes (goal_behavior: trial): clocks, removal, restores, metrics.

Hand-built straight-road scenes give hand-computed timings; procedural scenes with
experts check bit-identical trial starts and the on-device trial metrics against a
brute-force host computation from a recorded rollout.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_AGENTS, SMALL_ENV, SMALL_SCENARIO, straight_road

from jaxdrive.agents.controllers import CONTROLLERS
from jaxdrive.agents.rollout import RolloutStats
from jaxdrive.config import ConfigError
from jaxdrive.env import REMOVED_XY, Env, EnvConfig
from jaxdrive.metrics.trials import TrialTotals
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch
from jaxdrive.types import EntityKind, tree_stack

A = SMALL_AGENTS
SC = SMALL_SCENARIO
BASE = {**SMALL_ENV, "goal_behavior": "trial"}
_FNS = {}


def env_fns(**overrides):
    """(env, jitted reset_to, jitted step), compiled once per config in this module."""
    key = repr(sorted(overrides.items()))
    if key not in _FNS:
        env = Env(EnvConfig.from_dict({**BASE, **overrides}))
        _FNS[key] = (env, jax.jit(env.reset_to), jax.jit(env.step))
    return _FNS[key]


def run(fns, scene, steps, action=None):
    """Reset on ``scene`` and take ``steps`` steps; returns [(state, timestep), ...]."""
    env, reset_to, step = fns
    pool = make_pool(tree_stack([jax.tree.map(jnp.asarray, scene)]), env.config.road_index)
    params = env.make_params(pool)
    state, ts = reset_to(params, jnp.int32(0), jax.random.key(0))
    if action is None:
        grid = np.asarray(env.dynamics.action_grid())
        action = int(np.flatnonzero(np.all(grid == 0, axis=1))[0])  # keep speed
    act = jnp.full((A,), action, jnp.int32)
    out = [(state, ts)]
    for _ in range(steps):
        state, ts = step(params, state, act)
        out.append((state, ts))
    return out


def flags(out, name):
    """(steps, A) or (steps,) array of a TimeStep field (or of its info record, or of the
    state) over the steps taken."""

    def get(state, ts):
        for holder in (ts, ts.info, state):
            if hasattr(holder, name):
                return getattr(holder, name)
        raise AttributeError(name)

    return np.array([np.asarray(get(state, ts)) for state, ts in out[1:]])


def test_timeout_cycle_wraps_trials_and_terminates_every_k():
    # Two parked cars far from their goals never reach them: every trial times out.
    scene = straight_road(SC, [(0, -2, 0, 0, *CAR), (-60, 2, 0, 0, *CAR)],
                          goals=[(50, -2), (-90, 2)])
    k, timeout, steps = 3, 5, 30
    out = run(env_fns(num_trials=k, trial_timeout=timeout), scene, steps)
    controlled = np.array([True, True, False, False])
    t = np.arange(1, steps + 1)
    trial_end = t % timeout == 0
    episode_end = t % (timeout * k) == 0
    np.testing.assert_array_equal(flags(out, "trial_ended"),
                                  trial_end[:, None] & controlled[None])
    np.testing.assert_array_equal(flags(out, "terminated"),
                                  episode_end[:, None] & controlled[None])
    np.testing.assert_array_equal(flags(out, "truncated"),
                                  (trial_end & ~episode_end)[:, None] & controlled[None])
    np.testing.assert_array_equal(flags(out, "episode_done"), episode_end)
    np.testing.assert_array_equal(flags(out, "trial_done"), trial_end)
    # The trial index of each returned observation: 0,0,0,0,1,1,...,2,0 (wraps).
    np.testing.assert_array_equal(flags(out, "trial"), (t // timeout) % k)
    # Metrics: two episodes, each K timed-out trials of 5 steps, no goal reached.
    totals = TrialTotals.zeros(k)
    for _, ts in out[1:]:
        totals = totals.update(ts.info.episode_done, ts.info.trials)
    m = {name: float(v) for name, v in totals.metrics().items()}
    assert m["trial_episodes"] == 2
    assert m["trials_completed"] == k and m["trials_timed_out"] == k
    assert m["trials_goal_reached"] == 0 and m["trial_mean_length"] == timeout
    assert all(m[f"trial_{i}_score"] == 0 for i in range(k))


def test_goal_mid_trial_removes_agent_until_trial_end():
    # Agent 0 drives 10 m/s towards a goal 5 m ahead: distance 4, 3, 2 -> reached on
    # step 3 (radius 2). Agent 2 stands 10 m ahead of agent 0, facing it: had agent 0
    # gone on, their boxes would overlap from step 4. Agent 1 keeps the trial going.
    scene = straight_road(
        SC,
        [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR), (10, -2, np.pi, 0, *CAR)],
        goals=[(5, -2), (-90, 2), (-50, -2)],
    )
    timeout = 8
    out = run(env_fns(num_trials=2, trial_timeout=timeout), scene, timeout)
    removed = flags(out, "removed")
    np.testing.assert_array_equal(removed[:, 0], [False, False, True, True, True, True, True,
                                                  False])
    for state, _ in out[3:timeout]:
        np.testing.assert_array_equal(state.agents.xy[0], [REMOVED_XY, REMOVED_XY])
        np.testing.assert_array_equal(state.agents.vel[0], [0.0, 0.0])
    # Goal reward once, then nothing while removed.
    np.testing.assert_allclose(flags(out, "reward")[:timeout - 1, 0],
                               [0.1, 0.1, 1.1, 0, 0, 0, 0], atol=1e-5)
    # Agent 2 sees agent 0 (its only partner within 50 m) until agent 0 is removed.
    seen = np.array([bool(ts.obs.partner_mask[2].any()) for _, ts in out])
    np.testing.assert_array_equal(seen, [True] * 3 + [False] * 5 + [True])
    collided = np.array([np.asarray(ts.info.metrics.collided) for _, ts in out[1:]])
    assert not collided.any()
    # No truncation or termination for it until the trial ends (step 8).
    assert not flags(out, "truncated")[:timeout - 1].any()
    assert not flags(out, "terminated").any()
    np.testing.assert_array_equal(flags(out, "truncated")[timeout - 1], [True, True, True, False])
    # The next trial starts from the initial state, agent 0 active and in place again.
    state, ts = out[timeout]
    np.testing.assert_allclose(state.agents.xy[0], [0.0, -2.0])
    assert bool(ts.active[0]) and int(state.trial) == 1


def test_all_goals_reached_ends_trial_early():
    # Agent 0 reaches on step 3, agent 1 (7 m from its goal at 10 m/s) on step 5.
    scene = straight_road(SC, [(0, -2, 0, 10, *CAR), (0, 2, np.pi, 10, *CAR)],
                          goals=[(5, -2), (-7, 2)])
    out = run(env_fns(num_trials=2, trial_timeout=8), scene, 10)
    np.testing.assert_array_equal(flags(out, "trial_done"), [t in (5, 10) for t in range(1, 11)])
    np.testing.assert_array_equal(flags(out, "trial_ended")[4], [True, True, False, False])
    _, ts = out[10]
    assert bool(ts.info.episode_done)
    np.testing.assert_array_equal(ts.terminated, [True, True, False, False])
    np.testing.assert_array_equal(ts.info.trials.length, [5, 5])
    np.testing.assert_array_equal(ts.info.trials.ego_reached, [2, 2])
    np.testing.assert_array_equal(ts.info.trials.goal_reached, [True, True])
    np.testing.assert_array_equal(ts.info.trials.timed_out, [False, False])


def test_co_player_goals_never_count_toward_ego_scores():
    # Agent 0 (the SDC, always ego) never reaches; agent 1 (a co-player) reaches on
    # step 3 of each trial. Removed agent 1 must not show up in any metric.
    scene = straight_road(SC, [(0, 2, np.pi, 0, *CAR), (0, -2, 0, 10, *CAR)],
                          goals=[(-60, 2), (5, -2)], sdc=0)
    k, timeout = 2, 6
    out = run(env_fns(num_trials=k, trial_timeout=timeout, co_player_fraction=1.0), scene,
              k * timeout)
    np.testing.assert_array_equal(out[0][0].ego, [True, False, False, False])
    np.testing.assert_array_equal(out[0][0].co_player, [False, True, False, False])
    env = env_fns(num_trials=k, trial_timeout=timeout, co_player_fraction=1.0)[0]
    stats = RolloutStats.zeros(env)
    removed_steps = 0
    for (_, prev), (_, ts) in zip(out[:-1], out[1:], strict=True):
        stats = stats.update(ts)
        gone = np.asarray(prev.removed)  # removed before this step
        removed_steps += gone.sum()
        m = ts.info.metrics
        assert not (np.asarray(m.collided | m.offroad | m.goal_reached) & gone).any()
        assert not np.asarray(ts.reward)[gone].any()
    assert removed_steps == 2 * (timeout - 3)
    r = jax.device_get(stats).rates()
    assert r["trial_0_score"] == 0 and r["trial_1_score"] == 0
    assert r["ada_delta_trial_1_minus_0"] == 0
    assert r["co_player_trial_0_score"] == 1 and r["co_player_trial_1_score"] == 1
    assert r["agent_episodes"] == 1 and r["goal_rate"] == 0
    assert r["co_player_agent_episodes"] == 1 and r["co_player_goal_rate"] == 1
    # The co-player acted 3 steps per trial: its removed steps count nowhere.
    np.testing.assert_array_equal(out[-1][1].info.episode.length[:2], [2 * timeout, 6])


def test_non_trial_goal_behaviours_leave_trial_fields_inert():
    scene = straight_road(SC, [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR)],
                          goals=[(5, -2), (-90, 2)])
    for behaviour in ("stop", "respawn", "new_goal"):
        out = run(env_fns(goal_behavior=behaviour, episode_length=4), scene, 9)
        assert not flags(out, "trial_ended").any()
        np.testing.assert_array_equal(flags(out, "trial"), 0)
        np.testing.assert_array_equal(flags(out, "trial_done"), flags(out, "episode_done"))
        assert flags(out, "episode_done").sum() == 2
        assert all(int(s.trial_start) == 0 for s, _ in out)


def test_trial_config_errors():
    with pytest.raises(ConfigError, match="num_trials"):
        EnvConfig.from_dict({"num_trials": 3})  # goal_behavior defaults to stop
    with pytest.raises(ConfigError, match="trial_timeout"):
        EnvConfig.from_dict({"goal_behavior": "trial", "trial_timeout": 500})
    with pytest.raises(ConfigError, match="num_trials"):
        EnvConfig.from_dict({"goal_behavior": "trial", "num_trials": 0})
    with pytest.raises(ConfigError, match="co_player_fraction"):
        EnvConfig.from_dict({"co_player_fraction": 1.5})


def _plain(tree):
    is_key = lambda x: jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
    return jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)


def test_trial_batched_equals_single_and_traces_once():
    scene_a = straight_road(SC, [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR)],
                            goals=[(5, -2), (-90, 2)])
    scene_b = straight_road(SC, [(10, 2, np.pi, 5, *CAR), (40, 2, np.pi, 7, *CAR)])
    env, _, single = env_fns(num_trials=2, trial_timeout=3)
    pool = make_pool(tree_stack([jax.tree.map(jnp.asarray, s) for s in (scene_a, scene_b)]),
                     env.config.road_index)
    params = env.make_params(pool)
    reset = jax.jit(chex.assert_max_traces(env.reset_batch, n=1), static_argnums=2)
    step = jax.jit(chex.assert_max_traces(env.step_batch, n=1))
    states, _ = reset(params, jax.random.key(1), 3)
    boundaries = 0
    for i in range(8):  # crosses trial (3, 9) and episode (6) boundaries
        actions = jax.random.randint(jax.random.key(i), (3, A), 0, env.num_actions)
        new_states, ts = step(params, states, actions)
        boundaries += int(jnp.sum(ts.info.trial_done))
        for b in range(3):
            pick = lambda x, b=b: x[b]
            s_b, ts_b = single(params, jax.tree.map(pick, states), actions[b])
            chex.assert_trees_all_close(_plain(s_b), _plain(jax.tree.map(pick, new_states)),
                                        atol=1e-6)
            chex.assert_trees_all_close(ts_b, jax.tree.map(pick, ts), atol=1e-6)
        states = new_states
    assert boundaries >= 6


# --------------------------------------------------------------- procedural scenes
PSC = ScenarioConfig(max_agents=12, num_steps=41, max_road_points=4096)
PROC = ProceduralConfig(num_agents=(6, 12), arm_length=40.0, goal_distance=(4.0, 12.0))
PBASE = {
    "scenario": PSC.to_dict(),
    "observation": {"num_partners": 6, "num_road": 20},
    "road_index": {"road_per_cell": 40},
    "init_step": 5,
    "goal_behavior": "trial",
    "trial_timeout": 8,
}
B = 3


def procedural_rollout(overrides, controller, steps, seed=0):
    """Record ``steps`` batched steps of B envs on procedural scenes with experts.

    Returns (env, the reset (state, timestep), stacked (states, timesteps) (steps, B, ...),
    RolloutStats).
    """
    env = Env(EnvConfig.from_dict({**PBASE, **overrides}))
    scenes = generate_batch(jax.random.key(seed), 4, PROC, PSC)
    params = env.make_params(make_pool(scenes, env.config.road_index))
    act = jax.vmap(CONTROLLERS[controller](env), in_axes=(None, 0, 0, 0))

    @jax.jit
    def roll(key):
        state, ts0 = env.reset_batch(params, key, B)

        def body(carry, k):
            state, ts, stats = carry
            state, ts = env.step_batch(params, state, act(params, state, ts,
                                                          jax.random.split(k, B)))
            return (state, ts, stats.update(ts)), (state, ts)

        state0 = state
        (_, _, stats), (sts, tss) = jax.lax.scan(body, (state, ts0, RolloutStats.zeros(env)),
                                                 jax.random.split(key, steps))
        return state0, ts0, sts, tss, stats

    state0, ts0, sts, tss, stats = roll(jax.random.key(seed + 1))
    # PRNG keys are not NumPy data; the checks read every other field on the host.
    state0, sts = state0.replace(key=None), sts.replace(key=None)
    state0, ts0, sts, tss, stats = jax.device_get((state0, ts0, sts, tss, stats))
    assert (np.asarray(state0.kind) == EntityKind.EXPERT).any(), "scenes need experts"
    return env, (state0, ts0), (sts, tss), stats


@pytest.mark.parametrize(
    "k, overrides",
    [
        (2, {"control_mode": "sdc"}),
        # Slow-marked for the CI budget; the golden env cases replay these trial
        # configurations (delta_local continuous, co-players) bit for bit.
        pytest.param(3, {"control_mode": "fraction", "collision_behavior": "remove",
                         "dynamics": {"model": "delta_local", "action_space": "continuous"}},
                     marks=pytest.mark.slow),
        pytest.param(4, {"control_mode": "fraction", "co_player_fraction": 0.5,
                         "collision_behavior": "stop"}, marks=pytest.mark.slow),
    ],
)
def test_first_observation_of_every_trial_is_bit_identical(k, overrides):
    env, (_, ts0), (_, tss), _ = procedural_rollout({**overrides, "num_trials": k}, "random",
                                                    40)
    obs_fields = lambda ts, t, b: [np.asarray(x)[t, b] if t is not None else np.asarray(x)[b]
                                   for x in jax.tree.leaves(ts.obs)]
    trial_starts = 0
    for b in range(B):
        first = obs_fields(ts0, None, b)  # first observation of the current episode
        moved = False
        for t in range(len(tss.first)):
            obs = obs_fields(tss, t, b)
            if bool(tss.info.episode_done[t, b]):
                first = obs
            elif bool(tss.info.trial_done[t, b]):
                trial_starts += 1
                for got, want in zip(obs, first, strict=True):
                    np.testing.assert_array_equal(got, want)
            else:
                moved |= any(not np.array_equal(g, w) for g, w in zip(obs, first, strict=True))
        assert moved
    assert trial_starts >= B * (k - 1)


def test_trial_metrics_equal_brute_force_from_recorded_rollout():
    k = 8
    env, (state0, ts0), (sts, tss), stats = procedural_rollout(
        {"num_trials": k, "trial_timeout": 6, "co_player_fraction": 0.3}, "lane_follow", 110
    )
    steps = tss.first.shape[0]
    ego_agents = 0
    co_agents = 0
    ego_hits = np.zeros(k)
    co_hits = np.zeros(k)
    episodes = completed = timed_out = all_goal = length_sum = 0
    for b in range(B):
        prev = jax.tree.map(lambda x, b=b: np.asarray(x)[b], ts0)
        prev_s = jax.tree.map(lambda x, b=b: np.asarray(x)[b], state0)
        hits = [set() for _ in range(k)]
        lengths = np.zeros(k, int)
        for t in range(steps):
            cur = jax.tree.map(lambda x, t=t, b=b: np.asarray(x)[t, b], tss)
            cur_s = jax.tree.map(lambda x, t=t, b=b: np.asarray(x)[t, b], sts)
            trial = int(prev_s.trial)
            lengths[trial] += 1
            for i in np.flatnonzero(cur.info.metrics.goal_reached & prev.active):
                hits[trial].add(int(i))
            if cur.info.episode_done:
                ego = set(np.flatnonzero(prev_s.ego).tolist())
                co = set(np.flatnonzero(prev_s.co_player).tolist())
                episodes += 1
                ego_agents += len(ego)
                co_agents += len(co)
                for j in range(k):
                    ego_hits[j] += len(hits[j] & ego)
                    co_hits[j] += len(hits[j] & co)
                    completed += 1
                    timed_out += int(lengths[j] >= 6)
                    length_sum += lengths[j]
                controlled = ego | co
                all_goal += sum(int(lengths[j] < 6 and bool(controlled) and controlled <= hits[j])
                                for j in range(k))
                hits = [set() for _ in range(k)]
                lengths = np.zeros(k, int)
            prev, prev_s = cur, cur_s
    assert episodes >= B  # every env finished at least one 8-trial episode
    m = {name: float(v) for name, v in stats.trials.metrics().items()}
    want = {"trial_episodes": episodes, "trials_completed": completed / episodes,
            "trials_timed_out": timed_out / episodes,
            "trials_goal_reached": all_goal / episodes,
            "trial_mean_length": length_sum / completed}
    for j in range(k):
        want[f"trial_{j}_score"] = ego_hits[j] / ego_agents
        want[f"co_player_trial_{j}_score"] = co_hits[j] / max(co_agents, 1)
        if j:
            want[f"ada_delta_trial_{j}_minus_0"] = (ego_hits[j] - ego_hits[0]) / ego_agents
    assert set(m) == set(want)
    for name, value in want.items():
        assert m[name] == pytest.approx(value, abs=1e-6), name
    assert ego_hits.sum() > 0 and co_agents > 0  # the check is not vacuous

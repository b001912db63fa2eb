"""Environment reset/step: hand-computed states, behaviours, auto-reset, jit/vmap, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_AGENTS, SMALL_ENV, SMALL_SCENARIO, straight_road

from jaxdrive.config import ConfigError
from jaxdrive.env import REMOVED_XY, Env, EnvConfig
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.types import EntityKind, tree_stack

A = SMALL_AGENTS
SC = SMALL_SCENARIO
BASE = SMALL_ENV


def make_env(**overrides):
    cfg = dict(BASE)
    cfg.update(overrides)
    return Env(EnvConfig.from_dict(cfg))


def pool_of(*scenes, env):
    return make_pool(tree_stack([jax.tree.map(jnp.asarray, s) for s in scenes]),
                     env.config.road_index)


def zero_action(env):
    """Index of the (accel 0, steer 0) grid action."""
    grid = np.asarray(env.dynamics.action_grid())
    return int(np.flatnonzero(np.all(grid == 0, axis=1))[0])


# One env per behaviour; each compiles reset and step once for the whole module.
_ENVS = {}


def env_fns(**overrides):
    key = repr(sorted(overrides.items()))
    if key not in _ENVS:
        env = make_env(**overrides)
        _ENVS[key] = (env, jax.jit(env.reset_to), jax.jit(env.step))
    return _ENVS[key]


def run(env_fns_, scene, steps, action=None, sid=0):
    env, reset_to, step = env_fns_
    params = env.make_params(pool_of(scene, env=env))
    state, ts = reset_to(params, jnp.int32(sid), jax.random.key(0))
    act = jnp.full((A,), zero_action(env) if action is None else action, jnp.int32)
    out = [(state, ts)]
    for _ in range(steps):
        state, ts = step(params, state, act)
        out.append((state, ts))
    return params, out


def test_reset_matches_log_and_kinds():
    # Agents 0 and 2 drive; agent 1 is parked on its goal (its log's last position), so
    # it is not controlled but held static; slot 3 is empty -> INVALID.
    scene = straight_road(SC, [(0, -2, 0, 10, *CAR), (20, -2, 0, 0, *CAR), (0, 2, np.pi, 5, *CAR)])
    _, [(state, ts)] = run(env_fns(), scene, 0)
    np.testing.assert_array_equal(
        state.kind,
        [EntityKind.CONTROLLED, EntityKind.STATIC, EntityKind.CONTROLLED, EntityKind.INVALID],
    )
    np.testing.assert_allclose(state.agents.xy[:3], [[0, -2], [20, -2], [0, 2]], atol=1e-5)
    np.testing.assert_array_equal(ts.active, [True, False, True, False])
    assert ts.obs.ego.shape == (A, 8) and ts.obs.partners.shape == (A, 10, 3)


def test_sdc_mode_experts_replay_log_and_parked_are_static():
    scene = straight_road(SC, [(0, -2, 0, 10, *CAR), (20, -2, 0, 5, *CAR), (-30, 2, 0, 0, *CAR)])
    params, out = run(env_fns(control_mode="sdc"), scene, 3)
    state0 = out[0][0]
    np.testing.assert_array_equal(
        state0.kind,
        [EntityKind.CONTROLLED, EntityKind.EXPERT, EntityKind.STATIC, EntityKind.INVALID],
    )
    # After 3 steps the expert is at its logged position: 20 + 5 m/s * 0.3 s = 21.5.
    state3 = out[3][0]
    np.testing.assert_allclose(state3.agents.xy[1], [21.5, -2.0], atol=1e-4)
    np.testing.assert_allclose(state3.agents.xy[2], [-30.0, 2.0], atol=1e-6)
    # The SDC keeps 10 m/s with the zero action: 0 + 10 * 0.3 = 3.0.
    np.testing.assert_allclose(state3.agents.xy[0], [3.0, -2.0], atol=1e-4)


def test_goal_stop_terminates_rewards_and_freezes():
    # Agent 0 at x=0, 10 m/s, goal at x=5: distance 5 -> 4 -> 3 -> 2 (reached, radius 2)
    # on step 3. Reward per step = 0.1 * progress(1 m) = 0.1, plus 1.0 at the goal.
    # Agent 1 is far away and keeps the episode going.
    scene = straight_road(
        SC, [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR)], goals=[(5.0, -2.0), (-90.0, 2.0)]
    )
    _, out = run(env_fns(), scene, 5)
    rewards = np.array([ts.reward[0] for _, ts in out[1:]])
    np.testing.assert_allclose(rewards, [0.1, 0.1, 1.1, 0.0, 0.0], atol=1e-5)
    term = [bool(ts.terminated[0]) for _, ts in out[1:]]
    assert term == [False, False, True, False, False]
    state = out[-1][0]
    assert bool(state.done[0]) and not bool(state.active[0])
    np.testing.assert_allclose(state.agents.xy[0], [3.0, -2.0], atol=1e-4)  # frozen
    np.testing.assert_allclose(state.agents.vel[0], [0.0, 0.0])


def test_goal_remove_terminates_and_leaves_the_scene():
    # As test_goal_stop_...: agent 0 reaches its goal on step 3 (reward 1.1), then is
    # parked at REMOVED_XY, invalid, and never rewarded again.
    scene = straight_road(
        SC, [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR)], goals=[(5.0, -2.0), (-90.0, 2.0)]
    )
    _, out = run(env_fns(goal_behavior="remove"), scene, 5)
    rewards = np.array([ts.reward[0] for _, ts in out[1:]])
    np.testing.assert_allclose(rewards, [0.1, 0.1, 1.1, 0.0, 0.0], atol=1e-5)
    assert [bool(ts.terminated[0]) for _, ts in out[1:]] == [False, False, True, False, False]
    state = out[-1][0]
    assert bool(state.done[0]) and bool(state.removed[0]) and not bool(state.active[0])
    np.testing.assert_allclose(state.agents.xy[0], [REMOVED_XY, REMOVED_XY])
    assert not bool(state.agents.valid[0])
    assert bool(state.active[1]) and not bool(state.removed[1])


def test_respawn_returns_to_start():
    scene = straight_road(
        SC, [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR)], goals=[(5.0, -2.0), (-90.0, 2.0)]
    )
    _, out = run(env_fns(goal_behavior="respawn"), scene, 3)
    state, ts = out[3]
    assert bool(ts.info.metrics.goal_reached[0]) and not bool(ts.terminated[0])
    np.testing.assert_allclose(state.agents.xy[0], [0.0, -2.0], atol=1e-5)
    np.testing.assert_allclose(state.agents.vel[0], [10.0, 0.0], atol=1e-4)
    assert bool(state.active[0])


def test_new_goal_is_on_a_lane_within_range():
    scene = straight_road(
        SC, [(0, -2, 0, 10, *CAR), (-60, 2, 0, 0, *CAR)], goals=[(5.0, -2.0), (-90.0, 2.0)]
    )
    _, out = run(env_fns(goal_behavior="new_goal"), scene, 3)
    state = out[3][0]
    goal = np.asarray(state.goal[0])
    assert not np.allclose(goal, [5.0, -2.0])
    assert abs(abs(goal[1]) - 2.0) < 1e-5  # lane centres are at y = +-2
    d = np.linalg.norm(goal - np.asarray(state.agents.xy[0]))
    assert 10.0 - 1e-3 <= d <= 60.0 + 1e-3


def test_collision_remove_and_stop():
    # Agents 0 and 1 overlap from the start (centres 3 m apart, 4 m long); agent 2 is
    # far away, so the episode goes on after both are out.
    agents = [(0, -2, 0, 0, *CAR), (3, -2, 0, 0, *CAR), (-60, 2, 0, 0, *CAR)]
    scene = straight_road(SC, agents, goals=[(50, -2), (50, -2), (-90, 2)])
    _, out = run(env_fns(collision_behavior="remove"), scene, 2)
    state, ts = out[1]
    np.testing.assert_array_equal(ts.info.metrics.collided, [True, True, False, False])
    np.testing.assert_array_equal(ts.terminated, [True, True, False, False])
    np.testing.assert_allclose(ts.reward[:2], [-0.5, -0.5])
    np.testing.assert_array_equal(state.removed, [True, True, False, False])
    np.testing.assert_allclose(state.agents.xy[:2], REMOVED_XY)
    # Removed agents are invisible to the remaining agent.
    assert not bool(jnp.any(out[2][1].obs.partner_mask[2]))
    assert not bool(jnp.any(out[2][1].info.metrics.collided))

    _, out = run(env_fns(collision_behavior="stop"), scene, 2)
    state, ts = out[1]
    np.testing.assert_array_equal(ts.terminated, [True, True, False, False])
    np.testing.assert_array_equal(state.removed, [False, False, False, False])
    np.testing.assert_allclose(state.agents.xy[:2], [[0, -2], [3, -2]], atol=1e-6)

    _, out = run(env_fns(collision_behavior="ignore"), scene, 2)
    assert not bool(jnp.any(out[1][1].terminated))
    assert bool(out[2][1].info.metrics.collided[0])


def test_offroad_flag_hand_computed():
    # Width 2 at y = 3.5: the left corners are at y = 4.5 > 4 (the road edge) -> off-road.
    # At y = 2.9 the corners reach 3.9 < 4 -> on-road.
    scene = straight_road(
        SC, [(0, 3.5, 0, 0, *CAR), (-40, 2.9, 0, 0, *CAR)], goals=[(50, 2), (50, 2)]
    )
    _, out = run(env_fns(), scene, 1)
    ts = out[1][1]
    np.testing.assert_array_equal(ts.info.metrics.offroad, [True, False, False, False])
    np.testing.assert_allclose(ts.reward[:2], [-0.25, 0.0], atol=1e-6)


def test_truncation_and_auto_reset():
    scene_a = straight_road(
        SC, [(0, -2, 0, 5, *CAR), (-60, 2, 0, 0, *CAR)], goals=[(50, -2), (-90, 2)]
    )
    scene_b = straight_road(SC, [(10, 2, np.pi, 5, *CAR)])
    fns = env_fns(episode_length=4)
    env, reset_to, step = fns
    params = env.make_params(pool_of(scene_a, scene_b, env=env))
    state, _ = reset_to(params, jnp.int32(0), jax.random.key(0))
    act = jnp.full((A,), zero_action(env), jnp.int32)
    for i in range(4):
        state, ts = step(params, state, act)
        assert bool(ts.info.episode_done) == (i == 3)
    np.testing.assert_array_equal(ts.truncated, [True, True, False, False])
    assert not bool(jnp.any(ts.terminated))
    np.testing.assert_array_equal(ts.info.episode.length[:2], [4, 4])
    assert int(state.step) == 0
    # The new episode starts at its scenario's initial state.
    log0 = params.pool.scenarios.objects.xy[state.scenario_id, :, 0]
    np.testing.assert_allclose(state.agents.xy, jnp.where(state.agents.valid[:, None], log0,
                                                          state.agents.xy))


def _plain(tree):
    """Key arrays -> their raw data, so chex can compare whole states."""
    is_key = lambda x: jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
    return jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)


def test_batched_equals_single_and_traces_once():
    scene_a = straight_road(SC, [(0, -2, 0, 5, *CAR), (3, -2, 0, 0, *CAR)])
    scene_b = straight_road(SC, [(10, 2, np.pi, 5, *CAR), (40, 2, np.pi, 7, *CAR)])
    env = make_env()
    params = env.make_params(pool_of(scene_a, scene_b, env=env))
    reset = jax.jit(chex.assert_max_traces(env.reset_batch, n=1), static_argnums=2)
    step = jax.jit(chex.assert_max_traces(env.step_batch, n=1))
    single = jax.jit(env.step)
    states, _ = reset(params, jax.random.key(1), 3)
    for i in range(3):
        actions = jax.random.randint(jax.random.key(i), (3, A), 0, env.num_actions)
        new_states, ts = step(params, states, actions)
        for b in range(3):
            s_b, ts_b = single(params, jax.tree.map(lambda x, b=b: x[b], states), actions[b])
            chex.assert_trees_all_close(
                _plain(s_b), _plain(jax.tree.map(lambda x, b=b: x[b], new_states)), atol=1e-6
            )
            chex.assert_trees_all_close(ts_b, jax.tree.map(lambda x, b=b: x[b], ts), atol=1e-6)
        states = new_states
    reset(params, jax.random.key(2), 3)


def test_continuous_delta_local_actions():
    env, reset_to, step = env_fns(
        dynamics={"model": "delta_local", "action_space": "continuous"}
    )
    scene = straight_road(SC, [(0, -2, 0, 0, *CAR)], goals=[(50, -2)])
    params = env.make_params(pool_of(scene, env=env))
    state, _ = reset_to(params, jnp.int32(0), jax.random.key(0))
    # dx = 1 m forward, dy = 0.5 m left: (0, -2) -> (1, -1.5).
    act = jnp.zeros((A, 3), jnp.float32).at[0].set(jnp.array([1.0, 0.5, 0.0]))
    state, _ = step(params, state, act)
    np.testing.assert_allclose(state.agents.xy[0], [1.0, -1.5], atol=1e-5)
    with pytest.raises(ValueError, match="action"):
        step(params, state, jnp.zeros((A,), jnp.float32))


def test_bad_config_and_pool_errors():
    with pytest.raises(ConfigError, match="collision_behaviour"):
        EnvConfig.from_dict({"collision_behaviour": "stop"})
    with pytest.raises(ConfigError, match="goal_behavior"):
        EnvConfig.from_dict({"goal_behavior": "vanish"})
    with pytest.raises(ConfigError, match="episode_length"):
        EnvConfig.from_dict({"episode_length": 500})
    with pytest.raises(ConfigError, match="num_road"):
        EnvConfig.from_dict({"observation": {"num_road": 300}})
    with pytest.raises(ConfigError, match="observation.num_partner"):
        EnvConfig.from_dict({"observation": {"num_partner": 3}})
    env = make_env()
    other = ScenarioConfig(max_agents=8, num_steps=31, max_road_points=1024)
    with pytest.raises(ConfigError, match="objects.xy"):
        env.make_params(pool_of(straight_road(other, [(0, -2, 0, 0, *CAR)]), env=env))

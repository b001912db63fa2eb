"""Traffic lights in observations and policies: hand-computed light rows on a hand-built
scene, the env's log clock (trials rewind the lights), policies reading light tokens, and
old run configs loading without light tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from policy_inputs import random_params
from scenes import CAR, straight_road

from jaxdrive.env import Env, EnvConfig
from jaxdrive.env.observation import ObservationConfig, observe
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import read_run_config, without_lights_if_absent
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.signals import LightColor
from jaxdrive.types import (
    LIGHT_FEATURES,
    AgentState,
    LightFeature,
    Observation,
    PartnerFeature,
    RoadFeature,
    TrafficLightState,
    tree_stack,
)

A = 4
SC = ScenarioConfig(max_agents=A, num_steps=31, max_road_points=1024, max_traffic_lights=4)
RADIUS = 30.0
# Agent 0 at (0, -2) heading +x; agent 1 at (10, 5) heading +y; agent 2 at (-30, 2)
# heading -x; slot 3 empty.
AGENTS = [(0.0, -2.0, 0.0, 0.0, *CAR), (10.0, 5.0, np.pi / 2, 0.0, *CAR),
          (-30.0, 2.0, np.pi, 0.0, *CAR)]
# Light 0 controls lane 2 (y = -2, runs +x), stop point (20, -2): red up to log step 10,
# green from 11. Light 1 controls lane 3 (y = +2, runs -x), stop point (-10, 2), yellow.
# Light 2 has no lane (direction 0), stop point (5, 30), green arrow. Light 3 is never
# valid, though nearest to agent 0.
STOP_XY = [(20.0, -2.0), (-10.0, 2.0), (5.0, 30.0), (1.0, -2.0)]
LANE = [2, 3, -1, 2]


def light_scene():
    scene = straight_road(SC, AGENTS, goals=[(60.0, -2.0)] * 3 + [(0.0, 0.0)])
    tl = scene.traffic_lights
    t = np.arange(SC.num_steps)
    tl.lane_id[:] = LANE
    tl.stop_xy[:] = STOP_XY
    tl.state[0] = np.where(t <= 10, TrafficLightState.STOP, TrafficLightState.GO)
    tl.state[1] = TrafficLightState.CAUTION
    tl.state[2] = TrafficLightState.ARROW_GO
    tl.state[3] = TrafficLightState.STOP
    tl.valid[:3] = True
    tl.valid[3] = False
    return scene


@pytest.fixture(scope="module")
def scene_pool():
    scene = light_scene()
    pool = make_pool(jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[None]), scene),
                     EnvConfig.from_dict(ENV).road_index)  # stacked on the host
    return scene, pool


def _obs_config(k):
    return ObservationConfig(num_partners=2, num_road=16, num_lights=k, light_radius=RADIUS)


@pytest.fixture(scope="module")
def observed(scene_pool):
    """(log_step, num_lights) -> lights (A, F, K_l) at log steps 10 and 11 (one compile;
    K_l = 0 only traced)."""
    scene, pool = scene_pool
    obj = scene.objects
    agents = AgentState(
        xy=jnp.asarray(obj.xy[:, 0]), yaw=jnp.asarray(obj.yaw[:, 0]),
        vel=jnp.asarray(obj.vel[:, 0]), steer=jnp.zeros(A), accel=jnp.zeros(A),
        valid=jnp.asarray(obj.valid[:, 0]))

    def lights(k, t):
        return observe(_obs_config(k), pool, jnp.int32(0), agents, agents.valid,
                       jnp.asarray(obj.length), jnp.asarray(obj.width),
                       jnp.asarray(obj.type), jnp.asarray(obj.goal), t).lights

    steps = jnp.asarray([10, 11], jnp.int32)
    got = jax.jit(lambda ts: {k: jax.vmap(lambda t, k=k: lights(k, t))(ts)
                              for k in (2, 6)})(steps)
    out = {(t, k): np.asarray(got[k][i]) for i, t in enumerate((10, 11)) for k in (2, 6)}
    out[10, 0] = jax.eval_shape(lambda: lights(0, jnp.int32(10)))
    return out


def _rows(x, y, dx, dy, colour):
    return {LightFeature.X: x / RADIUS, LightFeature.Y: y / RADIUS, LightFeature.DIR_X: dx,
            LightFeature.DIR_Y: dy, LightFeature.VALID: 1.0, LightFeature.TYPE: colour}


def _check(col, want):
    assert set(want) == set(LightFeature)
    for f, v in want.items():
        np.testing.assert_allclose(col[f], v, atol=1e-6, err_msg=f.name)


def test_light_rows_hand_computed_nearest_first(observed):
    lights = observed[10, 6]
    assert lights.shape == (A, LIGHT_FEATURES, 6)
    # Agent 0 at (0, -2), heading +x: light 1 at (-10, 4) (10.8 m, yellow, its lane runs
    # -x), then light 0 at (20, 0) (20 m, red at step 10, lane +x). Light 2 at (5, 32) is
    # 32.4 m > 30 m away; light 3 is invalid.
    _check(lights[0, :, 0], _rows(-10.0, 4.0, -1.0, 0.0, LightColor.YELLOW))
    _check(lights[0, :, 1], _rows(20.0, 0.0, 1.0, 0.0, LightColor.RED))
    assert np.all(lights[0, :, 2:] == 0)
    # Agent 1 at (10, 5), heading +y: local (x, y) = (dy, -dx). Light 0: (-7, -10), 12.2
    # m, lane +x -> (0, -1); light 1: (-3, 20), 20.2 m, lane -x -> (0, 1); light 2:
    # (25, 5), 25.5 m, no lane -> direction 0, green arrow.
    _check(lights[1, :, 0], _rows(-7.0, -10.0, 0.0, -1.0, LightColor.RED))
    _check(lights[1, :, 1], _rows(-3.0, 20.0, 0.0, 1.0, LightColor.YELLOW))
    _check(lights[1, :, 2], _rows(25.0, 5.0, 0.0, 0.0, LightColor.GREEN))
    assert np.all(lights[1, :, 3:] == 0)
    # Agent 2 at (-30, 2), heading -x: light 1 is 20 m behind it on its own lane (lane
    # direction -x = its forward); light 0 is 50.2 m away, light 2 44.8 m.
    _check(lights[2, :, 0], _rows(-20.0, 0.0, 1.0, 0.0, LightColor.YELLOW))
    assert np.all(lights[2, :, 1:] == 0)


def test_nearest_k_keeps_the_nearest_and_no_slots_when_zero(observed):
    two, six = observed[10, 2], observed[10, 6]
    assert two.shape == (A, LIGHT_FEATURES, 2)
    # Agent 1 sees three lights; K = 2 keeps the two nearest (lights 0 and 1).
    np.testing.assert_array_equal(two, six[:, :, :2])
    assert observed[10, 0].shape == (A, LIGHT_FEATURES, 0)  # traced only


def test_light_colour_follows_the_log_step(observed):
    before, after = observed[10, 6], observed[11, 6]
    # Light 0 (the only red one) turns green at step 11; nothing else changes.
    assert before[0, LightFeature.TYPE, 1] == LightColor.RED
    assert after[0, LightFeature.TYPE, 1] == LightColor.GREEN
    assert after[1, LightFeature.TYPE, 0] == LightColor.GREEN
    want = before.copy()
    colour = want[:, LightFeature.TYPE]
    colour[colour == LightColor.RED] = LightColor.GREEN
    np.testing.assert_array_equal(after, want)


# ---------------------------------------------------------------------- env
ENV = {
    "scenario": SC.to_dict(),
    "observation": {"num_partners": 2, "num_road": 16, "num_lights": 2,
                    "light_radius": RADIUS},
    "road_index": {"road_per_cell": 32, "chunk_size": 8, "grid_size": 8},
    "init_step": 8, "goal_radius": 2.0, "goal_behavior": "trial", "num_trials": 2,
    "trial_timeout": 5,
}
STEPS = 8


def test_env_lights_follow_the_clock_and_rewind_with_the_trial(scene_pool):
    _, pool = scene_pool
    env = Env(EnvConfig.from_dict(ENV))
    params = env.make_params(pool)
    grid = np.asarray(env.dynamics.action_grid())
    stay = int(np.flatnonzero(np.all(grid == 0, axis=1))[0])  # keep speed (0)

    @jax.jit
    def rollout(key):
        state, ts = env.reset(params, key)

        def body(state, _):
            state, ts = env.step(params, state, jnp.full((A,), stay, jnp.int32))
            return state, (ts.obs.lights, state.trial_step, state.trial)

        _, seq = jax.lax.scan(body, state, None, length=STEPS)
        return ts.obs.lights, seq

    first, (lights, trial_step, trial) = jax.device_get(rollout(jax.random.key(0)))
    assert first.shape == (A, LIGHT_FEATURES, 2) and lights.shape[1:] == first.shape
    # Agent 0 (parked at (0, -2)) sees light 1 then light 0, red while the log step
    # init_step + trial_step is at most 10, green after.
    log = ENV["init_step"] + trial_step
    np.testing.assert_array_equal(
        lights[:, 0, LightFeature.TYPE, 1],
        np.where(log <= 10, LightColor.RED, LightColor.GREEN))
    assert (log > 10).any() and (log <= 10).any()
    # The trial ends after 5 steps: the second trial starts with trial 0's observation.
    restart = np.flatnonzero((trial == 1) & (trial_step == 0))
    assert restart.size == 1 and lights[restart[0] - 1, 0, LightFeature.TYPE, 1] == (
        LightColor.GREEN)
    np.testing.assert_array_equal(lights[restart[0]], first)


# ---------------------------------------------------------------------- policies
N, K_L = 6, 3
# One head each: fewer unrolled per-head ops to compile.
CONFIGS = {"transformer": PolicyConfig(kind="transformer", model_dim=16, token_dim=8,
                                       horizon=4, road_group=4, scene_heads=1, heads=1),
           "mlp": PolicyConfig(kind="mlp", model_dim=16, token_dim=8, road_group=4)}


def _policy_obs(num_lights):
    """Random features (NumPy, nothing to compile): agent rows 0-2 see light 0 only (red);
    rows 3-5 have light 0 masked (its garbage features kept) and lights 1-2 valid."""
    rng = np.random.default_rng(0)
    p = rng.normal(size=(N, 10, 5)).astype(np.float32)
    p[:, PartnerFeature.VALID] = rng.random((N, 5)) < 0.6
    p[:, PartnerFeature.TYPE] = rng.integers(0, 5, (N, 5))
    r = rng.normal(size=(N, 6, 8)).astype(np.float32)
    r[:, RoadFeature.VALID] = rng.random((N, 8)) < 0.7
    r[:, RoadFeature.TYPE] = rng.integers(0, 8, (N, 8))
    ego = rng.normal(size=(N, 8)).astype(np.float32)
    rng = np.random.default_rng(1)  # lights last, from their own stream
    g = rng.normal(size=(N, LIGHT_FEATURES, num_lights)).astype(np.float32)
    if num_lights:
        g[:, LightFeature.VALID] = 1.0
        g[:, LightFeature.VALID, 0] = [1, 1, 1, 0, 0, 0]
        g[:3, LightFeature.VALID, 1:] = 0.0
        g[:, LightFeature.TYPE] = rng.integers(0, 4, (N, num_lights))
        g[:, LightFeature.TYPE, 0] = LightColor.RED
    return Observation(ego=jnp.asarray(ego), partners=jnp.asarray(p), road=jnp.asarray(r),
                       lights=jnp.asarray(g))


def _names(params) -> str:
    return " ".join(jax.tree_util.keystr(p) for p, _ in
                    jax.tree_util.tree_leaves_with_path(params))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def policy_case(request):
    """Parameter names and step outputs for: the observation, the same with light 0
    turned green and moved (a masked light's features change in rows 3-5), and, with
    parameters made without lights, the observation and the same without light slots
    (one compile; the parameters, initialiser-like, are drawn on the host from the
    module's own parameter shapes, so no initialiser is compiled)."""
    policy = Policy(CONFIGS[request.param], num_actions=5)
    obs, unlit = _policy_obs(K_L), _policy_obs(0)
    lights = np.array(obs.lights)  # edited on the host: nothing to compile
    lights[:, LightFeature.TYPE, 0] = float(LightColor.GREEN)
    lights[:, LightFeature.X, 0] += 0.5
    moved = obs.replace(lights=jnp.asarray(lights))
    first, removed = np.ones(N, bool), np.zeros(N, bool)

    params = random_params(policy, obs, jax.random.key(0), scale=0.0)
    old = random_params(policy, unlit, jax.random.key(0), scale=0.0)

    @jax.jit
    def outputs(params, old, obs, moved, unlit):
        step = lambda p, o: policy.step(p, policy.init_cache(N), o, first, removed)[0]
        # One variant at a time (lax.map, not vmap): each sees the same row positions in
        # the GEMMs, so unchanged rows give bit-identical results.
        return (jax.lax.map(lambda o: step(params, o), tree_stack([obs, moved])),
                step(old, obs), step(old, unlit))

    return _names(params), jax.device_get(outputs(params, old, obs, moved, unlit))


def test_policy_runs_with_light_tokens(policy_case):
    names, (out, _, _) = policy_case
    assert out.dist.shape == (2, N, 5) and out.value.shape == (2, N)
    assert np.all(np.isfinite(out.dist)) and np.all(np.isfinite(out.value))
    assert "light_embed" in names


def test_policy_reads_valid_lights_and_ignores_masked_ones(policy_case):
    _, (out, _, _) = policy_case
    # Light 0 turned green and moved: the agents that see it (rows 0-2) act differently
    # and value the state differently; those for which it is masked (rows 3-5) do not.
    assert np.all(np.abs(out.value[1, :3] - out.value[0, :3]) > 1e-6)
    assert np.all(np.abs(out.dist[1, :3] - out.dist[0, :3]).max(-1) > 0)
    np.testing.assert_array_equal(out.dist[1, 3:], out.dist[0, 3:])
    np.testing.assert_array_equal(out.value[1, 3:], out.value[0, 3:])


def test_parameters_without_lights_ignore_light_slots(policy_case):
    # A policy made before lights (e.g. a frozen co-player) acts on an observation with
    # light slots exactly as on the same observation without them.
    _, (_, old, unlit) = policy_case
    np.testing.assert_array_equal(old.dist, unlit.dist)
    np.testing.assert_array_equal(old.value, unlit.value)


def test_no_light_slots_no_light_parameters():
    obs = _policy_obs(0)
    assert obs.lights.shape == (N, LIGHT_FEATURES, 0)
    for config in CONFIGS.values():
        module = Policy(config, num_actions=5).module
        params = jax.eval_shape(module.init, jax.random.key(0), obs)
        assert "light" not in _names(params) and "road_embed" in _names(params)


# ---------------------------------------------------------------------- old run configs
def test_run_config_without_num_lights_loads_without_light_tokens(tmp_path):
    data = RunConfig().to_dict()
    assert data["env"]["observation"]["num_lights"] == 4  # the default for new configs
    del data["env"]["observation"]["num_lights"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    assert read_run_config(tmp_path).env.observation.num_lights == 0
    # A saved key (nested or dotted) is kept, and --set overrides still apply.
    assert read_run_config(tmp_path, {"env": {"observation": {"num_lights": 3}}}
                           ).env.observation.num_lights == 3
    data["env"]["observation"]["num_lights"] = 4
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    assert read_run_config(tmp_path).env.observation.num_lights == 4
    dotted = {"env": {"observation.num_lights": 2}}
    assert without_lights_if_absent(dotted) is dotted
    assert without_lights_if_absent({"train": {}}) == {
        "train": {}, "env": {"observation": {"num_lights": 0}}}

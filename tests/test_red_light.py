"""The red-light violation metric (``ran_red_light``), its reward term and trial rewind.

One controlled car drives 10 m/s (1 m per step) along the +x lane (id 2, y = -2) of the
straight road from x = -3.5, so its centre crosses the stop line of a light placed at
(0, -2) on step 4 (x: -0.5 -> 0.5), i.e. into the state of log step 4 (init_step 0).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_AGENTS, SMALL_ENV, SMALL_SCENARIO, straight_road

from jaxdrive.env import Env, EnvConfig
from jaxdrive.metrics import registry
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.signals import STOP_LINE_HALF_WIDTH
from jaxdrive.types import EntityKind, TrafficLightState, tree_stack

A = SMALL_AGENTS
SC = SMALL_SCENARIO
T = SC.num_steps
CROSS = 4  # the step (= log step) on which the car's centre passes x = 0
STEPS = 8  # episode length (and trial timeout)
W = -2.0  # red-light reward weight
RED, YELLOW, GREEN = TrafficLightState.STOP, TrafficLightState.CAUTION, TrafficLightState.GO
_FNS = {}


def env_fns(**overrides):
    """(env, jitted reset_to, jitted step), compiled once per config in this module."""
    key = repr(sorted(overrides.items()))
    if key not in _FNS:
        cfg = {**SMALL_ENV, "reward": {**SMALL_ENV["reward"], "red_light": W}, **overrides}
        env = Env(EnvConfig.from_dict(cfg))
        _FNS[key] = (env, jax.jit(env.reset_to), jax.jit(env.step))
    return _FNS[key]


PLAIN = {"episode_length": STEPS}
TRIALS = {"goal_behavior": "trial", "num_trials": 2, "trial_timeout": STEPS}


def scene(states=None, y=-2.0, x=-3.5, yaw=0.0):
    """The car at (x, y) heading ``yaw`` at 10 m/s; a light on lane 2 with stop point
    (0, -2) and ``states`` (T,) per log step (no light when None)."""
    s = straight_road(SC, [(x, y, yaw, 10.0, *CAR)], goals=[(90.0, y)])
    if states is not None:
        tl = s.traffic_lights
        tl.lane_id[0] = 2
        tl.stop_xy[0] = (0.0, -2.0)
        tl.state[0] = np.asarray(states, np.int32)
        tl.valid[0] = True
    return s


def constant(state):
    return np.full((T,), int(state), np.int32)


def run(fns, s, steps=STEPS, weight=W):
    """Reset on scene ``s`` (red-light weight ``weight``) and take ``steps`` zero-action
    steps; returns (per-step ran_red_light of agent 0 (steps,), rewards of agent 0
    (steps,), [timestep, ...], initial state)."""
    env, reset_to, step = fns
    pool = make_pool(tree_stack([jax.tree.map(jnp.asarray, s)]), env.config.road_index)
    params = env.make_params(pool)
    params = params.replace(reward=params.reward.replace(red_light=jnp.float32(weight)))
    state, ts = reset_to(params, jnp.int32(0), jax.random.key(0))
    assert not bool(ts.info.metrics.ran_red_light.any())
    grid = np.asarray(env.dynamics.action_grid())
    act = jnp.full((A,), int(np.flatnonzero(np.all(grid == 0, axis=1))[0]), jnp.int32)
    init, out = state, []
    for _ in range(steps):
        state, ts = step(params, state, act)
        out.append(ts)
    ran = np.array([np.asarray(ts.info.metrics.ran_red_light[0]) for ts in out])
    r = np.array([np.asarray(ts.reward[0]) for ts in out])
    return ran, r, out, init


def onehot(*steps, n=STEPS):
    """(n,) bool, True on the given 1-based step numbers."""
    x = np.zeros((n,), bool)
    x[np.asarray(steps, int) - 1] = True
    return x


@pytest.fixture(scope="module")
def green_run():
    return run(env_fns(**PLAIN), scene(constant(GREEN)))


def test_metric_is_registered_last_with_its_names():
    m = registry.metrics()[-1]
    assert (m.name, m.reduce, m.rate, m.count) == ("ran_red_light", "any", "red_light_rate",
                                                    "red_lights")
    assert "red_light_rate" in registry.report_names()
    assert "ran_red_light" in [m.name for m in env_fns(**PLAIN)[0].metrics]


def test_red_crossing_counts_once_with_its_reward(green_run):
    ran, r, out, init = run(env_fns(**PLAIN), scene(constant(RED)))
    assert init.kind[0] == EntityKind.CONTROLLED
    np.testing.assert_array_equal(ran, onehot(CROSS))
    # Same trajectory as under green: the reward differs by the weight on that step only.
    _, r_green, _, _ = green_run
    np.testing.assert_allclose(r - r_green, W * onehot(CROSS), atol=1e-6)
    end = out[-1].info
    assert bool(end.episode_done) and bool(end.episode.ran_red_light[0])
    np.testing.assert_allclose(end.episode.return_[0], r_green.sum() + W, atol=1e-5)


def test_light_state_is_read_at_the_state_reached():
    # Red only at log step CROSS (the state the crossing step reaches): a violation.
    states = constant(GREEN)
    states[CROSS] = RED
    ran, _, _, _ = run(env_fns(**PLAIN), scene(states))
    np.testing.assert_array_equal(ran, onehot(CROSS))
    # Red only at the step before: the light is green once the car is past the line.
    states = constant(GREEN)
    states[CROSS - 1] = RED
    ran, _, _, _ = run(env_fns(**PLAIN), scene(states))
    assert not ran.any()


@pytest.mark.parametrize("case", ["green", "yellow", "opposite", "outside_band"])
def test_no_violation(case, green_run):
    if case == "green":
        ran, r, out, _ = green_run
    elif case == "yellow":
        ran, r, out, _ = run(env_fns(**PLAIN), scene(constant(YELLOW)))
    elif case == "opposite":
        # Driving -x from x = 3.5 across the line against the lane's direction.
        ran, r, out, _ = run(env_fns(**PLAIN), scene(constant(RED), x=3.5, yaw=np.pi))
    else:
        # Half a metre beyond the band's edge, to the left of the lane.
        ran, r, out, _ = run(env_fns(**PLAIN),
                             scene(constant(RED), y=-2.0 + STOP_LINE_HALF_WIDTH + 0.5))
    assert not ran.any()
    assert not bool(out[-1].info.episode.ran_red_light[0])
    # The same car just inside the band does cross (the band, not the lane, decides).
    if case == "outside_band":
        ran, _, _, _ = run(env_fns(**PLAIN),
                           scene(constant(RED), y=-2.0 + STOP_LINE_HALF_WIDTH - 0.5))
        np.testing.assert_array_equal(ran, onehot(CROSS))


def test_zero_weight_reward_equals_a_run_without_lights():
    _, r_red, out_red, _ = run(env_fns(**PLAIN), scene(constant(RED)), weight=0.0)
    ran, r_none, _, _ = run(env_fns(**PLAIN), scene(None), weight=0.0)
    assert not ran.any()
    assert bool(out_red[-1].info.episode.ran_red_light[0])
    np.testing.assert_array_equal(r_red, r_none)


def test_trials_rewind_the_lights():
    # Red for log steps < 6, green after. The car crosses on trial step 4 of each trial:
    # log step 4 both times (the lights rewind); a global clock would read step 12: green.
    k = 6
    states = constant(GREEN)
    states[:k] = RED
    ran, r, out, _ = run(env_fns(**TRIALS), scene(states), steps=2 * STEPS)
    _, r_green, _, _ = run(env_fns(**TRIALS), scene(constant(GREEN)), steps=2 * STEPS)
    trial_ended = np.array([bool(ts.info.trial_done) for ts in out])
    np.testing.assert_array_equal(trial_ended, onehot(STEPS, 2 * STEPS, n=2 * STEPS))
    for trial in range(2):
        steps = slice(trial * STEPS, (trial + 1) * STEPS)
        np.testing.assert_array_equal(ran[steps], onehot(CROSS), err_msg=f"trial {trial}")
        np.testing.assert_allclose(r[steps] - r_green[steps], W * onehot(CROSS), atol=1e-6,
                                   err_msg=f"trial {trial}")
    end = out[-1].info
    assert bool(end.episode_done) and bool(end.episode.ran_red_light[0])

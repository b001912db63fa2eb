"""Planning score: hand-built feature series with hand-computed scores, and per-step
features on hand-built straight-road scenes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_AGENTS, SMALL_ENV, SMALL_SCENARIO, straight_road

from jaxdrive.config import ConfigError
from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval.planning import (
    SCORE_KEYS,
    PlanningConfig,
    PlanningStep,
    expert_progress,
    planning_features,
    planning_score,
    scenario_mean,
)
from jaxdrive.scenarios.pool import make_pool

CFG = PlanningConfig()
T, A = 30, 2  # every hand-built series has this shape: one trace of planning_score


@chex.assert_max_traces(n=1)
def _score(steps, scored, expert):
    return planning_score(steps, scored, expert, CFG)


SCORE = jax.jit(_score)


def clean_fields():
    """A clean drive: 10 m/s, 1 m of progress per step (30 m, the expert's too)."""
    full = lambda v, dt: np.full((T, A), v, dt)
    return dict(
        present=full(True, bool), kinematic=full(True, bool), ended=full(False, bool),
        speed=full(10.0, np.float32), accel=full(0.0, np.float32),
        yaw_rate=full(0.0, np.float32), at_fault_collision=full(False, bool),
        collision_any=full(False, bool), offroad=full(False, bool),
        wrong_way_distance=full(0.0, np.float32), min_ttc=full(np.inf, np.float32),
        progress=full(1.0, np.float32),
    )


def score(fields, scored=(True, True), expert=(30.0, 30.0)):
    steps = PlanningStep(**{k: jnp.asarray(v) for k, v in fields.items()})
    out = SCORE(steps, jnp.asarray(scored, bool), jnp.asarray(expert, jnp.float32))
    return {k: np.asarray(v) for k, v in out.items()}


def test_clean_drive_scores_one():
    out = score(clean_fields())
    assert set(out) == set(SCORE_KEYS)
    for k in SCORE_KEYS:
        assert out[k].shape == (A,) and out[k].dtype == np.float32
        np.testing.assert_array_equal(out[k], [1.0, 1.0], err_msg=k)


def test_at_fault_collision_zeroes_total_and_other_contacts_do_not():
    f = clean_fields()
    f["at_fault_collision"][5, 0] = True
    f["collision_any"][5, 0] = True
    f["collision_any"][5:9, 1] = True  # hit, but not at fault
    out = score(f)
    np.testing.assert_array_equal(out["no_at_fault_collision"], [0.0, 1.0])
    np.testing.assert_array_equal(out["total"], [0.0, 1.0])


def test_offroad_step_zeroes_total():
    f = clean_fields()
    f["offroad"][29, 1] = True
    out = score(f)
    np.testing.assert_array_equal(out["drivable_area"], [1.0, 0.0])
    np.testing.assert_array_equal(out["total"], [1.0, 0.0])


def test_driving_direction_over_one_second_windows():
    f = clean_fields()
    f["wrong_way_distance"][3:13, 0] = 0.3  # 3 m within 10 steps (1 s): > 2 m -> 0.5
    f["wrong_way_distance"][3:13, 1] = 0.7  # 7 m within 1 s: > 6 m -> 0
    out = score(f)
    np.testing.assert_allclose(out["driving_direction"], [0.5, 0.0])
    np.testing.assert_allclose(out["total"], [0.5, 0.0])

    f = clean_fields()
    f["wrong_way_distance"][:, 0] = 0.15  # 4.5 m in all, at most 1.5 m per window -> 1
    f["wrong_way_distance"][:20, 1] = 0.3  # 6 m over 2 s, at most 3 m per window -> 0.5
    out = score(f)
    np.testing.assert_allclose(out["driving_direction"], [1.0, 0.5])
    # Wrong-way metres on steps without own kinematics (e.g. a reset) do not count.
    f["kinematic"][:20, 1] = False
    np.testing.assert_allclose(score(f)["driving_direction"], [1.0, 1.0])


def test_ttc_below_threshold_drops_five_twelfths():
    f = clean_fields()
    f["min_ttc"][7, 0] = 0.9  # below 0.95 s while moving
    f["min_ttc"][7, 1] = 0.9
    f["kinematic"][7, 1] = False  # ... but agent 1's step 7 is not its own motion
    f["min_ttc"][12, 1] = 1.0  # above the threshold
    out = score(f)
    np.testing.assert_array_equal(out["ttc"], [0.0, 1.0])
    # total = (5 * 0 + 5 * 1 + 2 * 1) / 12
    np.testing.assert_allclose(out["total"], [7.0 / 12.0, 1.0], rtol=1e-6)


def test_progress_ratio_and_its_floors():
    f = clean_fields()
    f["progress"][:, 0] = 0.5  # 15 m of the expert's 30: ratio 0.5
    f["progress"][:, 1] = 0.1  # 3 m of 30: ratio 0.1 < 0.2 -> 0
    out = score(f)
    np.testing.assert_allclose(out["progress"], [0.5, 0.0], rtol=1e-6)
    # (5 + 5 * 0.5 + 2) / 12 = 1 - 2.5 / 12 ; (5 + 0 + 2) / 12
    np.testing.assert_allclose(out["total"], [9.5 / 12.0, 7.0 / 12.0], rtol=1e-6)

    f = clean_fields()
    f["progress"][:, 0] = 0.0  # the expert moved 4 m < 5 m: progress counts as 1
    f["progress"][:, 1] = 2.0  # 60 m of 30: clipped to 1
    out = score(f, expert=(4.0, 30.0))
    np.testing.assert_allclose(out["progress"], [1.0, 1.0])
    np.testing.assert_allclose(out["total"], [1.0, 1.0])


def test_comfort_bounds_accel_and_jerk():
    f = clean_fields()
    f["accel"][:, 0] = 4.5  # constant (no jerk) but above 4 m/s^2
    f["accel"][1::2, 1] = 1.0  # within 4 m/s^2 but jerk (1 - 0) / 0.1 = 10 m/s^3
    out = score(f)
    np.testing.assert_array_equal(out["comfort"], [0.0, 0.0])
    # (5 + 5 + 0) / 12
    np.testing.assert_allclose(out["total"], [10.0 / 12.0, 10.0 / 12.0], rtol=1e-6)

    f = clean_fields()
    f["accel"][:, 0] = 3.9
    f["accel"][15:, 1] = 1.0  # one 10 m/s^3 jerk between steps 14 and 15
    np.testing.assert_array_equal(score(f)["comfort"], [1.0, 0.0])
    f["kinematic"][15, 1] = False  # jerk needs two consecutive steps of own motion
    np.testing.assert_array_equal(score(f)["comfort"], [1.0, 1.0])


def test_unscored_absent_agents_and_steps_after_the_episode_do_not_count():
    f = clean_fields()
    f["at_fault_collision"][3, 1] = True
    out = score(f, scored=(True, False))
    np.testing.assert_array_equal(out["counted"], [1.0, 0.0])
    np.testing.assert_array_equal(out["total"], [1.0, 0.0])
    assert float(scenario_mean(jnp.asarray(out["total"]), jnp.asarray(out["counted"] > 0))) == 1.0

    f = clean_fields()
    f["present"][:, 1] = False
    f["offroad"][:, 1] = True  # never present: ignored
    out = score(f)
    np.testing.assert_array_equal(out["counted"], [1.0, 0.0])
    np.testing.assert_array_equal(out["total"], [1.0, 0.0])

    f = clean_fields()
    f["ended"][9, :] = True  # the episode ends on step 9; the env then auto-resets
    f["at_fault_collision"][20, 0] = True  # in the next episode
    f["at_fault_collision"][9, 1] = True  # on the ending step itself
    out = score(f, expert=(10.0, 10.0))
    np.testing.assert_array_equal(out["total"], [1.0, 0.0])


def test_scenario_mean_is_nan_free():
    v = jnp.asarray([[0.5, jnp.nan, 1.0], [0.2, 0.4, jnp.inf]], jnp.float32)
    m = jnp.asarray([[True, False, True], [False, False, False]])
    np.testing.assert_allclose(scenario_mean(v, m), [0.75, 0.0])


def test_config_validation():
    assert PlanningConfig.from_dict({"ttc_horizon": 3.0}).ttc_steps == 30
    assert CFG.direction_window_steps == 10
    with pytest.raises(ConfigError, match="comfort_max_jerk"):
        PlanningConfig.from_dict({"comfort_max_jerk": 0.0})
    with pytest.raises(ConfigError, match="ttc_horizn"):
        PlanningConfig.from_dict({"ttc_horizn": 1.0})


# ---------------------------------------------------------------- features on scenes
N_AGENTS = SMALL_AGENTS
FAR = (90.0, -2.0)
SCENES = {
    # 0 at 10 m/s runs into 1 at 5 m/s ahead in the same (+x, y = -2) lane.
    "moving": [(0.5, -2, 0, 10, *CAR), (12.0, -2, 0, 5, *CAR)],
    # 0 at 10 m/s runs into 1 parked ahead (held static by the env).
    "parked": [(0.5, -2, 0, 10, *CAR), (20.0, -2, 0, 0, *CAR)],
    # 0 drives +x in the y = +2 lane, whose centre line runs -x; 1 replays +x at y = -2.
    "wrong_way": [(-20.0, 2, 0, 10, *CAR), (-20.0, -2, 0, 10, *CAR)],
    # 0 reaches the parked car exactly on the episode's last step (30).
    "last_step": [(-13.5, -2, 0, 10, *CAR), (20.0, -2, 0, 0, *CAR)],
}
GOALS = {"last_step": [FAR, (20.0, -2.0)]}
SCORED = jnp.asarray([True, True, False, False])


@pytest.fixture(scope="module")
def sim():
    # Enough road slots that both lane centres are observed (16 holds only edges here);
    # the planning features do not read the observation, so this is for the policy only.
    return make_sim({"num_partners": 3, "num_road": 64})


def make_sim(observation, check_traces=True):
    cfg = dict(SMALL_ENV)
    cfg.update(control_mode="sdc", observation=observation,
               road_index=dict(SMALL_ENV["road_index"], road_per_cell=64))
    env = Env(EnvConfig.from_dict(cfg))
    scenes = [straight_road(SMALL_SCENARIO, a, goals=GOALS.get(name))
              for name, a in SCENES.items()]
    stacked = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *scenes)
    pool = make_pool(stacked, env.config.road_index)
    params = env.make_params(pool)
    grid = np.asarray(env.dynamics.action_grid())
    zero = int(np.flatnonzero(np.all(grid == 0, axis=1))[0])

    def features(p, prev, state, ts, scored):
        return planning_features(env.config, p, prev, state, ts, scored, CFG)

    if check_traces:  # chex counts traces per function name: one sim per test module
        features = chex.assert_max_traces(features, n=1)

    return env, params, jnp.full((N_AGENTS,), zero, jnp.int32), jax.jit(env.reset_to), \
        jax.jit(env.step), jax.jit(features)


@jax.jit
@chex.assert_max_traces(n=1)
def scene_score(steps, expert):
    """``planning_score`` of a 20-step scene rollout (one trace for every scene)."""
    return planning_score(steps, SCORED, expert, CFG)


def roll(sim, name, n):
    """(state at reset, stacked PlanningStep (n, A)) with zero actions."""
    env, params, action, reset_to, step, features = sim
    state, _ = reset_to(params, jnp.int32(list(SCENES).index(name)), jax.random.key(0))
    start, out = state, []
    for _ in range(n):
        new_state, ts = step(params, state, action)
        out.append(features(params, state, new_state, ts, SCORED))
        state = new_state
    return start, jax.tree.map(lambda *xs: np.stack(xs), *jax.device_get(out))


def test_features_rear_end_of_a_moving_car(sim):
    _, f = roll(sim, "moving", 20)
    k = np.arange(1, 21)  # row i is the state after step k = i + 1
    # Centres 11.5 - 0.5 k apart; boxes 4 m long overlap once that is < 4: k >= 16.
    contact = k >= 16
    np.testing.assert_array_equal(f.collision_any[:, 0], contact)
    np.testing.assert_array_equal(f.collision_any[:, 1], contact)
    np.testing.assert_array_equal(f.at_fault_collision[:, 0], contact)  # ran into it
    assert not f.at_fault_collision[:, 1].any()  # hit from behind while moving
    # Projected in 0.1 s sub-steps the gap 7.5 - 0.5 k closes by 0.5 m each: first
    # contact after m = 16 - k sub-steps, seen within the 1 s horizon from k = 6.
    expect = np.where((k >= 6) & (k <= 15), (16 - k) * 0.1, np.inf)
    np.testing.assert_allclose(f.min_ttc[:, 0], expect, rtol=1e-5)
    assert np.isinf(f.min_ttc[:, 1]).all()  # the car behind is not agent 1's to avoid
    np.testing.assert_allclose(f.speed[:, :2], np.broadcast_to([10.0, 5.0], (20, 2)))
    np.testing.assert_allclose(f.accel[:, :2], 0.0, atol=1e-4)
    assert not f.present[:, 2:].any()


def test_features_parked_car_is_not_at_fault_and_scores(sim):
    env, params, *_ = sim
    start, f = roll(sim, "parked", 20)
    k = np.arange(1, 21)
    # Centres 19.5 - k apart: contact from k = 16 (while 19.5 - k > -4).
    np.testing.assert_array_equal(f.collision_any[:, 1], k >= 16)
    # Fault is judged per step from the poses: once agent 0's centre has passed agent
    # 1's (k = 20; only because ignored collisions let boxes pass through), 1 lies in
    # 0's rear sector.
    np.testing.assert_array_equal(f.at_fault_collision[:, 0], (k >= 16) & (k <= 19))
    assert not f.at_fault_collision[:, 1].any()
    assert np.isinf(f.min_ttc[:, 1]).all()  # standing still
    # The log moves agent 0 from x = 0.5 to 20.5 in 20 steps towards its goal at
    # x = 30.5; agent 1 is parked on its goal.
    # Jitted: one small program in place of a compile per eager op.
    exp = np.asarray(jax.jit(expert_progress, static_argnums=(0, 3))(env.config, params,
                                                                      start, 20))
    np.testing.assert_allclose(exp, [20.0, 0.0, 0.0, 0.0], atol=1e-4)
    out = {k_: np.asarray(v) for k_, v in scene_score(f, jnp.asarray(exp)).items()}
    np.testing.assert_array_equal(out["counted"], [1, 1, 0, 0])
    np.testing.assert_array_equal(out["no_at_fault_collision"][:2], [0.0, 1.0])
    # Agent 0 drove 20 of 20 m but TTC fell below 0.95 s (0.1 s at k = 15) and it hit.
    np.testing.assert_array_equal(out["ttc"][:2], [0.0, 1.0])
    np.testing.assert_allclose(out["progress"][:2], [1.0, 1.0], rtol=1e-5)
    np.testing.assert_allclose(out["total"][:2], [0.0, 1.0], rtol=1e-6)


def test_features_wrong_way_distance(sim):
    _, f = roll(sim, "wrong_way", 20)
    # 10 m/s for 0.1 s against the y = +2 lane's -x direction; the replayed car follows
    # its own lane.
    np.testing.assert_allclose(f.wrong_way_distance[:, 0], 1.0, rtol=1e-5)
    np.testing.assert_array_equal(f.wrong_way_distance[:, 1], 0.0)
    out = scene_score(f, jnp.asarray([20.0, 20.0, 0.0, 0.0]))
    # 10 m against the lane within 1 s > 6 m.
    np.testing.assert_array_equal(np.asarray(out["driving_direction"])[:2], [0.0, 1.0])


def test_features_on_the_episode_end_use_the_pre_reset_pose(sim):
    _, f = roll(sim, "last_step", 30)
    # x0 = -13.5 + k reaches 16.5 (0.5 m into the parked car) on step 30, the time
    # limit; the env has auto-reset the state by then.
    np.testing.assert_array_equal(f.ended[:, 0], np.arange(1, 31) == 30)
    assert not f.collision_any[:29].any()
    assert f.collision_any[29, 0] and f.at_fault_collision[29, 0]
    assert f.collision_any[29, 1] and not f.at_fault_collision[29, 1]
    assert not f.kinematic[29].any() and f.kinematic[:29, 0].all()


def test_features_reject_a_dt_mismatch(sim):
    env, params, *_ = sim
    with pytest.raises(ConfigError, match="dt"):
        planning_features(env.config, params, None, None, None, SCORED,
                          PlanningConfig(dt=0.2))


def test_features_do_not_depend_on_the_observation_config(sim):
    # Eight road slots hold only road edges here and a 2 m radius masks most of them: the
    # policy then observes no lane centre, yet the wrong-way term (and every other
    # feature) is the same, read from the scenario's road index.
    other = make_sim({"num_partners": 1, "num_road": 8, "road_radius": 2.0},
                     check_traces=False)
    for name in ("wrong_way", "moving"):
        _, want = roll(sim, name, 12)
        _, got = roll(other, name, 12)
        for field in want.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field),
                                          err_msg=f"{name}: {field}")
    _, f = roll(other, "wrong_way", 12)
    np.testing.assert_allclose(f.wrong_way_distance[:, 0], 1.0, rtol=1e-5)

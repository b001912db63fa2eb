"""WOSAC 2025 realism metrics: hand-computed features and likelihoods, and invariants."""

import dataclasses
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.metrics import wosac
from jaxdrive.scenarios import road_index
from jaxdrive.types import Roadgraph, RoadType, TrafficLights, TrafficLightState

DT = 0.1
F32 = np.float32


# --------------------------------------------------------------------------- fixtures


def _straight_road() -> Roadgraph:
    """Road edges bounding x in [-60, 60], y in [-5, 5], counter-clockwise (drivable area
    on the left), and one lane centre line (id 1) along +x at y = -2."""
    xy = np.array([(-60, -5), (60, -5), (60, 5), (-60, 5), (-60, -5),
                   (-60, -2), (0, -2), (60, -2)], F32)
    d = np.zeros((8, 2), F32)
    d[:4] = np.diff(xy[:5], axis=0) / np.linalg.norm(np.diff(xy[:5], axis=0), axis=1)[:, None]
    d[4] = d[3]
    d[5:] = (1, 0)
    return Roadgraph(
        xy=jnp.asarray(xy), dir=jnp.asarray(d),
        type=jnp.asarray([RoadType.ROAD_EDGE] * 5 + [RoadType.LANE_CENTER] * 3, jnp.int32),
        id=jnp.asarray([0] * 5 + [1] * 3, jnp.int32),
        valid=jnp.ones(8, bool),
    )


def _lights(states) -> TrafficLights:
    """Light 0 controls lane 1 with its stop point at (5, -2); light 1 is padding."""
    t = len(states)
    return TrafficLights(
        lane_id=jnp.array([1, -1], jnp.int32),
        stop_xy=jnp.array([[5.0, -2.0], [0.0, 0.0]]),
        state=jnp.array([states, [0] * t], jnp.int32),
        valid=jnp.array([[True] * t, [False] * t]),
    )


ROAD = _straight_road()
INDEX_CONFIG = road_index.RoadIndexConfig(grid_size=8, road_per_cell=16, chunk_size=4,
                                          edges_per_cell=8, edge_merge_tolerance=0.0)


@functools.cache
def road_grid():
    """ROAD's road index, built (jitted: one compile, where an eager build is ~120 small
    ones) on first use, not at import (pytest-xdist workers import every module)."""
    return jax.jit(road_index.build_road_index, static_argnames="config")(
        ROAD, config=INDEX_CONFIG)


@pytest.fixture(autouse=True, scope="module")
def _road_grid_built_outside_jit():
    road_grid()  # first built here, so that no jitted function caches a traced grid


def _traj(xy, yaw, valid=None):
    xy = jnp.asarray(xy, jnp.float32)
    yaw = jnp.asarray(yaw, jnp.float32)
    valid = jnp.ones(yaw.shape, bool) if valid is None else jnp.asarray(valid, bool)
    return wosac.Trajectories(xy=xy, yaw=yaw, valid=valid)


# One jit per function, tiny shapes.
kinematic_jit = jax.jit(wosac.kinematic_features)
box_distance_jit = jax.jit(wosac.box_signed_distance)
nearest_jit = jax.jit(wosac.distance_to_nearest_object)
ttc_jit = jax.jit(wosac.time_to_collision)
edge_jit = jax.jit(wosac.distance_to_road_edge)
red_jit = jax.jit(wosac.red_light_crossings)
hist_jit = jax.jit(wosac.histogram_log_likelihood, static_argnames="feature")
bern_jit = jax.jit(wosac.bernoulli_log_likelihood, static_argnames="feature")
features_jit = jax.jit(wosac.compute_features)
from_features_jit = jax.jit(wosac.scores_from_features, static_argnames=("config", "init_steps"))
STATIC = ("config", "init_steps", "dt", "rollout_batch")
scores_jit = jax.jit(chex.assert_max_traces(wosac.realism_scores, n=1), static_argnames=STATIC)


# --------------------------------------------------------------------------- config


def test_config_is_the_2025_challenge_and_weights_sum_to_one():
    c = wosac.WOSAC_2025
    assert (c.linear_speed.min_val, c.linear_speed.max_val, c.linear_speed.num_bins) == (
        0.0, 25.0, 10)
    assert (c.linear_acceleration.min_val, c.linear_acceleration.num_bins) == (-12.0, 11)
    assert (c.angular_speed.max_val, c.angular_acceleration.max_val) == (0.628, 3.14)
    assert (c.distance_to_nearest_object.min_val, c.distance_to_road_edge.min_val) == (
        -5.0, -20.0)
    assert c.time_to_collision.max_val == 5.0
    assert all(getattr(c, n).independent_timesteps for n in wosac.HISTOGRAM_FEATURES)
    assert all(getattr(c, n).pseudocount == 0.1 for n in wosac.HISTOGRAM_FEATURES)
    assert all(getattr(c, n).pseudocount == 0.001 for n in wosac.BERNOULLI_FEATURES)
    weights = {n: c.weight(n) for n in wosac.FEATURE_NAMES}
    assert weights["collision_indication"] == weights["offroad_indication"] == 0.25
    assert weights["traffic_light_violation"] == weights["linear_speed"] == 0.05
    assert math.isclose(sum(weights.values()), 1.0)
    grouped = [n for names in wosac.GROUPS.values() for n in names]
    assert sorted(grouped) == sorted(wosac.FEATURE_NAMES)
    hash(c)  # usable as a static jit argument
    with pytest.raises(ValueError):
        wosac.HistogramFeature(1.0, 0.0, 10, 0.1, True, 0.1)


# --------------------------------------------------------------------------- kinematics


def test_kinematic_features_central_differences_wrapping_and_validity():
    # x = 0, 1, 3, 6, 10, 15 over steps of 0.1 s; the last step is invalid.
    # speed[t] = |x[t+1] - x[t-1]| / 0.2: t=1: 3/0.2 = 15, t=2: 5/0.2 = 25, t=3: 7/0.2 = 35;
    # t=4 needs the invalid t=5, t=0 has no t-1. accel[2] = (35 - 15) / 0.2 = 100, the only
    # valid acceleration (needs speeds at 1 and 3).
    # Heading increments 0.1, 0.2, 0.3, 0.4 rad crossing +-pi:
    # yaw = pi-0.25, pi-0.15, -pi+0.05, -pi+0.35, -pi+0.75.
    # angular speed = (two-step increment) / 0.2: t=1: 0.3/0.2 = 1.5, t=2: 2.5, t=3: 3.5;
    # angular accel[2] = (3.5 - 1.5) / 0.2 = 10 rad/s^2.
    x = [0, 1, 3, 6, 10, 15]
    xy = np.stack([x, np.zeros(6)], -1)[None]
    yaw = np.array([[math.pi - 0.25, math.pi - 0.15, -math.pi + 0.05, -math.pi + 0.35,
                     -math.pi + 0.75, -math.pi + 0.75]])
    valid = np.array([[True] * 5 + [False]])
    speed, accel, ang_speed, ang_accel, sv, av = kinematic_jit(
        jnp.asarray(xy, jnp.float32), jnp.asarray(yaw, jnp.float32), jnp.asarray(valid))
    np.testing.assert_array_equal(sv[0], [False, True, True, True, False, False])
    np.testing.assert_array_equal(av[0], [False, False, True, False, False, False])
    np.testing.assert_allclose(speed[0], [0, 15, 25, 35, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(accel[0], [0, 0, 100, 0, 0, 0], rtol=1e-4)
    np.testing.assert_allclose(ang_speed[0], [0, 1.5, 2.5, 3.5, 0, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ang_accel[0], [0, 0, 10, 0, 0, 0], rtol=1e-3, atol=1e-3)


def test_speed_is_planar_norm_and_signed_acceleration():
    # 3-4-5 motion: steps (0.3, 0.4) then three of (0.15, 0.2).
    # speed[1] = |(0.45, 0.6)| / 0.2 = 0.75 / 0.2 = 3.75; speed[2] = speed[3]
    # = |(0.3, 0.4)| / 0.2 = 2.5; accel[2] = (2.5 - 3.75) / 0.2 = -6.25 (signed).
    xy = np.array([[[0, 0], [0.3, 0.4], [0.45, 0.6], [0.6, 0.8], [0.75, 1.0]]], F32)
    speed, accel, *_ = kinematic_jit(jnp.asarray(xy), jnp.zeros((1, 5)), jnp.ones((1, 5), bool))
    np.testing.assert_allclose(speed[0, 1:4], [3.75, 2.5, 2.5], rtol=1e-5)
    assert float(accel[0, 2]) == pytest.approx(-6.25, rel=1e-4)


# --------------------------------------------------------------------------- interaction


def _box_distance(a, b):
    args = [jnp.asarray(v, jnp.float32) for v in (*a, *b)]
    return float(box_distance_jit(*args))


def test_box_signed_distance_hand_cases():
    z = [0.0, 0.0]
    # Side by side along x: 4 x 2 boxes 6 m apart: gap 6 - 2 - 2 = 2.
    assert _box_distance((z, 0.0, 4.0, 2.0), ([6.0, 0.0], 0.0, 4.0, 2.0)) == pytest.approx(2)
    # Corner to corner: 2 x 2 boxes at (0, 0) and (3, 3): corners (1, 1), (2, 2): sqrt(2).
    assert _box_distance((z, 0.0, 2.0, 2.0), ([3.0, 3.0], 0.0, 2.0, 2.0)) == pytest.approx(
        math.sqrt(2), rel=1e-5)
    # Overlap: b at (3, 0.5): x overlap 4 - 3 = 1, y overlap 2 - 0.5 = 1.5: depth 1.
    assert _box_distance((z, 0.0, 4.0, 2.0), ([3.0, 0.5], 0.0, 4.0, 2.0)) == pytest.approx(-1)
    # b turned 90 deg at (2.5, 0) covers x in [1.5, 3.5]: 0.5 m into a (x up to 2).
    assert _box_distance((z, 0.0, 4.0, 2.0), ([2.5, 0.0], math.pi / 2, 4.0, 2.0)) == (
        pytest.approx(-0.5, abs=1e-5))
    # Touching (b turned, at 3): distance 0, not a collision (strictly negative needed).
    assert _box_distance((z, 0.0, 4.0, 2.0), ([3.0, 0.0], math.pi / 2, 4.0, 2.0)) == (
        pytest.approx(0.0, abs=1e-5))


def test_box_signed_distance_matches_shapely_when_apart():
    shapely = pytest.importorskip("shapely")
    from shapely.geometry import Polygon

    rng = np.random.default_rng(0)
    n = 300
    xy_a, xy_b = rng.uniform(-6, 6, (2, n, 2)).astype(F32)
    yaw_a, yaw_b = rng.uniform(-np.pi, np.pi, (2, n)).astype(F32)
    len_a, len_b = rng.uniform(1, 5, (2, n)).astype(F32)
    wid_a, wid_b = rng.uniform(0.5, 2.5, (2, n)).astype(F32)
    got = np.asarray(box_distance_jit(xy_a, yaw_a, len_a, wid_a, xy_b, yaw_b, len_b, wid_b))
    corners = lambda *b: np.asarray(wosac.geometry.box_corners(*map(jnp.asarray, b)))  # noqa
    ca, cb = corners(xy_a, yaw_a, len_a, wid_a), corners(xy_b, yaw_b, len_b, wid_b)
    apart = 0
    for i in range(n):
        pa, pb = Polygon(ca[i]), Polygon(cb[i])
        if pa.intersects(pb):
            assert got[i] <= 1e-4
            assert got[i] >= -max(len_a[i], len_b[i])
        else:
            apart += 1
            assert got[i] == pytest.approx(pa.distance(pb), abs=1e-4)
    assert 50 < apart < n - 20
    del shapely


def test_distance_to_nearest_object_skips_self_and_invalid():
    # Three 4 x 2 boxes on y = 0 at x = 0, 6, 9 (step 0) with object 2 invalid at step 1.
    # Step 0: 0 -> 1: 2; 1 -> 2: 9 - 6 - 4 = -1 (overlap); 2 -> 1: -1.
    # Step 1: object 2 gone: 0 <-> 1 only: 2 and 2; object 2 sees nobody -> FAR.
    xy = np.zeros((3, 2, 2), F32)
    xy[:, :, 0] = [[0, 0], [6, 6], [9, 9]]
    valid = np.array([[1, 1], [1, 1], [1, 0]], bool)
    size = jnp.array([4.0, 4.0, 4.0]), jnp.array([2.0, 2.0, 2.0])
    d = np.asarray(nearest_jit(jnp.asarray(xy), jnp.zeros((3, 2)), jnp.asarray(valid), *size))
    np.testing.assert_allclose(d[:, 0], [2, -1, -1], atol=1e-5)
    np.testing.assert_allclose(d[:2, 1], [2, 2], atol=1e-5)
    assert d[2, 1] == wosac.FAR_DISTANCE


def test_nearest_object_boxes_have_rounded_corners():
    # Two 4 x 2 boxes, axis-aligned. Radius r = 0.7 * 2 / 2 = 0.7, cores 2.6 x 0.6.
    # Face to face (B at x = 6): cores 6 - 2.6 = 3.4 apart, minus 2r: 2.0, the sharp gap.
    # Corner to corner (B at (4, 2)): the sharp corners touch (0), but the cores' corners
    # (1.3, 0.3) and (2.7, 1.7) are 1.4 * sqrt(2) apart: 1.4 * sqrt(2) - 1.4 = 0.5799.
    # With corner_rounding 0 both are the sharp distances.
    xy = jnp.asarray([[[0.0, 0.0], [0.0, 0.0]], [[6.0, 0.0], [4.0, 2.0]]], jnp.float32)
    yaw, valid = jnp.zeros((2, 2)), jnp.ones((2, 2), bool)
    size = jnp.array([4.0, 4.0]), jnp.array([2.0, 2.0])
    d = np.asarray(nearest_jit(xy, yaw, valid, *size))
    np.testing.assert_allclose(d[0], [2.0, 1.4 * math.sqrt(2) - 1.4], atol=1e-5)
    sharp = np.asarray(jax.jit(wosac.distance_to_nearest_object, static_argnums=5)(
        xy, yaw, valid, *size, 0.0))
    np.testing.assert_allclose(sharp[0], [2.0, 0.0], atol=1e-5)


def _ttc_scene(leader_y, leader_yaw, leader_x0=20.0):
    # Ego (4 x 2) at 10 m/s along +x from 0; leader (4 x 2) at 5 m/s along its heading.
    t = np.arange(3) * DT
    ego = np.stack([10 * t, 0 * t], -1)
    lead = np.stack([leader_x0 + 5 * t * np.cos(leader_yaw),
                     leader_y + 5 * t * np.sin(leader_yaw)], -1)
    xy = jnp.asarray(np.stack([ego, lead]), jnp.float32)
    yaw = jnp.asarray([[0.0] * 3, [leader_yaw] * 3], jnp.float32)
    valid = jnp.ones((2, 3), bool)
    length, width = jnp.array([4.0, 4.0]), jnp.array([2.0, 2.0])
    speed, _, _, _, sv, _ = kinematic_jit(xy, yaw, valid)
    return np.asarray(ttc_jit(xy, yaw, valid, length, width, speed, sv))


def test_time_to_collision_hand_cases():
    # Step 1: ego at x = 1, leader at x = 20.5: gap = 19.5 - 2 - 2 = 15.5 m, closing
    # 10 - 5 = 5 m/s: TTC 3.1 s. The leader follows nobody: 5 s. Steps 0 and 2 have no
    # speed (trajectory ends): 5 s.
    ttc = _ttc_scene(0.0, 0.0)
    assert ttc[0, 1] == pytest.approx(3.1, rel=1e-4)
    np.testing.assert_allclose(ttc[1], 5.0)
    np.testing.assert_allclose(ttc[0, [0, 2]], 5.0)
    # Lateral offset 1.7 m: overlap |1.7| - 1 - 1 = -0.3 (small, < 0.5 m), same heading:
    # still followed.
    assert _ttc_scene(1.7, 0.0)[0, 1] == pytest.approx(3.1, rel=1e-4)
    # Leader turned 0.3 rad (17 deg > 10 deg) at y0 = 2.1: at step 1 y = 2.1 + 0.5 sin 0.3
    # = 2.248; its half-extent across the ego is 2 sin 0.3 + 1 cos 0.3 = 1.546, overlap
    # 2.248 - 1 - 1.546 = -0.30 m (small): not followed. Turned 0.15 rad (8.6 deg):
    # overlap 2.175 - 1 - 1.288 = -0.11 m, aligned enough: followed.
    assert _ttc_scene(2.1, 0.3)[0, 1] == 5.0
    assert _ttc_scene(2.1, 0.15)[0, 1] < 5.0
    # The same 0.3 rad turn at y0 = 1.7: overlap -0.70 m (not small): followed.
    assert _ttc_scene(1.7, 0.3)[0, 1] < 5.0
    # Offset 2.7 m: no overlap with the trail.
    assert _ttc_scene(2.7, 0.0)[0, 1] == 5.0
    # Oncoming (heading pi, > 75 deg): not followed.
    assert _ttc_scene(0.0, math.pi)[0, 1] == 5.0
    # Far ahead: 60 m gap / 5 m/s = 12 s, capped at 5.
    assert _ttc_scene(0.0, 0.0, leader_x0=65.0)[0, 1] == 5.0
    # Heading +179 deg vs ego at -179 deg... checked via the wrap: leader yaw 2 pi.
    assert _ttc_scene(0.0, 2 * math.pi)[0, 1] == pytest.approx(3.1, rel=1e-3)


# --------------------------------------------------------------------------- map


def test_distance_to_road_edge_and_offroad():
    # Road y in [-5, 5]. A 4 x 2 box at y = 0: corners at y = +-1, 4 m from the edges:
    # -4. At y = 4.5: corners reach y = 5.5: +0.5, off-road. Turned 90 deg at y = 2:
    # corners reach y = 4: -1.
    xy = jnp.array([[[0.0, 0.0]], [[10.0, 4.5]], [[-10.0, 2.0]]])
    yaw = jnp.array([[0.0], [0.0], [math.pi / 2]])
    d = np.asarray(edge_jit(road_grid(), ROAD, xy, yaw, jnp.full(3, 4.0), jnp.full(3, 2.0)))
    np.testing.assert_allclose(d[:, 0], [-4.0, 0.5, -1.0], atol=1e-5)


def test_red_light_crossings_hand_cases():
    # Stop line at x = 5 across lane 1 (y = -2, heading +x), band |y + 2| <= 2.
    # Light: GO at steps 0-2, STOP at 3-4.
    # 0: x 2, 3, 4, 6, 7 at y = -1.5: passes x = 5 between steps 2 and 3, red at 3: True.
    # 1: x 3, 4, 6, 7, 8: passes between 1 and 2, on green: never.
    # 2: as 0 at y = +0.5 (2.5 m from the lane centre): outside the band.
    # 3: as 0 heading -x (against the lane): not a crossing of this line.
    # 4: as 0 but invalid at step 2: the crossing step has no valid predecessor.
    go, stop = TrafficLightState.GO, TrafficLightState.STOP
    x0 = [2, 3, 4, 6, 7]
    xs = np.array([x0, [3, 4, 6, 7, 8], x0, x0, x0], F32)
    ys = np.array([-1.5, -1.5, 0.5, -1.5, -1.5], F32)[:, None] + 0 * xs
    xy = jnp.asarray(np.stack([xs, ys], -1))
    yaw = jnp.zeros((5, 5)).at[3].set(math.pi)
    valid = jnp.ones((5, 5), bool).at[4, 2].set(False)
    got = np.asarray(red_jit(xy, yaw, valid, _lights([go, go, go, stop, stop]), ROAD))
    want = np.zeros((5, 5), bool)
    want[0, 3] = True
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- likelihoods


def test_histogram_likelihood_with_smoothing_by_hand():
    feature = wosac.HistogramFeature(0.0, 10.0, 5, 0.5, True, 1.0)
    # Bins of 2 m. Simulated (R=2, T=2): 1, 3 / 3, 9 -> bins 0, 1, 1, 4.
    # Pooled counts [1, 2, 0, 0, 1], n = 4: p = (count + 0.5) / (4 + 5 * 0.5)
    # = [1.5, 2.5, .5, .5, 1.5] / 6.5. Logged 3.5 -> bin 1: log(2.5 / 6.5); logged 12 is
    # clipped into bin 4: log(1.5 / 6.5).
    sim = jnp.array([[[1.0, 3.0]], [[3.0, 9.0]]])
    log = jnp.array([[3.5, 12.0]])
    ok = jnp.ones((2, 1, 2), bool)
    got = np.asarray(hist_jit(log, sim, ok, feature=feature))
    np.testing.assert_allclose(got[0], np.log([2.5 / 6.5, 1.5 / 6.5]), rtol=1e-6)
    # Per step (independent_timesteps False): step 0 samples 1, 3 -> counts [1, 1, 0, 0, 0],
    # p(bin 1) = 1.5 / 4.5; step 1 samples 3, 9 -> p(bin 4) = 1.5 / 4.5.
    per_step = wosac.HistogramFeature(0.0, 10.0, 5, 0.5, False, 1.0)
    got = np.asarray(hist_jit(log, sim, ok, feature=per_step))
    np.testing.assert_allclose(got[0], np.log([1.5 / 4.5, 1.5 / 4.5]), rtol=1e-6)
    # A masked sample is not counted: drop the 9: counts [1, 2, 0, 0, 0], n = 3,
    # p(bin 4) = 0.5 / 5.5.
    ok = ok.at[1, 0, 1].set(False)
    got = np.asarray(hist_jit(log, sim, ok, feature=feature))
    np.testing.assert_allclose(got[0, 1], np.log(0.5 / 5.5), rtol=1e-6)


def test_bernoulli_likelihood_by_hand():
    f = wosac.BernoulliFeature(0.001, 1.0)
    # R = 4, one rollout with the event: p(true) = (1 + 0.001) / (4 + 0.002).
    sim = jnp.array([[True, False], [False, False], [False, False], [False, False]])
    got = np.asarray(bern_jit(jnp.array([True, False]), sim, feature=f))
    p = 1.001 / 4.002
    np.testing.assert_allclose(got, [np.log(p), np.log(1 - 0.001 / 4.002)], rtol=1e-5)


# --------------------------------------------------------------------------- scenes


A, T, R, INIT = 3, 14, 4, 2
LENGTH = jnp.array([4.5, 4.5, 4.0])
WIDTH = jnp.array([2.0, 2.0, 1.8])
EVALUATED = jnp.array([True, True, False])


def _log_scene() -> wosac.Trajectories:
    """Three cars on the straight road: two in a lane (the second faster, closing), one
    in the other lane, object 2 appearing at step 3."""
    t = np.arange(T) * DT
    xy = np.zeros((A, T, 2), F32)
    xy[0, :, 0] = 10 * t + 0.5 * t * t
    xy[0, :, 1] = -2.0
    xy[1, :, 0] = -15 + 12 * t
    xy[1, :, 1] = -2.0 + 0.2 * t
    xy[2, :, 0] = 20 - 8 * t
    xy[2, :, 1] = 2.5
    yaw = np.zeros((A, T), F32)
    yaw[1] = 0.02
    yaw[2] = math.pi
    valid = np.ones((A, T), bool)
    valid[2, :3] = False
    return _traj(xy, yaw, valid)


def _noisy(log: wosac.Trajectories, seed, scale) -> wosac.Trajectories:
    # Noise drawn on the host (NumPy): no random-number kernels to compile.
    rng = np.random.default_rng(seed)
    xy = np.asarray(log.xy)[None] + scale * rng.standard_normal((R,) + log.xy.shape)
    yaw = np.asarray(log.yaw)[None] + 0.2 * scale * rng.standard_normal((R,) + log.yaw.shape)
    return wosac.Trajectories(xy=jnp.asarray(xy, jnp.float32),
                              yaw=jnp.asarray(yaw, jnp.float32),
                              valid=jnp.asarray(np.broadcast_to(log.valid, (R, A, T))))


def _replay(log: wosac.Trajectories) -> wosac.Trajectories:
    return jax.tree.map(lambda x: jnp.asarray(np.broadcast_to(x, (R,) + x.shape)), log)


def _scores(sim, log, fn=scores_jit, **kw):
    out = fn(sim, log, LENGTH, WIDTH, EVALUATED, road_grid(), ROAD, init_steps=INIT, **kw)
    return {k: np.asarray(v) for k, v in out.items()}


def test_realism_scores_shapes_finite_and_metametric_is_weighted_sum():
    log = _log_scene()
    out = _scores(_noisy(log, 0, 0.5), log)
    for name in wosac.FEATURE_NAMES:
        assert out[name].shape == () and 0.0 <= out[name] <= 1.0, name
        assert out[name + "/per_object"].shape == (A,)
        assert out[name + "/per_object"][2] == 1.0  # not evaluated
    assert all(np.isfinite(v).all() for v in out.values())
    c = wosac.WOSAC_2025
    want = sum(c.weight(n) * out[n] for n in wosac.FEATURE_NAMES)
    assert out["metametric"] == pytest.approx(want, rel=1e-6)
    kin = sum(out[n] for n in wosac.GROUPS["kinematic"]) / 4
    assert out["kinematic"] == pytest.approx(kin, rel=1e-6)
    inter = (0.1 * out["distance_to_nearest_object"] + 0.25 * out["collision_indication"]
             + 0.1 * out["time_to_collision"]) / 0.45
    assert out["interactive"] == pytest.approx(inter, rel=1e-6)
    # Feature score = exp of the mean log-likelihood over the evaluated objects' valid
    # steps; both evaluated objects have 11 valid speed steps here, so it is the geometric
    # mean of their per-object likelihoods (each exp of the mean over its own steps).
    assert out["linear_speed"] == pytest.approx(
        np.sqrt(np.prod(out["linear_speed/per_object"][:2])), rel=1e-5)
    # ... and the collision score the geometric mean of the objects' Bernoulli terms.
    assert out["collision_indication"] == pytest.approx(
        np.sqrt(np.prod(out["collision_indication/per_object"][:2])), rel=1e-5)
    # The object_mean aggregation: the arithmetic mean of the per-object likelihoods.
    objects = _scores(_noisy(log, 0, 0.5), log,
                      fn=jax.jit(wosac.realism_scores, static_argnames=STATIC),
                      config=dataclasses.replace(wosac.WOSAC_2025, aggregation="object_mean"))
    assert objects["linear_speed"] == pytest.approx(
        out["linear_speed/per_object"][:2].mean(), rel=1e-6)
    with pytest.raises(ValueError, match="aggregation"):
        dataclasses.replace(wosac.WOSAC_2025, aggregation="mean")
    assert out["min_ade"] <= out["ade"]
    assert 0.2 < out["ade"] < 1.0  # ~ E|N(0, 0.5^2 I_2)| = 0.63


def test_per_object_likelihood_is_exp_mean_log_over_valid_steps():
    # Replay with one object's logged speed feature moved to another bin at one step:
    # the per-object speed likelihood is exp of the mean over its valid steps.
    log = _log_scene()
    log_f = features_jit(log, LENGTH, WIDTH, road_grid(), ROAD)
    sim_f = jax.tree.map(lambda x: jnp.broadcast_to(x, (R,) + x.shape), log_f)
    out = from_features_jit(sim_f, log_f, EVALUATED, init_steps=INIT)
    c = wosac.WOSAC_2025.linear_speed
    # Object 0: speed valid at steps 2..12 (11 steps, the last has no t+1), every sample of
    # R x 11 in the bin of the logged value... unless speeds straddle bins; compute it.
    v = np.asarray(log_f.linear_speed[0, INIT:T - 1])
    bins = np.clip(np.floor((v - c.min_val) / (c.max_val - c.min_val) * c.num_bins), 0, 9)
    counts = np.bincount(bins.astype(int), minlength=10) * R
    p = (counts + 0.1) / (counts.sum() + 10 * 0.1)
    want = np.exp(np.mean(np.log(p[bins.astype(int)])))
    assert float(out["linear_speed/per_object"][0]) == pytest.approx(want, rel=1e-5)


def test_log_replay_scores_highest():
    log = _log_scene()
    replay = _scores(_replay(log), log)
    noisy = _scores(_noisy(log, 1, 1.0), log)
    assert replay["min_ade"] == pytest.approx(0.0, abs=1e-6)
    for group in ("metametric", "kinematic", "interactive", "map_based"):
        assert replay[group] >= noisy[group], group
    assert replay["metametric"] > noisy["metametric"]
    assert replay["kinematic"] > noisy["kinematic"]
    # No collision or off-road in the log nor in the replay: Bernoulli terms
    # (R + c) / (R + 2c) each.
    near_one = (R + 0.001) / (R + 0.002)
    for name in wosac.BERNOULLI_FEATURES:
        assert replay[name] == pytest.approx(near_one, rel=1e-6)


def _without(tr: wosac.Trajectories, k: int) -> wosac.Trajectories:
    """``tr`` with object ``k`` invalid at every step."""
    valid = np.array(tr.valid)
    valid[..., k, :] = False
    return wosac.Trajectories(xy=tr.xy, yaw=tr.yaw, valid=jnp.asarray(valid))


def test_a_track_that_appears_later_is_no_obstacle():
    """Waymo's convention: the obstacles are the objects valid at the current step
    (INIT - 1). Object 2 appears at step 3: it is nobody's nearest object, collision or
    leader, so every score equals that of the scene without it (it is not scored)."""
    log = _log_scene()
    assert not bool(log.valid[2, :3].any()) and bool(log.valid[2, 3:].all())
    # It is near: the nearest object of object 0 or 1 at some steps (the other lane).
    obstacles = jnp.array([True, True, False])
    d_all = np.asarray(nearest_jit(log.xy, log.yaw, log.valid, LENGTH, WIDTH))
    d_obst = np.asarray(nearest_jit(log.xy, log.yaw, log.valid, LENGTH, WIDTH,
                                    obstacles=obstacles))
    d_two = np.asarray(nearest_jit(log.xy[:2], log.yaw[:2], log.valid[:2], LENGTH[:2],
                                   WIDTH[:2]))
    assert np.any(d_all[:2] < d_obst[:2] - 0.1)  # object 2 was someone's nearest
    np.testing.assert_array_equal(d_obst[:2], d_two)
    sim = _noisy(log, 7, 0.3)
    with_late = _scores(sim, log)
    without = _scores(_without(sim, 2), _without(log, 2))
    assert with_late.keys() == without.keys()
    for k in with_late:
        np.testing.assert_allclose(with_late[k], without[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_one_collision_lowers_exactly_the_collision_term():
    log = _log_scene()
    log_f = features_jit(log, LENGTH, WIDTH, road_grid(), ROAD)
    replay_f = jax.tree.map(lambda x: jnp.broadcast_to(x, (R,) + x.shape), log_f)
    hit = replay_f.replace(
        collision_indication=replay_f.collision_indication.at[0, 1, 7].set(True))
    base = from_features_jit(replay_f, log_f, EVALUATED, init_steps=INIT)
    one = from_features_jit(hit, log_f, EVALUATED, init_steps=INIT)
    changed = {k for k in base if not np.array_equal(np.asarray(base[k]), np.asarray(one[k]))}
    assert changed == {"collision_indication", "collision_indication/per_object",
                       "metametric", "interactive", "simulated_collision_rate"}
    # Object 1 (of the 2 evaluated): p(no collision) drops from (4 + c) / (4 + 2c) to
    # (3 + c) / (4 + 2c); the feature is exp of the mean log-probability over the two
    # objects (their geometric mean).
    c = 0.001
    p_base, p_hit = (4 + c) / (4 + 2 * c), (3 + c) / (4 + 2 * c)
    drop = p_base - math.sqrt(p_base * p_hit)
    assert float(base["collision_indication"] - one["collision_indication"]) == (
        pytest.approx(drop, rel=1e-5))
    assert float(base["metametric"] - one["metametric"]) == pytest.approx(0.25 * drop, rel=1e-4)
    assert float(one["simulated_collision_rate"]) == pytest.approx(1 / (R * 2))


def test_a_simulated_crash_is_detected_and_scored():
    # Rollout 0 equals the log except object 1 (behind object 0 in its lane) is moved
    # onto object 0 from step 6 on: a collision for both (object 0 is hit) in one rollout
    # of four, none in the log: p(no collision) = (3 + c) / (4 + 2c) for both objects.
    log = _log_scene()
    replay = _replay(log)
    xy = replay.xy.at[0, 1, 6:].set(log.xy[0, 6:] + jnp.array([1.0, 0.5]))
    out = _scores(replay.replace(xy=xy), log)
    base = _scores(replay, log)
    c = 0.001
    assert float(out["collision_indication"]) == pytest.approx((3 + c) / (4 + 2 * c), rel=1e-5)
    assert float(out["simulated_collision_rate"]) == pytest.approx(2 / 8)
    assert out["interactive"] < base["interactive"]
    # Object 1's jump also changes its speeds; object 0's kinematics are untouched.
    np.testing.assert_allclose(out["linear_speed/per_object"][0],
                               base["linear_speed/per_object"][0], rtol=1e-6)
    np.testing.assert_allclose(out["offroad_indication"], base["offroad_indication"])


def test_permuting_rollouts_changes_nothing():
    log = _log_scene()
    sim = _noisy(log, 2, 0.7)
    perm = jnp.array([2, 0, 3, 1])
    a = _scores(sim, log)
    b = _scores(jax.tree.map(lambda x: x[perm], sim), log)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, err_msg=k)


def test_red_light_input_and_vmap_over_scenarios():
    log = _log_scene()
    sim = _noisy(log, 3, 0.3)
    # Scenario 0: object 0 runs a red light in the log at step 5 and in one rollout of
    # four: p(true) = (1 + c) / (4 + 2c); object 1 never: (4 + c) / (4 + 2c).
    log_red = np.zeros((A, T), bool)
    log_red[0, 5] = True
    sim_red = np.zeros((R, A, T), bool)
    sim_red[2, 0, 9] = True
    # Scenario 1: the replay without red lights. Both in one vmapped call (rollouts in
    # lax.map batches of 3: one batch and a remainder; one program for both checks).
    stack = lambda *x: jnp.stack(x)  # noqa: E731
    sims = jax.tree.map(stack, sim, _replay(log))
    logs = jax.tree.map(stack, log, log)
    sim_reds = jnp.asarray(np.stack([sim_red, np.zeros_like(sim_red)]))
    log_reds = jnp.asarray(np.stack([log_red, np.zeros_like(log_red)]))
    batched = jax.jit(jax.vmap(
        lambda s, lg, sr, lr: wosac.realism_scores(
            s, lg, LENGTH, WIDTH, EVALUATED, road_grid(), ROAD, sim_red_light=sr,
            log_red_light=lr,
            init_steps=INIT, rollout_batch=3)))(sims, logs, sim_reds, log_reds)
    c = 0.001
    want = math.sqrt((1 + c) / (4 + 2 * c) * (4 + c) / (4 + 2 * c))  # geometric mean
    assert float(batched["traffic_light_violation"][0]) == pytest.approx(want, rel=1e-5)
    assert float(batched["simulated_traffic_light_violation_rate"][0]) == pytest.approx(1 / 8)
    # The vmapped call equals separate calls (one batch of all 4; no red-light input).
    single = _scores(_replay(log), log)
    for k in ("metametric", "kinematic", "map_based", "min_ade", "traffic_light_violation"):
        assert float(batched[k][1]) == pytest.approx(float(single[k]), rel=1e-5, abs=1e-6)


def test_traffic_lights_drive_the_violation_term():
    # Object 0 drives along lane 1 (y = -2) past the stop point x = 5 at step 5
    # (x = 10 t + t^2 / 2: 4.08 at step 4, 5.125 at step 5) under a red light; object 1
    # stays behind x = 0.6; object 2 is in the other lane, heading -x.
    log = _log_scene()
    lights = _lights([TrafficLightState.STOP] * T)
    red = np.asarray(red_jit(log.xy, log.yaw, log.valid, lights, ROAD))
    want = np.zeros((A, T), bool)
    want[0, 5] = True
    np.testing.assert_array_equal(red, want)
    # Replay: both evaluated objects match the log in all 4 rollouts: (4 + c) / (4 + 2c);
    # half of the (rollout, evaluated object) pairs violate.
    with_lights = jax.jit(wosac.realism_scores, static_argnames=STATIC)
    out = _scores(_replay(log), log, with_lights, traffic_lights=lights)
    c = 0.001
    assert float(out["traffic_light_violation"]) == pytest.approx((4 + c) / (4 + 2 * c))
    assert float(out["simulated_traffic_light_violation_rate"]) == pytest.approx(0.5)

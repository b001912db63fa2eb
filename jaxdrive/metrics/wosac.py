"""WOSAC 2025 realism metrics (Waymo Open Sim Agents Challenge) as pure JAX functions.

Pipeline for one scenario (vmap over scenarios; jit at the caller's edge):

1. Features, per object and step, for the logged trajectory and for each of the R
   simulated rollouts (``compute_features``): linear speed and acceleration, angular
   speed and acceleration, signed distance to the nearest object, collision indication,
   time to collision, signed distance to the road edge, off-road indication and
   traffic-light violation.
2. Per feature, the likelihood of the logged values under the distribution of the
   simulated ones (``scores_from_features``): a histogram with additive smoothing for the
   continuous features, a 2-bin (Bernoulli) histogram of "any event in the window" for
   the three indications.
3. The meta-metric (weighted sum of the feature likelihoods), the three group scores
   (kinematic / interactive / map-based, weighted averages within a group), minADE.

Sources of the numbers (facts, no code taken from them):

- Histogram ranges, bin counts, pseudocounts, ``independent_timesteps`` and weights:
  ``challenge_2025_sim_agents_config.textproto`` in waymo-research/waymo-open-dataset
  (``src/waymo_open_dataset/wdl_limited/sim_agents_metrics/``). The Bernoulli
  pseudocount is the proto default of ``BernoulliEstimate.additive_smoothing_pseudocount``
  (0.001) in ``protos/sim_agents_metrics.proto``, as the 2025 textproto sets none.
- Central differences for speeds and accelerations, validity needing both neighbours,
  heading deltas wrapped after doubling (``wrap(2 * dh) / 2``), 0.1 s steps: the
  published trajectory-feature definitions of the 2024/2025 challenge.
- Distance to nearest object = signed distance between oriented boxes with rounded
  corners (radius 0.7 x half the smaller side, as Waymo's package models objects: the
  distance between the shrunk core boxes minus both radii; negative when they overlap,
  the Minkowski-difference definition between the cores); collision = that distance < 0.
- Time to collision along the heading with the object followed: ahead of the front
  bumper (longitudinal distance > 0), heading difference <= 75 deg, lateral overlap of the
  other box with the ego's straight trail (< 0 m), and heading difference <= 10 deg when
  that overlap is smaller than 0.5 m; TTC = gap / closing speed, 5 s when not closing, no
  object followed, or larger. (WOSAC paper, arXiv 2305.12032, and the challenge's
  published interaction-feature definitions.)
- Distance to road edge = the largest signed distance of the box's four corners (> 0
  outside the drivable area); off-road = that distance > 0.
- Feature score = exp(mean log probability over every evaluated object's valid logged
  steps) (``WosacConfig.aggregation = "log_mean"``, as Waymo's metrics package computes
  it; checked against it in docs/realism.md), or with ``"object_mean"`` the mean over
  evaluated objects of each one's own likelihood, exp(mean over its valid steps) (the
  agent-level estimate PufferDrive's docs describe). Per-object likelihoods are
  reported either way.
  With ``independent_timesteps`` the histogram pools the object's R x T simulated samples;
  without it each logged step is scored under the R samples of that step.
- Groups: kinematic = the four speeds/accelerations, interactive = nearest-object
  distance, collision, TTC; map-based = road-edge distance, off-road, traffic-light
  violation. Weights sum to 1: 4 x 0.05 + 0.1 + 0.25 + 0.1 + 0.05 + 0.25 + 0.05.

Conventions chosen where the published text leaves room (tested in tests/test_wosac.py):

- 2-D only: positions have no z, so speed is the planar speed.
- Finite differences run over the whole trajectory (history included), so the first
  evaluated step uses the last history step; features are then cut to steps
  ``[init_steps, T)``. The first and last steps of a trajectory have no speed, the first
  two and last two no acceleration.
- Simulated samples enter a histogram where the simulated feature is valid; logged values
  are scored where the logged feature is valid. Values are clipped to the histogram range
  (a value at ``max_val`` falls in the last bin).
- The TTC heading difference is wrapped to [0, pi] (a raw ``|yaw_b - yaw_a|`` would call
  headings of +179 deg and -179 deg opposed).
- An object whose speed is undefined at a step (trajectory ends) gives TTC 5 s there.
- An indication counts a step only where the object is valid in the log and in the
  rollout (objects absent from the log cannot be blamed for a simulated event).
- Traffic-light violation: the per-step indicator is an input (``red_light``,
  (..., A, T) bool: the object crossed a stop line of a lane whose light is red at that
  step), e.g. the simulator's own per-step ``ran_red_light`` metric
  (``jaxdrive.metrics.step``, the same ``signals.red_light_crossing`` test), or
  ``realism_scores`` derives it from the trajectories and the logged light states with
  ``red_light_crossings``: our own geometric test (a centre crossing the line through
  the stop point across the lane, within 2 m of the lane centre, heading along the lane,
  light STOP or ARROW_STOP), an approximation of the challenge's lane-association rule.
  With neither, no object ever violates, which scores (R + c) / (R + 2c) ~ 1 for log and
  rollouts alike.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive import geometry
from jaxdrive.scenarios import road_index as road_index_lib
from jaxdrive.scenarios import signals
from jaxdrive.scenarios.road_index import RoadIndex
from jaxdrive.types import Roadgraph, TrafficLights

# Distance standing in for "no other object": larger than any histogram range, finite.
FAR_DISTANCE = 1.0e10
# TTC following-test thresholds and the TTC cap (WOSAC interaction features).
TTC_MAX_HEADING_DIFF = math.radians(75.0)
TTC_MAX_HEADING_DIFF_SMALL_OVERLAP = math.radians(10.0)
TTC_SMALL_OVERLAP = 0.5  # metres
TTC_MAX = 5.0  # seconds
STEP_SECONDS = 0.1  # WOMD logs and WOSAC rollouts run at 10 Hz
STOP_LINE_HALF_WIDTH = signals.STOP_LINE_HALF_WIDTH
RED_STATES = signals.RED_STATES


@dataclasses.dataclass(frozen=True)
class HistogramFeature:
    """A continuous feature scored with a smoothed histogram.

    Attributes:
      min_val, max_val: histogram range; values outside are clipped into it.
      num_bins: equal-width bins over the range.
      pseudocount: added to every bin's count before normalising.
      independent_timesteps: pool the simulated samples of all steps into one histogram
        per object (True) or keep one histogram per step (False).
      weight: meta-metric weight.
    """

    min_val: float
    max_val: float
    num_bins: int
    pseudocount: float
    independent_timesteps: bool
    weight: float

    def __post_init__(self):
        if not self.max_val > self.min_val:
            raise ValueError(f"histogram max_val {self.max_val} must exceed min_val "
                             f"{self.min_val}")
        if self.num_bins < 1 or self.pseudocount < 0 or self.weight < 0:
            raise ValueError(f"bad histogram feature {self}")


@dataclasses.dataclass(frozen=True)
class BernoulliFeature:
    """A per-object indication ("any event in the window") scored with a 2-bin histogram.

    Attributes:
      pseudocount: added to both bins' counts before normalising.
      weight: meta-metric weight.
    """

    pseudocount: float
    weight: float

    def __post_init__(self):
        if self.pseudocount < 0 or self.weight < 0:
            raise ValueError(f"bad Bernoulli feature {self}")


HISTOGRAM_FEATURES = (
    "linear_speed", "linear_acceleration", "angular_speed", "angular_acceleration",
    "distance_to_nearest_object", "time_to_collision", "distance_to_road_edge",
)
BERNOULLI_FEATURES = ("collision_indication", "offroad_indication", "traffic_light_violation")
FEATURE_NAMES = (
    "linear_speed", "linear_acceleration", "angular_speed", "angular_acceleration",
    "distance_to_nearest_object", "collision_indication", "time_to_collision",
    "distance_to_road_edge", "offroad_indication", "traffic_light_violation",
)
GROUPS = {
    "kinematic": ("linear_speed", "linear_acceleration", "angular_speed",
                  "angular_acceleration"),
    "interactive": ("distance_to_nearest_object", "collision_indication",
                    "time_to_collision"),
    "map_based": ("distance_to_road_edge", "offroad_indication", "traffic_light_violation"),
}


# Boxes in the nearest-object distance and collision have rounded corners: radius
# CORNER_ROUNDING x half the smaller side (the value Waymo's metrics package uses).
CORNER_ROUNDING = 0.7

# How a feature's log-likelihoods become its score: ``log_mean``, exp of the mean
# log-likelihood over every scored (object, step) pair (histograms) or scored object
# (indications), as Waymo's metrics package computes it; ``object_mean``, the mean over
# scored objects of each object's own likelihood (the agent-level estimate).
AGGREGATIONS = ("log_mean", "object_mean")


@dataclasses.dataclass(frozen=True)
class WosacConfig:
    """One ``HistogramFeature`` or ``BernoulliFeature`` per WOSAC feature, and the
    ``aggregation`` over objects (``AGGREGATIONS``); hashable, so it can be a static
    argument of ``jax.jit``."""

    linear_speed: HistogramFeature
    linear_acceleration: HistogramFeature
    angular_speed: HistogramFeature
    angular_acceleration: HistogramFeature
    distance_to_nearest_object: HistogramFeature
    collision_indication: BernoulliFeature
    time_to_collision: HistogramFeature
    distance_to_road_edge: HistogramFeature
    offroad_indication: BernoulliFeature
    traffic_light_violation: BernoulliFeature
    aggregation: str = "log_mean"

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"WosacConfig.aggregation must be one of {AGGREGATIONS}, "
                             f"got {self.aggregation!r}.")

    def weight(self, name: str) -> float:
        """Meta-metric weight of feature ``name``."""
        return getattr(self, name).weight


def _hist(lo, hi, bins, weight):
    return HistogramFeature(lo, hi, bins, 0.1, True, weight)


# challenge_2025_sim_agents_config.textproto (see the module docstring).
WOSAC_2025 = WosacConfig(
    linear_speed=_hist(0.0, 25.0, 10, 0.05),
    linear_acceleration=_hist(-12.0, 12.0, 11, 0.05),
    angular_speed=_hist(-0.628, 0.628, 11, 0.05),
    angular_acceleration=_hist(-3.14, 3.14, 11, 0.05),
    distance_to_nearest_object=_hist(-5.0, 40.0, 10, 0.1),
    collision_indication=BernoulliFeature(0.001, 0.25),
    time_to_collision=_hist(0.0, 5.0, 10, 0.1),
    distance_to_road_edge=_hist(-20.0, 40.0, 10, 0.05),
    offroad_indication=BernoulliFeature(0.001, 0.25),
    traffic_light_violation=BernoulliFeature(0.001, 0.05),
)


@struct.dataclass
class Trajectories:
    """Object boxes over time.

    Attributes:
      xy: (..., A, T, 2) float32, box centre, metres, world frame.
      yaw: (..., A, T) float32, heading, radians.
      valid: (..., A, T) bool.
    """

    xy: jax.Array
    yaw: jax.Array
    valid: jax.Array


@struct.dataclass
class Features:
    """Per-object, per-step WOSAC features; every field (..., A, T).

    ``speed_valid`` / ``accel_valid`` mark where the finite differences are defined;
    the other features are defined where ``valid``.
    """

    linear_speed: jax.Array
    linear_acceleration: jax.Array
    angular_speed: jax.Array
    angular_acceleration: jax.Array
    distance_to_nearest_object: jax.Array
    collision_indication: jax.Array
    time_to_collision: jax.Array
    distance_to_road_edge: jax.Array
    offroad_indication: jax.Array
    traffic_light_violation: jax.Array
    valid: jax.Array
    speed_valid: jax.Array
    accel_valid: jax.Array

    def feature_valid(self, name: str) -> jax.Array:
        """(..., A, T) bool: where feature ``name`` is defined."""
        if name in ("linear_speed", "angular_speed"):
            return self.speed_valid
        if name in ("linear_acceleration", "angular_acceleration"):
            return self.accel_valid
        return self.valid


# --------------------------------------------------------------------------- kinematics


def wrap_angle(angle: jax.Array) -> jax.Array:
    """Angles (any shape, radians) wrapped into [-pi, pi)."""
    return (angle + jnp.pi) % (2 * jnp.pi) - jnp.pi


def central_diff(x: jax.Array) -> jax.Array:
    """(x[t+1] - x[t-1]) / 2 along the last axis, 0 at the first and last step.

    Args:
      x: (..., T) float.
    Returns:
      (..., T), same dtype.
    """
    pad = jnp.zeros(x.shape[:-1] + (1,), x.dtype)
    return jnp.concatenate([pad, (x[..., 2:] - x[..., :-2]) / 2, pad], axis=-1)


def central_valid(valid: jax.Array) -> jax.Array:
    """valid[t-1] & valid[t+1] along the last axis, False at the first and last step.

    Args:
      valid: (..., T) bool.
    Returns:
      (..., T) bool.
    """
    pad = jnp.zeros(valid.shape[:-1] + (1,), bool)
    return jnp.concatenate([pad, valid[..., 2:] & valid[..., :-2], pad], axis=-1)


def kinematic_features(
    xy: jax.Array, yaw: jax.Array, valid: jax.Array, dt: float = STEP_SECONDS
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Speeds and accelerations by central differences.

    speed[t] = |xy[t+1] - xy[t-1]| / (2 dt); accel[t] = (speed[t+1] - speed[t-1]) / (2 dt);
    angular speed[t] = wrap(yaw[t+1] - yaw[t-1]) / (2 dt) (the two-step delta is wrapped,
    so a turn of up to pi/2 per step is measured); angular accel[t] =
    wrap(h[t+1] - h[t-1]) / (2 dt^2) with h the per-step heading delta.

    Args:
      xy: (..., T, 2) float32, metres. yaw: (..., T) radians. valid: (..., T) bool.
      dt: seconds per step.
    Returns:
      linear_speed (m/s), linear_acceleration (m/s^2), angular_speed (rad/s),
      angular_acceleration (rad/s^2), speed_valid, accel_valid: each (..., T); values
      are 0 where not valid.
    """
    dpos = jnp.stack([central_diff(xy[..., 0]), central_diff(xy[..., 1])], axis=-1)
    speed = jnp.sqrt(jnp.sum(dpos * dpos, axis=-1)) / dt
    accel = central_diff(speed) / dt
    # central_diff halves the two-step delta; double it back before wrapping.
    dh_step = wrap_angle(2 * central_diff(yaw)) / 2
    d2h_step = wrap_angle(2 * central_diff(dh_step)) / 2
    speed_valid = central_valid(valid)
    accel_valid = central_valid(speed_valid)
    zero = jnp.float32(0.0)
    return (
        jnp.where(speed_valid, speed, zero),
        jnp.where(accel_valid, accel, zero),
        jnp.where(speed_valid, dh_step / dt, zero),
        jnp.where(accel_valid, d2h_step / (dt * dt), zero),
        speed_valid,
        accel_valid,
    )


# --------------------------------------------------------------------------- interaction


def box_signed_distance(
    xy_a: jax.Array, yaw_a: jax.Array, len_a: jax.Array, wid_a: jax.Array,
    xy_b: jax.Array, yaw_b: jax.Array, len_b: jax.Array, wid_b: jax.Array,
) -> jax.Array:
    """Signed distance between oriented boxes: gap when apart, minus the penetration depth
    when they overlap.

    Disjoint convex polygons are closest at a vertex of one of them, so the gap is the
    least distance from a corner of either box to the other box (measured in that box's
    frame: the corner's excess over its half-extents; no 4 x 4 corner-edge pairs).
    Overlapping ones: the Minkowski difference of two rectangles has only the four box
    axes as edge normals, so the penetration depth is the least overlap along those axes
    (the largest, negative, axis gap).

    Args:
      xy_*: (..., 2); yaw_*, len_*, wid_*: (...,), broadcast against each other.
    Returns:
      (...,) float32, metres.
    """
    ca, sa = jnp.cos(yaw_a), jnp.sin(yaw_a)
    cb, sb = jnp.cos(yaw_b), jnp.sin(yaw_b)
    dx = xy_b[..., 0] - xy_a[..., 0]
    dy = xy_b[..., 1] - xy_a[..., 1]
    ha, wa, hb, wb = 0.5 * len_a, 0.5 * wid_a, 0.5 * len_b, 0.5 * wid_b
    cos_d = jnp.abs(ca * cb + sa * sb)
    sin_d = jnp.abs(sa * cb - ca * sb)
    gap = jnp.stack([
        jnp.abs(dx * ca + dy * sa) - (ha + hb * cos_d + wb * sin_d),
        jnp.abs(-dx * sa + dy * ca) - (wa + hb * sin_d + wb * cos_d),
        jnp.abs(dx * cb + dy * sb) - (hb + ha * cos_d + wa * sin_d),
        jnp.abs(-dx * sb + dy * cb) - (wb + ha * sin_d + wa * cos_d),
    ], axis=-1)
    max_gap = jnp.max(gap, axis=-1)

    def corners_to_box(xy_p, c_p, s_p, h_p, w_p, xy_q, c_q, s_q, h_q, w_q):
        # Distance from p's four corners to box q, in q's frame: the corner's excess over
        # q's half-extents, per axis.
        corners = geometry.box_corners(xy_p, None, 2 * h_p, 2 * w_p, trig=(c_p, s_p))
        d = corners - xy_q[..., None, :]
        c, s = c_q[..., None], s_q[..., None]
        along = c * d[..., 0] + s * d[..., 1]
        across = -s * d[..., 0] + c * d[..., 1]
        ex = jnp.maximum(jnp.abs(along) - h_q[..., None], 0.0)
        ey = jnp.maximum(jnp.abs(across) - w_q[..., None], 0.0)
        return jnp.min(jnp.sqrt(ex * ex + ey * ey), axis=-1)

    apart = jnp.minimum(
        corners_to_box(xy_a, ca, sa, ha, wa, xy_b, cb, sb, hb, wb),
        corners_to_box(xy_b, cb, sb, hb, wb, xy_a, ca, sa, ha, wa),
    )
    return jnp.where(max_gap < 0, max_gap, apart).astype(jnp.float32)


def _pairs(x: jax.Array, feature_axes: int):
    """(..., A, T, *f) -> ego (..., A, 1, T, *f) and other (..., 1, A, T, *f)."""
    axis = x.ndim - feature_axes - 2
    return jnp.expand_dims(x, axis + 1), jnp.expand_dims(x, axis)


def _pair_mask(valid: jax.Array, obstacles: jax.Array | None = None) -> jax.Array:
    """(..., A, T) -> (..., A, A, T): both valid, not the same object, and the other one
    an obstacle (``obstacles``: (A,) bool; None: every object)."""
    ego, other = _pairs(valid, 0)
    a = valid.shape[-2]
    mask = ego & other & ~jnp.eye(a, dtype=bool)[:, :, None]
    if obstacles is not None:
        mask = mask & obstacles[None, :, None]
    return mask


def distance_to_nearest_object(
    xy: jax.Array, yaw: jax.Array, valid: jax.Array, length: jax.Array, width: jax.Array,
    corner_rounding: float = CORNER_ROUNDING, obstacles: jax.Array | None = None,
) -> jax.Array:
    """Signed distance to the nearest other valid object, boxes with rounded corners.

    Each box is the set of points within r = ``corner_rounding`` x min(length, width) / 2
    of its core, the box shrunk by r on every side (0: the sharp box; 1: a capsule), as
    the challenge's interaction features model objects. The distance between two such
    shapes is the signed distance between their cores minus both radii.

    Args:
      xy: (..., A, T, 2); yaw, valid: (..., A, T); length, width: (A,).
      corner_rounding: in [0, 1] (static).
      obstacles: optional (A,) bool, the objects others can be near (None: all).
    Returns:
      (..., A, T) float32, metres (< 0: overlapping); ``FAR_DISTANCE`` where no other
      object is valid.
    """
    radius = corner_rounding * jnp.minimum(length, width) / 2
    xy_e, xy_o = _pairs(xy, 1)
    yaw_e, yaw_o = _pairs(yaw, 0)
    size = lambda s: jnp.broadcast_to(s[:, None], yaw.shape[-2:])  # noqa: E731
    len_e, len_o = _pairs(size(length - 2 * radius), 0)
    wid_e, wid_o = _pairs(size(width - 2 * radius), 0)
    r_e, r_o = _pairs(size(radius), 0)
    d = box_signed_distance(xy_e, yaw_e, len_e, wid_e, xy_o, yaw_o, len_o, wid_o) - r_e - r_o
    d = jnp.where(_pair_mask(valid, obstacles), d, FAR_DISTANCE)
    return jnp.min(d, axis=-2)


def time_to_collision(
    xy: jax.Array, yaw: jax.Array, valid: jax.Array, length: jax.Array, width: jax.Array,
    speed: jax.Array, speed_valid: jax.Array, obstacles: jax.Array | None = None,
) -> jax.Array:
    """Time until each object reaches the object it follows, at constant speeds.

    The followed object is the nearest (by longitudinal gap) valid object that is ahead
    of the front bumper, heading within 75 deg, overlapping the straight trail laterally,
    and heading within 10 deg if that overlap is under 0.5 m (see the module docstring).

    Args:
      xy: (..., A, T, 2); yaw, valid: (..., A, T); length, width: (A,);
      speed, speed_valid: (..., A, T) from ``kinematic_features``.
      obstacles: optional (A,) bool, the objects others can follow (None: all).
    Returns:
      (..., A, T) float32 seconds in [0, ``TTC_MAX``].
    """
    xy_e, xy_o = _pairs(xy, 1)
    yaw_e, yaw_o = _pairs(yaw, 0)
    rel = geometry.to_local(xy_o, xy_e, yaw_e)  # other's centre in the ego frame
    yaw_diff = jnp.abs(wrap_angle(yaw_o - yaw_e))
    cd, sd = jnp.abs(jnp.cos(yaw_diff)), jnp.abs(jnp.sin(yaw_diff))
    half_len = (0.5 * length)[:, None]  # (A, 1), broadcast over T
    half_wid = (0.5 * width)[:, None]
    hl_e, hl_o = half_len[:, None], half_len[None]  # (A, 1, 1), (1, A, 1)
    hw_e, hw_o = half_wid[:, None], half_wid[None]
    # Extents of the other box along the ego's heading and across it.
    long_extent = hl_o * cd + hw_o * sd
    lat_extent = hl_o * sd + hw_o * cd
    gap = rel[..., 0] - hl_e - long_extent
    lat_overlap = jnp.abs(rel[..., 1]) - hw_e - lat_extent  # < 0: in the trail
    following = (
        (gap > 0) & (yaw_diff <= TTC_MAX_HEADING_DIFF) & (lat_overlap < 0)
        & ((lat_overlap < -TTC_SMALL_OVERLAP) | (yaw_diff <= TTC_MAX_HEADING_DIFF_SMALL_OVERLAP))
        & _pair_mask(valid, obstacles)
    )
    gap = jnp.where(following, gap, FAR_DISTANCE)
    ahead = jnp.argmin(gap, axis=-2)  # (..., A, T)
    gap_ahead = jnp.take_along_axis(gap, ahead[..., None, :], axis=-2)[..., 0, :]
    _, speed_o = _pairs(speed, 0)
    _, speed_ok_o = _pairs(speed_valid, 0)
    speed_o = jnp.broadcast_to(speed_o, gap.shape)
    speed_ok_o = jnp.broadcast_to(speed_ok_o, gap.shape)
    speed_ahead = jnp.take_along_axis(speed_o, ahead[..., None, :], axis=-2)[..., 0, :]
    speed_ok = speed_valid & jnp.take_along_axis(
        speed_ok_o, ahead[..., None, :], axis=-2)[..., 0, :]
    closing = speed - speed_ahead
    ok = speed_ok & (closing > 0) & (gap_ahead < FAR_DISTANCE)
    ttc = jnp.where(ok, gap_ahead / jnp.where(ok, closing, 1.0), TTC_MAX)
    return jnp.minimum(ttc, TTC_MAX).astype(jnp.float32)


# --------------------------------------------------------------------------- map


def distance_to_road_edge(
    index: RoadIndex, roadgraph: Roadgraph, xy: jax.Array, yaw: jax.Array,
    length: jax.Array, width: jax.Array,
) -> jax.Array:
    """Largest signed road-edge distance over the box's corners (> 0: off-road).

    Uses the scenario's road index (``road_index.offroad_distance``: +inf beyond the
    grid when the map has edges, ``geometry.NO_EDGE_DISTANCE`` when it has none).

    Args:
      index, roadgraph: one scenario's.
      xy: (..., A, T, 2); yaw: (..., A, T); length, width: (A,).
    Returns:
      (..., A, T) float32, metres.
    """
    corners = geometry.box_corners(xy, yaw, length[:, None], width[:, None])
    return jnp.max(road_index_lib.offroad_distance(index, roadgraph, corners), axis=-1)


def red_light_crossings(
    xy: jax.Array, yaw: jax.Array, valid: jax.Array, lights: TrafficLights,
    roadgraph: Roadgraph, half_width: float = STOP_LINE_HALF_WIDTH,
) -> jax.Array:
    """Steps at which an object crosses the stop line of a red light.

    The stop line of light k is the segment through ``stop_xy`` across its lane's
    direction there (the direction of the lane's centre-line point nearest the stop
    point), ``half_width`` to either side. Object a crosses it at step t when its centre
    goes from behind the line (step t-1) to on or past it (step t), within the band, with
    its heading within 90 deg of the lane's, both steps valid, and the light valid and red
    (``STOP`` or ``ARROW_STOP``; a flashing red acts as a stop sign) at step t.

    Args:
      xy: (..., A, T, 2); yaw, valid: (..., A, T).
      lights: ``TrafficLights`` with TL lights over the same T steps.
      roadgraph: the scenario's roadgraph (lane centre lines carry the lane ids).
      half_width: metres.
    Returns:
      (..., A, T) bool, False at step 0.
    """
    u = signals.stop_directions(lights, roadgraph)  # (TL, 2)
    red = jnp.swapaxes(signals.is_red(lights.state, lights.valid), 0, 1)  # (T, TL)
    prev_xy = jnp.concatenate([xy[..., :1, :], xy[..., :-1, :]], axis=-2)
    cross = signals.red_light_crossing(
        jnp.swapaxes(prev_xy, -2, -3), jnp.swapaxes(xy, -2, -3), jnp.swapaxes(yaw, -1, -2),
        lights.stop_xy, u, red, half_width)  # (..., T, A)
    both_valid = jnp.concatenate(
        [jnp.zeros_like(valid[..., :1]), valid[..., 1:] & valid[..., :-1]], axis=-1)
    return jnp.swapaxes(cross, -1, -2) & both_valid


# --------------------------------------------------------------------------- features


def compute_features(
    traj: Trajectories, length: jax.Array, width: jax.Array, index: RoadIndex,
    roadgraph: Roadgraph, red_light: jax.Array | None = None, dt: float = STEP_SECONDS,
    obstacles: jax.Array | None = None,
) -> Features:
    """All WOSAC features of a set of trajectories (logged or simulated).

    Args:
      traj: ``Trajectories`` with fields (..., A, T[, 2]).
      length, width: (A,) float32 box sizes, metres.
      index, roadgraph: the scenario's road index and roadgraph.
      red_light: optional (..., A, T) bool, the object crossed a red light's stop line at
        that step (provided by the simulator; all False when None).
      dt: seconds per step.
      obstacles: optional (A,) bool, the objects that count in the interaction features
        (nearest object, collisions, time to collision); None: every object.
    Returns:
      ``Features`` with fields (..., A, T).
    """
    xy, yaw, valid = traj.xy, traj.yaw, traj.valid
    speed, accel, ang_speed, ang_accel, speed_valid, accel_valid = kinematic_features(
        xy, yaw, valid, dt)
    dist = distance_to_nearest_object(xy, yaw, valid, length, width, obstacles=obstacles)
    ttc = time_to_collision(xy, yaw, valid, length, width, speed, speed_valid, obstacles)
    edge = distance_to_road_edge(index, roadgraph, xy, yaw, length, width)
    red = jnp.zeros(valid.shape, bool) if red_light is None else red_light.astype(bool)
    return Features(
        linear_speed=speed, linear_acceleration=accel, angular_speed=ang_speed,
        angular_acceleration=ang_accel, distance_to_nearest_object=dist,
        collision_indication=dist < 0, time_to_collision=ttc, distance_to_road_edge=edge,
        offroad_indication=edge > 0, traffic_light_violation=red & valid, valid=valid,
        speed_valid=speed_valid, accel_valid=accel_valid,
    )


# --------------------------------------------------------------------------- likelihoods


def _bin_index(values: jax.Array, feature: HistogramFeature) -> jax.Array:
    span = feature.max_val - feature.min_val
    scaled = (values - feature.min_val) * (feature.num_bins / span)
    scaled = jnp.where(jnp.isnan(scaled), 0.0, scaled)
    return jnp.clip(jnp.floor(scaled), 0, feature.num_bins - 1).astype(jnp.int32)


def histogram_log_likelihood(
    log_values: jax.Array, sim_values: jax.Array, sim_valid: jax.Array,
    feature: HistogramFeature,
) -> jax.Array:
    """Log probability of each logged value under the smoothed histogram of the simulated
    values: p(bin) = (count(bin) + c) / (n + num_bins * c).

    Args:
      log_values: (A, T) float32.
      sim_values: (R, A, T) float32; sim_valid: (R, A, T) bool, samples to count.
      feature: histogram range, bins, pseudocount c, and ``independent_timesteps`` (one
        histogram per object over all R x T samples) or not (one per object and step).
    Returns:
      (A, T) float32, natural log.
    """
    b = feature.num_bins
    hot = jax.nn.one_hot(_bin_index(sim_values, feature), b, dtype=jnp.float32)
    counts = jnp.sum(hot * sim_valid[..., None], axis=0)  # (A, T, B)
    if feature.independent_timesteps:
        counts = jnp.sum(counts, axis=-2, keepdims=True)  # (A, 1, B)
    c = jnp.float32(feature.pseudocount)
    log_p = jnp.log(counts + c) - jnp.log(jnp.sum(counts, -1, keepdims=True) + b * c)
    log_p = jnp.broadcast_to(log_p, log_values.shape + (b,))
    idx = _bin_index(log_values, feature)[..., None]
    return jnp.take_along_axis(log_p, idx, axis=-1)[..., 0]


def bernoulli_log_likelihood(
    log_values: jax.Array, sim_values: jax.Array, feature: BernoulliFeature
) -> jax.Array:
    """Log probability of each logged indication under the smoothed frequency of the
    simulated ones: p(true) = (k + c) / (R + 2c), k = rollouts with the event.

    Args:
      log_values: (A,) bool. sim_values: (R, A) bool.
    Returns:
      (A,) float32, natural log.
    """
    r = sim_values.shape[0]
    c = jnp.float32(feature.pseudocount)
    k = jnp.sum(sim_values.astype(jnp.float32), axis=0)
    p_true = (k + c) / (r + 2 * c)
    return jnp.where(log_values, jnp.log(p_true), jnp.log1p(-p_true))


def _masked_mean(x: jax.Array, mask: jax.Array, axis) -> jax.Array:
    n = jnp.sum(mask, axis=axis)
    return jnp.sum(jnp.where(mask, x, 0.0), axis=axis) / jnp.maximum(n, 1)


def scores_from_features(
    sim: Features, log: Features, evaluated: jax.Array, config: WosacConfig = WOSAC_2025,
    init_steps: int = 0,
) -> dict[str, jax.Array]:
    """Feature likelihoods, meta-metric and group scores from precomputed features.

    Args:
      sim: ``Features`` with fields (R, A, T); log: ``Features`` with fields (A, T).
      evaluated: (A,) bool, objects scored (the others only act as obstacles).
      config: the WOSAC feature configuration (static).
      init_steps: steps [0, init_steps) are context (history) and not scored (static).
    Returns:
      ``"<feature>"``: () likelihood in [0, 1] over scored objects (``config.aggregation``);
      ``"<feature>/per_object"``: (A,) likelihood (1 for objects not scored);
      ``"metametric"``, ``"kinematic"``, ``"interactive"``, ``"map_based"``: ();
      ``"simulated_collision_rate"``, ``"simulated_offroad_rate"``,
      ``"simulated_traffic_light_violation_rate"``: () fraction of (rollout, scored
      object) pairs with the event.
    """
    cut = lambda x: x[..., init_steps:]  # noqa: E731
    out = {}
    for name in HISTOGRAM_FEATURES:
        log_ok = cut(log.feature_valid(name))
        ll = histogram_log_likelihood(
            cut(getattr(log, name)), cut(getattr(sim, name)), cut(sim.feature_valid(name)),
            getattr(config, name))
        scored = evaluated & jnp.any(log_ok, axis=-1)
        per_object = jnp.exp(_masked_mean(ll, log_ok, axis=-1))
        out[name + "/per_object"] = jnp.where(scored, per_object, 1.0)
        if config.aggregation == "log_mean":
            out[name] = jnp.exp(_masked_mean(ll, log_ok & scored[..., None], axis=(-2, -1)))
        else:
            out[name] = _masked_mean(per_object, scored, axis=-1)
    rates = {"collision_indication": "simulated_collision_rate",
             "offroad_indication": "simulated_offroad_rate",
             "traffic_light_violation": "simulated_traffic_light_violation_rate"}
    for name in BERNOULLI_FEATURES:
        log_ok = cut(log.valid)
        log_any = jnp.any(cut(getattr(log, name)) & log_ok, axis=-1)
        sim_any = jnp.any(cut(getattr(sim, name)) & log_ok & cut(sim.valid), axis=-1)
        ll = bernoulli_log_likelihood(log_any, sim_any, getattr(config, name))
        scored = evaluated & jnp.any(log_ok, axis=-1)
        per_object = jnp.exp(ll)
        out[name + "/per_object"] = jnp.where(scored, per_object, 1.0)
        if config.aggregation == "log_mean":
            out[name] = jnp.exp(_masked_mean(ll, scored, axis=-1))
        else:
            out[name] = _masked_mean(per_object, scored, axis=-1)
        out[rates[name]] = _masked_mean(
            sim_any.astype(jnp.float32), jnp.broadcast_to(scored, sim_any.shape),
            axis=(0, 1))
    out["metametric"] = sum(config.weight(n) * out[n] for n in FEATURE_NAMES)
    for group, names in GROUPS.items():
        total = sum(config.weight(n) for n in names)
        out[group] = sum(config.weight(n) * out[n] for n in names) / total
    return out


def displacement_errors(
    sim: Trajectories, log: Trajectories, evaluated: jax.Array, init_steps: int = 0
) -> tuple[jax.Array, jax.Array]:
    """ADE and minADE over the scored steps.

    Per rollout: each evaluated object's mean distance to its log over the steps valid in
    the log, averaged over objects; ADE = mean over rollouts, minADE = min over rollouts.

    Args:
      sim: fields (R, A, T[, 2]); log: fields (A, T[, 2]); evaluated: (A,) bool.
    Returns:
      ade, min_ade: () float32, metres.
    """
    d = jnp.linalg.norm(sim.xy - log.xy, axis=-1)[..., init_steps:]  # (R, A, T')
    ok = log.valid[..., init_steps:]
    per_object = _masked_mean(d, ok, axis=-1)  # (R, A)
    scored = evaluated & jnp.any(ok, axis=-1)
    per_rollout = _masked_mean(per_object, jnp.broadcast_to(scored, per_object.shape), -1)
    return jnp.mean(per_rollout), jnp.min(per_rollout)


def realism_scores(
    sim: Trajectories, log: Trajectories, length: jax.Array, width: jax.Array,
    evaluated: jax.Array, index: RoadIndex, roadgraph: Roadgraph,
    sim_red_light: jax.Array | None = None, log_red_light: jax.Array | None = None,
    config: WosacConfig = WOSAC_2025, init_steps: int = 0, dt: float = STEP_SECONDS,
    rollout_batch: int | None = 8, traffic_lights: TrafficLights | None = None,
) -> dict[str, jax.Array]:
    """WOSAC realism scores of one scenario's rollouts against its log.

    Pure and un-jitted; jit with ``config``, ``init_steps``, ``dt`` and ``rollout_batch``
    static, vmap over scenarios.

    Args:
      sim: ``Trajectories`` (R, A, T[, 2]): R rollouts of all A objects over the whole
        window, the first ``init_steps`` steps being the logged history.
      log: ``Trajectories`` (A, T[, 2]).
      length, width: (A,) float32 box sizes, metres.
      evaluated: (A,) bool, objects scored.
      index, roadgraph: the scenario's road index and roadgraph.
      sim_red_light, log_red_light: optional (R, A, T) / (A, T) bool red-light crossings.
      config: feature configuration (default the 2025 challenge's).
      init_steps: context steps at the start, not scored. With ``init_steps > 0`` the
        obstacles of the interaction features are the objects valid in the log at the
        current step ``init_steps - 1``, as in Waymo's package: a track that appears
        later is nobody's obstacle.
      dt: seconds per step.
      rollout_batch: rollouts whose features are computed at once (``lax.map`` batch
        size; None: all R). The pairwise terms hold (R, A, A, T) arrays, ~1.5 GB per
        float32 intermediate at R = 32, A = 128, T = 91; batching bounds that.
      traffic_lights: optional logged light states over the same T steps; where a
        ``*_red_light`` array is not given, it is derived by ``red_light_crossings``.
    Returns:
      The dict of ``scores_from_features`` plus ``"ade"`` and ``"min_ade"`` (metres).
    """
    if traffic_lights is not None:
        if sim_red_light is None:
            sim_red_light = red_light_crossings(sim.xy, sim.yaw, sim.valid, traffic_lights,
                                                roadgraph)
        if log_red_light is None:
            log_red_light = red_light_crossings(log.xy, log.yaw, log.valid, traffic_lights,
                                                roadgraph)
    obstacles = log.valid[..., init_steps - 1] if init_steps > 0 else None
    with jax.named_scope("wosac_features"):
        sim_f = jax.lax.map(
            lambda args: compute_features(args[0], length, width, index, roadgraph,
                                          args[1], dt, obstacles),
            (sim, sim_red_light), batch_size=rollout_batch)
        log_f = compute_features(log, length, width, index, roadgraph, log_red_light, dt,
                                 obstacles)
    out = scores_from_features(sim_f, log_f, evaluated, config, init_steps)
    out["ade"], out["min_ade"] = displacement_errors(sim, log, evaluated, init_steps)
    return out

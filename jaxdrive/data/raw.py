"""The neutral, unpadded scene every reader produces and the converter consumes.

Readers (``womd.py`` for WOMD protos, ``json_scene.py`` for GPUDrive/PufferDrive JSON)
fill a ``RawScene`` in float64 world coordinates; ``convert.py`` turns it into the padded
float32 ``Scenario`` arrays. Nothing here depends on JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdrive.types import (
    NUM_OBJECT_TYPES,
    NUM_ROAD_TYPES,
    ObjectType,
    RoadType,
    TrafficLightState,
)


class SceneError(ValueError):
    """A scene cannot be used (no valid SDC, malformed fields, ...).

    Converters catch it and record the scene as skipped with this message as the reason.
    """


@dataclasses.dataclass
class RawScene:
    """One logged scene, unpadded (``N`` objects, ``T`` steps, ``P`` road points, ``K``
    polylines, ``TL`` traffic-light lanes).

    Attributes:
      scenario_id: the dataset's id string.
      source: where it came from (file, and record index for TFRecords).
      xy: (N, T, 2) float64, world frame metres (filler where invalid).
      yaw: (N, T) float64, radians.
      vel: (N, T, 2) float64, m/s.
      valid: (N, T) bool.
      length, width: (N,) float64, box size.
      object_type: (N,) int32, ``ObjectType``.
      object_id: (N,) int64, the dataset's track ids.
      sdc_index: index of the self-driving car, -1 if the scene names none.
      of_interest, to_predict: (N,) bool.
      expert: (N,) bool, the JSON format's ``mark_as_expert`` (False for WOMD).
      road_xy: (P, 2) float64, polyline points, polylines concatenated.
      road_start: (K + 1,) int64, polyline ``k`` is ``road_xy[road_start[k]:road_start[k+1]]``.
      road_type: (K,) int32, ``RoadType``.
      road_id: (K,) int64, map feature ids.
      lane_exits: feature id of a lane -> feature ids of the lanes it exits to.
      tl_lane: (TL,) int64, feature id of each signal-controlled lane.
      tl_state: (TL, T) int32, ``TrafficLightState``.
      tl_valid: (TL, T) bool.
      tl_stop_xy: (TL, 2) float64, stop point.
      current_time_index: the WOMD "current" step, if the source gives one.
      sdc_inferred: how the SDC was chosen when the source names none (``infer_sdc``'s
        rule name), None when the source gives it.
      notes: remarks made while reading (units guessed, unknown types, ...).
    """

    scenario_id: str
    source: str
    xy: np.ndarray
    yaw: np.ndarray
    vel: np.ndarray
    valid: np.ndarray
    length: np.ndarray
    width: np.ndarray
    object_type: np.ndarray
    object_id: np.ndarray
    sdc_index: int
    of_interest: np.ndarray
    to_predict: np.ndarray
    expert: np.ndarray
    road_xy: np.ndarray
    road_start: np.ndarray
    road_type: np.ndarray
    road_id: np.ndarray
    lane_exits: dict[int, list[int]]
    tl_lane: np.ndarray
    tl_state: np.ndarray
    tl_valid: np.ndarray
    tl_stop_xy: np.ndarray
    current_time_index: int | None = None
    sdc_inferred: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def num_objects(self) -> int:
        """() int: N, objects in the scene."""
        return self.xy.shape[0]

    @property
    def num_steps(self) -> int:
        """() int: T, logged steps."""
        return self.xy.shape[1]

    @property
    def num_road_points(self) -> int:
        """() int: P, road points over all polylines."""
        return self.road_xy.shape[0]

    @property
    def num_polylines(self) -> int:
        """() int: K, polylines (map features)."""
        return self.road_type.shape[0]

    def check(self) -> RawScene:
        """Raise ``SceneError`` if array shapes disagree with each other or any value the
        conversion uses is unusable (``value_problems``); return self."""
        n, t = self.valid.shape if self.valid.ndim == 2 else (-1, -1)
        k = self.road_type.shape[0]
        tl = self.tl_lane.shape[0]
        expect = {
            "xy": (n, t, 2), "yaw": (n, t), "vel": (n, t, 2), "length": (n,), "width": (n,),
            "object_type": (n,), "object_id": (n,), "of_interest": (n,), "to_predict": (n,),
            "expert": (n,), "road_start": (k + 1,), "road_id": (k,), "tl_state": (tl, t),
            "tl_valid": (tl, t), "tl_stop_xy": (tl, 2),
        }
        for name, shape in expect.items():
            got = getattr(self, name).shape
            if got != shape:
                raise SceneError(f"{self.source}: field '{name}' has shape {got}, expected "
                                 f"{shape}; the file is malformed.")
        if self.road_xy.ndim != 2 or self.road_xy.shape[1] != 2:
            raise SceneError(f"{self.source}: road points must be (P, 2), got "
                             f"{self.road_xy.shape}.")
        if k and (self.road_start[0] != 0 or self.road_start[-1] != self.road_xy.shape[0]
                  or np.any(np.diff(self.road_start) < 1)):
            raise SceneError(f"{self.source}: polyline offsets are inconsistent (empty "
                             "polyline or wrong point count).")
        problems = self.value_problems()
        if problems:
            more = f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
            raise SceneError(f"{self.source}: {'; '.join(problems[:6])}{more}.")
        return self

    def value_problems(self) -> list[str]:
        """Every unusable value the conversion would read, one message each (empty if none).

        Checked where they are used: positions, headings and velocities at valid steps
        (finite, within ``MAX_COORD`` m / ``MAX_HEADING`` rad / ``MAX_SPEED`` m/s); box
        sizes of objects valid at some step (in [``MIN_SIZE``, ``MAX_SIZE``] m); road points
        and stop points (finite, within ``MAX_COORD``); object, road and traffic-light
        types in range; flags boolean. Invalid steps may hold anything (they are masked).
        """
        problems = []
        for name in ("valid", "tl_valid", "of_interest", "to_predict", "expert"):
            if getattr(self, name).dtype != np.bool_:
                problems.append(f"'{name}' must be booleans, got {getattr(self, name).dtype}")
        if problems:
            return problems
        valid = self.valid
        for what, values, limit in (("position", self.xy, MAX_COORD),
                                    ("heading", self.yaw, MAX_HEADING),
                                    ("velocity", self.vel, MAX_SPEED)):
            bad = valid & ~_within(values, limit, valid.ndim)
            if bad.any():
                i, s = np.argwhere(bad)[0]
                problems.append(
                    f"{self._object(i)}: {what} at step {s} is {_fmt(values[i, s])} (must be "
                    f"finite, |{what}| <= {limit:g}; {int(bad.sum())} valid steps affected)")
        present = valid.any(axis=1)
        for what, values in (("length", self.length), ("width", self.width)):
            bad = present & ~((values >= MIN_SIZE) & (values <= MAX_SIZE))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                problems.append(f"{self._object(i)}: {what} {_fmt(values[i])} must be in "
                                f"[{MIN_SIZE:g}, {MAX_SIZE:g}] m ({int(bad.sum())} objects "
                                "affected)")
        for what, values in (("road point", self.road_xy),
                             ("traffic-light stop point", self.tl_stop_xy)):
            bad = ~_within(values, MAX_COORD, 1)
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                problems.append(f"{what} {j} is {_fmt(values[j])} (must be finite, |x|, |y| <= "
                                f"{MAX_COORD:g}; {int(bad.sum())} affected)")
        for what, values, count in (("object type", self.object_type, NUM_OBJECT_TYPES),
                                    ("road type", self.road_type, NUM_ROAD_TYPES),
                                    ("traffic-light state", self.tl_state[self.tl_valid],
                                     len(TrafficLightState))):
            bad = (values < 0) | (values >= count)
            if bad.any():
                problems.append(f"{what} {int(values[bad][0])} is not one of 0..{count - 1}")
        return problems

    def _object(self, i) -> str:
        """How messages name object ``i``: ``objects[i] (id X)``."""
        return f"objects[{int(i)}] (id {int(self.object_id[i])})"


# Largest magnitudes a usable scene holds (anything beyond is corrupt data, and would
# overflow float32 arithmetic downstream).
MAX_COORD = 1e7  # m, world coordinates (WOMD: kilometres)
MAX_SPEED = 1e3  # m/s
MAX_HEADING = 1e3  # rad (after reading degrees as such)
MIN_SIZE, MAX_SIZE = 1e-3, 1e3  # m, box length and width


def _within(values: np.ndarray, limit: float, mask_ndim: int) -> np.ndarray:
    """Whether every component is finite with magnitude <= ``limit``, reduced over the
    axes beyond the first ``mask_ndim`` ((N, T, 2) -> (N, T) with ``mask_ndim`` 2)."""
    ok = np.abs(values) <= limit  # False for NaN
    return ok.all(axis=tuple(range(mask_ndim, ok.ndim)))


def _fmt(value) -> str:
    """A number or small array, short."""
    if np.ndim(value):
        return "(" + ", ".join(f"{v:g}" for v in np.ravel(value)) + ")"
    return f"{value:g}"


MOVING_SPEED = 2.0  # m/s: faster than this, a vehicle's heading is its direction of motion
MIN_MOVING_STEPS = 5  # fewer moving object-steps than this say nothing about headings
HEADING_DISAGREES = 0.5  # rad: a median heading error beyond this is a problem


def heading_motion_error(yaw: np.ndarray, vel: np.ndarray,
                         valid: np.ndarray) -> tuple[float, int] | None:
    """Median angle (rad, in [0, pi]) between the heading and the direction of the
    velocity over the valid steps faster than ``MOVING_SPEED``, and how many there are;
    None when fewer than ``MIN_MOVING_STEPS``.

    Args:
      yaw: (..., T) headings, radians.
      vel: (..., T, 2) velocities.
      valid: (..., T) bool.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # unchecked input: inf, NaN
        speed = np.linalg.norm(vel, axis=-1)
        moving = valid & np.isfinite(speed) & np.isfinite(yaw) & (speed > MOVING_SPEED)
    n = int(moving.sum())
    if n < MIN_MOVING_STEPS:
        return None
    motion = np.arctan2(vel[..., 1], vel[..., 0])[moving]
    error = np.abs(np.angle(np.exp(1j * (yaw[moving] - motion))))
    return float(np.median(error)), n


MOVING_MIN_REACH_M = 2.0  # a track that never gets this far from where it starts is parked


def track_reach(xy: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(N,) float64 metres: how far each track gets from its first valid position (the
    largest distance over its valid steps; 0 for a track valid at fewer than 2 steps).
    Unlike a path length it does not grow with a parked car's position noise.

    Args:
      xy: (N, T, 2) positions.
      valid: (N, T) bool.
    """
    first = np.argmax(valid, axis=1)
    start = xy[np.arange(xy.shape[0]), first]  # (N, 2)
    with np.errstate(over="ignore", invalid="ignore"):  # unchecked input: inf, NaN
        d = np.linalg.norm(xy - start[:, None, :], axis=-1)
    return np.where(valid & np.isfinite(d), d, 0.0).max(axis=1, initial=0.0)


def infer_sdc(valid: np.ndarray, object_type: np.ndarray, flagged: np.ndarray,
              xy: np.ndarray) -> tuple[int, str | None]:
    """Choose the self-driving car of a scene whose source names none.

    Rule: the first object flagged ``is_sdc``; else a vehicle that drives: among the
    vehicles valid at every step that move (``track_reach`` at least
    ``MOVING_MIN_REACH_M``), the one that gets farthest (``"moving_full_track"``); else
    among the moving vehicles, the one with the most valid steps, then the farthest
    (``"moving_vehicle"``); else (no vehicle moves) the vehicle with the most valid steps
    (``"longest_vehicle_track"``). Ties go to the lowest index.

    Args:
      valid: (N, T) bool.
      object_type: (N,) int32, ``ObjectType``.
      flagged: (N,) bool, the source's per-object SDC flag (all False if absent).
      xy: (N, T, 2) positions.
    Returns:
      (index, rule): the object index and the rule's name, or (-1, None) when the scene
      has no vehicle valid at any step.
    """
    if flagged.any():
        return int(np.flatnonzero(flagged)[0]), "is_sdc"
    vehicles = np.flatnonzero(object_type == ObjectType.VEHICLE)
    if vehicles.shape[0] == 0:
        return -1, None
    steps = valid[vehicles].sum(axis=1)
    if steps.max() == 0:
        return -1, None
    reach = track_reach(xy[vehicles], valid[vehicles])
    moving = reach >= MOVING_MIN_REACH_M
    full = steps == valid.shape[1]
    # np.argmax and the stable np.lexsort (last key primary) give ties the lowest index.
    if (moving & full).any():
        order = np.where(moving & full, reach, -1.0)
        return int(vehicles[np.argmax(order)]), "moving_full_track"
    if moving.any():
        best = np.lexsort((-reach, -np.where(moving, steps, -1)))[0]
        return int(vehicles[best]), "moving_vehicle"
    return int(vehicles[np.argmax(steps)]), "longest_vehicle_track"


def close_polygon(points: np.ndarray) -> np.ndarray:
    """(n, 2) polygon outline -> the same with the first point repeated at the end (once)."""
    if points.shape[0] >= 2 and not np.array_equal(points[0], points[-1]):
        return np.concatenate([points, points[:1]], axis=0)
    return points


POLYGON_TYPES = (RoadType.CROSSWALK, RoadType.SPEED_BUMP, RoadType.DRIVEWAY)


def pack_polylines(polylines: list[tuple[np.ndarray, int, int]]):
    """[(points (n, 2), RoadType, feature id)] -> (road_xy, road_start, road_type, road_id).

    Empty polylines are left out (the caller counts them); polygons get closed.
    """
    pts, types, ids, lens = [], [], [], []
    for points, rtype, fid in polylines:
        if points.shape[0] == 0:
            continue
        if rtype in POLYGON_TYPES:
            points = close_polygon(points)
        pts.append(points)
        types.append(int(rtype))
        ids.append(int(fid))
        lens.append(points.shape[0])
    road_xy = np.concatenate(pts, axis=0) if pts else np.zeros((0, 2), np.float64)
    start = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=start[1:])
    return (road_xy.astype(np.float64), start, np.asarray(types, np.int32),
            np.asarray(ids, np.int64))

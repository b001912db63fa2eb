"""``RawScene`` -> padded ``Scenario`` arrays (NumPy) plus a report of what did not fit.

Conventions of a converted scene:

- Coordinates are metres relative to the scene origin, the SDC's logged position at
  ``init_step`` (float64 world minus origin, then float32: WOMD's kilometre-scale world
  coordinates would lose centimetres in float32). The origin is kept in the metadata.
- Agents: objects never valid in the kept steps are dropped (``dropped_invalid_agents``).
  When more remain than ``max_agents``, slots go, in order, to the SDC, objects of
  interest, tracks to predict, the other objects present at ``init_step`` (nearest to
  the SDC first), then the objects that appear later or left before (by distance at
  their first valid step), ties by original index: the scene as it was at the start
  stays whole. The SDC is slot 0. ``truncated_agents`` counts what was dropped,
  ``truncated_present_agents`` the dropped ones that were present at ``init_step``.
- Goals: each agent's final valid logged position.
- Time: the first ``num_steps`` logged steps; shorter logs are padded as invalid.
- Road points: lanes first (polyline ids ``0..L-1``, the nearest ``max_lanes`` lanes if
  there are more), then the other polylines (ids ``>= L``). A map that fits
  ``max_road_points`` is kept point for point. Otherwise every polyline is simplified
  shape-preservingly (Douglas-Peucker, ``simplify.py``): a point is removed only while
  the simplified polyline stays within ``road_tolerance`` of the original, so corners
  stay and nearly collinear points go (``simplified_road_points``). If that still does
  not fit, the smallest coarser tolerance that fits (up to ``max_road_tolerance``) is
  used, first for all but road edges, then for road edges too; only then are whole
  polylines dropped, least important type and farthest from the origin first (road
  edges last). The tolerances used are recorded (``road_tolerance`` = [edges, others],
  0 = every point kept) and anything beyond ``road_tolerance`` is noted in ``notes``.
- Traffic lights: the ``max_traffic_lights`` signal lanes nearest the origin, states per
  step; ``lane_id`` is the kept lane's polyline id (-1 when the lane was not kept).

Every element left out is counted in the report.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxdrive.config import ConfigBase, check_int, check_range
from jaxdrive.data.raw import RawScene, SceneError
from jaxdrive.data.simplify import resample, significance
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.types import LaneGraph, ObjectLog, Roadgraph, RoadType, Scenario, TrafficLights

# Which polylines go first when whole polylines must be dropped (larger = dropped first).
_DROP_RANK = {RoadType.ROAD_EDGE: 0, RoadType.LANE_CENTER: 1, RoadType.STOP_SIGN: 2,
              RoadType.ROAD_LINE: 3, RoadType.CROSSWALK: 4, RoadType.SPEED_BUMP: 5,
              RoadType.DRIVEWAY: 6, RoadType.UNKNOWN: 7}

REPORT_COUNTS = (
    "truncated_agents", "dropped_invalid_agents", "truncated_road_points",
    "simplified_road_points", "dropped_polylines", "truncated_lanes",
    "truncated_lane_successors", "dropped_lane_links", "truncated_traffic_lights",
    "truncated_steps", "padded_steps", "inferred_sdc", "truncated_present_agents",
)


@dataclasses.dataclass(frozen=True)
class ConvertConfig(ConfigBase):
    """Conversion choices beyond the padded sizes.

    Attributes:
      init_step: the logged step that defines the origin and the agent ranking, and at
        which the SDC must be valid (10 in WOMD: 1.1 s of history; match the env's
        ``init_step``).
      road_tolerance: metres; when a map's points exceed ``max_road_points``, every
        polyline is simplified (Douglas-Peucker) so that it stays within this distance of
        the original; only nearly collinear points go, corners stay.
      max_road_tolerance: metres; the coarsest simplification tried (others first, then
        road edges) before whole polylines are dropped.
      road_spacing: metres; > 0 resamples every polyline at this uniform spacing before
        anything else (``simplify.resample``), the layout of procedural maps
        (``procedural.point_spacing``), so that a policy trained on them sees the
        road-point density it knows; 0 keeps the logged points. Give a
        ``max_road_points`` that holds the resampled map, or the budget's simplification
        removes the collinear points again (counted in the manifest).
    """

    init_step: int = 10
    road_tolerance: float = 0.05
    max_road_tolerance: float = 2.0
    road_spacing: float = 0.0

    def __post_init__(self):
        check_int("init_step", self.init_step, 0, 100_000)
        check_range("road_tolerance", self.road_tolerance, 0.0, 100.0)
        check_range("max_road_tolerance", self.max_road_tolerance, self.road_tolerance,
                    1000.0)
        check_range("road_spacing", self.road_spacing, 0.0, 1000.0)

    @classmethod
    def from_manifest(cls, data: dict, path: str = "") -> ConvertConfig:
        """Like ``from_dict``, also for manifests written before road simplification
        (their ``max_stride`` key is ignored)."""
        data = {k: v for k, v in dict(data or {}).items() if k != "max_stride"}
        return cls.from_dict(data, path)


# Padded sizes for converting real (WOMD) scenes, measured on the scenes in
# ../shared/data (docs/data.md, "Real-data defaults"): WOMD's tf.Example format caps a
# scene at 128 agents (Waymo's own test scene has 83); the largest map (35,218 points,
# 257 lanes) simplifies to 3,133 points at the 0.05 m tolerance; 12 signal lanes; at
# most 4 exits per lane.
# Separate from ``ScenarioConfig()``'s defaults, which procedural scenes and the presets
# use (changing those would change training results).
REAL_DATA_SIZES = {"max_agents": 128, "num_steps": 91, "max_road_points": 4096,
                   "max_lanes": 512, "max_lane_successors": 4, "max_traffic_lights": 32}


def real_data_config(**overrides) -> ScenarioConfig:
    """The padded sizes ``python -m jaxdrive.data convert`` uses by default
    (``REAL_DATA_SIZES``), with ``overrides`` (ScenarioConfig keys) applied."""
    return ScenarioConfig(**{**REAL_DATA_SIZES, **overrides})


def _fit_tolerance(sig: np.ndarray, budget: int, low: float, high: float) -> float | None:
    """Smallest tolerance in [low, high] at which at most ``budget`` of the vertices with
    significance ``sig`` are kept (kept: ``sig > tolerance``), or None."""
    if int((sig > low).sum()) <= budget:
        return low
    if budget < 0 or int((sig > high).sum()) > budget:
        return None
    finite = np.sort(sig[np.isfinite(sig)])[::-1]
    need = budget - int(np.isinf(sig).sum())  # finite vertices that may stay
    return max(low, float(finite[need])) if need < finite.shape[0] else low


def convert_scene(
    raw: RawScene, config: ScenarioConfig, convert: ConvertConfig | None = None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Pad and convert one scene.

    Args:
      raw: the scene as read.
      config: padded sizes.
      convert: conversion choices (default ``ConvertConfig()``).
    Returns:
      (arrays, info): ``arrays`` maps every ``ScenarioConfig.shapes()`` key to a NumPy
      array of that shape; ``info`` has ``scenario_id``, ``source``, ``origin`` [x, y]
      (float64 world frame), ``num_agents``, ``num_road_points`` (kept) and one count per
      ``REPORT_COUNTS`` name, plus ``notes``.
    Raises:
      SceneError: the scene has no SDC valid at ``init_step`` (or is too short), or a
        converted array is not finite.
    """
    cc = convert or ConvertConfig()
    t0 = cc.init_step
    A, T = config.max_agents, config.num_steps
    L, S, TLn = config.max_lanes, config.max_lane_successors, config.max_traffic_lights
    raw_t = raw.num_steps
    if raw_t <= t0:
        raise SceneError(f"{raw.source}: scene has {raw_t} steps; init_step {t0} needs more "
                         "(lower --init-step or use full-length logs).")
    if T <= t0:
        raise SceneError(f"{raw.source}: num_steps {T} must exceed init_step {t0}.")
    sdc = raw.sdc_index
    if not 0 <= sdc < raw.num_objects:
        raise SceneError(f"{raw.source}: no valid SDC (sdc_track_index {sdc} is not one of "
                         f"the {raw.num_objects} objects).")
    if not raw.valid[sdc, t0]:
        raise SceneError(f"{raw.source}: no valid SDC (object {sdc} is invalid at "
                         f"init_step {t0}).")
    steps = min(T, raw_t)
    origin = raw.xy[sdc, t0].astype(np.float64)
    report = {k: 0 for k in REPORT_COUNTS}
    report["truncated_steps"] = max(0, raw_t - T)
    report["padded_steps"] = max(0, T - raw_t)
    report["inferred_sdc"] = int(raw.sdc_inferred is not None)

    # ---------------------------------------------------------------- agents
    valid = raw.valid[:, :steps]
    present = valid.any(axis=1)
    report["dropped_invalid_agents"] = int((~present).sum())
    first = np.argmax(valid, axis=1)
    ref_t = np.where(valid[:, t0], t0, first)
    n = raw.num_objects
    dist = np.linalg.norm(raw.xy[np.arange(n), ref_t] - origin, axis=-1)
    at_start = raw.valid[:, t0]  # the SDC check above: t0 is a logged step
    priority = np.where(at_start, 3, 4)
    priority[raw.to_predict] = 2
    priority[raw.of_interest] = 1
    priority[sdc] = 0
    cand = np.flatnonzero(present)
    order = cand[np.lexsort((cand, dist[cand], priority[cand]))]
    keep = order[:A]
    report["truncated_agents"] = int(len(order) - len(keep))
    report["truncated_present_agents"] = int(at_start[order[A:]].sum())
    k = len(keep)

    out: dict[str, np.ndarray] = {}
    vk = valid[keep]
    xy = np.zeros((A, T, 2), np.float32)
    xy[:k, :steps] = np.where(vk[..., None], raw.xy[keep, :steps] - origin, 0.0)
    yaw = np.zeros((A, T), np.float32)
    yaw[:k, :steps] = np.where(vk, raw.yaw[keep, :steps], 0.0)
    vel = np.zeros((A, T, 2), np.float32)
    vel[:k, :steps] = np.where(vk[..., None], raw.vel[keep, :steps], 0.0)
    ok = np.zeros((A, T), bool)
    ok[:k, :steps] = vk
    last = steps - 1 - np.argmax(vk[:, ::-1], axis=1)
    goal = np.zeros((A, 2), np.float32)
    goal[:k] = raw.xy[keep, last] - origin

    def per_agent(values, dtype):
        arr = np.zeros((A,), dtype)
        arr[:k] = values[keep]
        return arr

    out["objects.xy"], out["objects.yaw"], out["objects.vel"], out["objects.valid"] = (
        xy, yaw, vel, ok)
    out["objects.length"] = per_agent(raw.length, np.float32)
    out["objects.width"] = per_agent(raw.width, np.float32)
    out["objects.type"] = per_agent(raw.object_type, np.int32)
    out["objects.goal"] = goal
    is_sdc = np.zeros(A, bool)
    is_sdc[0] = True  # the SDC always sorts first
    out["objects.is_sdc"] = is_sdc
    out["objects.of_interest"] = per_agent(raw.of_interest, bool)
    out["objects.to_predict"] = per_agent(raw.to_predict, bool)

    # ---------------------------------------------------------------- road graph
    if cc.road_spacing > 0:
        road_xy, road_start = resample(raw.road_xy, raw.road_start, cc.road_spacing)
        raw = dataclasses.replace(raw, road_xy=road_xy, road_start=road_start)
    road, lane_of_feature, road_info = _convert_roads(raw, origin, config, cc)
    out.update(road)
    report.update({key: road_info[key] for key in (
        "truncated_road_points", "simplified_road_points", "dropped_polylines",
        "truncated_lanes")})

    successors = np.full((L, S), -1, np.int32)
    lanes_valid = np.zeros(L, bool)
    lanes_valid[:len(lane_of_feature)] = True
    for fid, lane in lane_of_feature.items():
        nxt = [lane_of_feature[e] for e in raw.lane_exits.get(fid, ()) if e in lane_of_feature]
        report["dropped_lane_links"] += len(raw.lane_exits.get(fid, ())) - len(nxt)
        report["truncated_lane_successors"] += max(0, len(nxt) - S)
        successors[lane, :min(S, len(nxt))] = nxt[:S]
    out["lanes.successors"], out["lanes.valid"] = successors, lanes_valid

    # ---------------------------------------------------------------- traffic lights
    tl_n = raw.tl_lane.shape[0]
    tl_order = np.argsort(np.linalg.norm(raw.tl_stop_xy - origin, axis=-1), kind="stable")
    tl_keep = tl_order[:TLn]
    report["truncated_traffic_lights"] = int(tl_n - len(tl_keep))
    m = len(tl_keep)
    tl_lane = np.full(TLn, -1, np.int32)
    tl_lane[:m] = [lane_of_feature.get(int(f), -1) for f in raw.tl_lane[tl_keep]]
    tl_xy = np.zeros((TLn, 2), np.float32)
    tl_xy[:m] = raw.tl_stop_xy[tl_keep] - origin
    tl_state = np.zeros((TLn, T), np.int32)
    tl_state[:m, :steps] = raw.tl_state[tl_keep, :steps]
    tl_valid = np.zeros((TLn, T), bool)
    tl_valid[:m, :steps] = raw.tl_valid[tl_keep, :steps]
    out["traffic_lights.lane_id"], out["traffic_lights.stop_xy"] = tl_lane, tl_xy
    out["traffic_lights.state"] = np.where(tl_valid, tl_state, 0).astype(np.int32)
    out["traffic_lights.valid"] = tl_valid

    for key, arr in out.items():  # the readers check their values; this guards the rest
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise SceneError(f"{raw.source}: converted '{key}' is not finite; the scene "
                             "holds values out of range.")
    info = {
        "scenario_id": raw.scenario_id, "source": raw.source,
        "origin": [float(origin[0]), float(origin[1])],
        "num_agents": int(k), "num_objects_in": int(n),
        "num_road_points": int(road_info["kept_points"]),
        "num_road_points_in": int(raw.num_road_points),
        "road_tolerance": list(road_info["tolerance"]),
        "sdc_inferred": raw.sdc_inferred,
        **report, "notes": list(raw.notes) + road_info["notes"],
    }
    return out, info


def direction_source(same_next: np.ndarray) -> np.ndarray:
    """Which segment gives each point of consecutive polylines its ``Roadgraph.dir``.

    Args:
      same_next: (n,) bool, point i and point i+1 belong to the same polyline.
    Returns:
      (n,) int64, the point that starts the segment: i itself, i-1 at a polyline's last
      point, -1 for a single-point polyline (its direction is zero).
    """
    n = same_next.shape[0]
    has_prev = np.zeros(n, bool)
    has_prev[1:] = same_next[:-1]
    i = np.arange(n)
    return np.where(same_next, i, np.where(has_prev, i - 1, -1))


def segment_units(pts: np.ndarray, same_next: np.ndarray) -> np.ndarray:
    """(n, 2) pts, (n,) bool -> (n, 2): unit vector from point i to point i+1 where
    ``same_next`` (zero elsewhere and for segments shorter than 1e-9 m)."""
    seg = np.zeros_like(pts)
    seg[:-1] = pts[1:] - pts[:-1]
    seg[~same_next] = 0.0
    norm = np.linalg.norm(seg, axis=-1, keepdims=True)
    return np.where(norm > 1e-9, seg / np.maximum(norm, 1e-9), 0.0)


def polyline_directions(pts: np.ndarray, same_next: np.ndarray) -> np.ndarray:
    """``Roadgraph.dir`` of consecutive polylines.

    Args:
      pts: (n, 2) float, points; same_next: (n,) bool (see ``direction_source``).
    Returns:
      (n, 2), pts' dtype: ``segment_units`` taken by ``direction_source``.
    """
    return take_directions(segment_units(pts, same_next), direction_source(same_next))


def take_directions(units: np.ndarray, source: np.ndarray) -> np.ndarray:
    """(n, 2) segment unit vectors, (n,) ``direction_source`` -> (n, 2) point directions."""
    return np.where(source[:, None] >= 0, units[np.maximum(source, 0)], 0.0)


def _convert_roads(raw: RawScene, origin, config: ScenarioConfig, cc: ConvertConfig):
    R, L = config.max_road_points, config.max_lanes
    lens = np.diff(raw.road_start)
    kpoly = lens.shape[0]
    rtype = raw.road_type
    info = {"truncated_road_points": 0, "simplified_road_points": 0, "dropped_polylines": 0,
            "truncated_lanes": 0, "kept_points": 0, "tolerance": [0.0, 0.0], "notes": []}
    # Distance of each polyline to the origin (nearest point), for every ranking below.
    rel = raw.road_xy - origin
    pdist = np.sqrt(np.einsum("ij,ij->i", rel, rel))
    poly_dist = (np.minimum.reduceat(pdist, raw.road_start[:-1]) if kpoly
                 else np.zeros(0))
    alive = np.ones(kpoly, bool)
    lanes = np.flatnonzero(rtype == RoadType.LANE_CENTER)
    if len(lanes) > L:
        far = lanes[np.lexsort((lanes, poly_dist[lanes]))][L:]
        alive[far] = False
        info["truncated_lanes"] = int(len(far))
        info["dropped_polylines"] += int(len(far))
    is_edge = rtype == RoadType.ROAD_EDGE
    base, top = cc.road_tolerance, cc.max_road_tolerance
    owner_all = np.repeat(np.arange(kpoly), lens)
    if int(lens[alive].sum()) <= R:  # fits: every point kept as it is
        point_ok = alive[owner_all]
        tol = (0.0, 0.0)
    else:
        sig = significance(rel, raw.road_start, base)
        pt_alive, pt_edge = alive[owner_all], is_edge[owner_all]
        n_edge_base = int((pt_alive & pt_edge & (sig > base)).sum())
        t_other = _fit_tolerance(sig[pt_alive & ~pt_edge], R - n_edge_base, base, top)
        if t_other is not None:
            tol = (base, t_other)  # road edges at the finest tolerance while possible
        else:
            n_other_top = int((pt_alive & ~pt_edge & (sig > top)).sum())
            t_edge = _fit_tolerance(sig[pt_alive & pt_edge], R - n_other_top, base, top)
            if t_edge is None:
                # Drop whole polylines: least important type first, farthest first, at
                # the coarsest tolerance, until the rest fits.
                counts = np.bincount(owner_all, weights=sig > top, minlength=kpoly)
                rank = np.array([_DROP_RANK.get(int(t), 7) for t in rtype])
                cand = np.flatnonzero(alive)
                drop_order = cand[np.lexsort((-cand, -poly_dist[cand], -rank[cand]))]
                total = int(counts[alive].sum())
                for p in drop_order:
                    if total <= R:
                        break
                    alive[p] = False
                    total -= int(counts[p])
                    info["dropped_polylines"] += 1
                t_edge = top
            tol = (t_edge, top)
        point_ok = alive[owner_all] & (sig > np.where(is_edge[owner_all], tol[0], tol[1]))
        info["simplified_road_points"] = int((alive[owner_all] & (sig <= base)).sum())
    info["tolerance"] = [float(tol[0]), float(tol[1])]
    if max(tol) > base or info["dropped_polylines"] > info["truncated_lanes"]:
        info["notes"].append(
            f"road map over budget ({int(lens.sum())} points > {R}): simplified beyond "
            f"{base:g} m (edges {tol[0]:.3g} m, others {tol[1]:.3g} m), "
            f"{info['dropped_polylines'] - info['truncated_lanes']} polylines dropped")
    # Output order: kept lanes (raw order) get ids 0..; other polylines ids L + j.
    lane_sel = np.flatnonzero(alive & (rtype == RoadType.LANE_CENTER))
    other_sel = np.flatnonzero(alive & (rtype != RoadType.LANE_CENTER))
    sel = np.concatenate([lane_sel, other_sel])
    new_id = np.concatenate([np.arange(len(lane_sel)), L + np.arange(len(other_sel))])
    lane_of_feature = {int(raw.road_id[p]): int(i) for i, p in enumerate(lane_sel)}

    sel_lens = lens[sel]
    # Point indices of the selected polylines, in output order.
    starts = raw.road_start[sel]
    owner = np.repeat(np.arange(len(sel)), sel_lens)
    local = np.arange(owner.shape[0]) - np.repeat(np.cumsum(sel_lens) - sel_lens, sel_lens)
    src = np.repeat(starts, sel_lens) + local
    keep = point_ok[src]
    src, owner = src[keep], owner[keep]
    kept = src.shape[0]
    if kept > R:  # cannot happen after the fit above; guard the invariant loudly
        raise SceneError(f"{raw.source}: internal error, {kept} road points exceed {R}.")
    info["kept_points"] = kept
    info["truncated_road_points"] = int(raw.num_road_points - kept)

    pts = raw.road_xy[src] - origin
    same_next = np.zeros(kept, bool)
    same_next[:-1] = owner[1:] == owner[:-1]
    direction = polyline_directions(pts, same_next)

    xy = np.zeros((R, 2), np.float32)
    xy[:kept] = pts
    dirs = np.zeros((R, 2), np.float32)
    dirs[:kept] = direction
    types = np.zeros(R, np.int32)
    types[:kept] = rtype[sel][owner]
    ids = np.full(R, -1, np.int32)
    ids[:kept] = new_id[owner]
    ok = np.zeros(R, bool)
    ok[:kept] = True
    return ({"roadgraph.xy": xy, "roadgraph.dir": dirs, "roadgraph.type": types,
             "roadgraph.id": ids, "roadgraph.valid": ok}, lane_of_feature, info)


# ---------------------------------------------------------------------- pytree glue
def arrays_to_scenario(arrays: dict[str, Any]) -> Scenario:
    """Flat ``{"objects.xy": ...}`` arrays (batched or not) -> ``Scenario`` pytree."""
    def group(prefix, cls):
        fields = [f.name for f in dataclasses.fields(cls)]
        return cls(**{f: arrays[f"{prefix}.{f}"] for f in fields})

    return Scenario(
        roadgraph=group("roadgraph", Roadgraph), lanes=group("lanes", LaneGraph),
        traffic_lights=group("traffic_lights", TrafficLights),
        objects=group("objects", ObjectLog),
    )


def scenario_to_arrays(scenario: Scenario) -> dict[str, np.ndarray]:
    """``Scenario`` pytree -> flat NumPy arrays keyed like ``ScenarioConfig.shapes()``."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(scenario)[0]:
        name = ".".join(getattr(p, "name", str(p)) for p in path)
        out[name] = np.asarray(leaf)
    return out


def stack_arrays(items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack converted scenes on a new leading axis N."""
    if not items:
        raise ValueError("stack_arrays needs at least one scene.")
    return {key: np.stack([it[key] for it in items]) for key in items[0]}

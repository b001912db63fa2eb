"""Data augmentation of converted scenes (host-side NumPy).

``mirror_scenario`` reflects a scene across its x axis (y -> -y): ``python -m
jaxdrive.data convert --mirror`` writes that copy of every scene next to the original, for
training splits only.
"""

from __future__ import annotations

import numpy as np

from jaxdrive.data.convert import direction_source, take_directions
from jaxdrive.types import LaneGraph, ObjectLog, Roadgraph, RoadType, Scenario, TrafficLights

MIRROR_SUFFIX = "~mirror"  # appended to a mirrored copy's scenario id


def _flip_y(xy: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(..., 2), (...) bool -> (..., 2): y negated where ``mask``; padding keeps its bits."""
    out = np.array(xy, copy=True)
    out[..., 1] = np.where(mask, -xy[..., 1], xy[..., 1])
    return out


def _edge_runs(rg_type: np.ndarray, rg_id: np.ndarray, valid: np.ndarray):
    """Road-edge polylines of one map: runs of consecutive valid ROAD_EDGE points with
    one id (``Roadgraph.segment_mask``'s connectivity).

    Args:
      rg_type, rg_id: (R,) int; valid: (R,) bool.
    Returns:
      in_edge: (R,) bool, the point belongs to a road-edge polyline.
      link: (R,) bool, point i and point i+1 are consecutive points of one.
      perm: (R,) int64, the slot whose point each slot holds once every road-edge
        polyline is reversed within its slots (identity elsewhere).
    """
    r = valid.shape[0]
    in_edge = valid & (rg_type == RoadType.ROAD_EDGE)
    link = np.zeros(r, bool)
    link[:-1] = in_edge[:-1] & in_edge[1:] & (rg_id[1:] == rg_id[:-1])
    prev_link = np.concatenate([[False], link[:-1]])
    i = np.arange(r)
    start = np.maximum.accumulate(np.where(in_edge & ~prev_link, i, 0))
    end = np.minimum.accumulate(np.where(in_edge & ~link, i, r)[::-1])[::-1]
    return in_edge, link, np.where(in_edge, start + end - i, i)


def _mirror_roadgraph(xy, dirs, rg_type, rg_id, valid):
    """One map (R,): reflected points and directions, road edges reversed."""
    m_xy, m_dir = _flip_y(xy, valid), _flip_y(dirs, valid)
    in_edge, link, perm = _edge_runs(rg_type, rg_id, valid)
    if not in_edge.any():
        return m_xy, m_dir
    # The segment from new slot j to j+1 runs from old point perm[j] back to perm[j] - 1,
    # whose unit vector the old direction at perm[j] - 1 already holds: negate it rather
    # than recompute it from float32 points, so that mirroring twice is exact.
    units = np.where(link[:, None], -m_dir[np.maximum(perm - 1, 0)], 0.0).astype(dirs.dtype)
    edge_dir = take_directions(units, direction_source(link)).astype(dirs.dtype)
    return (m_xy[perm], np.where(in_edge[:, None], edge_dir, m_dir))


def mirror_scenario(scenario: Scenario) -> Scenario:
    """The scene reflected across its x axis (y -> -y), host-side.

    Transformed, at valid entries only (padding keeps its exact bits):

    - ``objects.xy``, ``objects.vel``: y negated (valid steps); ``objects.yaw`` -> ``-yaw``
      (valid steps; a range symmetric about 0 such as WOMD's [-pi, pi] stays that range).
    - ``objects.goal``: y negated (agents valid at some step).
    - ``roadgraph.xy``, ``roadgraph.dir``: y negated (valid points). A reflection swaps
      left and right, and off-road is the right side of a road-edge segment
      (``geometry.signed_distance_to_segments``), so every road-edge polyline (consecutive
      valid ``ROAD_EDGE`` points with one id) is reversed within its slots and its
      directions follow the ``Roadgraph.dir`` rule (``convert.direction_source``) on the
      reversed order. Lane centres and every other type keep their point order.
    - ``traffic_lights.stop_xy``: y negated (slots valid at some step, with a lane, or
      with a nonzero stop point).

    Unchanged: ``lanes`` (ids and connectivity), light states, object sizes, types and
    flags, road types and ids. Logged right-hand traffic becomes left-hand traffic.
    Mirroring twice gives the input back bit for bit when its road-edge directions follow
    the ``Roadgraph.dir`` rule (as converted and procedural scenes do).

    Args:
      scenario: ``Scenario`` of NumPy arrays (or anything ``np.asarray`` reads), with any
        leading batch axes.
    Returns:
      ``Scenario`` of NumPy arrays, same shapes and dtypes.
    """
    rg, obj, tl = scenario.roadgraph, scenario.objects, scenario.traffic_lights
    valid = np.asarray(obj.valid)
    objects = ObjectLog(
        xy=_flip_y(np.asarray(obj.xy), valid),
        yaw=np.where(valid, -np.asarray(obj.yaw), np.asarray(obj.yaw)),
        vel=_flip_y(np.asarray(obj.vel), valid),
        valid=valid, length=np.asarray(obj.length), width=np.asarray(obj.width),
        type=np.asarray(obj.type), goal=_flip_y(np.asarray(obj.goal), valid.any(-1)),
        is_sdc=np.asarray(obj.is_sdc), of_interest=np.asarray(obj.of_interest),
        to_predict=np.asarray(obj.to_predict),
    )
    stop_xy, tl_valid = np.asarray(tl.stop_xy), np.asarray(tl.valid)
    lane_id = np.asarray(tl.lane_id)
    used = tl_valid.any(-1) | (lane_id >= 0) | (stop_xy != 0).any(-1)
    lights = TrafficLights(lane_id=lane_id, stop_xy=_flip_y(stop_xy, used),
                           state=np.asarray(tl.state), valid=tl_valid)

    xy, dirs = np.asarray(rg.xy), np.asarray(rg.dir)
    rg_type, rg_id, rg_valid = np.asarray(rg.type), np.asarray(rg.id), np.asarray(rg.valid)
    batch = rg_valid.shape[:-1]
    r = rg_valid.shape[-1]
    flat = [a.reshape((-1, r) + a.shape[len(batch) + 1:])
            for a in (xy, dirs, rg_type, rg_id, rg_valid)]
    maps = [_mirror_roadgraph(*(a[b] for a in flat)) for b in range(flat[0].shape[0])]
    m_xy = np.stack([m[0] for m in maps]).reshape(xy.shape) if maps else xy.copy()
    m_dir = np.stack([m[1] for m in maps]).reshape(dirs.shape) if maps else dirs.copy()
    roadgraph = Roadgraph(xy=m_xy.astype(xy.dtype), dir=m_dir.astype(dirs.dtype),
                          type=rg_type, id=rg_id, valid=rg_valid)
    lanes = LaneGraph(successors=np.asarray(scenario.lanes.successors),
                      valid=np.asarray(scenario.lanes.valid))
    return Scenario(roadgraph=roadgraph, lanes=lanes, traffic_lights=lights, objects=objects)


def mirror_info(info: dict) -> dict:
    """A converted scene's record (``convert_scene``'s info) for its mirrored copy: id
    suffixed ``MIRROR_SUFFIX``, ``mirror_of`` the original id, origin y negated (the copy
    is the world reflected across its x axis)."""
    sid = str(info["scenario_id"])
    ox, oy = info["origin"]
    return {**info, "scenario_id": sid + MIRROR_SUFFIX, "mirror_of": sid,
            "origin": [float(ox), -float(oy)]}

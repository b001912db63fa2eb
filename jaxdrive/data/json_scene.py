"""GPUDrive / PufferDrive JSON scenes (WOMD converted) -> ``RawScene``.

The format: ``objects`` (per-step ``position`` {x, y, z}, ``heading``, ``velocity`` {x, y},
``valid``; ``width``, ``length``, ``goalPosition``, ``type``, ``id``, ``mark_as_expert``),
``roads`` (``geometry`` list of {x, y, z}, ``type``, ``id``), ``tl_states`` (lane id ->
{``state``: [names], ``x``, ``y``, ``time_index``}), ``metadata`` (``sdc_track_index``,
``objects_of_interest`` (track ids), ``tracks_to_predict`` ({``track_index``} or ints)).
Headings are radians; a file whose valid headings exceed 2 pi is read as degrees (older
GPUDrive converters wrote degrees) and says so in the scene's notes.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from jaxdrive.data.raw import RawScene, SceneError, pack_polylines
from jaxdrive.types import ObjectType, RoadType, TrafficLightState

_OBJECT_TYPES = {"unset": ObjectType.UNSET, "vehicle": ObjectType.VEHICLE,
                 "pedestrian": ObjectType.PEDESTRIAN, "cyclist": ObjectType.CYCLIST,
                 "other": ObjectType.OTHER}
_ROAD_TYPES = {"lane": RoadType.LANE_CENTER, "road_edge": RoadType.ROAD_EDGE,
               "road_line": RoadType.ROAD_LINE, "crosswalk": RoadType.CROSSWALK,
               "stop_sign": RoadType.STOP_SIGN, "speed_bump": RoadType.SPEED_BUMP,
               "driveway": RoadType.DRIVEWAY}
_TL_STATES = {s.name.lower(): int(s) for s in TrafficLightState}


def read_json_scene(path: str | os.PathLike) -> RawScene:
    """Read one JSON scene file.

    Raises:
      SceneError: the file is not valid JSON or misses a required field (the message
        names the file and the field).
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except json.JSONDecodeError as e:
        raise SceneError(f"{path}: malformed JSON ({e}).") from None
    except UnicodeDecodeError as e:
        raise SceneError(f"{path}: not a text JSON file ({e}).") from None
    return scene_from_dict(data, path)


def _need(d: Any, key: str, where: str):
    if not isinstance(d, dict) or key not in d:
        raise SceneError(f"{where}: missing field '{key}'.")
    return d[key]


def _xy(points: list, where: str) -> np.ndarray:
    try:
        return np.array([(p["x"], p["y"]) for p in points], np.float64).reshape(-1, 2)
    except (KeyError, TypeError) as e:
        raise SceneError(f"{where}: points must be objects with 'x' and 'y' ({e}).") from None


def scene_from_dict(data: dict, source: str = "<json>") -> RawScene:
    """A decoded JSON scene (dict) -> ``RawScene``."""
    if not isinstance(data, dict):
        raise SceneError(f"{source}: top level must be an object with 'objects' and 'roads'.")
    objects = _need(data, "objects", source)
    roads = _need(data, "roads", source)
    if not isinstance(objects, list) or not isinstance(roads, list):
        raise SceneError(f"{source}: 'objects' and 'roads' must be lists.")
    notes: list[str] = []
    n = len(objects)
    t_steps = len(_need(objects[0], "position", f"{source}: objects[0]")) if n else 0
    xy = np.zeros((n, t_steps, 2), np.float64)
    yaw = np.zeros((n, t_steps), np.float64)
    vel = np.zeros((n, t_steps, 2), np.float64)
    valid = np.zeros((n, t_steps), bool)
    length = np.zeros(n, np.float64)
    width = np.zeros(n, np.float64)
    obj_type = np.zeros(n, np.int32)
    object_id = np.zeros(n, np.int64)
    expert = np.zeros(n, bool)
    unknown_types = set()
    for i, obj in enumerate(objects):
        where = f"{source}: objects[{i}]"
        pos = _need(obj, "position", where)
        head = _need(obj, "heading", where)
        v = _need(obj, "velocity", where)
        ok = _need(obj, "valid", where)
        if not (len(pos) == len(head) == len(v) == len(ok) == t_steps):
            raise SceneError(
                f"{where}: 'position', 'heading', 'velocity' and 'valid' must all have "
                f"{t_steps} steps (got {len(pos)}, {len(head)}, {len(v)}, {len(ok)}).")
        xy[i] = _xy(pos, f"{where}.position")
        try:
            yaw[i] = np.asarray(head, np.float64)
            vel[i] = np.array([(p["x"], p["y"]) for p in v], np.float64).reshape(-1, 2)
            valid[i] = np.asarray(ok, bool)
            length[i] = float(_need(obj, "length", where))
            width[i] = float(_need(obj, "width", where))
        except (KeyError, TypeError, ValueError) as e:
            raise SceneError(f"{where}: malformed field ({e}).") from None
        name = str(obj.get("type", "unset")).lower()
        if name not in _OBJECT_TYPES:
            unknown_types.add(name)
        obj_type[i] = _OBJECT_TYPES.get(name, ObjectType.OTHER)
        object_id[i] = int(obj.get("id", i))
        expert[i] = bool(obj.get("mark_as_expert", False))
    if unknown_types:
        notes.append(f"object types {sorted(unknown_types)} read as 'other'")
    if valid.any():
        vmax = float(np.max(np.abs(yaw[valid])))
        if vmax > 2 * math.pi + 0.1:
            yaw = np.deg2rad(yaw)
            notes.append(f"headings read as degrees (largest |heading| {vmax:.1f} > 2 pi)")
    yaw = np.where(valid, yaw, 0.0)

    meta = data.get("metadata") or {}
    sdc = meta.get("sdc_track_index", data.get("sdc_track_index", -1))
    sdc = -1 if sdc is None else int(sdc)
    ids = {int(oid): i for i, oid in enumerate(object_id)}
    of_interest = np.zeros(n, bool)
    for oid in meta.get("objects_of_interest", []) or []:
        if int(oid) in ids:
            of_interest[ids[int(oid)]] = True
        else:
            notes.append(f"objects_of_interest id {oid} names no object")
    to_predict = np.zeros(n, bool)
    for req in meta.get("tracks_to_predict", []) or []:
        k = int(req["track_index"] if isinstance(req, dict) else req)
        if 0 <= k < n:
            to_predict[k] = True
        else:
            notes.append(f"tracks_to_predict index {k} out of range")

    polylines, unknown_roads, empty = [], set(), 0
    for j, road in enumerate(roads):
        where = f"{source}: roads[{j}]"
        name = str(_need(road, "type", where)).lower()
        pts = _xy(_need(road, "geometry", where), f"{where}.geometry")
        if pts.shape[0] == 0:
            empty += 1
            continue
        if name not in _ROAD_TYPES:
            unknown_roads.add(name)
        polylines.append((pts, _ROAD_TYPES.get(name, RoadType.UNKNOWN), int(road.get("id", j))))
    if unknown_roads:
        notes.append(f"road types {sorted(unknown_roads)} read as UNKNOWN")
    if empty:
        notes.append(f"{empty} roads without geometry were skipped")
    road_xy, road_start, road_type, road_id = pack_polylines(polylines)

    tl_lane, tl_state, tl_valid, tl_stop = _traffic_lights(data.get("tl_states"), t_steps,
                                                           source, notes)
    return RawScene(
        scenario_id=str(data.get("scenario_id") or data.get("name") or
                        os.path.splitext(os.path.basename(source))[0]),
        source=source, xy=xy, yaw=yaw, vel=vel, valid=valid, length=length, width=width,
        object_type=obj_type, object_id=object_id, sdc_index=sdc, of_interest=of_interest,
        to_predict=to_predict, expert=expert, road_xy=road_xy, road_start=road_start,
        road_type=road_type, road_id=road_id, lane_exits={}, tl_lane=tl_lane,
        tl_state=tl_state, tl_valid=tl_valid, tl_stop_xy=tl_stop, notes=notes,
    ).check()


def _traffic_lights(tl: Any, t_steps: int, source: str, notes: list[str]):
    """``tl_states`` {lane id: {state: [...], x: [...], y: [...], time_index: [...]}}."""
    if not tl:  # the converters write {} or [] for scenes without signals
        return (np.zeros(0, np.int64), np.zeros((0, t_steps), np.int32),
                np.zeros((0, t_steps), bool), np.zeros((0, 2), np.float64))
    if not isinstance(tl, dict):
        raise SceneError(f"{source}: 'tl_states' must map lane ids to state series.")
    k = len(tl)
    lanes = np.zeros(k, np.int64)
    state = np.zeros((k, t_steps), np.int32)
    valid = np.zeros((k, t_steps), bool)
    stop = np.zeros((k, 2), np.float64)
    unknown = set()
    for slot, (lane, series) in enumerate(tl.items()):
        where = f"{source}: tl_states[{lane}]"
        try:
            lanes[slot] = int(lane)
            names = list(_need(series, "state", where))
            times = list(series.get("time_index", range(len(names))))
            xs, ys = list(series.get("x", [])), list(series.get("y", []))
        except (TypeError, ValueError) as e:
            raise SceneError(f"{where}: malformed traffic-light series ({e}).") from None
        for i, (t, name) in enumerate(zip(times, names, strict=False)):
            t = int(t)
            if not 0 <= t < t_steps:
                continue
            key = str(name).lower().removeprefix("lane_state_")
            if key not in _TL_STATES:
                unknown.add(str(name))
            state[slot, t] = _TL_STATES.get(key, TrafficLightState.UNKNOWN)
            valid[slot, t] = True
            if i == 0 and xs and ys:
                stop[slot] = (float(xs[0]), float(ys[0]))
    if unknown:
        notes.append(f"traffic-light states {sorted(unknown)} read as UNKNOWN")
    return lanes, state, valid, stop

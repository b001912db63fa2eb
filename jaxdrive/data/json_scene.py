"""GPUDrive / PufferDrive JSON scenes (WOMD converted) -> ``RawScene``.

The format: ``objects`` (per-step ``position`` {x, y, z}, ``heading``, ``velocity`` {x, y},
``valid``; ``width``, ``length``, ``goalPosition``, ``type``, ``id``, ``mark_as_expert``),
``roads`` (``geometry`` list of {x, y, z}, ``type``, ``id``), ``tl_states`` (lane id ->
{``state``: [names], ``x``, ``y``, ``time_index``}), ``metadata`` (``sdc_track_index``,
``objects_of_interest`` (track ids), ``tracks_to_predict`` ({``track_index``} or ints)).
Older layouts have no ``metadata`` (nor ``id``, ``height``): when the scene names no SDC
(no ``sdc_track_index``, or -1), it is chosen by ``raw.infer_sdc`` (an object's
``is_sdc`` flag, else a vehicle that drives, preferring fully valid tracks) and
marked as inferred (``RawScene.sdc_inferred``, the manifest's ``sdc_inferred``).
Headings are radians or degrees (older GPUDrive converters wrote degrees): the unit under
which headings follow the objects' direction of motion (``_headings_in_radians``); a
degrees reading and headings that follow the motion in neither unit are noted.

Every value is type-checked where it is read: numbers must be JSON numbers (not strings,
null or lists), flags JSON booleans, indices and ids integers, traffic-light states known
names. Anything else is a ``SceneError`` naming the file, the field and the value; the
values themselves (finite, in range) are checked by ``RawScene.check``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import reprlib
import zlib
from typing import Any

import numpy as np

from jaxdrive.data.raw import (
    HEADING_DISAGREES,
    RawScene,
    SceneError,
    heading_motion_error,
    infer_sdc,
    pack_polylines,
    track_reach,
)
from jaxdrive.types import ObjectType, RoadType, TrafficLightState

_OBJECT_TYPES = {"unset": ObjectType.UNSET, "vehicle": ObjectType.VEHICLE,
                 "pedestrian": ObjectType.PEDESTRIAN, "cyclist": ObjectType.CYCLIST,
                 "other": ObjectType.OTHER}
_ROAD_TYPES = {"lane": RoadType.LANE_CENTER, "road_edge": RoadType.ROAD_EDGE,
               "road_line": RoadType.ROAD_LINE, "crosswalk": RoadType.CROSSWALK,
               "stop_sign": RoadType.STOP_SIGN, "speed_bump": RoadType.SPEED_BUMP,
               "driveway": RoadType.DRIVEWAY}
_TL_STATES = {s.name.lower(): int(s) for s in TrafficLightState}


_SHOW = reprlib.Repr()
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 40, 40, 4, 3


def _show(value: Any) -> str:
    """A short, depth-limited repr of a JSON value for messages."""
    return _SHOW.repr(value)


GZIP_MAGIC = b"\x1f\x8b"
# A WOMD scene's JSON is 1-20 MB; a gzip file that inflates past this is not a scene (and
# would otherwise fill memory: a "zip bomb").
MAX_JSON_BYTES = 1 << 30


def read_json_bytes(path: str) -> bytes:
    """The JSON text of a scene file, inflated if it is gzip-compressed (``.json.gz``, or
    any file starting with gzip's magic bytes).

    Raises:
      SceneError: unreadable, a damaged gzip stream, or more than ``MAX_JSON_BYTES``.
    """
    try:
        with open(path, "rb") as f:
            if f.read(2) != GZIP_MAGIC:
                f.seek(0)
                return f.read()
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise SceneError(f"{path}: damaged gzip file ({e or type(e).__name__}).") from None
    if len(data) > MAX_JSON_BYTES:
        raise SceneError(f"{path}: inflates to more than {MAX_JSON_BYTES >> 20} MiB of "
                         "JSON; not a scene file.")
    return data


def read_json_scene(path: str | os.PathLike) -> RawScene:
    """Read one JSON scene file (plain or gzip-compressed).

    Raises:
      SceneError: the file cannot be read, is not valid JSON (or nested too deeply), or a
        field is missing, of the wrong type or unusable (the message names the file and
        the field).
    """
    path = os.fspath(path)
    try:
        data = json.loads(read_json_bytes(path))
    except json.JSONDecodeError as e:
        raise SceneError(f"{path}: malformed JSON ({e}).") from None
    except UnicodeDecodeError as e:
        raise SceneError(f"{path}: not a text JSON file ({e}).") from None
    except RecursionError:
        raise SceneError(f"{path}: JSON nested too deeply to be a scene.") from None
    except OSError as e:
        raise SceneError(f"{path}: cannot read the file ({e.strerror or e}).") from None
    return scene_from_dict(data, path)


def _need(d: Any, key: str, where: str):
    if not isinstance(d, dict):
        raise SceneError(f"{where}: must be an object with '{key}', got {_show(d)}.")
    if key not in d:
        raise SceneError(f"{where}: missing field '{key}'.")
    return d[key]


def _opt(d: dict, key: str, default: Any = None) -> Any:
    """``d[key]``, or ``default`` when absent or null."""
    value = d.get(key)
    return default if value is None else value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and (
        isinstance(v, float) or abs(v) < 2 ** 63)


def _number(value: Any, where: str) -> float:
    """A JSON number -> float; ``SceneError`` for anything else (strings, null, lists)."""
    if not _is_number(value):
        raise SceneError(f"{where} must be a number, got {_show(value)}.")
    return float(value)


def _integer(value: Any, where: str) -> int:
    """A JSON integer (or an integral float) -> int; ``SceneError`` otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not -2 ** 63 <= value < 2 ** 63:
        raise SceneError(f"{where} must be an integer, got {_show(value)}.")
    return value


def _list(value: Any, where: str, what: str = "a list") -> list:
    if not isinstance(value, list):
        raise SceneError(f"{where} must be {what}, got {_show(value)}.")
    return value


def _numbers(values: Any, where: str) -> np.ndarray:
    """A JSON list of numbers -> (n,) float64."""
    _list(values, where, "a list of numbers")
    try:
        arr = np.array(values)
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in "fiu":
        for i, v in enumerate(values):
            _number(v, f"{where}[{i}]")
        raise SceneError(f"{where} must be a list of numbers.")
    return arr.astype(np.float64, copy=False)


def _flags(values: Any, where: str) -> np.ndarray:
    """A JSON list of booleans -> (n,) bool (strings such as "false" are refused)."""
    _list(values, where, "a list of booleans")
    try:
        arr = np.array(values)  # bool dtype only if every entry is a JSON boolean
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or (values and (arr.dtype != np.bool_ or arr.ndim != 1)):
        for i, v in enumerate(values):
            if not isinstance(v, bool):
                raise SceneError(f"{where}[{i}] must be true or false, got {_show(v)}.")
    return np.array(values, bool).reshape(-1)


def _xy(points: Any, where: str) -> np.ndarray:
    """A JSON list of {x, y(, z)} objects -> (n, 2) float64."""
    _list(points, where, "a list of points {x, y}")
    if not points:
        return np.zeros((0, 2), np.float64)
    try:
        arr = np.array([(p["x"], p["y"]) for p in points])
    except (KeyError, TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or arr.dtype.kind not in "fiu" or arr.shape != (len(points), 2):
        for i, p in enumerate(points):
            _number(_need(p, "x", f"{where}[{i}]"), f"{where}[{i}].x")
            _number(_need(p, "y", f"{where}[{i}]"), f"{where}[{i}].y")
        raise SceneError(f"{where}: points must be objects with numbers 'x' and 'y'.")
    return arr.astype(np.float64, copy=False).reshape(-1, 2)


def _read_object(obj: Any, i: int, t_steps: int, where: str) -> dict[str, Any]:
    """One entry of ``objects`` -> its arrays and fields (steps checked against
    ``t_steps``)."""
    fields = {"position": _xy(_need(obj, "position", where), f"{where}.position"),
              "heading": _numbers(_need(obj, "heading", where), f"{where}.heading"),
              "velocity": _xy(_need(obj, "velocity", where), f"{where}.velocity"),
              "valid": _flags(_need(obj, "valid", where), f"{where}.valid")}
    lens = [len(v) for v in fields.values()]
    if any(n != t_steps for n in lens):
        raise SceneError(
            f"{where}: 'position', 'heading', 'velocity' and 'valid' must all have "
            f"{t_steps} steps (got {', '.join(map(str, lens))}).")
    fields["length"] = _number(_need(obj, "length", where), f"{where}.length")
    fields["width"] = _number(_need(obj, "width", where), f"{where}.width")
    name = _opt(obj, "type", "unset")
    if not isinstance(name, str):
        raise SceneError(f"{where}.type must be a string, got {_show(name)}.")
    fields["type"] = name.lower()
    fields["id"] = _integer(_opt(obj, "id", i), f"{where}.id")
    expert = _opt(obj, "mark_as_expert", False)
    if not isinstance(expert, bool):
        raise SceneError(f"{where}.mark_as_expert must be true or false, got {_show(expert)}.")
    fields["expert"] = expert
    is_sdc = _opt(obj, "is_sdc", False)
    if not isinstance(is_sdc, bool):
        raise SceneError(f"{where}.is_sdc must be true or false, got {_show(is_sdc)}.")
    fields["is_sdc"] = is_sdc
    return fields


def _scenario_id(data: dict, source: str) -> str:
    value = data.get("scenario_id") or data.get("name")
    if not value:
        return os.path.splitext(os.path.basename(source))[0]
    if isinstance(value, str):
        try:
            value.encode("utf-8")  # lone surrogates ("\ud800") cannot be printed or stored
        except UnicodeEncodeError:
            raise SceneError(f"{source}: 'scenario_id' is not valid text, got "
                             f"{_show(value)}.") from None
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise SceneError(f"{source}: 'scenario_id' (or 'name') must be a string, got "
                     f"{_show(value)}.")


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
    t_steps = len(_list(_need(objects[0], "position", f"{source}: objects[0]"),
                        f"{source}: objects[0].position")) if n else 0
    xy = np.zeros((n, t_steps, 2), np.float64)
    yaw = np.zeros((n, t_steps), np.float64)
    vel = np.zeros((n, t_steps, 2), np.float64)
    valid = np.zeros((n, t_steps), bool)
    length = np.zeros(n, np.float64)
    width = np.zeros(n, np.float64)
    obj_type = np.zeros(n, np.int32)
    object_id = np.zeros(n, np.int64)
    expert = np.zeros(n, bool)
    flagged = np.zeros(n, bool)
    unknown_types = set()
    for i, obj in enumerate(objects):
        f = _read_object(obj, i, t_steps, f"{source}: objects[{i}]")
        xy[i], yaw[i], vel[i], valid[i] = f["position"], f["heading"], f["velocity"], f["valid"]
        length[i], width[i], object_id[i], expert[i] = f["length"], f["width"], f["id"], f[
            "expert"]
        flagged[i] = f["is_sdc"]
        if f["type"] not in _OBJECT_TYPES:
            unknown_types.add(f["type"])
        obj_type[i] = _OBJECT_TYPES.get(f["type"], ObjectType.OTHER)
    if unknown_types:
        notes.append(f"object types {sorted(unknown_types)} read as 'other'")
    yaw = np.where(valid, _headings_in_radians(yaw, vel, valid, notes), 0.0)

    sdc, of_interest, to_predict = _metadata(data, object_id, source, notes)
    sdc_inferred = None
    if sdc == -1:  # older layouts carry no metadata: choose by the documented rule
        sdc, sdc_inferred = infer_sdc(valid, obj_type, flagged, xy)
        if sdc_inferred:
            reach = float(track_reach(xy[sdc:sdc + 1], valid[sdc:sdc + 1])[0])
            notes.append(f"no sdc_track_index: SDC inferred as objects[{sdc}] "
                         f"(rule {sdc_inferred}: {int(valid[sdc].sum())} of "
                         f"{valid.shape[1]} steps valid, {reach:.1f} m from its start)")
    road_xy, road_start, road_type, road_id = pack_polylines(_roads(roads, source, notes))
    tl_lane, tl_state, tl_valid, tl_stop = _traffic_lights(data.get("tl_states"), t_steps,
                                                           source, notes)
    return RawScene(
        scenario_id=_scenario_id(data, source),
        source=source, xy=xy, yaw=yaw, vel=vel, valid=valid, length=length, width=width,
        object_type=obj_type, object_id=object_id, sdc_index=sdc, of_interest=of_interest,
        to_predict=to_predict, expert=expert, road_xy=road_xy, road_start=road_start,
        road_type=road_type, road_id=road_id, lane_exits={}, tl_lane=tl_lane,
        tl_state=tl_state, tl_valid=tl_valid, tl_stop_xy=tl_stop, sdc_inferred=sdc_inferred,
        notes=notes,
    ).check()


def _headings_in_radians(yaw: np.ndarray, vel: np.ndarray, valid: np.ndarray,
                         notes: list[str]) -> np.ndarray:
    """(N, T) headings as read -> radians, the unit decided from the data.

    Where objects move (``raw.heading_motion_error``), the unit is the one under which
    the headings follow the direction of the velocity (the smaller median angle between
    them): unwrapped radians beyond 2 pi stay radians, degrees below 2 pi are read as
    degrees. A scene whose headings follow the motion under neither unit
    (``HEADING_DISAGREES``) is noted. Without motion, headings beyond 2 pi + 0.1 are read
    as degrees.
    """
    as_rad = heading_motion_error(yaw, vel, valid)
    if as_rad is not None:
        err_rad, moving = as_rad
        err_deg, _ = heading_motion_error(np.deg2rad(yaw), vel, valid)
        degrees = err_deg < err_rad
        if degrees:
            notes.append(f"headings read as degrees: as degrees they follow the direction "
                         f"of motion (median error {err_deg:.3f} rad over {moving} moving "
                         f"steps), as radians they do not ({err_rad:.3f} rad)")
        if min(err_rad, err_deg) > HEADING_DISAGREES:
            notes.append(f"headings disagree with the direction of motion in either unit "
                         f"(median error {min(err_rad, err_deg):.3f} rad over {moving} "
                         "moving steps)")
        return np.deg2rad(yaw) if degrees else yaw
    if valid.any():
        vmax = float(np.max(np.abs(yaw[valid])))
        if vmax > 2 * math.pi + 0.1:
            notes.append(f"headings read as degrees (no moving object to decide by; largest "
                         f"|heading| {vmax:.1f} > 2 pi)")
            return np.deg2rad(yaw)
    return yaw


def _metadata(data: dict, object_id: np.ndarray, source: str, notes: list[str]):
    """``metadata`` -> (sdc index or -1, of_interest (N,) bool, to_predict (N,) bool)."""
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict):
        raise SceneError(f"{source}: 'metadata' must be an object, got {_show(meta)}.")
    n = object_id.shape[0]
    where = f"{source}: metadata"
    sdc = meta.get("sdc_track_index", data.get("sdc_track_index", -1))
    sdc = -1 if sdc is None else _integer(sdc, f"{where}.sdc_track_index")
    ids = {int(oid): i for i, oid in enumerate(object_id)}
    of_interest = np.zeros(n, bool)
    for j, oid in enumerate(_list(_opt(meta, "objects_of_interest", []),
                                  f"{where}.objects_of_interest")):
        oid = _integer(oid, f"{where}.objects_of_interest[{j}]")
        if oid in ids:
            of_interest[ids[oid]] = True
        else:
            notes.append(f"objects_of_interest id {oid} names no object")
    to_predict = np.zeros(n, bool)
    for j, req in enumerate(_list(_opt(meta, "tracks_to_predict", []),
                                  f"{where}.tracks_to_predict")):
        at = f"{where}.tracks_to_predict[{j}]"
        k = _integer(_need(req, "track_index", at) if isinstance(req, dict) else req,
                     f"{at}.track_index" if isinstance(req, dict) else at)
        if 0 <= k < n:
            to_predict[k] = True
        else:
            notes.append(f"tracks_to_predict index {k} out of range")
    return sdc, of_interest, to_predict


def _roads(roads: list, source: str, notes: list[str]) -> list[tuple[np.ndarray, int, int]]:
    """``roads`` -> [(points (n, 2), RoadType, id)] (roads without points left out)."""
    polylines, unknown_roads, empty = [], set(), 0
    for j, road in enumerate(roads):
        where = f"{source}: roads[{j}]"
        name = _need(road, "type", where)
        if not isinstance(name, str):
            raise SceneError(f"{where}.type must be a string, got {_show(name)}.")
        name = name.lower()
        pts = _xy(_need(road, "geometry", where), f"{where}.geometry")
        if pts.shape[0] == 0:
            empty += 1
            continue
        if name not in _ROAD_TYPES:
            unknown_roads.add(name)
        polylines.append((pts, _ROAD_TYPES.get(name, RoadType.UNKNOWN),
                          _integer(_opt(road, "id", j), f"{where}.id")))
    if unknown_roads:
        notes.append(f"road types {sorted(unknown_roads)} read as UNKNOWN")
    if empty:
        notes.append(f"{empty} roads without geometry were skipped")
    return polylines


def _traffic_lights(tl: Any, t_steps: int, source: str, notes: list[str]):
    """``tl_states`` {lane id: {state: [...], x: [...], y: [...], time_index: [...]}} ->
    (lanes (TL,) int64, states (TL, T) int32, valid (TL, T) bool, stop points (TL, 2))."""
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
    for slot, (lane, series) in enumerate(tl.items()):
        where = f"{source}: tl_states[{_show(lane)}]"
        try:
            lanes[slot] = int(lane)
        except (TypeError, ValueError, OverflowError):
            raise SceneError(f"{where}: the lane id must be an integer.") from None
        names = _list(_need(series, "state", where), f"{where}.state")
        times = _list(_opt(series, "time_index", list(range(len(names)))),
                      f"{where}.time_index")
        xs = _list(_opt(series, "x", []), f"{where}.x")
        ys = _list(_opt(series, "y", []), f"{where}.y")
        for i, (t, name) in enumerate(zip(times, names, strict=False)):
            t = _integer(t, f"{where}.time_index[{i}]")
            if not 0 <= t < t_steps:
                continue
            key = name.lower().removeprefix("lane_state_") if isinstance(name, str) else None
            if key not in _TL_STATES:
                raise SceneError(f"{where}.state[{i}]: unknown traffic-light state "
                                 f"{_show(name)} (known: {', '.join(_TL_STATES)}).")
            state[slot, t] = _TL_STATES[key]
            valid[slot, t] = True
            if i == 0 and xs and ys:
                stop[slot] = (_number(xs[0], f"{where}.x[0]"), _number(ys[0], f"{where}.y[0]"))
    return lanes, state, valid, stop

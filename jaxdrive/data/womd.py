"""WOMD ``Scenario`` protos (from TFRecord files) -> ``RawScene``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
from google.protobuf.message import DecodeError

from jaxdrive.data import womd_schema as pb
from jaxdrive.data.raw import RawScene, SceneError, pack_polylines
from jaxdrive.data.tfrecord import EMPTY_TFRECORD, scan_records
from jaxdrive.types import ObjectType, RoadType

# oneof ``feature_data`` member -> (RoadType, name of the repeated MapPoint field)
# (field numbers from map.proto: LaneCenter.polyline = 8, RoadLine/RoadEdge.polyline = 2,
# Crosswalk/SpeedBump/Driveway.polygon = 1)
_FEATURES = {
    "lane": (RoadType.LANE_CENTER, "polyline", 8),
    "road_line": (RoadType.ROAD_LINE, "polyline", 2),
    "road_edge": (RoadType.ROAD_EDGE, "polyline", 2),
    "crosswalk": (RoadType.CROSSWALK, "polygon", 1),
    "speed_bump": (RoadType.SPEED_BUMP, "polygon", 1),
    "driveway": (RoadType.DRIVEWAY, "polygon", 1),
}


# Fast path: a fully populated message serialises its scalar fields in field order with
# fixed sizes, so a run of them decodes as one NumPy record array. The tag bytes are
# checked per record; anything else (missing fields, other order) takes the slow path.
_STATE_DT = np.dtype([
    ("t2", "u1"), ("cx", "<f8"), ("t3", "u1"), ("cy", "<f8"), ("t4", "u1"), ("cz", "<f8"),
    ("t5", "u1"), ("length", "<f4"), ("t6", "u1"), ("width", "<f4"), ("t7", "u1"),
    ("height", "<f4"), ("t8", "u1"), ("heading", "<f4"), ("t9", "u1"), ("vx", "<f4"),
    ("t10", "u1"), ("vy", "<f4"), ("t11", "u1"), ("valid", "u1")])
_STATE_TAGS = {"t2": 0x11, "t3": 0x19, "t4": 0x21, "t5": 0x2D, "t6": 0x35, "t7": 0x3D,
               "t8": 0x45, "t9": 0x4D, "t10": 0x55, "t11": 0x58}
_POINT_DT = np.dtype([("t1", "u1"), ("x", "<f8"), ("t2", "u1"), ("y", "<f8"), ("t3", "u1"),
                      ("z", "<f8")])
_POINT_TAGS = {"t1": 0x09, "t2": 0x11, "t3": 0x19}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        out |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return out, pos
        shift += 7


def _block(buf: bytes, field: int, count: int, dtype: np.dtype, tags: dict[str, int]):
    """The ``count`` occurrences of message field ``field`` decoded in one go, if they
    form one contiguous run of fully populated records; else ``None``."""
    key = (field << 3) | 2
    if count == 0 or key > 0x7F or dtype.itemsize > 0x7F:
        return None
    pos, n = 0, len(buf)
    while pos < n:  # skip the (few) fields serialised before the run
        k, start = _varint(buf, pos)
        if k == key:
            break
        wire = k & 7
        if wire == 0:
            _, pos = _varint(buf, start)
        elif wire == 1:
            pos = start + 8
        elif wire == 5:
            pos = start + 4
        elif wire == 2:
            length, pos = _varint(buf, start)
            pos += length
        else:
            return None
    stride = 2 + dtype.itemsize
    if pos >= n or pos + count * stride > n:
        return None
    raw = np.frombuffer(buf, np.uint8, count * stride, pos).reshape(count, stride)
    offsets, expect = _tag_layout(dtype, tags, key)
    if not (raw[:, offsets] == expect).all():
        return None
    return raw.view(np.dtype([("k", "u1"), ("n", "u1"), ("r", dtype)]))[:, 0]["r"]


_LAYOUTS: dict = {}


def _tag_layout(dtype: np.dtype, tags: dict[str, int], key: int):
    """Byte offsets (within one length-prefixed record) of the key, the length and every
    field tag, and the bytes expected there."""
    cache_key = (dtype, key)
    if cache_key not in _LAYOUTS:
        offsets = [0, 1] + [2 + dtype.fields[name][1] for name in tags]
        expect = [key, dtype.itemsize] + list(tags.values())
        _LAYOUTS[cache_key] = (np.array(offsets), np.array(expect, np.uint8))
    return _LAYOUTS[cache_key]


def _track_rows(track, out: np.ndarray) -> None:
    """Fill ``out`` (T, 8) with x, y, heading, vx, vy, valid, length, width per state."""
    rec = _block(track.SerializeToString(), 3, len(track.states), _STATE_DT, _STATE_TAGS)
    if rec is not None:
        with np.errstate(invalid="ignore"):  # a signalling NaN is checked later, not warned
            for j, name in enumerate(("cx", "cy", "heading", "vx", "vy", "valid", "length",
                                      "width")):
                out[:, j] = rec[name]
        return
    out[:] = np.array([(st.center_x, st.center_y, st.heading, st.velocity_x, st.velocity_y,
                      st.valid, st.length, st.width) for st in track.states],
                    np.float64).reshape(-1, 8)


def _points(msg, field_name: str, field_number: int) -> np.ndarray:
    """(n, 2) float64 x, y of a repeated ``MapPoint`` field."""
    points = getattr(msg, field_name)
    rec = _block(msg.SerializeToString(), field_number, len(points), _POINT_DT, _POINT_TAGS)
    if rec is not None:
        return np.stack([rec["x"], rec["y"]], axis=1)
    return np.array([(p.x, p.y) for p in points], np.float64).reshape(-1, 2)


def parse_scenario(data: bytes, source: str = "<bytes>") -> RawScene:
    """Decode one serialized WOMD ``Scenario`` into a ``RawScene``.

    Raises:
      SceneError: the bytes are not a Scenario, or its tracks disagree in length.
    """
    proto = pb.Scenario()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        raise SceneError(f"{source}: not a WOMD Scenario proto ({e}).") from None
    return scenario_to_raw(proto, source)


def scenario_to_raw(proto, source: str = "<proto>") -> RawScene:
    """A parsed ``womd_schema.Scenario`` message -> ``RawScene``."""
    tracks = proto.tracks
    n = len(tracks)
    lens = {len(t.states) for t in tracks}
    if len(lens) > 1:
        raise SceneError(f"{source}: tracks have different numbers of states {sorted(lens)}; "
                         "WOMD tracks must all span the scenario's timestamps.")
    t_steps = lens.pop() if lens else len(proto.timestamps_seconds)
    if t_steps == 0:
        raise SceneError(f"{source}: scenario has no time steps.")
    rows = np.zeros((n, t_steps, 8), np.float64)
    for i, track in enumerate(tracks):
        _track_rows(track, rows[i])
    valid = rows[..., 5] > 0.5
    # Box size: the last valid state's (as the GPUDrive/PufferDrive JSON converters do).
    last = np.where(valid.any(1), t_steps - 1 - np.argmax(valid[:, ::-1], axis=1), 0)
    size = rows[np.arange(n), last]
    obj_type = np.array([t.object_type for t in tracks], np.int32)
    obj_type = np.where((obj_type >= 0) & (obj_type < len(ObjectType)), obj_type, 0)
    object_id = np.array([t.id for t in tracks], np.int64)

    sdc = proto.sdc_track_index if proto.HasField("sdc_track_index") else -1
    ids = {int(oid): i for i, oid in enumerate(object_id)}
    of_interest = np.zeros(n, bool)
    notes = []
    for oid in proto.objects_of_interest:
        if oid in ids:
            of_interest[ids[oid]] = True
        else:
            notes.append(f"objects_of_interest id {oid} names no track")
    to_predict = np.zeros(n, bool)
    for req in proto.tracks_to_predict:
        if 0 <= req.track_index < n:
            to_predict[req.track_index] = True
        else:
            notes.append(f"tracks_to_predict index {req.track_index} out of range")

    polylines, lane_exits, skipped_features = [], {}, 0
    for feature in proto.map_features:
        kind = feature.WhichOneof("feature_data")
        if kind == "stop_sign":
            p = feature.stop_sign.position
            polylines.append((np.array([[p.x, p.y]], np.float64), RoadType.STOP_SIGN, feature.id))
            continue
        if kind not in _FEATURES:
            skipped_features += 1
            continue
        rtype, field, number = _FEATURES[kind]
        msg = getattr(feature, kind)
        pts = _points(msg, field, number)
        if pts.shape[0] == 0:
            skipped_features += 1
            continue
        polylines.append((pts, rtype, feature.id))
        if kind == "lane" and len(msg.exit_lanes):
            lane_exits[int(feature.id)] = [int(e) for e in msg.exit_lanes]
    if skipped_features:
        notes.append(f"{skipped_features} map features without geometry were skipped")
    road_xy, road_start, road_type, road_id = pack_polylines(polylines)

    tl_lane, tl_state, tl_valid, tl_stop = _traffic_lights(proto.dynamic_map_states, t_steps)
    return RawScene(
        scenario_id=proto.scenario_id, source=source,
        xy=rows[..., 0:2].copy(), yaw=rows[..., 2].copy(), vel=rows[..., 3:5].copy(),
        valid=valid, length=size[:, 6].copy(), width=size[:, 7].copy(),
        object_type=obj_type.astype(np.int32), object_id=object_id, sdc_index=int(sdc),
        of_interest=of_interest, to_predict=to_predict, expert=np.zeros(n, bool),
        road_xy=road_xy, road_start=road_start, road_type=road_type, road_id=road_id,
        lane_exits=lane_exits, tl_lane=tl_lane, tl_state=tl_state, tl_valid=tl_valid,
        tl_stop_xy=tl_stop,
        current_time_index=(proto.current_time_index
                            if proto.HasField("current_time_index") else None),
        notes=notes,
    ).check()


def _traffic_lights(dynamic_map_states, t_steps: int):
    """Per-lane signal series from the per-step ``DynamicMapState`` list."""
    lanes: dict[int, int] = {}
    entries = []
    for t, dms in enumerate(dynamic_map_states):
        if t >= t_steps:
            break
        for ls in dms.lane_states:
            slot = lanes.setdefault(int(ls.lane), len(lanes))
            sp = ls.stop_point
            entries.append((slot, t, int(ls.state), sp.x, sp.y))
    k = len(lanes)
    state = np.zeros((k, t_steps), np.int32)
    valid = np.zeros((k, t_steps), bool)
    stop = np.zeros((k, 2), np.float64)
    seen = np.zeros(k, bool)
    for slot, t, st, x, y in entries:
        state[slot, t] = st
        valid[slot, t] = True
        if not seen[slot]:
            stop[slot] = (x, y)
            seen[slot] = True
    return np.array(list(lanes), np.int64), state, valid, stop


def iter_tfrecord_scenes(path: str | os.PathLike) -> Iterator[tuple[RawScene | None, dict | None]]:
    """Scenes of a WOMD TFRecord file: yields ``(scene, None)`` or ``(None, skip)``.

    ``skip`` is ``{"source", "reason"}`` for a record that failed its CRC, was truncated
    or does not decode (or for the file, if it holds no record); a fatal framing error
    ends the file after its skip entry.
    """
    path = os.fspath(path)
    empty = True
    for rec in scan_records(path):
        empty = False
        source = f"{path}#{rec.index}"
        if rec.error:
            yield None, {"source": source, "reason": rec.error}
            continue
        try:
            yield parse_scenario(rec.data, source), None
        except SceneError as e:
            yield None, {"source": source, "reason": str(e)}
    if empty:
        yield None, {"source": path, "reason": EMPTY_TFRECORD}

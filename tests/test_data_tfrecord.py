"""TFRecord framing and CRC32C, the WOMD schema's wire format, WOMD protos read back."""

import struct

import numpy as np
import pytest

from jaxdrive.data import womd_schema as pb
from jaxdrive.data.load import convert_to_shards
from jaxdrive.data.raw import SceneError
from jaxdrive.data.synth import synth_scenario
from jaxdrive.data.tfrecord import (
    TFRecordError,
    crc32c,
    frame_record,
    masked_crc32c,
    read_records,
    scan_records,
    write_records,
)
from jaxdrive.data.womd import iter_tfrecord_scenes, parse_scenario
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.types import ObjectType, RoadType, TrafficLightState


def bitwise_crc32c(data: bytes) -> int:
    """Reference CRC32C, one bit at a time (no table)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_known_vectors():
    # The CRC32C check value, and the iSCSI test vectors of RFC 3720 B.4.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"") == 0


@pytest.mark.parametrize("n", [2047, 2048, 4099, 70001])
def test_crc32c_lanes_match_bitwise_reference(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert crc32c(data) == bitwise_crc32c(data)


def test_masked_crc_and_frame_layout():
    # crc32c(b"") = 0, so the mask is just the delta.
    assert masked_crc32c(b"") == 0xA282EAD8
    c = crc32c(b"abc")
    assert masked_crc32c(b"abc") == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2**32
    framed = frame_record(b"abc")
    assert len(framed) == 8 + 4 + 3 + 4
    assert struct.unpack_from("<Q", framed)[0] == 3
    assert struct.unpack_from("<I", framed, 8)[0] == masked_crc32c(framed[:8])
    assert framed[12:15] == b"abc"
    assert struct.unpack_from("<I", framed, 15)[0] == masked_crc32c(b"abc")


def test_records_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    payloads = [b"", b"x", rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes(), b"end"]
    path = tmp_path / "a.tfrecord"
    assert write_records(path, payloads) == 4
    assert list(read_records(path)) == payloads


def test_corrupt_and_truncated_records_are_reported(tmp_path):
    payloads = [b"first record", b"second record", b"third record"]
    good = b"".join(frame_record(p) for p in payloads)
    # Flip one payload byte of record 1: its data CRC fails, framing stays intact.
    off1 = len(frame_record(payloads[0]))
    bad = bytearray(good)
    bad[off1 + 12 + 2] ^= 0x01
    path = tmp_path / "crc.tfrecord"
    path.write_bytes(bytes(bad))
    recs = list(scan_records(path))
    assert [r.data for r in recs] == [payloads[0], None, payloads[2]]
    assert "record 1" in recs[1].error and "data CRC mismatch" in recs[1].error
    assert not recs[1].fatal
    with pytest.raises(TFRecordError, match="data CRC mismatch"):
        list(read_records(path))
    # Cut the file inside record 2: records 0 and 1 read, then a fatal truncation.
    path2 = tmp_path / "cut.tfrecord"
    path2.write_bytes(good[:-5])
    recs = list(scan_records(path2))
    assert [r.data for r in recs[:2]] == payloads[:2]
    assert recs[2].fatal and "truncated record" in recs[2].error
    # A corrupt length header: framing cannot continue.
    hdr = bytearray(good)
    hdr[0] ^= 0x40
    path3 = tmp_path / "hdr.tfrecord"
    path3.write_bytes(bytes(hdr))
    recs = list(scan_records(path3))
    assert len(recs) == 1 and recs[0].fatal and "length CRC mismatch" in recs[0].error


def test_schema_field_numbers_on_the_wire():
    # Hand-encoded wire bytes with the field numbers of the public WOMD protos:
    # ObjectState.center_x = 2 (double, tag 0x11), valid = 11 (varint, tag 0x58).
    state = pb.ObjectState()
    state.ParseFromString(b"\x11" + struct.pack("<d", 1234.5) + b"\x58\x01")
    assert state.center_x == 1234.5 and state.valid
    # Track.object_type = 2 (tag 0x10); Scenario.sdc_track_index = 6 (tag 0x30),
    # Scenario.scenario_id = 5 (tag 0x2a), current_time_index = 10 (tag 0x50).
    track = pb.Track()
    track.ParseFromString(b"\x08\x07\x10\x03")
    assert track.id == 7 and track.object_type == ObjectType.CYCLIST
    scen = pb.Scenario()
    scen.ParseFromString(b"\x30\x04\x2a\x02ab\x50\x0a")
    assert scen.sdc_track_index == 4 and scen.scenario_id == "ab"
    assert scen.current_time_index == 10
    # MapFeature.road_edge = 5 holding RoadEdge.polyline = 2 of MapPoint(x = 1).
    point = b"\x09" + struct.pack("<d", 3.0)
    edge = b"\x12" + bytes([len(point)]) + point
    feature = pb.MapFeature()
    feature.ParseFromString(b"\x08\x09\x2a" + bytes([len(edge)]) + edge)
    assert feature.id == 9 and feature.WhichOneof("feature_data") == "road_edge"
    assert feature.road_edge.polyline[0].x == 3.0
    # LaneCenter.exit_lanes = 10 is packed (tag 0x52, length, varints).
    lane = pb.LaneCenter()
    lane.ParseFromString(b"\x52\x02\x05\x06")
    assert list(lane.exit_lanes) == [5, 6]


def hand_scenario():
    """3 tracks x 4 steps, one map feature of every kind, two signal lanes."""
    s = pb.Scenario(scenario_id="hand01", sdc_track_index=1, current_time_index=1)
    s.timestamps_seconds.extend([0.0, 0.1, 0.2, 0.3])
    specs = [(11, pb.Track.TYPE_PEDESTRIAN, [True, True, False, False]),
             (22, pb.Track.TYPE_VEHICLE, [True, True, True, True]),
             (33, pb.Track.TYPE_CYCLIST, [False, True, True, False])]
    for i, (tid, otype, valid) in enumerate(specs):
        tr = s.tracks.add(id=tid, object_type=otype)
        for k, ok in enumerate(valid):
            if ok:
                tr.states.add(center_x=1000.0 * i + k, center_y=-500.0 + 0.25 * k, center_z=3.0,
                              length=4.0 + i, width=1.5 + 0.25 * k, height=1.0,
                              heading=0.5 * i - 0.25 * k, velocity_x=float(k),
                              velocity_y=-float(i), valid=True)
            else:
                tr.states.add(valid=False)
    s.objects_of_interest.extend([33])
    s.tracks_to_predict.add(track_index=0, difficulty=1)
    f = s.map_features.add(id=501)
    for x in (0.0, 1.0, 2.0):
        f.lane.polyline.add(x=x, y=10.0)
    f.lane.exit_lanes.extend([502])
    f = s.map_features.add(id=502)
    f.lane.polyline.add(x=3.0, y=10.0)
    f.lane.polyline.add(x=4.0, y=11.0)
    f = s.map_features.add(id=503)
    f.road_edge.polyline.add(x=0.0, y=8.0)
    f.road_edge.polyline.add(x=5.0, y=8.0)
    f = s.map_features.add(id=504)
    f.road_line.polyline.add(x=0.0, y=12.0)
    f.road_line.polyline.add(x=5.0, y=12.0)
    f = s.map_features.add(id=505)
    f.stop_sign.position.x, f.stop_sign.position.y = 7.0, 7.5
    for fid, kind in ((506, "crosswalk"), (507, "speed_bump"), (508, "driveway")):
        f = s.map_features.add(id=fid)
        poly = getattr(f, kind).polygon
        for x, y in ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0)):
            poly.add(x=x + fid, y=y)
    for k in range(4):
        dms = s.dynamic_map_states.add()
        if k >= 1:
            ls = dms.lane_states.add(lane=501, state=pb.TrafficSignalLaneState.LANE_STATE_GO)
            ls.stop_point.x, ls.stop_point.y = 2.0, 10.0
        ls = dms.lane_states.add(lane=502, state=pb.TrafficSignalLaneState.LANE_STATE_STOP
                                 if k < 2 else pb.TrafficSignalLaneState.LANE_STATE_CAUTION)
        ls.stop_point.x, ls.stop_point.y = 4.0, 11.0
    return s


def test_womd_proto_read_back_field_for_field(tmp_path):
    path = tmp_path / "hand.tfrecord"
    write_records(path, [hand_scenario().SerializeToString()])
    [(raw, skip)] = list(iter_tfrecord_scenes(path))
    assert skip is None
    assert raw.scenario_id == "hand01" and raw.source == f"{path}#0"
    assert raw.sdc_index == 1 and raw.current_time_index == 1
    np.testing.assert_array_equal(raw.object_id, [11, 22, 33])
    np.testing.assert_array_equal(raw.object_type, [ObjectType.PEDESTRIAN, ObjectType.VEHICLE,
                                                    ObjectType.CYCLIST])
    np.testing.assert_array_equal(raw.valid, [[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]])
    np.testing.assert_array_equal(raw.xy[1, :, 0], [1000.0, 1001.0, 1002.0, 1003.0])
    np.testing.assert_array_equal(raw.xy[2, 1], [2001.0, -499.75])
    np.testing.assert_allclose(raw.yaw[2, 1:3], [0.75, 0.5])
    np.testing.assert_array_equal(raw.vel[1, 3], [3.0, -1.0])
    # Box size from each track's last valid state.
    np.testing.assert_array_equal(raw.length, [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(raw.width, [1.75, 2.25, 2.0])
    np.testing.assert_array_equal(raw.of_interest, [False, False, True])
    np.testing.assert_array_equal(raw.to_predict, [True, False, False])
    np.testing.assert_array_equal(raw.road_id, [501, 502, 503, 504, 505, 506, 507, 508])
    np.testing.assert_array_equal(raw.road_type, [
        RoadType.LANE_CENTER, RoadType.LANE_CENTER, RoadType.ROAD_EDGE, RoadType.ROAD_LINE,
        RoadType.STOP_SIGN, RoadType.CROSSWALK, RoadType.SPEED_BUMP, RoadType.DRIVEWAY])
    # Polygons are closed (first point repeated): 3 + 2 + 2 + 2 + 1 + 3 * 4 points.
    np.testing.assert_array_equal(np.diff(raw.road_start), [3, 2, 2, 2, 1, 4, 4, 4])
    np.testing.assert_array_equal(raw.road_xy[:3], [[0, 10], [1, 10], [2, 10]])
    np.testing.assert_array_equal(raw.road_xy[9], [7.0, 7.5])
    np.testing.assert_array_equal(raw.road_xy[10:14], [[506, 0], [507, 0], [507, 1], [506, 0]])
    assert raw.lane_exits == {501: [502]}
    np.testing.assert_array_equal(raw.tl_lane, [502, 501])  # order of first appearance
    np.testing.assert_array_equal(raw.tl_valid, [[1, 1, 1, 1], [0, 1, 1, 1]])
    np.testing.assert_array_equal(raw.tl_state, [
        [TrafficLightState.STOP, TrafficLightState.STOP, TrafficLightState.CAUTION,
         TrafficLightState.CAUTION], [0, TrafficLightState.GO, TrafficLightState.GO,
                                      TrafficLightState.GO]])
    np.testing.assert_array_equal(raw.tl_stop_xy, [[4.0, 11.0], [2.0, 10.0]])


def test_undecodable_and_inconsistent_protos_are_scene_errors():
    with pytest.raises(SceneError, match="not a WOMD Scenario"):
        parse_scenario(b"\xff\xff\xff", "x#0")
    s = pb.Scenario(scenario_id="bad")
    s.tracks.add(id=1).states.add(valid=True)
    s.tracks.add(id=2)
    with pytest.raises(SceneError, match="different numbers of states"):
        parse_scenario(s.SerializeToString(), "x#1")


def test_bad_records_are_skipped_with_reasons_in_the_manifest(tmp_path):
    good = [synth_scenario(i, num_objects=6, num_steps=20, num_lanes=3, lane_points=10,
                           num_edges=2, edge_points=10, num_lines=1, line_points=5,
                           num_lights=1).SerializeToString() for i in range(3)]
    no_sdc = pb.Scenario()
    no_sdc.ParseFromString(good[0])
    no_sdc.scenario_id = "nosdc"
    no_sdc.sdc_track_index = 99
    records = [good[0], good[1], no_sdc.SerializeToString(), good[2]]
    data = bytearray(b"".join(frame_record(r) for r in records))
    off1 = len(frame_record(records[0]))
    data[off1 + 40] ^= 0xFF  # corrupt record 1's payload
    path = tmp_path / "mixed.tfrecord"
    path.write_bytes(bytes(data[:-3]))  # and truncate record 3
    cfg = ScenarioConfig(max_agents=8, num_steps=20, max_road_points=64, max_lanes=8)
    m = convert_to_shards([str(path)], tmp_path / "out", cfg)
    assert m["num_scenarios"] == 1
    reasons = {s["source"]: s["reason"] for s in m["skipped"]}
    assert set(reasons) == {f"{path}#1", f"{path}#2", f"{path}#3"}
    assert "data CRC mismatch" in reasons[f"{path}#1"]
    assert "no valid SDC" in reasons[f"{path}#2"]
    assert "truncated record" in reasons[f"{path}#3"]


def test_deferred_crc_check_catches_corruption_in_the_worker_step(tmp_path):
    # With several workers the payload CRC is checked where the proto is parsed.
    from jaxdrive.data.sources import iter_items, read_item

    blob = hand_scenario().SerializeToString()
    data = bytearray(frame_record(blob) + frame_record(blob))
    data[12 + 5] ^= 0x10  # corrupt record 0's payload
    path = tmp_path / "d.tfrecord"
    path.write_bytes(bytes(data))
    items = list(iter_items([(str(path), "tfrecord")], defer_crc=True))
    assert [it[0] for it in items] == ["proto", "proto"]
    with pytest.raises(SceneError, match="d.tfrecord#0: data CRC mismatch"):
        read_item(items[0])
    assert read_item(items[1]).scenario_id == "hand01"

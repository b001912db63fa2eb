"""Traffic lights read from real scenes, checked against the raw files parsed here
independently: per-step states, stop points recentred like the objects, each light on a
lane-centre polyline of the converted road graph that follows its raw lane, no light
dropped at the real-data sizes; ``inspect``'s light-steps per state.

The JSON scene is read with ``json``; the WOMD TFRecord with the minimal protobuf
wire-format decoder below (field numbers of Waymo's public ``scenario.proto`` /
``map_feature.proto``), not the project's reader. Real-data tests skip without
``../shared/data``; the inspect counts are also checked on a synthetic cache.
"""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from jaxdrive.data.__main__ import main as cli
from jaxdrive.data.convert import ConvertConfig, real_data_config
from jaxdrive.data.load import convert_one
from jaxdrive.data.synth import synth_scenario
from jaxdrive.data.tfrecord import write_records
from jaxdrive.types import RoadType, TrafficLightState

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
JSON_FILES = sorted((DATA / "womd_json_traffic_lights").glob("*.json")) if DATA.is_dir() else []
TFRECORD = DATA / "womd_tfrecord" / "motion_data_one_scenario.tfrecord"
needs_json = pytest.mark.skipif(not JSON_FILES, reason=f"no JSON scenes with lights in {DATA}")
needs_tfrecord = pytest.mark.skipif(not TFRECORD.is_file(), reason=f"{TFRECORD} not found")
STATE_NAMES = [s.name for s in TrafficLightState]
INIT = ConvertConfig().init_step


# ----------------------------------------------------------- protobuf wire format
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        out |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes) -> dict[int, list]:
    """{field number: [values]}: ints for varints, bytes for length-delimited and fixed."""
    out: dict[int, list] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(num, []).append(value)
    return out


def _double(f: dict, num: int) -> float:
    return struct.unpack("<d", f[num][0])[0] if num in f else 0.0


def _records(path: Path) -> list[bytes]:
    """TFRecord framing: u64 length, u32 CRC, payload, u32 CRC (CRCs not checked here)."""
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        out.append(data[i + 12 : i + 12 + n])
        i += 16 + n
    return out


def _womd_raw(path: Path) -> dict:
    """The first scene of a WOMD TFRecord: SDC track positions, lane polylines and light
    series by lane id (Scenario: tracks 2, sdc_track_index 6, dynamic_map_states 7,
    map_features 8; ObjectState: center_x 2, center_y 3, valid 11; MapFeature: id 1,
    lane 3 (LaneCenter.polyline 8); TrafficSignalLaneState: lane 1, state 2,
    stop_point 3; MapPoint: x 1, y 2)."""
    scene = _fields(_records(path)[0])
    sdc = scene[6][0]
    states = [_fields(s) for s in _fields(scene[2][sdc])[3]]
    sdc_xy = np.array([[_double(s, 2), _double(s, 3)] for s in states])
    sdc_valid = np.array([bool(s.get(11, [0])[0]) for s in states])
    lanes = {}
    for feature in scene.get(8, []):
        f = _fields(feature)
        if 3 in f:
            pts = [_fields(p) for p in _fields(f[3][0]).get(8, [])]
            lanes[f[1][0]] = np.array([[_double(p, 1), _double(p, 2)] for p in pts])
    t_steps = len(states)
    lights: dict[int, dict] = {}
    for t, dms in enumerate(scene.get(7, [])):
        for ls in _fields(dms).get(1, []):
            f = _fields(ls)
            stop = _fields(f[3][0]) if 3 in f else {}
            rec = lights.setdefault(f[1][0], {"state": np.zeros(t_steps, np.int64),
                                              "valid": np.zeros(t_steps, bool), "stops": []})
            rec["state"][t] = f.get(2, [0])[0]
            rec["valid"][t] = True
            rec["stops"].append((_double(stop, 1), _double(stop, 2)))
    return {"sdc_xy": sdc_xy, "sdc_valid": sdc_valid, "lanes": lanes, "lights": lights}


def _json_raw(path: Path) -> dict:
    """The same facts from a GPUDrive JSON scene (``tl_states`` by lane id)."""
    d = json.loads(path.read_text())
    sdc = d["objects"][d["metadata"]["sdc_track_index"]]
    sdc_xy = np.array([[p["x"], p["y"]] for p in sdc["position"]])
    t_steps = len(sdc_xy)
    lanes = {r["id"]: np.array([[p["x"], p["y"]] for p in r["geometry"]])
             for r in d["roads"] if r["type"] == "lane"}
    lights = {}
    for lane, series in d["tl_states"].items():
        state = np.zeros(t_steps, np.int64)
        valid = np.zeros(t_steps, bool)
        for t, name in zip(series["time_index"], series["state"], strict=True):
            state[t] = STATE_NAMES.index(name.upper())
            valid[t] = True
        lights[int(lane)] = {"state": state, "valid": valid,
                             "stops": list(zip(series["x"], series["y"], strict=True))}
    return {"sdc_xy": sdc_xy, "sdc_valid": np.array(sdc["valid"], bool), "lanes": lanes,
            "lights": lights}


def _counts(raw: dict) -> dict[str, int]:
    out = dict.fromkeys(STATE_NAMES, 0)
    for rec in raw["lights"].values():
        for s in rec["state"][rec["valid"]]:
            out[STATE_NAMES[s]] += 1
    return out


REAL = ([pytest.param(p, _json_raw, marks=needs_json, id=f"json-{p.stem[-8:]}")
         for p in JSON_FILES]
        + [pytest.param(TFRECORD, _womd_raw, marks=needs_tfrecord, id="tfrecord")])


@pytest.mark.parametrize(("path", "parse"), REAL)
def test_converted_lights_match_the_raw_file(path, parse):
    raw = parse(path)
    arrays, info = convert_one(str(path), real_data_config(), ConvertConfig())
    T = arrays["traffic_lights.state"].shape[1]
    # Recentring: the origin is the SDC's raw position at init_step, and the SDC (slot 0)
    # is stored relative to it at every valid step.
    origin = raw["sdc_xy"][INIT]
    np.testing.assert_allclose(info["origin"], origin, rtol=0, atol=1e-9)
    v = raw["sdc_valid"][:T]
    np.testing.assert_allclose(arrays["objects.xy"][0, :T][v] + origin, raw["sdc_xy"][:T][v],
                               rtol=0, atol=1e-3)
    # Every light kept (12 in each real scene, 32 slots).
    lit = arrays["traffic_lights.valid"].any(axis=1)
    assert info["truncated_traffic_lights"] == 0
    assert lit.sum() == len(raw["lights"]) > 0
    assert not lit[len(raw["lights"]):].any()  # kept lights fill the first slots
    rg_xy, rg_id = arrays["roadgraph.xy"], arrays["roadgraph.id"]
    rg_type, rg_valid = arrays["roadgraph.type"], arrays["roadgraph.valid"]
    unmatched = set(raw["lights"])
    for k in np.flatnonzero(lit):
        lane = arrays["traffic_lights.lane_id"][k]
        on = rg_valid & (rg_id == lane)
        assert lane >= 0 and on.sum() >= 2, f"light {k}: lane {lane} not in the road graph"
        assert (rg_type[on] == RoadType.LANE_CENTER).all()
        pts = rg_xy[on].astype(np.float64) + origin
        stop = arrays["traffic_lights.stop_xy"][k].astype(np.float64) + origin
        state = arrays["traffic_lights.state"][k]
        valid = arrays["traffic_lights.valid"][k]

        def same_light(fid, pts=pts, stop=stop, state=state, valid=valid):
            rec, geom = raw["lights"][fid], raw["lanes"].get(fid)
            # The kept lane points are points of the raw lane (simplification only drops).
            on_lane = geom is not None and np.all(np.min(np.linalg.norm(
                pts[:, None] - geom[None], axis=-1), axis=1) < 1e-3)
            return (on_lane and np.abs(stop - rec["stops"][0]).max() < 1e-3
                    and np.array_equal(valid, rec["valid"][:T])
                    and np.array_equal(state[valid], rec["state"][:T][valid]))

        fid = next((f for f in sorted(unmatched) if same_light(f)), None)
        assert fid is not None, f"light {k} matches no raw light"
        unmatched.remove(fid)
        # The raw stop point is the same at every step (so the first one is the one).
        assert np.ptp(np.array(raw["lights"][fid]["stops"]), axis=0).max() < 1e-9
    assert not unmatched
    # Invalid light-steps and empty slots hold state 0.
    assert (arrays["traffic_lights.state"][~arrays["traffic_lights.valid"]] == 0).all()


@pytest.mark.skipif(not (JSON_FILES and TFRECORD.is_file()), reason=f"no real lights in {DATA}")
def test_inspect_counts_light_steps_per_state_of_real_scenes(tmp_path, capsys):
    cache = tmp_path / "cache"
    assert cli(["convert", str(TFRECORD), *map(str, JSON_FILES), "--out", str(cache)]) == 0
    capsys.readouterr()
    assert cli(["inspect", str(cache), "--all", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    raws = [_womd_raw(TFRECORD)] + [_json_raw(p) for p in JSON_FILES]
    want = [_counts(r) for r in raws]
    assert [s["traffic_light_states"] for s in out["per_scenario"]] == want
    assert [s["traffic_lights"] for s in out["per_scenario"]] == [len(r["lights"]) for r in raws]
    assert out["traffic_light_states"] == {k: sum(w[k] for w in want) for k in STATE_NAMES}
    # The two real scenes have red, green and unknown light-steps between them.
    assert min(out["traffic_light_states"][k] for k in ("STOP", "GO", "UNKNOWN")) > 0
    # One scene, straight from its source file.
    assert cli(["inspect", str(JSON_FILES[0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["traffic_light_states"] == want[1]


def test_inspect_counts_on_a_synthetic_cache(tmp_path, capsys):
    protos = [synth_scenario(i, num_objects=6, num_steps=40, num_lanes=3, lane_points=10,
                             num_edges=1, edge_points=5, num_lines=1, line_points=5,
                             num_lights=n) for i, n in enumerate((2, 3))]
    write_records(tmp_path / "s.tfrecord", [p.SerializeToString() for p in protos])
    cache = tmp_path / "cache"
    assert cli(["convert", str(tmp_path / "s.tfrecord"), "--out", str(cache),
                "--max-agents", "8", "--num-steps", "40", "--max-road-points", "64",
                "--max-lanes", "4", "--max-traffic-lights", "4"]) == 0
    want = []
    for p in protos:
        c = dict.fromkeys(STATE_NAMES, 0)
        for dms in p.dynamic_map_states:
            for ls in dms.lane_states:
                c[STATE_NAMES[ls.state]] += 1
        want.append(c)
    assert sum(want[1].values()) == 3 * 40 and want[1]["GO"] > 0 and want[1]["STOP"] > 0
    capsys.readouterr()
    assert cli(["inspect", str(cache), "--all", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["traffic_light_states"] for s in out["per_scenario"]] == want
    assert out["traffic_lights"] == 5
    # The text form names each state with light-steps.
    assert cli(["inspect", str(cache), "--all"]) == 0
    text = capsys.readouterr().out
    total = {k: want[0][k] + want[1][k] for k in STATE_NAMES}
    assert "total light-steps: " + ", ".join(f"{k} {v}" for k, v in total.items() if v) in text
    assert cli(["inspect", str(cache), "--index", "1"]) == 0
    assert ", ".join(f"{k} {v}" for k, v in want[1].items() if v) in capsys.readouterr().out
    # --all needs a converted directory.
    assert cli(["inspect", str(tmp_path / "s.tfrecord"), "--all"]) == 2

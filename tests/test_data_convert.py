"""Conversion to padded arrays (agent choice, road budget, lights, lanes), shards and
manifest, load_scenarios, the CLI, the prefetching dataset and subsets."""

import csv
import itertools
import json
import os
import runpy
import sys

import jax
import numpy as np
import pytest

from jaxdrive.config import ConfigError
from jaxdrive.data import load_scenarios
from jaxdrive.data.__main__ import main as cli
from jaxdrive.data.checks import scenario_problems
from jaxdrive.data.convert import ConvertConfig, arrays_to_scenario, convert_scene
from jaxdrive.data.dataset import ScenarioDataset
from jaxdrive.data.raw import RawScene, SceneError, pack_polylines
from jaxdrive.data.subsets import subset_ids
from jaxdrive.data.synth import raw_to_json, synth_scenario
from jaxdrive.data.tfrecord import write_records
from jaxdrive.data.womd import parse_scenario
from jaxdrive.scenarios.base import ScenarioConfig, validate_scenario
from jaxdrive.types import ObjectType, RoadType, TrafficLightState

WORLD = np.array([8123.456789, -3021.987654])  # kilometre-scale world offset


def make_raw(objects, polylines, t=6, sdc=0, of_interest=(), to_predict=(), lights=(),
             exits=None):
    """objects: list of (x, y, valid list or None = all); each moves +1 m/step in x."""
    n = len(objects)
    xy = np.zeros((n, t, 2))
    valid = np.zeros((n, t), bool)
    for i, (x, y, ok) in enumerate(objects):
        xy[i] = WORLD + np.array([x, y]) + np.stack([np.arange(t), np.zeros(t)], 1)
        valid[i] = True if ok is None else ok
    road_xy, start, rtype, rid = pack_polylines(
        [(np.asarray(p, float) + WORLD, ty, fid) for p, ty, fid in polylines])
    tl_lane = np.array([lane for lane, _, _ in lights], np.int64)
    tl_state = np.array([st for _, st, _ in lights], np.int32).reshape(len(lights), t)
    tl_stop = np.array([xy_ for _, _, xy_ in lights], float).reshape(len(lights), 2) + WORLD
    return RawScene(
        scenario_id="hand", source="hand.json", xy=xy, yaw=np.full((n, t), 0.1), vel=np.ones(
            (n, t, 2)), valid=valid, length=np.arange(n) + 4.0, width=np.full(n, 2.0),
        object_type=np.ones(n, np.int32), object_id=np.arange(n) + 100, sdc_index=sdc,
        of_interest=np.isin(np.arange(n), of_interest),
        to_predict=np.isin(np.arange(n), to_predict), expert=np.zeros(n, bool),
        road_xy=road_xy, road_start=start, road_type=rtype, road_id=rid,
        lane_exits=exits or {}, tl_lane=tl_lane, tl_state=tl_state,
        tl_valid=tl_state > 0, tl_stop_xy=tl_stop,
    ).check()


EDGE = [(x, -4.0) for x in range(10)]  # 10 points
LANE = [(x * 0.5, 0.0) for x in range(21)]  # 21 points
LINE = [(x, 4.0) for x in range(11)]  # 11 points
ROADS = [(LINE, RoadType.ROAD_LINE, 7), (LANE, RoadType.LANE_CENTER, 5),
         (EDGE, RoadType.ROAD_EDGE, 9)]


def test_agent_selection_order_and_counts():
    # SDC = object 3 (at x=0); object 5 of interest (far), object 1 to predict (far);
    # the rest by distance from the SDC at init_step 2: obj 0 at 3 m, obj 2 at 1 m,
    # obj 4 at 2 m; obj 6 is never valid.
    objs = [(3, 0, None), (50, 0, None), (1, 0, None), (0, 0, None), (2, 0, None),
            (90, 0, None), (0, 0, [False] * 6)]
    raw = make_raw(objs, ROADS, sdc=3, of_interest=[5], to_predict=[1])
    cfg = ScenarioConfig(max_agents=5, num_steps=6, max_road_points=64, max_lanes=4)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=2))
    # Kept: SDC 3, interest 5, predict 1, then nearest 2 (1 m) and 4 (2 m); 0 truncated.
    np.testing.assert_array_equal(arrays["objects.length"], [7.0, 9.0, 5.0, 6.0, 8.0])
    assert info["truncated_agents"] == 1 and info["dropped_invalid_agents"] == 1
    np.testing.assert_array_equal(arrays["objects.is_sdc"], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(arrays["objects.of_interest"], [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(arrays["objects.to_predict"], [0, 0, 1, 0, 0])
    # Origin: the SDC at step 2 = WORLD + (2, 0); the SDC's step-0 position is (-2, 0).
    np.testing.assert_allclose(info["origin"], WORLD + [2.0, 0.0], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(arrays["objects.xy"][0, 0], [-2.0, 0.0])
    # Goal: the last valid position (step 5): object 5 at 90 + 5 - 2 = 93 m.
    np.testing.assert_allclose(arrays["objects.goal"][1], [93.0, 0.0], atol=1e-4)


def test_relative_coordinates_keep_centimetres_at_kilometre_scale():
    objs = [(0.0123456, 0.0, None), (123.4567891, -45.678912, None)]
    raw = make_raw(objs, ROADS)
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=64, max_lanes=4)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    expect = raw.xy - np.asarray(info["origin"])  # float64 reference
    np.testing.assert_allclose(arrays["objects.xy"], expect, rtol=0, atol=1e-5)
    # The same in float32 world coordinates would be off by about a millimetre.
    assert np.max(np.abs(raw.xy.astype(np.float32) - raw.xy)) > 1e-4


def test_road_budget_simplifies_straight_runs_and_keeps_corners():
    # 10 edge + 21 lane + 11 line = 42 points > 30: every polyline is simplified at the
    # 0.05 m tolerance. Lane and line are straight (2 points each); the edge is an L
    # (kerb corner at x = 9): (0,-4) .. (9,-4) then up to (9,-1): 3 points.
    kerb = EDGE + [(9, -3), (9, -2), (9, -1)]
    roads = ROADS[:2] + [(kerb, RoadType.ROAD_EDGE, 9)]
    raw = make_raw([(0, 0, None)], roads)
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=30, max_lanes=4)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    assert info["road_tolerance"] == [0.05, 0.05]
    assert info["num_road_points"] == 7 and info["truncated_road_points"] == 45 - 7
    assert info["simplified_road_points"] == 45 - 7 and info["dropped_polylines"] == 0
    rg_valid, rg_type, rg_id = (arrays[k] for k in ("roadgraph.valid", "roadgraph.type",
                                                    "roadgraph.id"))
    np.testing.assert_array_equal(rg_valid, np.arange(30) < 7)
    # Lanes first with id 0, then the line (id L + 0) and the edge (L + 1), raw order.
    np.testing.assert_array_equal(rg_id[:7], [0, 0, 4, 4, 5, 5, 5])
    np.testing.assert_array_equal(rg_id[7:], -1)
    np.testing.assert_array_equal(rg_type[4:7], RoadType.ROAD_EDGE)
    np.testing.assert_allclose(arrays["roadgraph.xy"][:7],
                               [[0, 0], [10, 0], [0, 4], [10, 4], [0, -4], [9, -4], [9, -1]],
                               atol=1e-4)
    # Directions: along each kept segment (last points copy the previous one), zero padding.
    np.testing.assert_allclose(arrays["roadgraph.dir"][:7],
                               [[1, 0], [1, 0], [1, 0], [1, 0], [1, 0], [0, 1], [0, 1]],
                               atol=1e-6)
    np.testing.assert_array_equal(arrays["roadgraph.dir"][7:], 0)
    np.testing.assert_array_equal(arrays["lanes.valid"], [1, 0, 0, 0])


def _zigzag(n, y0, amp=3.0):
    """n points 1 m apart in x, alternating y0 / y0 + amp: every vertex a sharp corner
    (at least 1.4 m off any chord between other vertices)."""
    return [(x, y0 + amp * (x % 2)) for x in range(n)]


def test_road_budget_coarsens_others_before_edges():
    # The edge zigzags (10 sharp corners, kept at any tolerance up to 1.4 m); the lane is
    # straight but for a 1 m bump at x = 10 and a 0.3 m bump at x = 5. Budget 13: edge 10
    # + lane endpoints 2 leaves one lane point: the others' tolerance rises past 0.3 m,
    # the 1 m bump stays, the edges keep the 0.05 m tolerance.
    lane = [(x * 0.5, 0.0) for x in range(21)]
    lane[10], lane[20] = (5.0, 1.0), (10.0, 0.0)
    lane[5] = (2.5, 0.3)
    roads = [(lane, RoadType.LANE_CENTER, 5), (_zigzag(10, -8), RoadType.ROAD_EDGE, 9)]
    raw = make_raw([(0, 0, None)], roads)
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=13, max_lanes=4)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    edge_tol, other_tol = info["road_tolerance"]
    assert edge_tol == 0.05 and 0.05 < other_tol < 1.0
    assert info["num_road_points"] == 13 and info["dropped_polylines"] == 0
    np.testing.assert_allclose(arrays["roadgraph.xy"][:3], [[0, 0], [5, 1], [10, 0]],
                               atol=1e-4)
    assert any("over budget" in note for note in info["notes"])


def test_road_budget_drops_least_important_polylines_last_resort():
    # Zigzags with sharp corners keep every point even at the coarsest tolerance (1 m):
    # edge 10 + lane 21 + line 11 = 42 > 12. Drop the line, then the lane: the edge fits.
    roads = [(_zigzag(11, 8), RoadType.ROAD_LINE, 7), (_zigzag(21, 0), RoadType.LANE_CENTER, 5),
             (_zigzag(10, -8), RoadType.ROAD_EDGE, 9)]
    raw = make_raw([(0, 0, None)], roads)
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=12, max_lanes=4)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0, max_road_tolerance=1.0))
    assert info["dropped_polylines"] == 2 and info["num_road_points"] == 10
    assert info["truncated_road_points"] == 42 - 10 and info["road_tolerance"] == [1.0, 1.0]
    np.testing.assert_array_equal(arrays["roadgraph.type"][:10], RoadType.ROAD_EDGE)
    np.testing.assert_allclose(arrays["roadgraph.xy"][:10, 0], np.arange(10), atol=1e-4)


def test_lanes_successors_and_traffic_lights():
    lanes = [([(0, 0), (1, 0)], RoadType.LANE_CENTER, 10),
             ([(50, 0), (51, 0)], RoadType.LANE_CENTER, 11),
             ([(2, 0), (3, 0)], RoadType.LANE_CENTER, 12),
             (EDGE, RoadType.ROAD_EDGE, 13)]
    t = 6
    go, stop = int(TrafficLightState.GO), int(TrafficLightState.STOP)
    lights = [(11, [go] * t, (50, 0)), (12, [stop, stop, go, go, 0, 0], (3, 0)),
              (10, [go] * t, (1, 0))]
    raw = make_raw([(0, 0, None)], lanes, lights=lights, exits={10: [12, 11], 12: [11]})
    # Two lane slots: lanes 10 and 12 are nearest; 11 (50 m) is dropped. One successor
    # slot; two traffic-light slots: the stop points nearest the origin (12, 10).
    cfg = ScenarioConfig(max_agents=2, num_steps=t, max_road_points=64, max_lanes=2,
                         max_lane_successors=1, max_traffic_lights=2)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    assert info["truncated_lanes"] == 1 and info["dropped_polylines"] == 1
    # Lane 10 -> id 0, lane 12 -> id 1. 10 exits to 12 (kept) and 11 (dropped lane).
    np.testing.assert_array_equal(arrays["lanes.successors"], [[1], [-1]])
    assert info["dropped_lane_links"] == 2 and info["truncated_lane_successors"] == 0
    assert info["truncated_traffic_lights"] == 1
    np.testing.assert_array_equal(arrays["traffic_lights.lane_id"], [0, 1])
    np.testing.assert_array_equal(arrays["traffic_lights.state"][1],
                                  [stop, stop, go, go, 0, 0])
    np.testing.assert_array_equal(arrays["traffic_lights.valid"][1], [1, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(arrays["traffic_lights.stop_xy"], [[1, 0], [3, 0]], atol=1e-4)
    # Edge ids follow the lane slots: L + 0 = 2.
    assert set(arrays["roadgraph.id"][arrays["roadgraph.type"] == RoadType.ROAD_EDGE]) == {2}


def test_steps_truncated_or_padded_and_bad_sdc_rejected():
    raw = make_raw([(0, 0, None), (5, 0, [True, False, True, True, True, False])], ROADS)
    short = ScenarioConfig(max_agents=2, num_steps=4, max_road_points=64, max_lanes=4)
    arrays, info = convert_scene(raw, short, ConvertConfig(init_step=0))
    assert info["truncated_steps"] == 2
    np.testing.assert_allclose(arrays["objects.goal"][1], [8.0, 0.0], atol=1e-4)  # step 3
    long = short.replace(num_steps=9)
    arrays, info = convert_scene(raw, long, ConvertConfig(init_step=0))
    assert info["padded_steps"] == 3
    np.testing.assert_array_equal(arrays["objects.valid"][0], [1] * 6 + [0] * 3)
    with pytest.raises(SceneError, match="no valid SDC"):
        convert_scene(make_raw([(0, 0, [False] * 6)], ROADS), short, ConvertConfig(0))
    with pytest.raises(SceneError, match="no valid SDC"):
        convert_scene(make_raw([(0, 0, None)], ROADS, sdc=-1), short, ConvertConfig(0))


def test_checks_flag_broken_scenarios():
    raw = make_raw([(0, 0, None), (5, 0, None)], ROADS)
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=64, max_lanes=4)
    arrays, _ = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    assert scenario_problems(arrays_to_scenario(arrays), cfg, init_step=0) == []
    two = dict(arrays, **{"objects.is_sdc": np.array([True, True])})
    assert "2 agents are marked SDC" in scenario_problems(arrays_to_scenario(two), cfg, 0)[0]
    late = dict(arrays, **{"objects.valid": np.array([[False] * 6, [True] * 6])})
    assert "not valid at init_step 0" in scenario_problems(arrays_to_scenario(late), cfg, 0)[0]
    no_edge = dict(arrays, **{"roadgraph.type": np.where(
        arrays["roadgraph.type"] == RoadType.ROAD_EDGE, RoadType.ROAD_LINE,
        arrays["roadgraph.type"])})
    assert "no road-edge" in scenario_problems(arrays_to_scenario(no_edge), cfg, 0)[0]


# ---------------------------------------------------------------------- files, cache, CLI
SMALL = ScenarioConfig(max_agents=8, num_steps=20, max_road_points=128, max_lanes=8,
                       max_traffic_lights=4)
SYNTH = dict(num_objects=10, num_steps=20, num_lanes=4, lane_points=30, num_edges=3,
             edge_points=20, num_lines=2, line_points=10, num_lights=2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two TFRecord files (5 scenes) and two JSON scenes (one malformed)."""
    d = tmp_path_factory.mktemp("inputs")
    protos = [synth_scenario(i, **SYNTH) for i in range(5)]
    write_records(d / "a.tfrecord", [p.SerializeToString() for p in protos[:3]])
    write_records(d / "b.tfrecord", [p.SerializeToString() for p in protos[3:]])
    raw = parse_scenario(synth_scenario(7, **SYNTH, scenario_id="json7").SerializeToString())
    (d / "scene7.json").write_text(json.dumps(raw_to_json(raw)))
    (d / "broken.json").write_text('{"objects": [')
    return d


def test_convert_cli_manifest_and_load_round_trip(inputs, tmp_path, capsys):
    out = tmp_path / "cache"
    rc = cli(["convert", str(inputs / "a.tfrecord"), str(inputs / "b.tfrecord"),
              str(inputs / "scene7.json"), str(inputs / "broken.json"), "--out", str(out),
              "--max-agents", "8", "--num-steps", "20", "--max-road-points", "128",
              "--max-lanes", "8", "--max-traffic-lights", "4", "--shard-size", "4"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["num_scenarios"] == 6 and m["num_shards"] == 2
    assert [s["num_scenarios"] for s in m["shards"]] == [4, 2]
    # Objects valid at some step, beyond the 8 slots, counted from the protos themselves.
    present = [sum(any(st.valid for st in tr.states) for tr in synth_scenario(i, **SYNTH).tracks)
               for i in (0, 1, 2, 3, 4, 7)]
    assert m["truncated_agents"] == sum(max(0, p - 8) for p in present) > 0
    assert m["totals"]["dropped_invalid_agents"] == sum(10 - p for p in present)
    assert m["truncated_road_points"] == sum(r["truncated_road_points"] for r in m["scenarios"])
    assert m["truncated_road_points"] > 0
    assert [s["source"] for s in m["skipped"]] == [str(inputs / "broken.json")]
    assert "malformed JSON" in m["skipped"][0]["reason"]
    assert m["scenario_config"] == SMALL.to_dict() and m["version"] == 1
    assert len(m["source_files"]) == 4 and m["total_bytes"] > 0
    ids = [r["scenario_id"] for r in m["scenarios"]]
    assert ids == [f"synth{i:08d}" for i in range(5)] + ["json7"]
    # The cache loads to exactly what converting the inputs in memory gives.
    cached, rep_c = load_scenarios([str(out)], SMALL)
    direct, rep_d = load_scenarios([str(inputs / "a.tfrecord"), str(inputs / "b.tfrecord"),
                                    str(inputs / "scene7.json")], SMALL)
    validate_scenario(cached, SMALL, batch_dims=1)
    for a, b in zip(jax.tree.leaves(cached), jax.tree.leaves(direct), strict=True):
        np.testing.assert_array_equal(a, b)
    assert rep_c["scenario_ids"] == rep_d["scenario_ids"] == ids
    np.testing.assert_array_equal(rep_c["origins"], rep_d["origins"])
    # Loading into larger sizes pads; lane ids stay < L, other polylines move up.
    big = SMALL.replace(max_agents=10, max_lanes=12, max_road_points=160)
    padded, _ = load_scenarios([str(out)], big)
    validate_scenario(padded, big, batch_dims=1)
    np.testing.assert_array_equal(padded.objects.xy[:, :8], cached.objects.xy)
    assert not padded.objects.valid[:, 8:].any()
    edge = cached.roadgraph.type == RoadType.ROAD_EDGE
    np.testing.assert_array_equal(padded.roadgraph.id[:, :128][edge],
                                  cached.roadgraph.id[edge] + 4)
    with pytest.raises(ConfigError, match="max_agents: stored 8 > wanted 4"):
        load_scenarios([str(out)], SMALL.replace(max_agents=4))
    capsys.readouterr()
    assert cli(["inspect", str(out), "--id", "json7"]) == 0
    text = capsys.readouterr().out
    assert "scenario json7" in text and "agents: 8 kept of 10" in text
    assert "checks: ok" in text
    # A manifest written before road simplification (convert_config with max_stride)
    # still reads.
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["convert_config"] = {"init_step": 2, "max_stride": 64}
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert cli(["inspect", str(out), "--id", "json7"]) == 0
    assert "init_step 2" in capsys.readouterr().out


def test_json_and_tfrecord_paths_agree(inputs):
    # scene7.json was written from the same proto content: identical arrays, except the
    # lane graph, which the JSON format does not carry.
    proto = synth_scenario(7, **SYNTH, scenario_id="json7")
    (inputs / "seven.tfrecord").write_bytes(b"")
    write_records(inputs / "seven.tfrecord", [proto.SerializeToString()])
    a, _ = load_scenarios([str(inputs / "seven.tfrecord")], SMALL)
    b, _ = load_scenarios([str(inputs / "scene7.json")], SMALL)
    assert (a.lanes.successors >= 0).any() and (b.lanes.successors == -1).all()
    a = a.replace(lanes=a.lanes.replace(successors=b.lanes.successors))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    os.remove(inputs / "seven.tfrecord")


def test_load_scenarios_errors_are_clear(inputs, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_scenarios([str(tmp_path / "nope.json")], SMALL)
    with pytest.raises(ConfigError, match="no usable scenarios.*malformed JSON"):
        load_scenarios([str(inputs / "broken.json")], SMALL)


def test_module_entry_point_inspect(inputs, monkeypatch, capsys):
    # ``python -m jaxdrive.data`` runs __main__ (in this interpreter: a new one would
    # spend seconds importing JAX).
    monkeypatch.setattr(sys, "argv", [
        "jaxdrive.data", "inspect", str(inputs / "a.tfrecord"), "--index", "2",
        "--max-agents", "8", "--num-steps", "20", "--max-road-points", "128",
        "--max-lanes", "8", "--max-traffic-lights", "4", "--json"])
    monkeypatch.delitem(sys.modules, "jaxdrive.data.__main__")  # run it afresh as __main__
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("jaxdrive.data", run_name="__main__", alter_sys=True)
    assert exit_.value.code == 0
    s = json.loads(capsys.readouterr().out)
    assert s["scenario_id"] == "synth00000002" and s["steps"] == 20
    assert s["agents"] == 8 and s["agents_in_source"] == 10 and s["sdc"]["slot"] == 0
    assert s["traffic_lights"] == 2 and s["problems"] == []


# ---------------------------------------------------------------------- dataset, subsets
@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache")
    src = d / "src.tfrecord"
    write_records(src, [synth_scenario(i, **SYNTH).SerializeToString() for i in range(11)])
    assert cli(["convert", str(src), "--out", str(d / "c"), "--max-agents", "8",
                "--num-steps", "20", "--max-road-points", "128", "--max-lanes", "8",
                "--max-traffic-lights", "4", "--shard-size", "3", "--no-compress"]) == 0
    return d / "c"


def ids_of(ds, n):
    return [[str(s) for s in batch["meta.scenario_id"]]
            for batch in itertools.islice(ds.host_batches(), n)]


def test_dataset_seeded_shuffle_and_disjoint_host_split(cache):
    all_ids = [f"synth{i:08d}" for i in range(11)]
    one = ScenarioDataset(cache, 5, seed=1, repeat=False, drop_remainder=False,
                          process_index=0, process_count=1, prefetch=0)
    epoch = sum(ids_of(one, 10), [])
    assert sorted(epoch) == all_ids and epoch != all_ids  # a permutation, not the order
    again = ScenarioDataset(cache, 5, seed=1, repeat=False, drop_remainder=False,
                            process_index=0, process_count=1, prefetch=0)
    assert sum(ids_of(again, 10), []) == epoch
    other = ScenarioDataset(cache, 5, seed=2, repeat=False, drop_remainder=False,
                            process_index=0, process_count=1, prefetch=0)
    assert sum(ids_of(other, 10), []) != epoch
    hosts = [ScenarioDataset(cache, 1, seed=3, repeat=False, process_index=h,
                             process_count=3, prefetch=0) for h in range(3)]
    got = [sum(ids_of(ds, 20), []) for ds in hosts]
    # 11 scenes over 3 hosts: 3 each (equal split), disjoint; host h owns h, h+3, h+6.
    assert [len(g) for g in got] == [3, 3, 3]
    for h, g in enumerate(got):
        assert sorted(g) == [all_ids[i] for i in (h, h + 3, h + 6)]
    assert hosts[0].num_dropped_for_balance == 1  # scene 9; 10 goes to host 1 -> dropped
    # Repeat: epochs continue seamlessly, each epoch a fresh permutation.
    rep = ScenarioDataset(cache, 11, seed=1, process_index=0, process_count=1, prefetch=0)
    e0, e1 = ids_of(rep, 2)
    assert sorted(e0) == sorted(e1) == all_ids and e0 == epoch and e1 != e0


def test_dataset_prefetch_thread_yields_device_batches(cache):
    seen = []

    def transform(s):
        seen.append(1)
        return s

    ds = ScenarioDataset(cache, 4, seed=0, process_index=0, process_count=1, prefetch=2,
                         transform=transform)
    batches = list(itertools.islice(ds, 5))
    assert len(batches) == 5 and ds.batches_served == 5
    assert isinstance(batches[0].objects.xy, jax.Array)
    validate_scenario(batches[0], SMALL, batch_dims=1)
    assert batches[0].objects.xy.shape[0] == 4 and len(seen) >= 5
    assert ds._thread is None  # closed when the loop stopped
    # The same stream without the thread.
    sync = ScenarioDataset(cache, 4, seed=0, process_index=0, process_count=1, prefetch=0)
    for a, b in zip(batches, itertools.islice(sync, 5), strict=True):
        np.testing.assert_array_equal(a.objects.xy, b.objects.xy)


def test_subset_from_scores_csv_and_dataset_filter(cache, tmp_path, capsys):
    scores = tmp_path / "scores.csv"
    with open(scores, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario_id", "lane_change_score"])
        for i in range(11):
            w.writerow([f"synth{i:08d}", i / 10])
        w.writerow(["unknown_id", 5.0])
    assert cli(["subset", str(cache), "--scores", str(scores), "--threshold", "0.75",
                "--name", "lane_change"]) == 0
    assert "lane_change: 3 scenarios" in capsys.readouterr().out
    ids = [f"synth{i:08d}" for i in (8, 9, 10)]
    assert subset_ids(cache, "lane_change") == ids
    m = json.loads((cache / "manifest.json").read_text())
    assert m["classes"]["lane_change"] == ids
    (cache / "subsets" / "hard_stop.json").write_text(json.dumps(
        {"name": "hard_stop", "scenario_ids": ["synth00000001"]}))
    ds = ScenarioDataset(cache, 1, subset="lane_change", repeat=False, process_index=0,
                         process_count=1, prefetch=0)
    assert sorted(sum(ids_of(ds, 10), [])) == ids
    assert cli(["subset", str(cache), "--list"]) == 0
    listing = capsys.readouterr().out
    assert "hard_stop: 1 scenarios" in listing and "lane_change: 3 scenarios" in listing
    with pytest.raises(ConfigError, match="no subset 'nope'"):
        subset_ids(cache, "nope")


def test_object_types_survive_conversion():
    proto = synth_scenario(3, **SYNTH)
    raw = parse_scenario(proto.SerializeToString())
    arrays, _ = convert_scene(raw, SMALL, ConvertConfig())
    kinds = set(arrays["objects.type"][arrays["objects.valid"].any(1)].tolist())
    assert kinds <= {ObjectType.VEHICLE, ObjectType.PEDESTRIAN} and ObjectType.VEHICLE in kinds

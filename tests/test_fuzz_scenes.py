"""Property-based fuzzing of scene files (hypothesis), issue 15.

Small valid scenes (the JSON layout with metadata and traffic lights, the legacy JSON
layout without metadata, ids or heights, and a WOMD proto) are mutated at random: a value
replaced by null, NaN, +-inf, a string, a huge number, a bool, a nested list or JSON
nested far too deeply, a key or element deleted, a value wrapped in a list. Properties:

- reader + converter: either a usable scene (every array finite, shapes and dtypes as the
  ``ScenarioConfig`` says, sanity checks pass) or a ``SceneError`` whose message names
  the file; never any other exception;
- the conversion CLI into an existing cache: always a manifest, the scene either
  converted or skipped with a reason naming the file (never "unexpected error"), and no
  file created, changed or deleted outside the output directory.

Example counts: ``JAXDRIVE_FUZZ_EXAMPLES`` (default 300 for the reader, a fifth of it
for the CLI); the ``slow`` tests run 5,000 (``python -m pytest -m slow
tests/test_fuzz_scenes.py``). Examples are derandomized (the same every run) unless
``JAXDRIVE_FUZZ_RANDOM=1``. Each test prints its outcome counts (``pytest -s``).
"""

import collections
import contextlib
import copy
import io
import json
import math
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxdrive.data.__main__ import main as cli
from jaxdrive.data.checks import scenario_problems
from jaxdrive.data.convert import ConvertConfig, arrays_to_scenario, convert_scene
from jaxdrive.data.json_scene import read_json_scene
from jaxdrive.data.load import UNEXPECTED
from jaxdrive.data.raw import SceneError
from jaxdrive.data.shards import shard_dtype
from jaxdrive.data.synth import raw_to_json, synth_scenario
from jaxdrive.data.womd import parse_scenario
from jaxdrive.scenarios.base import ScenarioConfig

EXAMPLES = int(os.environ.get("JAXDRIVE_FUZZ_EXAMPLES", "300"))
SLOW_EXAMPLES = 5000
RANDOM = os.environ.get("JAXDRIVE_FUZZ_RANDOM") == "1"
SC = ScenarioConfig(max_agents=4, num_steps=8, max_road_points=32, max_lanes=4,
                    max_traffic_lights=2)
CC = ConvertConfig(init_step=2)
SIZES = ["--max-agents", "4", "--num-steps", "8", "--max-road-points", "32", "--max-lanes",
         "4", "--max-traffic-lights", "2", "--init-step", "2"]
DEEP = "\x00deep\x00"  # replaced by JSON nested far beyond Python's recursion limit
DEEP_JSON = "[" * 50_000 + "]" * 50_000
ALLOWED_PROBLEMS = {"no road-edge points (off-road detection needs them)"}


def _proto(seed: int = 5):
    return synth_scenario(seed, num_objects=3, num_steps=8, num_lanes=1, lane_points=3,
                          num_edges=1, edge_points=3, num_lines=1, line_points=2,
                          num_lights=1, scenario_id="fuzz")


def _bases() -> dict[str, dict]:
    new = raw_to_json(parse_scenario(_proto().SerializeToString()))
    legacy = copy.deepcopy(new)
    del legacy["metadata"], legacy["scenario_id"]
    for obj in legacy["objects"]:
        del obj["id"], obj["height"], obj["mark_as_expert"]
        obj["heading"] = [h if h == -10000.0 else math.degrees(h) for h in obj["heading"]]
    for road in legacy["roads"]:
        del road["id"]
    legacy["tl_states"] = {}
    return {"new": new, "legacy": legacy}


BASES = _bases()


def _paths(node, prefix=()) -> list[tuple]:
    """Every path (tuple of keys / indices) below ``node`` (8 levels at most)."""
    out = []
    if len(prefix) >= 8:
        return out
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ())
    for key, child in items:
        out.append(prefix + (key,))
        out.extend(_paths(child, prefix + (key,)))
    return out


def _pattern(path) -> tuple:
    return tuple("*" if isinstance(k, int) else k for k in path)


REPLACEMENTS = st.one_of(
    st.sampled_from([None, math.nan, math.inf, -math.inf, "", "x", "1.5", "true", "nan",
                     10 ** 400, -(10 ** 30), 1e308, -1e308, 1e-320, True, False, 0, -1,
                     [], {}, [[[]]], [1, 2], {"x": 1}, DEEP]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2 ** 70), 2 ** 70),
    st.text(max_size=4), st.recursive(st.none() | st.integers(-3, 3),
                                      lambda c: st.lists(c, max_size=2), max_leaves=30),
)
MUTATION = st.tuples(st.sampled_from(["replace", "replace", "replace", "delete", "wrap"]),
                     st.integers(0, 1 << 30), st.integers(0, 1 << 30), REPLACEMENTS)


def mutate(base: dict, mutations) -> dict:
    """Apply ``(kind, i, j, value)`` mutations: the path is the ``j``-th of the ``i``-th
    path pattern (so that metadata keys are hit as often as per-step values)."""
    data = copy.deepcopy(base)
    for kind, i, j, value in mutations:
        groups = collections.defaultdict(list)
        for path in _paths(data):
            groups[_pattern(path)].append(path)
        if not groups:
            break
        keys = sorted(groups, key=repr)
        choices = groups[keys[i % len(keys)]]
        path = choices[j % len(choices)]
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if kind == "delete":
            del parent[path[-1]]
        elif kind == "wrap":
            parent[path[-1]] = [parent[path[-1]]]
        else:
            parent[path[-1]] = copy.deepcopy(value)  # never share the strategy's constants
    return data


def dump(data: dict) -> str:
    return json.dumps(data).replace(json.dumps(DEEP), DEEP_JSON)


def check_converted(arrays: dict) -> None:
    """A converted scene is usable: shapes, dtypes, finite floats, sanity checks."""
    shapes = SC.shapes()
    assert set(arrays) == set(shapes)
    for key, arr in arrays.items():
        assert arr.shape == shapes[key] and arr.dtype == shard_dtype(key), key
        assert arr.dtype.kind != "f" or np.isfinite(arr).all(), key
    problems = scenario_problems(arrays_to_scenario(arrays), SC, CC.init_step)
    assert set(problems) <= ALLOWED_PROBLEMS, problems


def _fuzz_reader(examples: int) -> collections.Counter:
    outcomes = collections.Counter()
    tmp_dir = tempfile.TemporaryDirectory(prefix="jaxdrive-fuzz-")
    tmp = tmp_dir.name

    @settings(max_examples=examples, deadline=None, database=None, derandomize=not RANDOM,
              suppress_health_check=list(HealthCheck))
    @given(base=st.sampled_from(sorted(BASES)), mutations=st.lists(MUTATION, min_size=1,
                                                                   max_size=3))
    def run(base, mutations):
        path = os.path.join(tmp, f"{base}.json")
        with open(path, "w") as f:
            f.write(dump(mutate(BASES[base], mutations)))
        try:
            raw = read_json_scene(path)
            arrays, _ = convert_scene(raw, SC, CC)
        except SceneError as e:
            assert str(e).startswith(path), str(e)
            outcomes[f"{base}: scene error"] += 1
            return
        check_converted(arrays)
        outcomes[f"{base}: converted"] += 1

    with tmp_dir:
        run()
    print(f"\njson reader fuzz: {sum(outcomes.values())} examples, {dict(outcomes)}")
    return outcomes


def test_fuzz_json_reader_and_converter():
    outcomes = _fuzz_reader(EXAMPLES)
    assert outcomes["new: converted"] > 0 and outcomes["new: scene error"] > 0


@pytest.mark.slow
def test_fuzz_json_reader_and_converter_long():
    _fuzz_reader(SLOW_EXAMPLES)


def _snapshot(root: str, skip: str) -> dict:
    """{path: (size, mtime_ns)} of everything under ``root`` except under ``skip``."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if os.path.join(d, x) != skip]
        for name in dirs + files:
            st_ = os.lstat(os.path.join(d, name))
            out[os.path.join(d, name)] = (st_.st_size, st_.st_mtime_ns)
    return out


def _fuzz_cli(examples: int) -> collections.Counter:
    outcomes = collections.Counter()
    good = dump(BASES["new"])

    @settings(max_examples=examples, deadline=None, database=None, derandomize=not RANDOM,
              suppress_health_check=list(HealthCheck))
    @given(base=st.sampled_from(sorted(BASES)), mutations=st.lists(MUTATION, min_size=1,
                                                                   max_size=3))
    def run(base, mutations):
        with tempfile.TemporaryDirectory(prefix="jaxdrive-fuzz-") as root:
            os.makedirs(os.path.join(root, "in"))
            out = os.path.join(root, "out")
            with open(os.path.join(root, "in", "good.json"), "w") as f:
                f.write(good)
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli(["convert", os.path.join(root, "in"), "--out", out, *SIZES]) == 0
            bad = os.path.join(root, "in", "mutated.json")
            with open(bad, "w") as f:
                f.write(dump(mutate(BASES[base], mutations)))
            before = _snapshot(root, out)
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli(["convert", os.path.join(root, "in"), "--out", out, *SIZES]) == 0
            assert _snapshot(root, out) == before  # nothing touched outside --out
            with open(os.path.join(out, "manifest.json")) as f:
                m = json.load(f)
            assert sorted(os.listdir(out)) == ["manifest.json", "shard-00000.npz"]
            for skip in m["skipped"]:
                assert skip["source"] == bad and skip["reason"].startswith(bad), skip
                assert UNEXPECTED not in skip["reason"], skip
            outcomes[f"{base}: {'skipped' if m['skipped'] else 'converted'}"] += 1

    run()
    print(f"\nconvert CLI fuzz: {sum(outcomes.values())} examples, {dict(outcomes)}")
    return outcomes


def test_fuzz_convert_cli_stays_inside_out_dir():
    outcomes = _fuzz_cli(max(10, EXAMPLES // 5))
    assert outcomes["new: skipped"] > 0


@pytest.mark.slow
def test_fuzz_convert_cli_stays_inside_out_dir_long():
    _fuzz_cli(SLOW_EXAMPLES // 5)


STATE_FIELDS = ("center_x", "center_y", "heading", "velocity_x", "velocity_y", "length",
                "width")
SPECIAL_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e30, 3e38, 0.0,
                                  -1.0, 1e-40]) | st.floats(width=32)
FIELD_EDIT = st.tuples(st.integers(0, 2), st.integers(0, 7), st.sampled_from(STATE_FIELDS),
                       SPECIAL_FLOATS)


def _edited_proto(edits, map_value) -> bytes:
    """The fuzz proto with state fields (track, step, field, value) and the first map
    point's x set."""
    proto = _proto()
    for track, step, field, value in edits:
        setattr(proto.tracks[track].states[step], field, value)
    if map_value is not None:
        proto.map_features[0].lane.polyline[0].x = map_value
    return proto.SerializeToString()


def _fuzz_proto(examples: int) -> collections.Counter:
    """Field edits (NaN, inf, huge, negative sizes in track states and map points), then
    byte flips and truncations of the serialized WOMD proto: a usable scene or a
    SceneError naming the source, nothing else."""
    outcomes = collections.Counter()
    size = len(_proto().SerializeToString())

    @settings(max_examples=examples, deadline=None, database=None, derandomize=not RANDOM,
              suppress_health_check=list(HealthCheck))
    @given(edits=st.lists(FIELD_EDIT, max_size=3), map_value=st.none() | SPECIAL_FLOATS,
           flips=st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 255)),
                          max_size=4), cut=st.none() | st.integers(0, size))
    def run(edits, map_value, flips, cut):
        data = bytearray(_edited_proto(edits, map_value))
        for at, value in flips:
            data[at % len(data)] = value
        try:
            arrays, _ = convert_scene(parse_scenario(bytes(data[:cut]), "f#0"), SC, CC)
        except SceneError as e:
            assert str(e).startswith("f#0"), str(e)
            outcomes["scene error"] += 1
            return
        check_converted(arrays)
        outcomes["converted"] += 1

    run()
    print(f"\nWOMD proto fuzz: {sum(outcomes.values())} examples, {dict(outcomes)}")
    return outcomes


def test_fuzz_womd_proto_reader():
    outcomes = _fuzz_proto(max(10, EXAMPLES // 2))
    assert outcomes["scene error"] > 0


@pytest.mark.slow
def test_fuzz_womd_proto_reader_long():
    _fuzz_proto(SLOW_EXAMPLES)

"""Data reliability (issue 15): manifest paths confined to their directory, one bad scene
never aborts a conversion (and a conversion never leaves shards without a manifest),
values checked where they enter (readers, ``inspect``, shards on load), corrupt shards
and manifests as clear errors, empty TFRecord files listed as skipped.

Each test names the defect it guards; all failed on the code before the fix. Tiny scenes
only (no JAX compilation)."""

import json
import os
import re
import shutil
import zipfile

import numpy as np
import pytest

from jaxdrive.config import ConfigError
from jaxdrive.data import load_scenarios
from jaxdrive.data.__main__ import main as cli
from jaxdrive.data.checks import scenario_problems
from jaxdrive.data.dataset import ScenarioDataset
from jaxdrive.data.json_scene import read_json_scene
from jaxdrive.data.load import convert_to_shards
from jaxdrive.data.raw import SceneError
from jaxdrive.data.staging import _move_in, staged_cache
from jaxdrive.data.subsets import subset_ids
from jaxdrive.data.synth import raw_to_json, synth_scenario
from jaxdrive.data.tfrecord import write_records
from jaxdrive.data.womd import parse_scenario
from jaxdrive.scenarios.base import ScenarioConfig

SC = ScenarioConfig(max_agents=8, num_steps=20, max_road_points=128, max_lanes=8,
                    max_traffic_lights=4)
SIZES = ["--max-agents", "8", "--num-steps", "20", "--max-road-points", "128",
         "--max-lanes", "8", "--max-traffic-lights", "4"]
SYNTH = dict(num_objects=5, num_steps=20, num_lanes=2, lane_points=6, num_edges=1,
             edge_points=5, num_lines=1, line_points=4, num_lights=2)


def scene(seed: int = 0) -> dict:
    """A small valid JSON scene (new layout, with traffic lights); object 0 is the SDC,
    valid at every step."""
    proto = synth_scenario(seed, **SYNTH, scenario_id=f"scene{seed}")
    return raw_to_json(parse_scenario(proto.SerializeToString()))


def write(path, data) -> str:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def tree(root) -> dict:
    """{relative path: bytes} of every file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def convert(inputs, out, *extra) -> int:
    return cli(["convert", *map(str, inputs), "--out", str(out), *SIZES, *extra])


@pytest.fixture
def cache(tmp_path):
    """A converted cache of 3 scenes in 2 shards."""
    paths = [write(tmp_path / f"s{i}.json", scene(i)) for i in range(3)]
    assert convert(paths, tmp_path / "cache", "--shard-size", "2") == 0
    return tmp_path / "cache"


def set_manifest(cache_dir, **changes):
    m = json.loads((cache_dir / "manifest.json").read_text())
    m.update(changes)
    (cache_dir / "manifest.json").write_text(json.dumps(m))
    return m


# ---------------------------------------------------------------- defect 2: manifest paths
@pytest.mark.parametrize("outside", ["../victim.npz", "ABSOLUTE"])
def test_convert_never_deletes_files_a_manifest_lists_outside_out(tmp_path, cache, capsys,
                                                                  outside):
    victim = tmp_path / "victim.npz"
    victim.write_bytes(b"precious")
    name = str(victim) if outside == "ABSOLUTE" else outside
    m = json.loads((cache / "manifest.json").read_text())
    m["shards"][0]["file"] = name
    (cache / "manifest.json").write_text(json.dumps(m))
    before = tree(tmp_path)
    capsys.readouterr()
    assert convert([tmp_path / "s0.json"], cache) == 2
    err = capsys.readouterr().err
    assert "manifest.json" in err and "shards[0].file" in err and name in err
    assert victim.read_bytes() == b"precious"
    assert tree(tmp_path) == before  # nothing written, nothing deleted


def test_readers_refuse_shard_names_outside_the_directory(tmp_path, cache, capsys):
    # A real shard placed outside the cache: the old readers loaded it through '../'.
    shutil.copy(cache / "shard-00000.npz", tmp_path / "outside.npz")
    m = json.loads((cache / "manifest.json").read_text())
    m["shards"][0]["file"] = "../outside.npz"
    (cache / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"manifest.json.*shards\[0\].file '../outside.npz'"):
        load_scenarios([str(cache)], SC)
    with pytest.raises(ConfigError, match=r"shards\[0\].file"):
        ScenarioDataset(cache, 1, prefetch=0, process_index=0, process_count=1)
    capsys.readouterr()
    assert cli(["inspect", str(cache)]) == 2
    assert "shards[0].file" in capsys.readouterr().err


# ---------------------------------------------------------------- defect 3: one bad scene
def _bad_id(d):
    d["objects"][1]["id"] = "abc"


def _null_position(d):
    d["objects"][2]["position"] = None


def _string_coordinate(d):
    d["objects"][0]["position"][3]["x"] = "12.5m"


def _string_index(d):
    d["metadata"]["sdc_track_index"] = "first"


def _string_time_index(d):
    next(iter(d["tl_states"].values()))["time_index"][0] = "zero"


def _wrong_type(d):
    d["objects"][0]["velocity"] = 3.0


BAD_SCENES = {
    "non-integer id": (_bad_id, r"objects\[1\].id must be an integer, got 'abc'"),
    "position null": (_null_position, r"objects\[2\].position must be a list"),
    "string coordinate": (_string_coordinate,
                          r"objects\[0\].position\[3\].x must be a number, got '12.5m'"),
    "string index": (_string_index, r"metadata.sdc_track_index must be an integer"),
    "string time index": (_string_time_index, r"time_index\[0\] must be an integer"),
    "wrong type": (_wrong_type, r"objects\[0\].velocity must be a list"),
}


@pytest.mark.parametrize("case", list(BAD_SCENES))
def test_one_malformed_scene_is_skipped_and_the_conversion_goes_on(tmp_path, case):
    mutate, reason = BAD_SCENES[case]
    bad = scene(1)
    mutate(bad)
    paths = [write(tmp_path / "a.json", scene(0)), write(tmp_path / "bad.json", bad),
             write(tmp_path / "c.json", scene(2))]
    assert convert(paths, tmp_path / "out", "--shard-size", "1") == 0
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["num_scenarios"] == 2 and m["num_shards"] == 2
    assert [s["source"] for s in m["skipped"]] == [paths[1]]
    assert m["skipped"][0]["reason"].startswith(paths[1])
    assert re.search(reason, m["skipped"][0]["reason"]), m["skipped"][0]
    assert sorted(os.listdir(tmp_path / "out")) == ["manifest.json", "shard-00000.npz",
                                                     "shard-00001.npz"]


def test_deeply_nested_json_is_a_scene_error(tmp_path):
    path = write(tmp_path / "deep.json", '{"objects": ' + "[" * 100_000 + "]" * 100_000 +
                 ', "roads": []}')
    with pytest.raises(SceneError, match="deep.json: JSON nested too deeply"):
        read_json_scene(path)
    assert convert([path, write(tmp_path / "ok.json", scene(0))], tmp_path / "out") == 0
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["num_scenarios"] == 1 and "nested too deeply" in m["skipped"][0]["reason"]


def test_reconversion_replaces_the_cache_and_keeps_other_files(tmp_path, cache):
    (cache / "notes.txt").write_text("mine")
    (cache / "subsets").mkdir()
    (cache / "subsets" / "x.json").write_text("[]")
    assert convert([tmp_path / "s0.json"], cache) == 0
    assert sorted(os.listdir(cache)) == ["manifest.json", "notes.txt", "shard-00000.npz",
                                         "subsets"]
    assert json.loads((cache / "manifest.json").read_text())["num_scenarios"] == 1
    assert (cache / "notes.txt").read_text() == "mine"
    assert not [f for f in os.listdir(tmp_path) if ".converting-" in f or ".previous-" in f]


def test_an_interrupted_conversion_leaves_the_previous_cache_intact(tmp_path, cache):
    before = tree(cache)
    with pytest.raises(KeyboardInterrupt), staged_cache(cache) as staging:
        (open(os.path.join(staging, "shard-00000.npz"), "wb")).close()
        raise KeyboardInterrupt  # Ctrl-C in the middle of a conversion
    assert tree(cache) == before
    assert sorted(os.listdir(tmp_path)) == ["cache", "s0.json", "s1.json", "s2.json"]
    load_scenarios([str(cache)], SC)


def test_conversion_into_a_new_nested_directory(tmp_path):
    out = tmp_path / "a" / "b" / "cache"
    assert convert([write(tmp_path / "s.json", scene(0))], out) == 0
    assert sorted(os.listdir(out)) == ["manifest.json", "shard-00000.npz"]
    assert os.listdir(tmp_path / "a" / "b") == ["cache"]


def test_in_place_publication_replaces_the_cache_manifest_last(tmp_path, cache):
    # The fallback when the staging directory cannot sit next to the output (parent not
    # writable) or the directories cannot be swapped (a mount point).
    convert_to_shards([str(tmp_path / "s0.json")], tmp_path / "new", SC)
    staging = cache / ".converting-test"
    shutil.copytree(tmp_path / "new", staging)
    (cache / "notes.txt").write_text("mine")
    _move_in(str(staging), str(cache), ["shard-00000.npz", "shard-00001.npz"])
    assert sorted(os.listdir(cache)) == [".converting-test", "manifest.json", "notes.txt",
                                         "shard-00000.npz"]
    scen, report = load_scenarios([str(cache)], SC)
    assert report["scenario_ids"] == ["scene0"]


def test_out_dir_that_is_a_file_is_refused_before_work(tmp_path, capsys):
    (tmp_path / "out").write_text("x")
    assert convert([write(tmp_path / "a.json", scene(0))], tmp_path / "out") == 2
    assert "is not a directory" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "x"


# ---------------------------------------------------------------- defect 4: values checked
def _nan_sdc_position(d):
    d["objects"][0]["position"][4]["x"] = float("nan")


def _nan_heading(d):
    d["objects"][1]["heading"][0] = float("nan")
    d["objects"][1]["valid"][0] = True


def _nan_length(d):
    d["objects"][0]["length"] = float("nan")


def _negative_width(d):
    d["objects"][0]["width"] = -2.0


def _string_valid(d):
    d["objects"][0]["valid"][5] = "false"


def _unknown_light(d):
    next(iter(d["tl_states"].values()))["state"][0] = "purple"


def _inf_road_point(d):
    d["roads"][0]["geometry"][1]["y"] = float("inf")


def _huge_velocity(d):
    d["objects"][0]["velocity"][2]["x"] = 1e300


BAD_VALUES = {
    "NaN SDC position": (_nan_sdc_position, r"objects\[0\] \(id 1000\): position at step 4"),
    "NaN heading": (_nan_heading, r"objects\[1\] \(id 1001\): heading at step 0 is nan"),
    "NaN length": (_nan_length, r"length nan must be in \[0.001, 1000\] m"),
    "negative width": (_negative_width, r"width -2 must be in \[0.001, 1000\] m"),
    "string valid flag": (_string_valid,
                          r"objects\[0\].valid\[5\] must be true or false, got 'false'"),
    "unknown light state": (_unknown_light, r"unknown traffic-light state 'purple'"),
    "inf road point": (_inf_road_point, r"road point 1 is \(3970.5, inf\)"),
    "huge velocity": (_huge_velocity, r"velocity at step 2"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_are_skipped_and_inspect_reports_them(tmp_path, capsys, case):
    mutate, reason = BAD_VALUES[case]
    bad = scene(1)
    mutate(bad)
    path = write(tmp_path / "bad.json", bad)
    capsys.readouterr()
    assert cli(["inspect", path, *SIZES]) == 2  # before: "checks: ok"
    err = capsys.readouterr().err
    assert path in err and re.search(reason, err), err
    with pytest.raises(ConfigError, match="no usable scenarios"):
        load_scenarios([path], SC)


def test_nan_in_a_tfrecord_scene_is_skipped(tmp_path):
    proto = synth_scenario(3, **SYNTH)
    proto.tracks[0].states[10].center_x = float("nan")  # the SDC at init_step: the origin
    for state in proto.tracks[1].states:
        state.length = -1.0
    write_records(tmp_path / "a.tfrecord", [proto.SerializeToString(),
                                            synth_scenario(4, **SYNTH).SerializeToString()])
    m = convert_to_shards([str(tmp_path / "a.tfrecord")], tmp_path / "out", SC)
    assert m["num_scenarios"] == 1
    reason = m["skipped"][0]["reason"]
    assert m["skipped"][0]["source"] == f"{tmp_path / 'a.tfrecord'}#0"
    assert "objects[0] (id 1000): position at step 10 is (nan, -2491.72)" in reason
    assert "objects[1] (id 1001): length -1 must be in [0.001, 1000] m" in reason


def test_scenario_checks_flag_non_finite_and_bad_values(cache):
    scen, _ = load_scenarios([str(cache)], SC)
    assert scenario_problems(scen, SC, index=0) == []
    yaw, width = scen.objects.yaw.copy(), scen.objects.width.copy()
    yaw[0, 0, 0], width[0, 0] = np.nan, -1.0
    bad = scen.replace(objects=scen.objects.replace(yaw=yaw, width=width))
    problems = scenario_problems(bad, SC, index=0)
    assert "non-finite values in 'objects.yaw'" in problems
    assert "agent width <= 0 (or NaN) for 1 agents" in problems


# ---------------------------------------------------------------- defect 9: corrupt shards
def _not_a_zip(path):
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)


def _truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewrite(path, change):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in arrays.items():
            with zf.open(f"{k}.npy", "w") as f:
                np.lib.format.write_array(f, v)


def _missing_key(path):
    _rewrite(path, lambda a: a.pop("objects.yaw"))


def _wrong_shape(path):
    _rewrite(path, lambda a: a.__setitem__("objects.xy", a["objects.xy"][:, :3]))


def _nan_values(path):
    _rewrite(path, lambda a: a["objects.yaw"].__setitem__((0, 0, 0), np.nan))


CORRUPT = {
    "not a zip": (_not_a_zip, "cannot read shard"),
    "truncated": (_truncated, "cannot read shard"),
    "missing key": (_missing_key, r"missing arrays \['objects.yaw'\]"),
    "wrong shape": (_wrong_shape, r"'objects.xy' is float32 \(2, 3, 20, 2\)"),
    "NaN values": (_nan_values, "'objects.yaw' holds non-finite values"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_shards_are_clear_errors_naming_the_shard(cache, capsys, case):
    damage, message = CORRUPT[case]
    shard = cache / "shard-00000.npz"
    damage(shard)
    with pytest.raises(ConfigError, match=message) as e:
        load_scenarios([str(cache)], SC)
    assert str(shard) in str(e.value)
    capsys.readouterr()
    assert cli(["inspect", str(cache)]) == 2
    assert str(shard) in capsys.readouterr().err
    ds = ScenarioDataset(cache, 1, prefetch=0, shuffle=False, process_index=0,
                         process_count=1)
    with pytest.raises(ConfigError, match=message):
        next(iter(ds))


@pytest.mark.parametrize("change", [
    {"scenarios": None}, {"shards": "x"}, {"scenario_config": [1]},
])
def test_damaged_manifests_are_clear_errors_naming_the_manifest(cache, capsys, change):
    if change == {"scenarios": None}:
        m = json.loads((cache / "manifest.json").read_text())
        del m["scenarios"]
        (cache / "manifest.json").write_text(json.dumps(m))
    else:
        set_manifest(cache, **change)
    key = next(iter(change))
    with pytest.raises(ConfigError, match=rf"manifest.json': '{key}' is missing or not a"):
        load_scenarios([str(cache)], SC)
    capsys.readouterr()
    assert cli(["inspect", str(cache)]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_manifest_records_out_of_range_are_clear_errors(cache):
    m = json.loads((cache / "manifest.json").read_text())
    m["scenarios"][2]["index"] = 7
    (cache / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"scenarios\[2\].index 7 is not a row of shard 1"):
        load_scenarios([str(cache)], SC)


# ---------------------------------------------------------------- defect 10: empty tfrecord
def test_empty_tfrecord_is_listed_as_skipped(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.tfrecord").write_bytes(b"")
    write_records(tmp_path / "in" / "one.tfrecord", [synth_scenario(0, **SYNTH)
                                                     .SerializeToString()])
    m = convert_to_shards([str(tmp_path / "in")], tmp_path / "out", SC)
    assert m["num_scenarios"] == 1
    assert m["skipped"] == [{"source": str(tmp_path / "in" / "empty.tfrecord"),
                             "reason": "empty TFRecord file (no records)"}]


def test_damaged_subset_file_is_a_clear_error(cache):
    (cache / "subsets").mkdir()
    (cache / "subsets" / "turns.json").write_text('{"scenario_ids": ')
    with pytest.raises(ConfigError, match=r"cannot read subset file .*turns.json"):
        subset_ids(cache, "turns")
    (cache / "subsets" / "turns.json").write_text('{"ids": []}')
    with pytest.raises(ConfigError, match="must hold a list of scenario ids"):
        subset_ids(cache, "turns")


def test_scenes_converted_larger_than_the_env_name_the_sizes_to_set():
    from jaxdrive.data.shards import adapt_arrays
    from jaxdrive.scenarios.base import ScenarioConfig

    stored = ScenarioConfig(max_agents=128, max_lanes=512)
    wanted = ScenarioConfig(max_agents=64, max_lanes=128)
    with pytest.raises(ConfigError, match=re.escape(
            "--set env.scenario.max_agents=128 --set env.scenario.max_lanes=512")):
        adapt_arrays({}, stored, wanted)


def test_a_scene_twice_is_kept_once_and_one_without_road_edges_is_skipped(tmp_path, capsys):
    """Issue 40, item 9: a scene without roads failed ``data inspect``'s check but exited
    0 and was converted; the same scene given twice became two entries of one id."""
    good = synth_scenario(1, **SYNTH, scenario_id="good").SerializeToString()
    bare = synth_scenario(2, **{**SYNTH, "num_edges": 0}, scenario_id="bare").SerializeToString()
    a, b = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    write_records(a, [good, bare])
    shutil.copy(a, b)
    manifest = convert_to_shards([str(a), str(b)], str(tmp_path / "out"), SC)
    assert [s["scenario_id"] for s in manifest["scenarios"]] == ["good"]
    reasons = [s["reason"] for s in manifest["skipped"]]
    assert sum("scenario bare has no road-edge points" in r for r in reasons) == 2
    assert sum(f"scenario good is already in the set (from {a}#0)" in r for r in reasons) == 1
    assert len(reasons) == 3
    # The same rule where raw files are loaded directly.
    scenes, report = load_scenarios([str(a), str(b)], SC)
    assert report["scenario_ids"] == ["good"] and len(report["skipped"]) == 3
    # data inspect exits 1 when the scene fails a check, 0 when it passes.
    assert cli(["inspect", str(a), "--index", "1", *SIZES]) == 1
    assert "no road-edge points" in capsys.readouterr().out
    assert cli(["inspect", str(a), "--index", "0", *SIZES]) == 0


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_during_convert_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys,
                                                            signals):
    """Issue 40, items 1-2: a signal during ``data convert`` into an existing cache was
    ignored (the cache replaced, exit 0) or left ``.DIR.converting-*`` behind. Now the
    first SIGTERM stops before the next scene, a second one at once; either way exit 143,
    the cache as it was, nothing staged left."""
    import signal

    from jaxdrive.data import load

    def scenes(path, seeds):
        write_records(path, [synth_scenario(s, **SYNTH, scenario_id=f"s{s}")
                             .SerializeToString() for s in seeds])
        return str(path)

    out = tmp_path / "cache"
    assert cli(["convert", scenes(tmp_path / "old.tfrecord", [1]), "--out", str(out),
                *SIZES]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    original = load._convert_item
    calls = []

    def convert_then_signal(job):
        calls.append(1)
        for _ in range(signals if len(calls) == 1 else 0):
            os.kill(os.getpid(), signal.SIGTERM)
        return original(job)

    monkeypatch.setattr(load, "_convert_item", convert_then_signal)
    new = scenes(tmp_path / "new.tfrecord", [2, 3, 4])
    capsys.readouterr()
    assert cli(["convert", new, "--out", str(out), *SIZES]) == 143
    err = capsys.readouterr()
    assert "stopped by SIGTERM: nothing converted was kept" in err.err
    assert len(calls) == 1  # stopped before the second scene
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if "converting" in p.name] == []
    assert signal.getsignal(signal.SIGTERM) is not None  # the handler was put back


def _convert_campaign(tmp_path, capsys, rounds: int, seed: int) -> dict:
    """Ctrl-C or SIGTERM at random moments of ``data convert`` into an existing cache
    (``run_command``, as ``python -m jaxdrive.data`` runs it). Each outcome is either a
    clean finish (exit 0, the new cache complete) or a clean stop (130 / 143, one line,
    the cache byte for byte as it was, nothing staged left); never "ignored"."""
    import random
    import signal
    import time


    def scenes(path, seeds):
        write_records(path, [synth_scenario(s, **SYNTH, scenario_id=f"s{s}")
                             .SerializeToString() for s in seeds])
        return str(path)

    old, new = scenes(tmp_path / "old.tfrecord", [1]), scenes(tmp_path / "new.tfrecord",
                                                                range(2, 14))
    out = tmp_path / "cache"
    argv = ["convert", new, "--out", str(out), *SIZES]
    t0 = time.perf_counter()
    assert cli(argv) == 0  # the length of a conversion, to draw moments within it
    span = time.perf_counter() - t0
    rng = random.Random(seed)
    outcomes = {}
    late = []  # signals that came after the command ended (run_command put this back)
    previous = {n: signal.signal(n, lambda n, f: late.append(n))
                for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        _rounds(argv, old, out, rounds, rng, span, capsys, tmp_path, outcomes, late)
    finally:
        for n, h in previous.items():
            signal.signal(n, h)
    return outcomes


def _rounds(argv, old, out, rounds, rng, span, capsys, tmp_path, outcomes, late):
    import signal
    import threading

    from jaxdrive.command import run_command

    for _ in range(rounds):
        shutil.rmtree(out)
        assert cli(["convert", old, "--out", str(out), *SIZES]) == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        signum = rng.choice([signal.SIGINT, signal.SIGTERM])
        timer = threading.Timer(rng.uniform(0, 1.2 * span), os.kill, (os.getpid(), signum))
        capsys.readouterr()
        timer.start()
        code = run_command(cli, "data", argv)
        timer.cancel()
        timer.join()
        err = capsys.readouterr().err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert [p.name for p in tmp_path.iterdir() if "converting" in p.name] == []
        if code == 0:
            ids = [s["scenario_id"] for s in
                   json.loads((out / "manifest.json").read_text())["scenarios"]]
            assert ids == [f"s{i}" for i in range(2, 14)]
        else:
            assert code == 128 + signum, (code, signum, err)
            assert len(err.strip().splitlines()) == 1 and err.startswith("stopped by ")
            assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        key = "late" if code == 0 and late else code
        late.clear()
        outcomes[key] = outcomes.get(key, 0) + 1


def test_signals_at_random_moments_of_a_conversion(tmp_path, capsys):
    outcomes = _convert_campaign(tmp_path, capsys, rounds=6, seed=40)
    assert sum(outcomes.values()) == 6


@pytest.mark.slow  # a longer campaign of the same property (40 signals)
def test_signals_at_random_moments_of_a_conversion_long(tmp_path, capsys):
    outcomes = _convert_campaign(tmp_path, capsys, rounds=40, seed=41)
    assert sum(outcomes.values()) == 40

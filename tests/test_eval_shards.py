"""Sharded evaluation: 3 shards run separately and merged equal the serial run exactly
(episode records, per-scenario lists, metrics), for every built-in type that runs on
procedural scenes; merge refuses files that are not the shards of one evaluation."""

import copy
import json
import re

import pytest
from test_eval import build, suite

from jaxdrive.eval import cli
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.merge import merge_results
from jaxdrive.eval.runner import run_evaluators
from jaxdrive.eval.shards import Shard, ShardError, decode_tree, encode_tree
from jaxdrive.eval.suite import load_suite_specs

NUM_SHARDS = 3  # the tiny suite has 3 batches (5 scenarios, batch 2): one each

FAST = suite(val={"type": "multi_scenario", "inherits": "_tiny"})
EVERY_TYPE = suite(
    val={"type": "multi_scenario", "inherits": "_tiny"},
    replay={"type": "human_replay", "inherits": "_tiny"},
    ada={"type": "adaptation", "inherits": "_tiny", "env.goal_behavior": "trial",
         "num_trials": 2, "trial_timeout": 7},  # test_eval's and the golden case's
    plan={"type": "planning", "inherits": "_tiny"},
)
TIMING = ("eval_seconds", "compile_seconds")


def _run(sections):
    """(serial results document, [shard documents]), every evaluator compiled once."""
    env_config, procedural, policy, params = build()
    evaluators = make_evaluators(load_suite_specs(sections, env_config, procedural).values())
    serial = run_evaluators(evaluators, policy, params, progress=False, checkpoint="RUN")
    shards = [run_evaluators(evaluators, policy, params, progress=False, checkpoint="RUN",
                             shard=Shard(i, NUM_SHARDS)) for i in range(NUM_SHARDS)]
    return (json.loads(serial.to_json()), [json.loads(s.to_json()) for s in shards])


@pytest.fixture(scope="module")
def runs():
    return _run(FAST)


def _docs(shards):
    return [(f"file{k}.json", d) for k, d in enumerate(shards)]


def _comparable(doc):
    return {name: {k: v for k, v in r.items() if k not in TIMING}
            for name, r in doc["evaluators"].items()}


def _check_merge(serial, shards):
    assert serial["status"] == "ok", serial["evaluators"]
    assert "shard" not in serial and all("shard" not in r for r in serial["evaluators"].values())
    # Disjoint episodes whose union is the serial run's, each recorded as in the serial run.
    for name, r in serial["evaluators"].items():
        got = [e for d in shards for e in d["evaluators"][name]["episodes"]]
        key = lambda e: (e["actor"], e["rollout"], e["batch"], e["env_index"])
        assert sorted(got, key=key) == sorted(r["episodes"], key=key), name
        assert all(d["evaluators"][name]["metrics"] == {} for d in shards)
    # Any order of the files.
    merged = json.loads(merge_results(_docs(shards[::-1])).to_json())
    assert merged["status"] == "ok"
    assert merged["config"] == serial["config"]
    assert merged["step"] == serial["step"] and merged["checkpoint"] == "RUN"
    assert "shard" not in merged
    assert _comparable(merged) == _comparable(serial)


def test_three_shards_merge_to_the_serial_run(runs):
    _check_merge(*runs)


@pytest.mark.slow  # 5 compiles: about 60 s of CPU
def test_every_type_merges_to_the_serial_run():
    serial, shards = _run(EVERY_TYPE)
    _check_merge(serial, shards)
    merged = json.loads(merge_results(_docs(shards)).to_json())
    # Non-additive metrics (confidence intervals, planning means) too.
    assert merged["evaluators"]["ada"]["metrics"]["ada_delta_trial_1_minus_0_ci_high"] == \
        serial["evaluators"]["ada"]["metrics"]["ada_delta_trial_1_minus_0_ci_high"]
    assert merged["evaluators"]["plan"]["metrics"]["score"] == \
        serial["evaluators"]["plan"]["metrics"]["score"]


def test_merge_cli_writes_the_merged_file(runs, tmp_path, capsys):
    serial, shards = runs
    paths = []
    for d in shards:
        p = tmp_path / f"results-shard-{d['shard']['id']}-of-{NUM_SHARDS}.json"
        p.write_text(json.dumps(d))
        paths.append(str(p))
    out = tmp_path / "merged" / "results.json"
    assert cli.main(["merge", *paths, "--out", str(out)]) == 0
    assert _comparable(json.loads(out.read_text())) == _comparable(serial)


def _refused(shards, match, tmp_path, capsys):
    with pytest.raises(ShardError, match=match):
        merge_results(_docs(shards))
    paths = []
    for k, d in enumerate(shards):
        p = tmp_path / f"s{k}.json"
        p.write_text(json.dumps(d))
        paths.append(str(p))
    assert cli.main(["merge", *paths, "--out", str(tmp_path / "m.json")]) == 2
    assert not (tmp_path / "m.json").exists()
    return capsys.readouterr().err


def test_merge_refuses_missing_duplicate_and_foreign_shards(runs, tmp_path, capsys):
    serial, shards = runs
    err = _refused(shards[:2], r"missing shard id\(s\) \[2\] of --num-shards 3", tmp_path,
                   capsys)
    assert "s0.json" in err
    _refused([shards[0], shards[1], shards[1]], "shard id 1 given twice", tmp_path, capsys)
    other = copy.deepcopy(shards[2])
    other["shard"]["num_shards"] = 4
    _refused([shards[0], shards[1], other], "differ in num_shards", tmp_path, capsys)
    other = copy.deepcopy(shards[2])
    other["config"]["val"]["seed"] = 8
    err = _refused([shards[0], shards[1], other], "differ in config", tmp_path, capsys)
    assert "s2.json" in err and "val.seed: 8 vs 7" in err
    other = copy.deepcopy(shards[2])
    other["shard"]["params_sha256"] = "0" * 64
    _refused([shards[0], shards[1], other], r"parameters \(params_sha256\)", tmp_path, capsys)
    other = copy.deepcopy(shards[2])
    other["step"] = 99
    _refused([shards[0], shards[1], other], "differ in step", tmp_path, capsys)
    _refused([shards[0], shards[1], serial], "not a shard results file", tmp_path, capsys)


def test_shard_flags_are_checked_before_any_work(capsys):
    base = ["--config", "eval/default", "--checkpoint", "/nonexistent"]
    for flags, msg in ((["--shard-id", "3", "--num-shards", "3"], "in \\[0, 2\\]"),
                       (["--shard-id", "-1", "--num-shards", "2"], "in \\[0, 1\\]"),
                       (["--shard-id", "0", "--num-shards", "0"], "at least 1"),
                       (["--num-shards", "2"], "go together")):
        assert cli.main(base + flags) == 2
        assert re.search(msg, capsys.readouterr().err)


def test_shard_split_and_exact_arrays():
    import numpy as np

    assert [list(Shard(i, 3).batches(7)) for i in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert list(Shard(4, 5).batches(3)) == []  # more shards than batches: an empty shard
    tree = {"a": np.array([1.5, np.nan, -0.0], np.float32), "b": {"c": np.arange(6).reshape(2, 3)}}
    back = decode_tree(json.loads(json.dumps(encode_tree(tree))))
    assert back["a"].dtype == np.float32 and back["a"].tobytes() == tree["a"].tobytes()
    assert (back["b"]["c"] == tree["b"]["c"]).all() and back["b"]["c"].dtype == tree["b"]["c"].dtype

"""``python -m jaxdrive.autotune`` on a tiny config: the JSON records, the recommendation
rule (recomputed here from the records), and the printed command (parsed by the train
CLI; its config has the recommended num_envs). One CLI run (two candidates, one repeat)
is shared by the module."""

import json
import shlex

import pytest
import yaml
from test_train_run import TINY

from jaxdrive.autotune import TOLERANCE, env_candidates, recommend, train_command, tune_eval
from jaxdrive.autotune import cli as autotune_cli
from jaxdrive.config import parse_overrides
from jaxdrive.runs.config import RunConfig, load_run_config
from jaxdrive.train import cli as train_cli


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autotune")
    config_file = tmp / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(TINY))
    out = tmp / "autotune.json"
    argv = ["--config", str(config_file), "--start-envs", "2", "--max-envs", "4",
            "--repeats", "1", "--set", f"logging.output_dir={tmp / 'runs'}",
            "--json", str(out)]
    code = autotune_cli.main(argv)
    return code, json.loads(out.read_text()), tmp


@pytest.mark.slow  # CI budget: the tuning sweep compiles several train steps
def test_records_are_monotone_timed_and_hold_memory(tuned):
    code, out, _ = tuned
    assert code == 0
    records = out["training"]
    envs = [r["num_envs"] for r in records]
    assert envs == sorted(envs) and len(set(envs)) == len(envs)
    assert envs[0] == 2 and len(records) in (1, 2)  # 2 then 4 unless stopped early
    for r in records:
        assert r["status"] == "ok"
        assert r["compile_s"] > 0 and r["iteration_s"] > 0
        assert r["agent_steps_per_s"] > 0 and r["trained_steps_per_s"] > 0
        # agent-steps per iteration = B x A x T = num_envs x 4 x 5
        assert r["agent_steps_per_iteration"] == r["num_envs"] * 4 * 5
        if r["memory_bytes"] is None:
            assert r["memory_note"]  # the reason it is missing
        else:
            assert r["memory_bytes"] > 0 and r["fits"] is not None
    dev = out["devices"]
    assert dev["count"] >= 1 and dev["kind"] and dev["memory_source"]
    assert out["argv"][:3] == ["python", "-m", "jaxdrive.autotune"]


@pytest.mark.slow  # CI budget: the tuning sweep compiles several train steps
def test_recommendation_follows_the_documented_rule(tuned):
    _, out, _ = tuned
    ok = [r for r in out["training"] if r["status"] == "ok" and r["fits"] is not False]
    best = max(r["agent_steps_per_s"] for r in ok)
    expected = max(r["num_envs"] for r in ok if r["agent_steps_per_s"] >= TOLERANCE * best)
    assert out["recommendation"]["num_envs"] == expected


def test_recommend_prefers_the_largest_fast_setting_that_fits():
    records = [
        {"num_envs": 8, "status": "ok", "fits": True, "agent_steps_per_s": 100.0},
        {"num_envs": 16, "status": "ok", "fits": True, "agent_steps_per_s": 200.0},
        {"num_envs": 32, "status": "ok", "fits": True, "agent_steps_per_s": 185.0},  # >= 90%
        {"num_envs": 64, "status": "ok", "fits": True, "agent_steps_per_s": 170.0},  # < 90%
        {"num_envs": 128, "status": "too_large", "fits": False},
    ]
    assert recommend(records)["num_envs"] == 32
    records[2]["fits"] = False  # over the memory fraction: never picked
    assert recommend(records)["num_envs"] == 16
    assert recommend([{"num_envs": 4, "status": "too_large", "fits": False}]) is None


@pytest.mark.slow  # CI budget: the tuning sweep compiles several train steps
def test_printed_command_parses_and_sets_num_envs(tuned):
    _, out, tmp = tuned
    n = out["recommendation"]["num_envs"]
    parts = shlex.split(out["command"])
    assert parts[:3] == ["python", "-m", "jaxdrive.train"]
    args = train_cli._parser().parse_args(parts[3:])
    config = load_run_config(args.config, parse_overrides(args.overrides))
    assert config.train.num_envs == n
    assert config.logging.output_dir == str(tmp / "runs")  # the user's --set is kept
    assert config.train.minibatches == TINY["train"]["minibatches"]


def test_train_command_replaces_a_given_num_envs():
    cmd = train_command("my config.yaml", ["train.num_envs=3", "train.seed=1"], 8)
    assert shlex.split(cmd) == ["python", "-m", "jaxdrive.train", "--config",
                                "my config.yaml", "--set", "train.seed=1", "--set",
                                "train.num_envs=8"]


def test_candidates_are_device_multiples_doubling():
    config = RunConfig.from_dict({"train": {"num_envs": 64}})
    assert env_candidates(config, 1) == [16, 32, 64, 128, 256, 512]
    assert env_candidates(config, 3, start=4, max_envs=40) == [6, 12, 24]
    assert env_candidates(config, 8, start=1, max_envs=16) == [8, 16]


def test_bad_config_exits_2(tmp_path, capsys):
    code = autotune_cli.main(["--config", str(tmp_path / "missing.yaml"),
                              "--json", str(tmp_path / "a.json")])
    assert code == 2
    assert "error:" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {num_envs: -1}\n")
    assert autotune_cli.main(["--config", str(bad), "--json", str(tmp_path / "a.json")]) == 2
    assert "num_envs" in capsys.readouterr().err


@pytest.mark.slow
def test_recommended_command_trains_and_eval_sweep_runs(tuned):
    _, out, tmp = tuned
    parts = shlex.split(out["command"])
    n = out["recommendation"]["num_envs"]
    one_iteration = n * 4 * 5
    assert train_cli.main(parts[3:] + ["--set", f"train.total_steps={one_iteration}"]) == 0
    (run_dir,) = (tmp / "runs").iterdir()
    assert (run_dir / "metrics.jsonl").read_text().strip()
    config = load_run_config(str(tmp / "tiny.yaml"))
    (rec,) = tune_eval(config, [2], repeats=1)
    assert rec["status"] == "ok" and rec["batch_s"] > 0
    # agent-steps per batch = batch x steps x agent slots = 2 x 12 x 4
    assert rec["agent_steps_per_batch"] == 2 * rec["steps"] * 4

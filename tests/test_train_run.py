"""The training run end to end on tiny shapes: Ctrl-C, exact resume, load_policy,
metrics.jsonl, the CLI's config errors. One tiny config, so the step compiles once per
``train`` call."""

import json
import os
import re
import signal
from pathlib import Path

import imageio.v3 as imageio
import jax
import numpy as np
import pytest
import yaml
from policy_inputs import random_obs

from jaxdrive.config import ConfigError
from jaxdrive.env import Env
from jaxdrive.render import cli as render_cli
from jaxdrive.render.record import VideoConfig
from jaxdrive.render.video import count_video_frames
from jaxdrive.runs.config import CheckpointConfig, EvaluationConfig, RunConfig, load_run_config
from jaxdrive.train import cli, run

TINY = {
    "env": {"scenario": {"max_agents": 4}, "collision_behavior": "remove",
            "observation": {"num_partners": 3, "num_road": 20},
            "road_index": {"road_per_cell": 20, "grid_size": 8}, "episode_length": 12},
    "procedural": {"num_agents": [2, 4], "topology": {"straight": 1.0, "curve": 0.0,
                                                      "t_junction": 0.0, "intersection": 0.0}},
    "policy": {"kind": "mlp", "model_dim": 16, "token_dim": 8},
    "train": {"seed": 3, "num_scenes": 2, "num_envs": 2, "rollout_steps": 5, "epochs": 2,
              "minibatches": 2, "total_steps": 3 * 2 * 4 * 5},
    "validation": {"every": 2, "num_scenes": 2},
    "checkpoint": {"every": 1, "keep_last": 2},
    "logging": {"every": 1},
}
STEPS_PER_IT = 2 * 4 * 5


def _config(tmp_path, **train):
    data = json.loads(json.dumps(TINY))
    data["train"].update(train)
    data["logging"]["output_dir"] = str(tmp_path)
    return RunConfig.from_dict(data)


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _without_timing(rows):
    drop = ("sps", "sps_valid", "time/", "held_out/")  # the evaluator: uninterrupted run only
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


# Videos change no training number (the resume test runs without them).
VIDEO = {"every": 2, "num_envs": 2, "views": ["scene", "ego"], "width": 32, "height": 32,
         "chunk_steps": 5}
EPISODE = TINY["env"]["episode_length"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    suite_file = tmp / "eval.yaml"
    suite_file.write_text(yaml.safe_dump({"eval": {"held_out": {
        "type": "multi_scenario", "interval": 1, "num_scenarios": 3, "batch_size": 2,
        "seed": 11}}}))
    config = _config(tmp).replace(video=VideoConfig.from_dict(VIDEO), evaluation=(
        EvaluationConfig(suite_file=str(suite_file))))
    run_dir = run.new_run_dir(config, "tiny")
    last = run.train(config, run_dir, quiet=True)
    return run_dir, last


def test_run_directory_holds_resolved_config_metrics_and_checkpoints(uninterrupted):
    run_dir, last = uninterrupted
    saved = yaml.safe_load(open(run_dir / "config.yaml"))
    assert saved["train"]["rollout_steps"] == 5
    assert saved["train"]["gamma"] == 0.99  # defaults spelled out
    assert RunConfig.from_dict(saved).replace(evaluation=EvaluationConfig()) == _config(
        run_dir.parent).replace(video=VideoConfig.from_dict(VIDEO))
    rows = _lines(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [STEPS_PER_IT, 2 * STEPS_PER_IT, 3 * STEPS_PER_IT]
    # validation every 2 iterations and at the end
    assert ["val/goal_rate" in r for r in rows] == [False, True, True]
    assert all(r["sps"] > 0 for r in rows)
    for r in rows[1:]:
        for k in ("val/goal_rate", "val/collision_rate", "val/offroad_rate"):
            assert 0.0 <= r[k] <= 1.0
    for k in ("loss/policy", "loss/value", "loss/entropy", "loss/approx_kl",
              "loss/clip_fraction", "loss/explained_variance", "loss/learning_rate"):
        assert k in rows[-1]
    assert last["step"] == 3 * STEPS_PER_IT
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints" / "last").iterdir()
                   if p.name.isdigit())
    assert steps == [2, 3]  # keep_last 2
    assert any((run_dir / "checkpoints" / "best").iterdir())


def test_validation_overlapped_with_the_next_iteration_gives_the_same_metrics(
        tmp_path, monkeypatch, uninterrupted):
    # No checkpoint before the end: iteration 2's validation runs on a copy of its
    # parameters while iteration 3 is already dispatched (accelerators only by default).
    full_dir, _ = uninterrupted
    copies = []
    params_copy = run._Run._params_copy

    def spy(self):
        copies.append(self.config.validation.every)
        return params_copy(self)

    monkeypatch.setattr(run._Run, "_params_copy", spy)
    # On CPU the loop does not overlap validation (slower there); the path is forced
    # here to check what it computes.
    build_extras = run._Run._build_extras

    def overlapping(self):
        build_extras(self)
        self.overlap_validation = True

    monkeypatch.setattr(run._Run, "_build_extras", overlapping)
    config = _config(tmp_path).replace(checkpoint=CheckpointConfig(every=0, keep_last=2))
    run_dir = run.new_run_dir(config, "tiny")
    run.train(config, run_dir, quiet=True)
    assert copies == [2]  # the overlapped path ran, once
    assert (_without_timing(_lines(run_dir / "metrics.jsonl"))
            == _without_timing(_lines(full_dir / "metrics.jsonl")))


def test_ctrl_c_saves_and_resume_reproduces_the_uninterrupted_run(tmp_path, monkeypatch,
                                                                   uninterrupted):
    full_dir, _ = uninterrupted
    config = _config(tmp_path)
    run_dir = run.new_run_dir(config, "tiny")
    original = run.JsonlWriter.write

    def write_then_interrupt(self, step, metrics):
        original(self, step, metrics)
        os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C now

    monkeypatch.setattr(run.JsonlWriter, "write", write_then_interrupt)
    run.train(config, run_dir, quiet=True)
    monkeypatch.setattr(run.JsonlWriter, "write", original)
    assert [r["step"] for r in _lines(run_dir / "metrics.jsonl")] == [STEPS_PER_IT]
    assert (run_dir / "checkpoints" / "last" / "1").is_dir()

    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(TINY))
    assert cli.main(["--config", str(config_file), "--resume", str(run_dir)]) == 0
    assert (_without_timing(_lines(run_dir / "metrics.jsonl"))
            == _without_timing(_lines(full_dir / "metrics.jsonl")))
    a = run.load_policy(run_dir, which="last")
    b = run.load_policy(full_dir, which="last")
    assert a.step == b.step == 3 * STEPS_PER_IT
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_load_policy_rebuilds_a_working_policy_from_the_run_directory(uninterrupted):
    run_dir, _ = uninterrupted
    loaded = run.load_policy(run_dir)
    assert loaded.config.policy.kind == "mlp" and loaded.policy.discrete
    obs_cfg = loaded.config.env.observation
    n = 6
    obs = random_obs(jax.random.key(0), (n,), obs_cfg.num_partners, obs_cfg.num_road,
                     num_lights=obs_cfg.num_lights)
    out, _ = jax.jit(loaded.policy.step)(loaded.params, loaded.policy.init_cache(n), obs,
                                         np.ones(n, bool), np.zeros(n, bool))
    assert out.dist.shape == (n, Env(loaded.config.env).num_actions)
    assert np.all(np.isfinite(np.asarray(out.value)))
    with pytest.raises(FileNotFoundError, match="checkpoints"):
        run.load_policy(run_dir / "nowhere")


def test_init_from_starts_from_another_runs_parameters(uninterrupted, tmp_path):
    # A learning rate of 1e-30 moves no float32 weight of magnitude > ~1e-22 (and a zero
    # only by ~1e-30), so after one iteration the new run's parameters are the source's.
    src, _ = uninterrupted
    source = run.load_policy(src, which="last")
    config = _config(tmp_path, init_from=str(src), init_checkpoint="last",
                     learning_rate=1e-30, total_steps=STEPS_PER_IT)
    run_dir = run.new_run_dir(config, "finetune")
    run.train(config, run_dir, quiet=True)
    got = run.load_policy(run_dir, which="last").params
    pairs = zip(jax.tree.leaves(source.params), jax.tree.leaves(got), strict=True)
    for want, have in pairs:
        np.testing.assert_allclose(np.asarray(have), np.asarray(want), rtol=0, atol=1e-20)
    fresh = _config(tmp_path, learning_rate=1e-30, total_steps=STEPS_PER_IT)
    fresh_dir = run.new_run_dir(fresh, "fresh")
    run.train(fresh, fresh_dir, quiet=True)
    other = jax.tree.leaves(run.load_policy(fresh_dir, which="last").params)
    assert any(not np.allclose(a, b) for a, b in zip(other, jax.tree.leaves(got), strict=True))


def test_init_from_a_policy_of_other_shapes_is_an_error_naming_the_parameter(
        uninterrupted, tmp_path):
    src, _ = uninterrupted
    data = json.loads(json.dumps(TINY))
    data["policy"]["model_dim"] = 24
    data["train"].update(init_from=str(src), total_steps=STEPS_PER_IT)
    data["logging"]["output_dir"] = str(tmp_path)
    config = RunConfig.from_dict(data)
    with pytest.raises(ConfigError,
                       match=r"'train.init_from'.*shape \(32,\) there and \(48,\) here"):
        run.train(config, run.new_run_dir(config, "bad"), quiet=True)
    with pytest.raises(ConfigError, match="init_checkpoint"):
        _config(tmp_path, init_from=str(src), init_checkpoint="first")


@pytest.mark.parametrize("setting, message", [
    ("train.learnin_rate=0.1", "learnin_rate.*Did you mean 'learning_rate'"),
    ("train.lr_schedule=cosine", "lr_schedule.*constant, linear"),
    ("train.minibatches=3", "minibatches.*divide"),
    ("trian.seed=1", "unknown config key 'trian'"),
    ("validation.seed=3", "validation.seed"),
])
def test_bad_config_values_are_errors_naming_the_key(tmp_path, capsys, setting, message):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert cli.main(["--config", str(path), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:")
    assert re.search(message, err), err
    assert not (tmp_path / "runs").exists()  # no run directory for a bad config


def test_cli_argument_errors(tmp_path, capsys):
    assert cli.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert cli.main(["--resume", str(tmp_path)]) == 2
    assert "config.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([])


def test_shipped_training_presets_validate():
    root = os.path.join(os.path.dirname(__file__), "..", "configs")
    quick = load_run_config(os.path.join(root, "quickstart.yaml"))
    assert quick.policy.kind == "mlp" and quick.validation.every > 0
    for name in ("selfplay_gpu.yaml", "adaptive.yaml"):
        load_run_config(os.path.join(root, name))
    adaptive = load_run_config(os.path.join(root, "adaptive.yaml"))
    assert adaptive.env.goal_behavior == "trial" and 2 <= adaptive.env.num_trials <= 4
    assert adaptive.policy.kind == "transformer"


@pytest.mark.slow  # CI budget: a benchmark's CLI, compiles its own trainer
def test_bench_train_cli_writes_policy_steps_per_s_and_compile_s(tmp_path, uninterrupted):
    from jaxdrive.bench import cli as bench

    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "t.json"
    assert bench.main(["train", "--config", str(config_file), "--policy", "mlp",
                       "--repeats", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["policy"] == "mlp" and data["records"][0]["policy"] == "mlp"
    assert data["steps_per_s"] > 0 and data["compile_s"] > 0
    assert data["agent_steps_per_iteration"] == STEPS_PER_IT
    assert bench.main(["train", "--config", str(config_file), "--set", "train.epoch=2"]) == 2


def _bench_learn(tmp_path, *args):
    """``bench learn`` on the tiny config: (exit code, the JSON it wrote, config file)."""
    from jaxdrive.bench import cli as bench

    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump({**TINY, "logging": {"every": 1,
                                                               "output_dir": str(tmp_path)}}))
    out = tmp_path / "learn.json"
    rc = bench.main(["learn", "--config", str(config_file), "--json", str(out), *args])
    return rc, (json.loads(out.read_text()) if rc == 0 else None), config_file


def test_bench_learn_stops_at_the_first_validation_meeting_the_targets(tmp_path):
    from jaxdrive.bench import cli as bench

    # Targets any policy meets: the first validation (iteration 2 of 3) ends the run.
    rc, data, config_file = _bench_learn(tmp_path, "--goal", "0", "--collision", "1",
                                         "--offroad", "1")
    assert rc == 0
    assert data["reached"] and data["agent_steps"] == 2 * STEPS_PER_IT
    assert data["validations"] == 1 and data["wall_s"] >= data["train_s"] > 0
    rows = _lines(Path(data["run_dir"]) / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2] and "val/goal_rate" in rows[-1]
    assert bench.main(["learn", "--config", str(config_file), "--set",
                       "validation.every=0"]) == 2
    assert bench.main(["learn", "--config", str(config_file), "--goal", "nan"]) == 2


@pytest.mark.slow
def test_bench_learn_runs_to_the_cap_when_the_targets_are_never_met(tmp_path):
    rc, data, _ = _bench_learn(tmp_path, "--goal", "1.5")
    assert rc == 0
    assert not data["reached"] and data["agent_steps"] == 3 * STEPS_PER_IT
    assert data["validations"] == 2  # iterations 2 and 3 (the final one)


def test_training_records_videos_and_the_render_cli_replays_the_checkpoint(
        uninterrupted, tmp_path, capsys):
    run_dir, _ = uninterrupted
    # Every 2 iterations and at the end (iteration 3): one mp4 per env per view, one
    # frame per step of an episode, named by the run step and the env index.
    for view in ("scene", "ego"):
        names = sorted(p.name for p in (run_dir / "videos" / "train" / view).iterdir())
        assert names == [f"step{it * STEPS_PER_IT:010d}_env{e:03d}.mp4"
                         for it in (2, 3) for e in range(2)]
        for name in names:
            assert count_video_frames(run_dir / "videos" / "train" / view / name) == EPISODE
    rows = _lines(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows if "time/video_s" in r] == [2, 3]

    args = ["--checkpoint", str(run_dir), "--envs", "2", "--size", "32", "--chunk", "5",
            "--view", "scene", "--view", "ego"]
    assert render_cli.main(args + ["--out", str(tmp_path), "--steps", "7"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.endswith(".mp4")]
    loaded_step = run.load_policy(run_dir).step
    assert sorted(printed) == sorted(
        str(tmp_path / "render" / v / f"step{loaded_step:010d}_env{e:03d}.mp4")
        for v in ("scene", "ego") for e in range(2))
    assert all(count_video_frames(p) == 7 for p in printed)
    png = tmp_path / "docs" / "frame.png"
    assert render_cli.main(args + ["--png", str(png), "--frame", "6"]) == 0
    assert capsys.readouterr().out.strip() == str(png)
    image = imageio.imread(png)
    assert image.shape == (32, 32, 3) and len(np.unique(image.reshape(-1, 3), axis=0)) > 3
    assert render_cli.main(["--checkpoint", str(tmp_path / "nowhere")]) == 2
    assert "checkpoints" in capsys.readouterr().err


def test_evaluators_run_at_their_interval_and_compile_once_per_run(uninterrupted):
    run_dir, _ = uninterrupted
    rows = _lines(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows if "held_out/goal_rate" in r] == [1, 2, 3]
    for r in rows:
        assert 0.0 <= r["held_out/goal_rate"] <= 1.0 and r["held_out/failed"] == 0.0
        assert r["held_out/scenarios"] == 3.0
    # Compiled on the first call only; later calls reuse it with new parameters.
    compile_s = [r["held_out/compile_seconds"] for r in rows]
    assert compile_s[0] > 0.0 and compile_s[1:] == [0.0, 0.0]
    results = sorted((run_dir / "eval").glob("step*.json"))
    assert [p.name for p in results] == [f"step{i * STEPS_PER_IT:010d}.json"
                                         for i in (1, 2, 3)]
    data = json.loads(results[-1].read_text())
    assert data["status"] == "ok" and data["step"] == 3 * STEPS_PER_IT
    assert len(data["evaluators"]["held_out"]["episodes"]) == 3


def test_end_of_run_line_names_validation_on_the_training_data(tmp_path):
    metrics = {"step": 10, "time/elapsed_s": 1.0, "val/goal_rate": 0.5,
               "val/collision_rate": 0.25, "val/offroad_rate": 0.0,
               "val/agent_episodes": 4.0}
    same = load_run_config(None, {"data.path": "shards", "data.validation_path": "./shards"})
    other = load_run_config(None, {"data.path": "shards", "data.validation_path": "val"})
    line = lambda config: run.summary_lines(metrics, tmp_path, config)[1]
    assert line(same) == ("validation (4 agent-episodes on the training scenes "
                          "(data.validation_path = data.path)): goal rate 0.500, collision "
                          "rate 0.250, off-road rate 0.000")
    assert "on held-out scenes)" in line(other)
    assert line(load_run_config(None)) == line(None) == line(other)

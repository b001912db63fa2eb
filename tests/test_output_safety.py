"""Outputs of the command lines and of ``jaxdrive.eval``: checked before the work, never
lost after it, never outside their root (issue 15, defects 7, 8 and 10).

Every check under test happens before the work, so these tests fail fast without
compiling: the eval tests use a ``probe`` evaluator type (registered here) that records
its calls and returns at once, and one tiny run directory (an MLP's random parameters
saved as a checkpoint) built once for the module. An unwritable path is one below a
regular file (the tests may run as root, for whom permissions do not bind).
"""

import dataclasses
import json
from pathlib import Path

import jax
import pytest
import yaml
from policy_inputs import random_obs
from test_train_run import TINY as TRAIN_TINY

from jaxdrive import simulate
from jaxdrive.bench import cli as bench_cli
from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval import cli as eval_cli
from jaxdrive.eval.api import run
from jaxdrive.eval.evaluator import EvalResult, Evaluator
from jaxdrive.eval.evaluators import MultiScenario, registered_evaluator
from jaxdrive.eval.manager import EvalManager
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.files import UnsafeNameError, write_or_fallback
from jaxdrive.models.policy import Policy
from jaxdrive.render import cli as render_cli
from jaxdrive.render.video import video_path
from jaxdrive.runs.checkpoint import Checkpointer
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import load_policy, save_config

TINY = {k: TRAIN_TINY[k] for k in ("env", "procedural", "policy")}
RENDER = {"enabled": True, "num_scenarios": 1, "steps": 2, "width": 16, "height": 16}


class Probe(Evaluator):
    """Records that it ran; ``action(out_dir)`` runs first (to break the output on
    purpose, as a full disk or a removed directory would during a long evaluation)."""

    type_name = "probe"
    calls: list = []
    action = None

    def run(self, policy, params, out_dir=None, step=0, progress=None, pools=None):
        Probe.calls.append(self.name)
        if Probe.action is not None:
            Probe.action(out_dir)
        return EvalResult(name=self.name, type=self.type_name, metrics={"x": 1.0},
                          config=dict(self.spec.resolved))


@pytest.fixture(autouse=True)
def probe():
    Probe.calls, Probe.action = [], None
    with registered_evaluator(Probe):
        yield Probe


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory: TINY's config and one checkpoint of random MLP parameters."""
    path = tmp_path_factory.mktemp("run")
    config = RunConfig.from_dict(TINY)
    save_config(config, path / "config.yaml")
    policy = Policy.for_env(config.policy, Env(config.env))
    o = config.env.observation
    obs = random_obs(jax.random.key(1), (2,), o.num_partners, o.num_road,
                     num_lights=o.num_lights)  # drawn on the host: nothing to compile
    with Checkpointer(path / "checkpoints") as ckpt:
        ckpt.save(40, {"params": policy.init(jax.random.key(0), obs)}, {"step": 40})
    return path


def _suite(tmp_path, **sections) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"eval": sections}))
    return path


def _eval(run_dir, suite, *extra):
    return eval_cli.main(["--config", str(suite), "--checkpoint", str(run_dir),
                          "--no-progress", *extra])


def _blocked(tmp_path) -> Path:
    """A regular file: any path below it cannot be created, even by root."""
    (tmp_path / "afile").write_text("")
    return tmp_path / "afile"


# ------------------------------------------------- defect 7: outputs checked first


def test_eval_out_unwritable_fails_before_any_evaluator(run_dir, tmp_path, capsys, probe):
    suite = _suite(tmp_path, p={"type": "probe", "num_scenarios": 1})
    out = _blocked(tmp_path) / "out" / "results.json"
    rc = _eval(run_dir, suite, "--out", str(out), "--output-root", str(tmp_path / "roots"))
    assert rc == 2
    err = capsys.readouterr().err
    assert f"error: --out {out}: cannot create the output directory {out.parent}" in err
    assert probe.calls == []
    assert not (tmp_path / "roots").exists()  # no empty output directory left behind


def test_eval_output_root_unwritable_fails_before_any_evaluator(run_dir, tmp_path, capsys,
                                                                probe):
    suite = _suite(tmp_path, p={"type": "probe", "num_scenarios": 1})
    root = _blocked(tmp_path) / "eval_runs"
    assert _eval(run_dir, suite, "--output-root", str(root)) == 2
    assert str(root) in capsys.readouterr().err
    assert probe.calls == []


def test_eval_with_out_and_no_videos_makes_no_empty_directory(run_dir, tmp_path, probe):
    suite = _suite(tmp_path, p={"type": "probe", "num_scenarios": 1})
    out = tmp_path / "r" / "results.json"
    assert _eval(run_dir, suite, "--out", str(out), "--output-root",
                 str(tmp_path / "roots")) == 0
    assert json.loads(out.read_text())["evaluators"]["p"]["metrics"] == {"x": 1.0}
    assert not (tmp_path / "roots").exists()
    assert [p.name for p in out.parent.iterdir()] == ["results.json"]  # no temp file left


def test_simulate_json_unwritable_fails_before_the_work(tmp_path, capsys):
    path = _blocked(tmp_path) / "s.json"
    assert simulate.main(["--scenes", "2", "--steps", "2", "--json", str(path)]) == 2
    captured = capsys.readouterr()
    assert str(path.parent) in captured.err and "jaxdrive.simulate:" not in captured.out


@pytest.mark.parametrize("flag, name", [("--png", "f.png"), ("--out", "videos")])
def test_render_output_unwritable_fails_before_the_work(tmp_path, capsys, flag, name):
    path = _blocked(tmp_path) / name
    assert render_cli.main([flag, str(path), "--envs", "1", "--size", "16"]) == 2
    assert str(_blocked(tmp_path)) in capsys.readouterr().err


def test_bench_json_unwritable_fails_before_the_work(tmp_path, capsys):
    path = _blocked(tmp_path) / "b.json"
    rc = bench_cli.main(["render", "--envs", "1", "--steps", "1", "--size", "16",
                         "--repeats", "1", "--json", str(path)])
    assert rc == 2
    captured = capsys.readouterr()
    assert str(path.parent) in captured.err and "jaxdrive bench" not in captured.out


# ----------------------------------------- results never lost after the work


def test_write_or_fallback_saves_next_to_the_directory_then_in_the_temp_dir(tmp_path,
                                                                            monkeypatch):
    ok = tmp_path / "fine" / "r.json"
    assert write_or_fallback(ok, "{}") == (ok, None)
    # The output directory turned into a file meanwhile: saved next to it.
    out = _blocked(tmp_path) / "r.json"
    saved, problem = write_or_fallback(out, '{"a": 1}')
    assert saved.parent == tmp_path and saved.name.startswith("afile-r-")
    assert json.loads(saved.read_text()) == {"a": 1}
    assert str(out) in problem and str(saved) in problem
    # Its parent too: saved in the system temp directory.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    saved, problem = write_or_fallback(out / "deeper.png", b"\x89PNG")
    assert saved.parent == temp and saved.read_bytes() == b"\x89PNG"


def test_eval_results_saved_elsewhere_when_the_directory_goes_away(run_dir, tmp_path,
                                                                   capsys, probe):
    suite = _suite(tmp_path, p={"type": "probe", "num_scenarios": 1})
    out = tmp_path / "res" / "results.json"

    def remove_the_directory(_):
        out.parent.rmdir()
        out.parent.write_text("")  # and something else took its place

    probe.action = remove_the_directory
    assert _eval(run_dir, suite, "--out", str(out)) == 1
    err = capsys.readouterr().err
    (saved,) = tmp_path.glob("res-results-*.json")
    assert f"could not write {out}" in err and str(saved) in err
    assert json.loads(saved.read_text())["evaluators"]["p"]["metrics"] == {"x": 1.0}


def test_api_results_saved_elsewhere_with_a_warning(tmp_path, probe):
    out = tmp_path / "res"

    def replace_the_directory(out_dir):
        out_dir.rmdir()
        out_dir.write_text("")

    probe.action = replace_the_directory
    with pytest.warns(UserWarning, match=f"could not write {out / 'results.json'}"):
        result = run({"p": 1}, {"eval": {"p": {"type": "probe"}}}, policy=object(),
                     env_config=EnvConfig(), out_dir=out, progress=False)
    assert result["p"].metrics == {"x": 1.0}
    (saved,) = tmp_path.glob("res-results-*.json")
    assert json.loads(saved.read_text())["status"] == "ok"


def test_manager_results_saved_elsewhere_with_a_warning(tmp_path, probe):
    specs = load_suite_specs({"eval": {"p": {"type": "probe", "interval": 1}}})
    log = []
    manager = EvalManager(list(specs.values()), policy=None, run_dir=tmp_path, log=log.append)
    (tmp_path / "eval").write_text("")  # RUN_DIR/eval cannot be a directory
    metrics, _ = manager.run(1, step=5, params=None)
    assert metrics["p/x"] == 1.0
    (saved,) = tmp_path.glob("eval-step0000000005-*.json")
    assert json.loads(saved.read_text())["step"] == 5
    assert len(log) == 1 and str(saved) in log[0]


# -------------------------------------------- defect 8: names confined to their root


@pytest.fixture(scope="module")
def render_spec():
    """A multi_scenario section that renders (TINY's env)."""
    env = RunConfig.from_dict(TINY).env
    (spec,) = load_suite_specs({"eval": {"v": {"type": "multi_scenario", "num_scenarios": 1,
                                               "render": RENDER}}}, env).values()
    return spec


@pytest.mark.parametrize("name", ["../../../x", "{tmp}/abs", "ok/../../x", "a/../.."])
def test_api_refuses_names_outside_the_output_dir_before_any_work(run_dir, tmp_path,
                                                                  render_spec, name):
    loaded = load_policy(run_dir)
    name = name.format(tmp=tmp_path)  # an absolute name, inside the test's directory
    out = tmp_path / "a" / "b" / "c" / "out"
    evaluator = MultiScenario(render_spec, name=name)  # past the suite loader
    with pytest.raises(UnsafeNameError, match="outside|must stay inside"):
        run(loaded, [evaluator], out_dir=out, progress=False)
    assert list(tmp_path.iterdir()) == []  # nothing written, inside or outside
    # Straight through Evaluator.run: a failed record, before any rollout is built.
    result = evaluator.run(loaded.policy, loaded.params, out_dir=out)
    assert result.status == "failed" and result.error.startswith("UnsafeNameError")
    assert result.compile_seconds == 0.0 and list(tmp_path.iterdir()) == []


def test_eval_cli_refuses_a_section_name_outside_the_root(run_dir, tmp_path, capsys, probe):
    suite = _suite(tmp_path, **{"../../x": {"type": "probe", "num_scenarios": 1,
                                            "render": RENDER}})
    assert _eval(run_dir, suite, "--output-root", str(tmp_path / "o" / "p")) == 2
    assert "../../x" in capsys.readouterr().err
    assert probe.calls == [] and not (tmp_path / "o").exists()


def test_manager_and_videos_refuse_names_outside_their_root(tmp_path, render_spec):
    child = dataclasses.replace(render_spec, name="../x",
                                config=render_spec.config.replace(mode="subprocess",
                                                                  interval=1))
    with pytest.raises(UnsafeNameError):
        EvalManager([child], policy=None, run_dir=tmp_path)
    with pytest.raises(UnsafeNameError):
        video_path(tmp_path, "render", "../../x", 0, 0)
    with pytest.raises(UnsafeNameError):
        video_path(tmp_path, "../render", "scene", 0, 0)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------- defect 10: numeric flags checked before the work


@pytest.mark.parametrize("frame", [12, 100000])
def test_render_frame_beyond_the_episode_is_an_error(tmp_path, capsys, frame):
    png = tmp_path / "f.png"
    rc = render_cli.main(["--png", str(png), "--frame", str(frame), "--envs", "1",
                          "--size", "16", "--set", "env.episode_length=12"])
    assert rc == 2
    assert f"--frame {frame} is beyond the episode" in capsys.readouterr().err
    assert not png.exists()


@pytest.mark.parametrize("argv", [["--size", "15"], ["--size", "0"], ["--steps", "-3"],
                                  ["--fps", "0"], ["--chunk", "0"], ["--envs", "0"],
                                  ["--frame", "-1"]])
def test_render_bad_counts_exit_2(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as e:
        render_cli.main(["--png", str(tmp_path / "f.png"), *argv])
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err


def test_simulate_zero_envs_is_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        simulate.main(["--scenes", "2", "--envs", "0"])
    assert e.value.code == 2 and "--envs" in capsys.readouterr().err


@pytest.mark.parametrize("checkpoint, message", [
    ("nowhere", "does not exist"), ("empty", "no checkpoints found")])
def test_eval_cli_bad_run_directories_exit_2(tmp_path, capsys, checkpoint, message):
    (tmp_path / "empty").mkdir()
    rc = eval_cli.main(["--config", "eval/default", "--checkpoint",
                        str(tmp_path / checkpoint), "--output-root", str(tmp_path / "o")])
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_eval_cli_unknown_suite_exits_2(run_dir, tmp_path, capsys):
    rc = eval_cli.main(["--config", "eval/default", "--checkpoint", str(run_dir),
                        "--suite", "nosuch", "--output-root", str(tmp_path / "o")])
    assert rc == 2 and "nosuch" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()

"""Presets: the files of configs/ ship with the package (package data ``jaxdrive.presets``)
and ``--config NAME`` / ``suite_file=NAME`` find them by name (``resolve_config_path``).

The fast tests read the checkout's configs/ (what an editable install or a source tree
sees); the slow test builds the wheel, installs it into a folder and trains and
evaluates from a directory outside the checkout with the wheel's copy only.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from jaxdrive import config as jconfig
from jaxdrive.config import ConfigError, list_presets, load_yaml, resolve_config_path
from jaxdrive.env import EnvConfig
from jaxdrive.scenarios.procedural import ProceduralConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
RUN_PRESETS = ("quickstart", "quickstart_transformer", "cpu_hour", "selfplay_gpu", "adaptive",
               "adaptive_hidden_goal", "adaptive_hidden_goal_mlp", "adaptive_passing",
               "adaptive_passing_gpu", "adaptive_passing_mlp", "adaptive_passing_oracle",
               "adaptive_population", "adaptive_population_partner", "womd_small", "womd_bc",
               "womd")
SIMULATE_PRESETS = ("simulate_default", "simulate_hard", "human_replay", "adaptive_simulate")
SUITE_PRESETS = ("eval/default", "eval/passing", "eval/population", "eval/realism")


def test_every_file_of_configs_is_a_preset_and_each_is_tested_here():
    files = sorted(p.relative_to(CONFIGS).as_posix()[:-len(".yaml")]
                   for p in CONFIGS.rglob("*.yaml"))
    assert list_presets() == files
    assert jconfig.presets_dir() == CONFIGS  # a checkout: configs/ itself, no copy
    assert sorted(RUN_PRESETS + SIMULATE_PRESETS + SUITE_PRESETS) == files


@pytest.mark.parametrize("name", RUN_PRESETS)
def test_run_presets_resolve_and_build_a_run_config(name):
    from jaxdrive.runs.config import RunConfig, load_run_config

    assert resolve_config_path(name) == str(CONFIGS / f"{name}.yaml")
    assert resolve_config_path(f"{name}.yaml") == str(CONFIGS / f"{name}.yaml")
    config = load_run_config(name)
    assert isinstance(config, RunConfig)
    assert config == load_run_config(str(CONFIGS / f"{name}.yaml"))
    assert load_run_config(name, {"train": {"seed": 5}}).train.seed == 5


@pytest.mark.parametrize("name", SIMULATE_PRESETS)
def test_simulate_presets_resolve_and_validate(name):
    from jaxdrive.simulate import load_config

    data = load_config(name, {})
    assert data == load_yaml(CONFIGS / f"{name}.yaml")
    EnvConfig.from_dict(data.get("env") or {}, "env")
    ProceduralConfig.from_dict(data.get("procedural") or {}, "procedural")


def test_eval_default_preset_loads_as_the_default_suite():
    from jaxdrive.eval.api import DEFAULT_SUITE_FILE
    from jaxdrive.eval.suite import load_suite_file

    assert resolve_config_path(DEFAULT_SUITE_FILE) == str(CONFIGS / "eval" / "default.yaml")
    names = [s.name for s in load_suite_file("eval/default", "default", EnvConfig())]
    assert names == [s.name for s in load_suite_file(CONFIGS / "eval" / "default.yaml",
                                                     "default", EnvConfig())]
    assert names == ["validation", "human_replay", "planning"]
    assert [s.name for s in load_suite_file("eval/default.yaml", "adaptive")] == ["adaptation"]


def test_eval_api_and_run_config_take_a_suite_preset_name():
    from jaxdrive.eval.api import resolve_evaluators
    from jaxdrive.runs.config import load_run_config

    evaluators = resolve_evaluators("planning", EnvConfig(), ProceduralConfig())
    assert [e.spec.name for e in evaluators] == ["planning"]
    assert [e.spec.name for e in resolve_evaluators(
        "planning", EnvConfig(), ProceduralConfig(), suite_file="eval/default")] == ["planning"]
    with pytest.raises(ConfigError, match=r"'eval/defualt'.*Did you mean 'eval/default'"
                                          r".*suite_file="):
        resolve_evaluators("default", EnvConfig(), ProceduralConfig(),
                           suite_file="eval/defualt")
    config = load_run_config("quickstart", {"evaluation": {"suite_file": "eval/default"}})
    assert config.evaluation.suite_file == "eval/default"


def test_inherits_between_presets_resolve_next_to_the_preset():
    from jaxdrive.runs.config import load_run_config

    quick, adaptive = load_run_config("quickstart"), load_run_config("adaptive")
    assert adaptive.policy.kind == "transformer" and adaptive.env.goal_behavior == "trial"
    assert adaptive.env.observation == quick.env.observation  # from quickstart.yaml
    assert adaptive.train.learning_rate == quick.train.learning_rate
    data = load_yaml(resolve_config_path("adaptive_simulate"))
    assert data["env"]["observation"]["num_road"] == 200  # from simulate_default.yaml
    assert data["env"]["num_trials"] == 4


def test_an_existing_path_wins_over_a_preset_name(tmp_path, monkeypatch):
    from jaxdrive.runs.config import load_run_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart.yaml").write_text("train: {seed: 7}\nvalidation: {seed: 9}\n")
    assert resolve_config_path("quickstart.yaml") == "quickstart.yaml"
    assert load_run_config("quickstart.yaml").train.seed == 7
    # No file named plain "quickstart" here: the name is the preset.
    assert resolve_config_path("quickstart") == str(CONFIGS / "quickstart.yaml")
    (tmp_path / "quickstart").write_text("train: {seed: 8}\nvalidation: {seed: 9}\n")
    assert resolve_config_path("quickstart") == "quickstart"
    assert load_run_config("quickstart").train.seed == 8
    assert resolve_config_path(tmp_path / "quickstart") == str(tmp_path / "quickstart")
    (tmp_path / "eval").mkdir()  # a directory is no file: the preset
    assert resolve_config_path("eval/default") == str(CONFIGS / "eval" / "default.yaml")


@pytest.mark.parametrize("arg, closest", [
    ("quickstrat", "quickstart"),
    ("selfplay-gpu.yaml", "selfplay_gpu"),
    ("configs/quickstart.yaml", "quickstart"),  # a path that does not exist from here
    ("eval/defaults", "eval/default"),
    ("nothing_like_it", None),
])
def test_unknown_names_are_errors_naming_the_argument_and_listing_presets(
        arg, closest, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve_config_path(arg)
    message = str(err.value)
    assert f"'{arg}'" in message
    assert "Presets: " + ", ".join(list_presets()) in message
    if closest:
        assert f"Did you mean '{closest}'?" in message
    else:
        assert "Did you mean" not in message


def test_clis_take_preset_names_and_reject_unknown_ones(tmp_path, monkeypatch, capsys):
    from jaxdrive import simulate
    from jaxdrive.bench import cli as bench
    from jaxdrive.train import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["--config", "quickstrat"]) == 2
    err = capsys.readouterr().err
    assert "'quickstrat'" in err and "Did you mean 'quickstart'?" in err
    assert not (tmp_path / "runs").exists()
    assert cli.main(["--config", "quickstart", "--set", "train.epoch=2"]) == 2
    assert "train.epoch" in capsys.readouterr().err
    assert simulate.main(["--scenes", "1", "--config", "human_replays"]) == 2
    assert "Did you mean 'human_replay'?" in capsys.readouterr().err
    assert bench.main(["train", "--config", "selfplay", "--json", "b.json"]) == 2
    assert "'selfplay'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "preset name (quickstart, selfplay_gpu" in " ".join(capsys.readouterr().out.split())


def test_a_zipped_install_reads_presets_from_an_extracted_copy(tmp_path):
    archive = tmp_path / "site.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("jaxdrive/presets/base.yaml", "env: {goal_radius: 3.0}\n")
        z.writestr("jaxdrive/presets/eval/child.yaml",
                   "inherits: ../base.yaml\nenv: {init_step: 4}\n")
        z.writestr("jaxdrive/presets/README.txt", "not a preset")
    root = zipfile.Path(archive, "jaxdrive/presets/")
    out = jconfig._extracted_presets(root)
    assert out == jconfig._extracted_presets(zipfile.Path(archive, "jaxdrive/presets/"))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "base.yaml", "eval/child.yaml"]
    assert load_yaml(out / "eval" / "child.yaml") == {"env": {"goal_radius": 3.0,
                                                              "init_step": 4}}


def test_pyproject_lists_every_subpackage_and_maps_the_presets_to_configs():
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    source = {p.parent.relative_to(ROOT).as_posix().replace("/", ".")
              for p in (ROOT / "jaxdrive").rglob("__init__.py")}
    presets = {"jaxdrive.presets" + ("." + d.relative_to(CONFIGS).as_posix().replace("/", ".")
                                     if d != CONFIGS else "")
               for d in [CONFIGS, *(p.parent for p in CONFIGS.rglob("*.yaml"))]}
    assert set(setuptools["packages"]) == source | presets
    assert setuptools["package-dir"] == {"jaxdrive.presets": "configs"}
    assert all(setuptools["package-data"][p] == ["*.yaml"] for p in presets)
    assert not (ROOT / "jaxdrive" / "presets").exists()  # one copy: configs/


# ---------------------------------------------------------------------------------------
# The built wheel, installed into a folder, used from outside the checkout.

TINY = {  # quickstart shrunk to one tiny iteration (the sizes of test_train_run.py)
    "env.scenario.max_agents": 4, "env.observation.num_partners": 3,
    "env.observation.num_road": 20, "env.road_index.road_per_cell": 20,
    "env.road_index.grid_size": 8, "env.episode_length": 12,
    "procedural.num_agents": "[2, 4]",
    "procedural.topology": "{straight: 1.0, curve: 0.0, t_junction: 0.0, intersection: 0.0}",
    "policy.model_dim": 16, "policy.token_dim": 8,
    "train.num_scenes": 2, "train.num_envs": 2, "train.rollout_steps": 5,
    "train.epochs": 1, "train.minibatches": 2, "train.total_steps": 1,
    "validation.num_scenes": 2, "checkpoint.every": 1, "logging.every": 1,
}

EVAL_SCRIPT = """
import json, sys
import jaxdrive, jaxdrive.eval
from jaxdrive.config import list_presets, presets_dir, resolve_config_path
print(json.dumps({"jaxdrive": jaxdrive.__file__, "presets_dir": str(presets_dir()),
                  "presets": list_presets(), "quickstart": resolve_config_path("quickstart"),
                  "eval_default": resolve_config_path("eval/default")}))
result = jaxdrive.eval.run(sys.argv[1], "default", out_dir=sys.argv[2], progress=False)
print(json.dumps({"status": result.status, "metrics": result.metrics,
                  "results": {r.name: r.status for r in result.results}}))
"""


def _run(cmd, cwd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _build_wheel(src: pathlib.Path, dist: pathlib.Path) -> pathlib.Path:
    """``pip wheel`` of the source copy: with the venv's own setuptools when it can build
    wheels, else (an old setuptools without ``wheel``) in pip's isolated build env."""
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist)]
    proc = subprocess.run(base + ["--no-build-isolation", str(src)], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        _run(base + [str(src)], src, None, timeout=300)
    (wheel,) = dist.glob("jaxdrive-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_ships_presets_and_trains_and_evaluates_outside_the_checkout(tmp_path):
    src = tmp_path / "src"  # a copy: the build leaves build/ and egg-info behind
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("jaxdrive", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    t0 = time.perf_counter()
    wheel = _build_wheel(src, tmp_path / "dist")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert {f"jaxdrive/presets/{p}.yaml" for p in list_presets()} <= set(names)
    assert not [n for n in names if n.startswith("configs/")]
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
          str(wheel)], tmp_path, None)
    assert not (site / "jaxdrive" / "presets" / "__init__.py").exists()
    t1 = time.perf_counter()

    work = tmp_path / "work"  # outside the checkout, without configs/
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(site), JAX_PLATFORMS="cpu")
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    sets += ["--set", f"logging.output_dir={work / 'runs'}"]
    train = _run([sys.executable, "-m", "jaxdrive.train", "--config", "quickstart", *sets],
                 work, env)
    t2 = time.perf_counter()
    (run_dir,) = (work / "runs").glob("quickstart-*")
    assert str(run_dir) in train.stdout
    assert (run_dir / "checkpoints").is_dir()

    proc = _run([sys.executable, "-c", EVAL_SCRIPT, str(run_dir), str(work / "eval")],
                work, env)
    print(f"build + install {t1 - t0:.1f} s, train {t2 - t1:.1f} s, evaluate "
          f"{time.perf_counter() - t2:.1f} s")
    paths, evaluation = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    installed = str(site / "jaxdrive")
    assert paths["jaxdrive"] == os.path.join(installed, "__init__.py")
    assert paths["presets_dir"] == os.path.join(installed, "presets")
    assert paths["presets"] == list_presets()
    assert paths["quickstart"] == os.path.join(installed, "presets", "quickstart.yaml")
    assert paths["eval_default"] == os.path.join(installed, "presets", "eval", "default.yaml")
    assert evaluation["status"] == "ok", evaluation
    assert sorted(evaluation["results"]) == ["human_replay", "planning", "validation"]
    assert evaluation["metrics"] and all(
        isinstance(v, int | float) for v in evaluation["metrics"].values())
    assert (work / "eval" / "results.json").is_file()
    # The eval CLI takes the preset name too (one evaluator, to keep it short).
    cli = _run([sys.executable, "-m", "jaxdrive.eval", "--config", "eval/default",
                "--checkpoint", str(run_dir), "--suite", "planning", "--no-progress",
                "--output-root", str(work / "eval_cli")], work, env)
    assert cli.stdout.startswith("planning: ") and "results: " in cli.stdout


def test_the_version_is_one_number_with_a_changelog_entry():
    """pyproject.toml and ``jaxdrive.__version__`` name the same version, and
    CHANGELOG.md has its section."""
    import jaxdrive

    tomllib = pytest.importorskip("tomllib")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert jaxdrive.__version__ == version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## {version} " in changelog or f"\n## {version}\n" in changelog


def test_eval_passing_preset_sections_set_each_partner_member():
    from jaxdrive.eval.suite import load_suite_file
    from jaxdrive.runs.config import load_run_config

    run = load_run_config("adaptive_passing")
    specs = load_suite_file("eval/passing", "default", run.env, run.procedural)
    got = {s.name: (s.procedural.partner_convention, s.procedural.partner_offset,
                    s.env.goal_behavior, s.num_scenarios, s.seed) for s in specs}
    train, wide = run.procedural.partner_offset, (1.5, 1.75)
    assert got == {
        "either": ("either", train, "trial", 256, 1000),
        "keep_right": ("keep_right", train, "trial", 256, 1000),
        "keep_left": ("keep_left", train, "trial", 256, 1000),
        "either_wide": ("either", wide, "trial", 256, 1000),
        "keep_right_wide": ("keep_right", wide, "trial", 256, 1000),
        "keep_left_wide": ("keep_left", wide, "trial", 256, 1000)}
    assert run.train.seed != 1000 and run.validation.seed != 1000  # held-out scenes
    assert [s.name for s in load_suite_file("eval/passing", "held_out", run.env,
                                            run.procedural)] == [
        "either_wide", "keep_right_wide", "keep_left_wide"]

"""The training-time eval manager: interval dispatch and subprocess evaluators."""

import json

import pytest
import yaml
from test_train_run import STEPS_PER_IT, _config

from jaxdrive.eval.manager import EvalManager
from jaxdrive.eval.suite import load_suite_file
from jaxdrive.train import run

SUITE = {"eval": {
    "_t": {"template": True, "num_scenarios": 2, "batch_size": 2},
    "often": {"type": "multi_scenario", "inherits": "_t", "interval": 2},
    "rare": {"type": "multi_scenario", "inherits": "_t", "interval": 3},
    "never": {"type": "multi_scenario", "inherits": "_t", "interval": 0},
    "off": {"type": "multi_scenario", "inherits": "_t", "interval": 1, "enabled": False},
    "child": {"type": "human_replay", "inherits": "_t", "interval": 1,
              "mode": "subprocess"},
}}


def test_only_due_evaluators_are_dispatched(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    config = _config(tmp_path)
    # Selecting every evaluator (None) leaves the disabled one out: pass it by name too.
    specs = {s.name: s for s in load_suite_file(
        str(path), ["often", "rare", "never", "off", "child"], base_env=config.env,
        base_procedural=config.procedural)}
    assert specs["off"].enabled is False
    manager = EvalManager(list(specs.values()), policy=None, run_dir=tmp_path)
    names = lambda it, final=False: [s.name for s in manager.due(it, final)]
    assert names(1) == ["child"]
    assert names(2) == ["often", "child"]
    assert names(3) == ["rare", "child"]
    assert names(6) == ["often", "rare", "child"]
    assert names(5, final=True) == ["often", "rare", "child"]
    assert manager.needs_checkpoint(1) and not EvalManager(
        [specs["often"]], None, tmp_path).needs_checkpoint(2)


@pytest.mark.slow
def test_subprocess_evaluator_runs_on_the_saved_checkpoint(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"eval": {"child": {
        "type": "multi_scenario", "interval": 1, "mode": "subprocess", "num_scenarios": 2,
        "batch_size": 2}}}))
    config = _config(tmp_path)
    config = config.replace(train=config.train.replace(total_steps=STEPS_PER_IT),
                            evaluation=config.evaluation.replace(suite_file=str(suite)))
    run_dir = run.new_run_dir(config, "tiny")
    last = run.train(config, run_dir, quiet=True)
    # The child evaluated the checkpoint of iteration 1 and was collected at the end.
    assert last["child/failed"] == 0.0 and last["child/source_step"] == STEPS_PER_IT
    assert last["child/scenarios"] == 2.0
    data = json.loads((run_dir / "eval" / "child" / f"step{STEPS_PER_IT:010d}.json")
                      .read_text())
    assert data["status"] == "ok" and data["step"] == STEPS_PER_IT


def test_child_environment_of_each_placement():
    from jaxdrive.eval.manager import child_environment
    from jaxdrive.runs.config import EvaluationConfig

    base = {"PATH": "/bin", "JAXDRIVE_COORDINATOR_ADDRESS": "h:1",
            "JAXDRIVE_NUM_PROCESSES": "2", "JAXDRIVE_PROCESS_ID": "0",
            "CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"}
    # Default: CPU, every accelerator hidden; never part of the trainer's job.
    cpu = child_environment(EvaluationConfig(), base)
    assert cpu == {"PATH": "/bin", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    same = child_environment(EvaluationConfig(subprocess_device="same",
                                              subprocess_memory_fraction=0.25), base)
    assert same == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0",
                    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25"}
    assert base["JAXDRIVE_PROCESS_ID"] == "0"  # the trainer's own environment untouched
    assert "JAX_PLATFORMS" in child_environment(EvaluationConfig())  # os.environ by default


def test_placement_keys_are_checked():
    from jaxdrive.config import ConfigError
    from jaxdrive.runs.config import RunConfig

    for value, msg in (({"subprocess_device": "gpu"}, "'subprocess_device' = 'gpu' is not "
                        "allowed.*Allowed values: cpu, same"),
                       ({"subprocess_memory_fraction": 0}, "'subprocess_memory_fraction' = 0 "
                        r"is out of range; allowed \(0.0, 1.0\]"),
                       ({"subprocess_memory_fraction": 1.5}, "subprocess_memory_fraction"),
                       ({"subprocess_memory_fraction": "half"}, "must be a number")):
        with pytest.raises(ConfigError, match=msg):
            RunConfig.from_dict({"evaluation": value})


def test_children_start_with_the_runs_placement(tmp_path, monkeypatch):
    """The manager reads the placement from RUN_DIR/config.yaml (or takes it as an
    argument) and starts each child with it, as a single process."""
    from jaxdrive.eval import manager as manager_module
    from jaxdrive.runs.config import EvaluationConfig
    from jaxdrive.runs.load import save_config

    started = []

    class Child:
        def __init__(self, cmd, env, **kw):
            started.append((cmd, env))

        def poll(self):
            return None

    monkeypatch.setattr(manager_module.subprocess, "Popen", Child)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    config = _config(tmp_path)
    config = config.replace(evaluation=config.evaluation.replace(
        suite_file=str(path), subprocess_device="same", subprocess_memory_fraction=0.3))
    save_config(config, tmp_path / "config.yaml")
    specs = load_suite_file(str(path), ["child"], base_env=config.env,
                            base_procedural=config.procedural)
    EvalManager(specs, None, tmp_path, suite_file=str(path))._launch(specs[0], 40)
    EvalManager(specs, None, tmp_path, suite_file=str(path),
                evaluation=EvaluationConfig())._launch(specs[0], 80)
    (cmd, env), (_, env_cpu) = started
    assert cmd[cmd.index("--num-processes") + 1] == "1"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env_cpu["JAX_PLATFORMS"] == "cpu" and env_cpu["CUDA_VISIBLE_DEVICES"] == ""

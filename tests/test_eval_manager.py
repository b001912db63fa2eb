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

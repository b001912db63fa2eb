"""Periodic validation in training: a ``multi_scenario`` evaluator (``jaxdrive.eval``).

Every held-out scene gets its own environment, started at the scene's first step, and
the policy acts with its mode (argmax / Beta mode) for one full episode (all trials in
trial mode); only that first episode counts. Rates are over ego agent-episodes, as in
training, and are logged as ``val/*``; ``val/goal_rate`` picks the best checkpoint.
Scenes: procedural with ``validation.seed`` (``validation.num_scenes`` of them), or the
first ``validation.num_scenes`` of ``data.validation_path``. The env is the training
env as it is (co-players, if any, act with the learner and are not scored).
"""

from __future__ import annotations

from jaxdrive.eval.evaluator import Evaluator
from jaxdrive.eval.evaluators import MultiScenario
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.runs.config import RunConfig


def make_validator(config: RunConfig) -> Evaluator:
    """The validation evaluator of a run (compiled on first use, reused after)."""
    v = config.validation
    section = {"type": "multi_scenario", "num_scenarios": v.num_scenes,
               "batch_size": v.num_scenes, "seed": v.seed, "deterministic": True,
               "clean": False, "trial_counters": True}
    if config.data.validation_path:
        section["scenarios"] = [config.data.validation_path]
    spec = load_suite_specs({"eval": {"validation": section}}, config.env,
                            config.procedural)["validation"]
    return MultiScenario(spec)

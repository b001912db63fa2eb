"""Evaluation: evaluators as scan-based rollouts with on-device reductions.

- ``suite``: evaluator sections from config (inheritance, templates, the clean macro).
- ``spec``: ``EvaluatorConfig`` (the keys every type accepts), ``EvaluatorSpec``.
- ``rollout``: the jitted one-episode-per-scenario rollout.
- ``evaluator`` / ``evaluators``: the ``Evaluator`` base; the registry of types
  (``register_evaluator``) and the five built-in ones with their configs.
- ``planning``: the nuPlan-style closed-loop score.
- ``runner``: suites of evaluators, the results file; ``manager``: evaluation in training.
- ``shards``: one shard of an evaluation (``--shard-id/--num-shards``) and the merge of
  the shards' files into the serial run's results (``python -m jaxdrive.eval merge``).
- ``run(params, suite)`` (``api``) for notebooks; ``python -m jaxdrive.eval`` (``cli``).
"""


def __getattr__(name):  # lazy: ``import jaxdrive.eval.suite`` stays light
    if name == "run":
        from jaxdrive.eval.api import run

        return run
    raise AttributeError(f"module 'jaxdrive.eval' has no attribute {name!r}")

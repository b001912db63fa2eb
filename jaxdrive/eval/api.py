"""``jaxdrive.eval.run(params, suite)``: evaluate from a notebook or a script.

``params`` is a run directory (its best checkpoint is loaded), a ``LoadedPolicy``
(``jaxdrive.train.load_policy``), or raw parameters together with ``policy=`` (and
``env_config=``, the env they were trained in: without it the default env, with a
warning).
``suite`` is a suite or evaluator name from the eval config file (``suite_file``: a file
or a preset name; default the preset ``eval/default``, the package's copy of
``configs/eval/default.yaml``, found by ``jaxdrive.config.resolve_config_path``), a
config mapping (``{"eval": {...}, "suites": {...}}``), or a list of names,
``EvaluatorSpec`` s or ``Evaluator`` s. The env the evaluators start
from is the run's (so observations match the policy); sections override it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxdrive.config import ConfigError, load_yaml, resolve_config_path
from jaxdrive.env import EnvConfig
from jaxdrive.eval.evaluator import Evaluator
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.runner import (
    SuiteResult,
    check_output_names,
    run_evaluators,
    timestamped_dir,
)
from jaxdrive.eval.suite import EvaluatorSpec, select_suite
from jaxdrive.files import check_writable
from jaxdrive.scenarios.procedural import ProceduralConfig

# A preset name (jaxdrive.config.resolve_config_path): configs/eval/default.yaml, shipped
# with the package as jaxdrive/presets/eval/default.yaml.
DEFAULT_SUITE_FILE = "eval/default"


def _policy_and_configs(params, policy, env_config, procedural):
    """(policy, params, env config, procedural config, step, run dir)."""
    from jaxdrive.runs.load import LoadedPolicy, load_policy

    if isinstance(params, str | os.PathLike):
        params = load_policy(params)
    if isinstance(params, LoadedPolicy):
        c = params.config
        return (params.policy, params.params, env_config or c.env,
                procedural or c.procedural, params.step, str(params.run_dir))
    if policy is None:
        raise ConfigError("jaxdrive.eval.run: raw parameters need policy= (a "
                          "jaxdrive.models.Policy); or pass a run directory / LoadedPolicy.")
    if env_config is None:
        # The policy reads any token counts, so a mismatch would not fail: it would
        # score the policy on observations it was not trained on.
        warnings.warn("jaxdrive.eval.run: raw parameters without env_config= are evaluated "
                      "in the default env (EnvConfig()), not the one they were trained in; "
                      "pass env_config=, or a run directory / LoadedPolicy (they carry it).",
                      stacklevel=3)
    return (policy, params, env_config or EnvConfig(), procedural or ProceduralConfig(), 0,
            None)


def resolve_evaluators(suite, env_config: EnvConfig, procedural: ProceduralConfig,
                       suite_file: str | os.PathLike | None = None) -> list[Evaluator]:
    """Evaluators for ``suite`` (see the module doc)."""
    if isinstance(suite, Mapping):
        return make_evaluators(select_suite(suite, None, env_config, procedural))
    if isinstance(suite, Sequence) and not isinstance(suite, str):
        items = list(suite)
        if all(isinstance(s, Evaluator) for s in items):
            return items
        if all(isinstance(s, EvaluatorSpec) for s in items):
            return make_evaluators(items)
    try:
        path = resolve_config_path(suite_file or DEFAULT_SUITE_FILE)
    except ConfigError as e:
        raise ConfigError(f"{e} Pass suite_file= (a file or a preset name) or a config "
                          "mapping as suite.") from None
    data = load_yaml(path)
    return make_evaluators(select_suite(data, suite, env_config, procedural))


def prepare_output_dir(evaluators: list[Evaluator], out_dir: str | os.PathLike | None,
                       output_root: str | os.PathLike, write: bool) -> Path | None:
    """The output directory, checked before any evaluator runs.

    Needed when ``write`` or when an evaluator renders videos: then ``out_dir`` (or a new
    timestamped directory under ``output_root``) is created and probed. Otherwise nothing
    is created: ``out_dir`` as given, or None.

    Raises:
      UnsafeNameError: an evaluator's name would put its files outside the directory.
      OutputError: the directory cannot be created or written (the message names it).
    """
    needed = write or any(ev.spec.render.enabled for ev in evaluators)
    check_output_names(evaluators, out_dir if out_dir is not None
                       else Path(output_root) / "eval")
    if not needed:
        return None if out_dir is None else Path(out_dir)
    if out_dir is not None:
        return check_writable(out_dir)
    return timestamped_dir(output_root)


def run(params, suite: Any = "default", *, policy=None, env_config: EnvConfig | None = None,
        procedural: ProceduralConfig | None = None, suite_file: str | None = None,
        out_dir: str | os.PathLike | None = None, output_root: str = "eval_runs",
        progress: bool = True, write: bool = True) -> SuiteResult:
    """Evaluate ``params`` on ``suite``; returns a ``SuiteResult`` (``.metrics``,
    ``.videos``, ``.to_pandas()``, ``.to_dict()``, ``result["NAME"]``).

    Outputs (videos, ``results.json``) go to ``out_dir``, by default a new timestamped
    directory under ``output_root``; it is checked before any evaluator runs
    (``prepare_output_dir``). If ``results.json`` cannot be written after the work, it
    is saved next to the directory or in the system temp directory, with a warning
    naming the path (``SuiteResult.write``).

    Raises:
      ConfigError: a bad suite or policy; UnsafeNameError: an evaluator name that would
      leave the output directory; OutputError: an unwritable output directory.
    """
    policy, params, env_config, procedural, step, run_dir = _policy_and_configs(
        params, policy, env_config, procedural)
    evaluators = resolve_evaluators(suite, env_config, procedural, suite_file)
    out = prepare_output_dir(evaluators, out_dir, output_root, write)
    result = run_evaluators(evaluators, policy, params, out_dir=out, step=step,
                            progress=progress, checkpoint=run_dir)
    if write:
        result.write(out / "results.json")
    return result

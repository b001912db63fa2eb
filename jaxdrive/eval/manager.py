"""Evaluation during training: run the evaluators whose interval divides the iteration.

``mode: inline`` evaluators run in the training process on the same device, each
compiled once per run and reused with new parameters. ``mode: subprocess`` evaluators
run ``python -m jaxdrive.eval`` against the run's latest checkpoint (saved just
before) in a child process while training goes on; their results are collected at a
later iteration and logged then (with ``NAME/source_step``, the step they evaluated).

Everything an evaluator reports is logged as ``NAME/metric``, plus
``NAME/eval_seconds`` and ``NAME/compile_seconds``; results files go to
``RUN_DIR/eval/stepSTEP.json`` and videos to ``RUN_DIR/eval/NAME/render/VIEW/``.

Placement of the children (``evaluation.subprocess_device`` of the run config,
``child_environment``): a child must not fight the training process for its
accelerator, and JAX is placed only through the environment a process starts with. With
``cpu`` (the default) the child sees no accelerator (``JAX_PLATFORMS=cpu``,
``CUDA_VISIBLE_DEVICES=""``); with ``same`` it shares the trainer's GPU, allocating on
demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false``) up to
``evaluation.subprocess_memory_fraction`` of its memory
(``XLA_PYTHON_CLIENT_MEM_FRACTION``). Either way the child is one process on its own:
the ``JAXDRIVE_*`` job variables are removed from its environment and it is started with
``--num-processes 1`` (SLURM / TPU variables are then ignored).

Evaluator names become directories only through ``Evaluator.output_dir`` and
``jaxdrive.files.confined``: a name that would leave ``RUN_DIR/eval`` is refused when
the manager is built, before training starts. A results file that cannot be written
(disk full, directory removed) is saved next to ``RUN_DIR/eval`` or in the system temp
directory with a warning saying where; training goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from jaxdrive.eval.evaluator import EvalResult, PoolCache
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.runner import SuiteResult, check_output_names
from jaxdrive.eval.suite import EvaluatorSpec
from jaxdrive.files import OutputError, confined, safe_name, write_or_fallback
from jaxdrive.runs.config import EvaluationConfig
from jaxdrive.telemetry.writers import video_keys

# The variables that make a process join a multi-process job (``jaxdrive.distributed``);
# a child evaluator never inherits them.
_JOB_VARIABLES = ("JAXDRIVE_COORDINATOR_ADDRESS", "JAXDRIVE_NUM_PROCESSES",
                  "JAXDRIVE_PROCESS_ID")
_PLACEMENT_VARIABLES = ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES",
                        "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def child_environment(evaluation: EvaluationConfig,
                      base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess evaluator: ``base`` (default ``os.environ``)
    without the multi-process job variables, with the placement of
    ``evaluation.subprocess_device`` (see the module doc):

    - ``cpu``: ``JAX_PLATFORMS=cpu``, ``CUDA_VISIBLE_DEVICES=""`` (no accelerator; a
      memory limit inherited from the trainer is dropped);
    - ``same``: the trainer's platform and visible devices, with
      ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and ``XLA_PYTHON_CLIENT_MEM_FRACTION`` =
      ``subprocess_memory_fraction``.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in _JOB_VARIABLES}
    if evaluation.subprocess_device == "cpu":
        env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{float(evaluation.subprocess_memory_fraction):g}"
    return env


def _run_evaluation_config(run_dir: Path) -> EvaluationConfig:
    """The ``evaluation`` section of ``RUN_DIR/config.yaml`` (defaults when the file or
    the section is missing or unreadable: the trainer has checked it already)."""
    from jaxdrive.config import ConfigError, read_yaml_file

    path = run_dir / "config.yaml"
    try:
        section = read_yaml_file(str(path)).get("evaluation") or {}
        return EvaluationConfig.from_dict(section, "evaluation")
    except ConfigError:  # placement falls back to the safe default
        return EvaluationConfig()


def result_metrics(result: EvalResult) -> dict[str, float]:
    """``NAME/metric`` for logging, ``NAME/failed`` = 1 for a failed evaluator."""
    out = {f"{result.name}/{k}": v for k, v in result.metrics.items()}
    out[f"{result.name}/eval_seconds"] = result.eval_seconds
    out[f"{result.name}/compile_seconds"] = result.compile_seconds
    out[f"{result.name}/failed"] = float(result.status != "ok")
    return out


class EvalManager:
    """Dispatches due evaluators during a training run (see the module doc).

    Args:
      specs: resolved evaluator specs (disabled ones and interval 0 never run here).
      policy: the trained policy object (fixed for the run).
      run_dir: the training run directory.
      suite_file, suite: where the specs came from (for subprocess evaluators).
      log: a ``print``-like function for warnings.
      evaluation: the run's ``evaluation`` config, for the placement of subprocess
        evaluators (``child_environment``); default: read from ``RUN_DIR/config.yaml``
        when the first child starts (the defaults if there is none).

    Raises:
      UnsafeNameError: an evaluator name that would leave ``RUN_DIR/eval``.
    """

    def __init__(self, specs: list[EvaluatorSpec], policy, run_dir: str | Path,
                 suite_file: str | None = None, log=print,
                 evaluation: EvaluationConfig | None = None):
        self.evaluation = evaluation
        self.specs = [s for s in specs if s.enabled and s.interval > 0]
        self.policy = policy
        self.run_dir = Path(run_dir)
        self.out_dir = self.run_dir / "eval"
        self.suite_file = suite_file
        self.log = log
        self.pools = PoolCache()  # shared by the inline evaluators for the run's life
        self.inline = {s.name: make_evaluators([s]) for s in self.specs
                       if s.mode == "inline"}
        for evaluators in self.inline.values():
            check_output_names(evaluators, self.out_dir)
        for s in self.specs:
            if s.mode == "subprocess":
                self._child_dir(s)
        self._children: list[tuple[subprocess.Popen, Path, int, str]] = []

    @property
    def pending(self) -> int:
        """Subprocess evaluations still to collect."""
        return len(self._children)

    def due(self, iteration: int, final: bool = False) -> list[EvaluatorSpec]:
        """Specs due at ``iteration`` (a multiple of their ``interval``); every one when
        ``final``."""
        return [s for s in self.specs if iteration % s.interval == 0 or final]

    def needs_checkpoint(self, iteration: int, final: bool = False) -> bool:
        """A subprocess evaluator is due: save a checkpoint first."""
        return any(s.mode == "subprocess" for s in self.due(iteration, final))

    def run(self, iteration: int, step: int, params, final: bool = False
            ) -> tuple[dict[str, float], list[tuple[str, str]]]:
        """Run the due inline evaluators, launch the due subprocess ones, collect the
        finished children. Returns (metrics, [(wandb key, video path)])."""
        metrics: dict[str, float] = {}
        videos: list[tuple[str, str]] = []
        results = []
        for spec in self.due(iteration, final):
            if spec.mode == "subprocess":
                self._launch(spec, step)
                continue
            for ev in self.inline[spec.name]:
                r = ev.run(self.policy, params, out_dir=self.out_dir, step=step,
                           pools=self.pools)
                if r.status != "ok":
                    self.log(f"warning: evaluator {r.name} failed at step {step}: "
                             f"{(r.error or '').splitlines()[0]}")
                results.append(r)
                metrics.update(result_metrics(r))
                videos += video_keys(r.name, r.videos)
        if results:
            self._write(SuiteResult(results=results, out_dir=str(self.out_dir), step=step,
                                    checkpoint=str(self.run_dir)))
        collected, more = self.collect(wait=final)
        metrics.update(collected)
        return metrics, videos + more

    def _write(self, result: SuiteResult) -> None:
        """``RUN_DIR/eval/stepSTEP.json``, atomically; on failure a copy elsewhere and a
        warning (training goes on)."""
        path = self.out_dir / f"step{result.step:010d}.json"
        try:
            _, problem = write_or_fallback(path, result.to_json())
        except OutputError as e:
            problem = f"{e} The results of step {result.step} are in the logged metrics only."
        if problem is not None:
            self.log(f"warning: {problem}")

    def _child_dir(self, spec: EvaluatorSpec) -> Path:
        """``RUN_DIR/eval/NAME``, the directory of a subprocess evaluator (UnsafeNameError
        if the name would leave ``RUN_DIR/eval``)."""
        return confined(self.out_dir, safe_name(spec.name, "evaluator section name"))

    def _launch(self, spec: EvaluatorSpec, step: int) -> None:
        if self.suite_file is None:
            self.log(f"warning: evaluator {spec.name} has mode subprocess but the run has "
                     "no evaluation.suite_file; skipped.")
            return
        directory = self._child_dir(spec)
        out = directory / f"step{step:010d}.json"
        cmd = [sys.executable, "-m", "jaxdrive.eval", "--config", self.suite_file,
               "--checkpoint", str(self.run_dir), "--which", "last", "--suite", spec.name,
               "--out", str(out), "--output-root", str(directory), "--no-progress",
               "--num-processes", "1"]
        if self.evaluation is None:
            self.evaluation = _run_evaluation_config(self.run_dir)
        env = child_environment(self.evaluation)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(out.with_suffix(".log"), "w") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        except OSError as e:
            self.log(f"warning: subprocess evaluator {spec.name} (step {step}) not started: "
                     f"cannot write {out.with_suffix('.log')}: {e.strerror or e}")
            return
        self._children.append((proc, out, step, spec.name))

    def collect(self, wait: bool = False) -> tuple[dict[str, float], list]:
        """Metrics of finished subprocess evaluations (all of them when ``wait``)."""
        metrics: dict[str, float] = {}
        videos = []
        running = []
        for proc, out, step, name in self._children:
            if wait:
                proc.wait()
            if proc.poll() is None:
                running.append((proc, out, step, name))
                continue
            if not out.is_file():
                self.log(f"warning: subprocess evaluator {name} (step {step}) wrote no "
                         f"results; see {out.with_suffix('.log')}")
                metrics[f"{name}/failed"] = 1.0
                continue
            try:
                data = json.loads(out.read_text())
            except (OSError, ValueError) as e:
                self.log(f"warning: subprocess evaluator {name} (step {step}) left an "
                         f"unreadable results file {out}: {e}")
                metrics[f"{name}/failed"] = 1.0
                continue
            for ev_name, ev in data["evaluators"].items():
                r = EvalResult(name=ev_name, type=ev["type"], status=ev["status"],
                               metrics=ev["metrics"], eval_seconds=ev["eval_seconds"],
                               compile_seconds=ev["compile_seconds"], error=ev["error"])
                metrics.update(result_metrics(r))
                metrics[f"{ev_name}/source_step"] = float(step)
                videos += video_keys(ev_name, ev["videos"])
        self._children = running
        return metrics, videos

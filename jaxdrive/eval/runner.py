"""Running a suite of evaluators and writing its results file.

Results file (JSON, ``RESULTS_VERSION``)::

    {"version": 1, "status": "ok" | "failed" | "partial", "created": ISO time,
     "step": run step of the evaluated parameters, "checkpoint": RUN_DIR or null,
     "wall_seconds": ..., "out_dir": ..., "config": {NAME: resolved section},
     "evaluators": {NAME: {"type", "status", "metrics", "per_scenario", "episodes",
                           "videos", "eval_seconds", "compile_seconds", "error",
                           "config"}}}

A shard's file (``--shard-id`` / ``--num-shards``) adds a top-level ``"shard"`` record
and each evaluator's ``"shard"`` (its batches' rows): see ``jaxdrive.eval.shards``.

``partial``: some evaluators failed, others not. A failed evaluator keeps its record
with the error; the others still run.

Outputs are safe to lose nothing: ``check_output_names`` refuses, before any evaluator
runs, an evaluator name that would put its videos outside the output directory;
``write_or_fallback`` writes a results file atomically and, when its path cannot be
written after the work (disk full, directory removed meanwhile), saves it next to the
output directory or in the system temp directory and says where.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxdrive.eval.evaluator import EvalResult, Evaluator, PoolCache
from jaxdrive.eval.shards import Shard, shard_header
from jaxdrive.files import OutputError, write_or_fallback

RESULTS_VERSION = 1


def _finite(x: Any) -> Any:
    """JSON-safe copy: NaN / inf floats become None (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


@dataclass
class SuiteResult:
    """Results of several evaluators, as plain Python data."""

    results: list[EvalResult]
    wall_seconds: float = 0.0
    out_dir: str | None = None
    step: int = 0
    checkpoint: str | None = None
    created: str = field(default_factory=lambda: datetime.datetime.now().isoformat(
        timespec="seconds"))
    shard: dict | None = None

    @property
    def status(self) -> str:
        """``ok`` (no evaluator failed), ``failed`` (all failed) or ``partial``."""
        failed = sum(r.status != "ok" for r in self.results)
        if failed == 0:
            return "ok"
        return "failed" if failed == len(self.results) else "partial"

    @property
    def metrics(self) -> dict[str, float]:
        """``NAME/metric`` -> value over every evaluator, plus ``NAME/eval_seconds``."""
        out = {}
        for r in self.results:
            out.update({f"{r.name}/{k}": v for k, v in r.metrics.items()})
            out[f"{r.name}/eval_seconds"] = r.eval_seconds
        return out

    @property
    def videos(self) -> list[str]:
        """Paths of every evaluator's videos, in evaluator order."""
        return [v for r in self.results for v in r.videos]

    def __getitem__(self, name: str) -> EvalResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no evaluator '{name}'; have {[r.name for r in self.results]}")

    def records(self) -> list[dict]:
        """One row per episode over every evaluator."""
        return [row for r in self.results for row in r.records()]

    def to_pandas(self):
        """The per-episode records as a ``pandas.DataFrame`` (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("SuiteResult.to_pandas needs pandas: pip install pandas (or "
                              "'jaxdrive[notebook]'); records() gives the same rows as "
                              "dicts.") from None

        return pd.DataFrame(self.records())

    def to_dict(self) -> dict:
        """The results JSON document: version, status, run info, each evaluator's config and
        result (NaN / inf floats become None)."""
        shard = {} if self.shard is None else {"shard": self.shard}
        return _finite({
            "version": RESULTS_VERSION, "status": self.status, "created": self.created,
            "step": self.step, "checkpoint": self.checkpoint,
            "wall_seconds": self.wall_seconds, "out_dir": self.out_dir, **shard,
            "config": {r.name: r.config for r in self.results},
            "evaluators": {r.name: {k: v for k, v in r.to_dict().items() if k != "name"}
                           for r in self.results},
        })

    def to_json(self) -> str:
        """``to_dict()`` as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def write(self, path: str | os.PathLike) -> Path:
        """Write ``to_json()`` to ``path`` atomically (parents created); returns where the
        file went: ``path``, or a fallback (``write_or_fallback``, with a warning naming
        both) when ``path`` cannot be written."""
        written, problem = write_or_fallback(path, self.to_json())
        if problem is not None:
            warnings.warn(problem, stacklevel=2)
        return written


def check_output_names(evaluators: list[Evaluator], out_dir: str | os.PathLike) -> None:
    """Before any work: every evaluator that renders keeps its videos inside ``out_dir``.

    Raises:
      UnsafeNameError: an evaluator's name would leave ``out_dir`` (``..``, an absolute
        path, a separator other than the ``SECTION/CLASS`` one).
    """
    for ev in evaluators:
        if ev.spec.render.enabled:
            ev.output_dir(out_dir)


def timestamped_dir(parent: str | os.PathLike, name: str = "eval") -> Path:
    """``parent/NAME-YYYYmmdd-HHMMSS`` (with a suffix if taken), created."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(parent).expanduser() / f"{name}-{stamp}"
    path, i = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            if not path.parent.is_dir():
                raise OutputError(f"cannot create the output directory {path}: "
                                  f"{path.parent} is not a directory; choose another "
                                  "output root") from None
            path, i = Path(f"{base}-{i}"), i + 1
        except OSError as e:
            raise OutputError(f"cannot create the output directory {path}: "
                              f"{e.strerror or e}; choose a writable output root") from e


def run_evaluators(evaluators: list[Evaluator], policy, params,
                   out_dir: str | os.PathLike | None = None, step: int = 0,
                   progress: bool = True, checkpoint: str | None = None,
                   shard: Shard | None = None) -> SuiteResult:
    """Run each evaluator in turn (a failure is recorded, the rest still run).

    ``shard``: run only that shard of every evaluator (``jaxdrive.eval.shards``); the
    result then records the shard and merges with the others' (``merge_results``).

    Raises:
      UnsafeNameError: before any evaluator runs, when one that renders into ``out_dir``
        has a name that would leave it (``check_output_names``).
    """
    if out_dir is not None:
        check_output_names(evaluators, out_dir)
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(evaluators), unit="evaluator", desc="eval")
    results = []
    pools = PoolCache()  # evaluators of the same scenes share one pool
    try:
        for ev in evaluators:
            if bar is not None:
                bar.set_postfix_str(ev.name)
            # ``shard`` only when sharding: evaluators that override ``run`` without it
            # keep working unsharded.
            extra = {} if shard is None else {"shard": shard}
            results.append(ev.run(policy, params, out_dir=out_dir, step=step, pools=pools,
                                  **extra))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return SuiteResult(results=results, wall_seconds=time.perf_counter() - t0,
                       out_dir=None if out_dir is None else str(out_dir), step=step,
                       checkpoint=checkpoint,
                       shard=None if shard is None else shard_header(shard, params))

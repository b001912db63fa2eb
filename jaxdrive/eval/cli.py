"""Evaluate a checkpoint on a suite and write the results JSON.

    python -m jaxdrive.eval --config configs/eval/default.yaml --checkpoint RUN_DIR
                            [--suite NAME] [--out FILE] [--which best|last]
    python -m jaxdrive.eval --config eval/default --checkpoint RUN_DIR ...

``--config``: a file with ``eval:`` sections (and ``suites:``), or a preset name
(``eval/default``: the package's copy of configs/eval/default.yaml); ``--suite``: a suite or
evaluator name (default: every enabled evaluator). Videos and ``results.json`` go to a
new timestamped directory under ``--output-root`` (default ``eval_runs``); ``--out``
writes the results JSON there instead / as well. Exit code 0 when every evaluator
succeeded, 1 when some failed (their records hold the errors), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from jaxdrive.config import ConfigError, load_yaml, resolve_config_path


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.eval``; returns the exit code (see the module
    doc)."""
    p = argparse.ArgumentParser(prog="python -m jaxdrive.eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True,
                   help="eval config YAML (eval: sections): a file or a preset name "
                        "(eval/default)")
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR",
                   help="training run directory")
    p.add_argument("--suite", default=None, help="suite or evaluator name")
    p.add_argument("--out", default=None, metavar="FILE", help="results JSON path")
    p.add_argument("--which", default="best", choices=("best", "last"))
    p.add_argument("--output-root", default="eval_runs")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    from jaxdrive.eval.evaluators import make_evaluators
    from jaxdrive.eval.runner import run_evaluators, timestamped_dir
    from jaxdrive.eval.suite import select_suite
    from jaxdrive.runs.load import load_policy

    try:
        loaded = load_policy(args.checkpoint, which=args.which)
        data = load_yaml(resolve_config_path(args.config))
        specs = select_suite(data, args.suite, loaded.config.env, loaded.config.procedural)
        evaluators = make_evaluators(specs)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out_dir = timestamped_dir(args.output_root)
    result = run_evaluators(evaluators, loaded.policy, loaded.params, out_dir=out_dir,
                            step=loaded.step, progress=not args.no_progress,
                            checkpoint=str(loaded.run_dir))
    path = result.write(args.out or out_dir / "results.json")
    for r in result.results:
        if r.status == "ok":
            shown = ", ".join(f"{k} {v:.3f}" for k, v in list(r.metrics.items())[:4])
            print(f"{r.name}: {shown} ({r.eval_seconds:.1f} s)")
        else:
            print(f"{r.name}: FAILED: {r.error.splitlines()[0]}")
    for v in result.videos:
        print(v)
    print(f"results: {path}")
    return 0 if result.status == "ok" else 1

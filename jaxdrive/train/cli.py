"""Train a policy with PPO.

    python -m jaxdrive.train --config configs/quickstart.yaml [--set key=value ...]
    python -m jaxdrive.train --config quickstart [--set key=value ...]
    python -m jaxdrive.train [--config FILE] --resume RUN_DIR [--set train.total_steps=N]

``--config`` is a file or a preset name (quickstart, selfplay_gpu, adaptive, ...: the
files of the repository's configs/, shipped with the package).

Prints the run directory; it holds config.yaml (resolved), metrics.jsonl and
checkpoints/. ``--set train.total_steps=N`` shortens (or, with --resume, extends) a run.
A resumed run uses the run directory's saved config.yaml (plus ``--set``).
Config sections: env, procedural, policy, train, validation, checkpoint, logging (see
``jaxdrive.runs.config``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxdrive.config import ConfigError, parse_overrides
from jaxdrive.runs.config import load_run_config
from jaxdrive.runs.load import read_run_config
from jaxdrive.train.run import new_run_dir, summary_lines, train


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.train``; returns the exit code (2 on bad
    input)."""
    p = argparse.ArgumentParser(prog="python -m jaxdrive.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None,
                   help="YAML run config (may inherits: others): a file or a preset name "
                        "(quickstart, selfplay_gpu, ...)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.total_steps=2000000")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run from its last checkpoint (uses its config.yaml)")
    args = p.parse_args(argv)
    if not args.config and not args.resume:
        p.error("give --config FILE or PRESET (e.g. configs/quickstart.yaml or quickstart) "
                "or --resume RUN_DIR")
    try:
        overrides = parse_overrides(args.overrides)
        if args.resume:
            run_dir = Path(args.resume)
            config = read_run_config(run_dir, overrides)
            if args.config and load_run_config(args.config, overrides) != config:
                print(f"note: --resume continues with {run_dir}/config.yaml (plus --set); "
                      f"it differs from {args.config}, which is not used.", flush=True)
            if not (run_dir / "checkpoints").is_dir():
                raise FileNotFoundError(f"{run_dir}/checkpoints not found: the run saved no "
                                        "checkpoint to resume from.")
        else:
            config = load_run_config(args.config, overrides)
            run_dir = new_run_dir(config, Path(args.config).stem)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    metrics = train(config, run_dir, resume=bool(args.resume))
    for line in summary_lines(metrics, run_dir):
        print(line)
    return 0

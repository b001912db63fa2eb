"""Validation overlapped with the next training iteration, against validation in
between iterations: alternating short quickstart runs (40 iterations after compilation,
validation every 2, no checkpoint before the end); prints the loop's seconds after
compilation and the validation seconds of each run.

    python experiments/validation_overlap.py --rounds 2

Measured on the 2-core CPU: overlap is slower there (docs/benchmarks.md), which is why
``_Run.overlap_validation`` is off on CPU; this forces it on and off.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from jaxdrive.runs.config import load_run_config
from jaxdrive.train import run

_build_extras = run._Run._build_extras


def _with_overlap(on: bool):
    def build(self):
        _build_extras(self)
        self.overlap_validation = on
    return build


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    config = load_run_config(args.config, {
        "train.total_steps": 41 * 32768, "validation.every": 2, "checkpoint.every": 0,
        "logging.every": 1})
    for r in range(args.rounds):
        for overlap in ((True, False) if r % 2 == 0 else (False, True)):
            run._Run._build_extras = _with_overlap(overlap)
            with tempfile.TemporaryDirectory() as tmp:
                c = config.replace(logging=config.logging.replace(output_dir=tmp))
                run_dir = run.new_run_dir(c, "overlap" if overlap else "between")
                run.train(c, run_dir, quiet=True)
                rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
            loop_s = rows[-1]["time/elapsed_s"] - rows[0]["time/elapsed_s"]
            val_s = sum(row.get("time/validation_s", 0.0) for row in rows)
            print(f"{'overlapped' if overlap else 'in between':>10}: loop {loop_s:.1f} s, "
                  f"validation {val_s:.1f} s, final val goal {rows[-1]['val/goal_rate']:.3f}",
                  flush=True)
    run._Run._build_extras = _build_extras


if __name__ == "__main__":
    main()

"""Held-out learning curves (goal, collision, off-road) of training runs.

    python experiments/plot_learning_curves.py RUN_DIR [RUN_DIR ...] --out docs/img/FILE.png
        [--labels A,B,...] [--title TEXT]

Reads the validation rows (``val/goal_rate``, ``val/collision_rate``,
``val/offroad_rate``) of each run's metrics.jsonl and plots them against agent-steps,
one panel per rate, one line per run, with the issue-20 targets dashed. Prints each
run's last validation row.
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RATES = (("val/goal_rate", "goal"), ("val/collision_rate", "collision"),
         ("val/offroad_rate", "off-road"))


def read_validation(run_dir: Path) -> list[dict]:
    """The metrics.jsonl rows of ``run_dir`` with validation rates."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (pass a training run directory)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "val/goal_rate" in r]
    if not rows:
        raise SystemExit(f"error: {path} has no validation rows (validation.every > 0?)")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--labels", default=None)
    p.add_argument("--title", default="held-out validation")
    args = p.parse_args()
    labels = args.labels.split(",") if args.labels else [r.name for r in args.runs]
    if len(labels) != len(args.runs):
        raise SystemExit("error: --labels needs one label per run directory")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for run, label in zip(args.runs, labels, strict=True):
        rows = read_validation(run)
        steps = [r["step"] / 1e6 for r in rows]
        for ax, (key, _) in zip(axes, RATES, strict=True):
            ax.plot(steps, [r[key] for r in rows], label=label)
        last = rows[-1]
        print(f"{label}: step {last['step']:,}: goal {last['val/goal_rate']:.3f}, collision "
              f"{last['val/collision_rate']:.3f}, off-road {last['val/offroad_rate']:.3f}")
    for ax, (_, name) in zip(axes, RATES, strict=True):
        ax.set_title(name)
        ax.set_xlabel("agent-steps (M)")
        ax.grid(alpha=0.3)
    axes[0].axhline(0.97, ls="--", c="gray", lw=0.8)
    axes[0].axhline(0.90, ls=":", c="gray", lw=0.8)
    for ax in axes[1:]:
        ax.axhline(0.03, ls=":", c="gray", lw=0.8)
        ax.axhline(0.01, ls="--", c="gray", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

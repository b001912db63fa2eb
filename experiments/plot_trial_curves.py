"""Learning curves of per-trial scores from training runs' metrics.jsonl (validation rows).

    python experiments/plot_trial_curves.py RUN_DIR [RUN_DIR ...] --out docs/img/FILE.png
        [--labels A,B,...] [--title TEXT]

One panel per run: ``val/trial_{k}_score`` (held-out validation scenes, share of
episodes whose ego reached its goal in trial k) against agent-steps, one line per trial,
and ``val/ada_delta_trial_1_minus_0`` on a second axis below. Reads only the files; prints
the last validation row of each run.
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_validation(run_dir: Path) -> list[dict]:
    """The metrics.jsonl rows of ``run_dir`` that hold validation trial scores."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (pass a training run directory)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "val/trial_0_score" in r]
    if not rows:
        raise SystemExit(f"error: {path} has no val/trial_0_score rows; was the run "
                         "trained with env.goal_behavior: trial and validation on?")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--labels", default=None, help="comma-separated panel titles")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else [r.name for r in args.runs]
    if len(labels) != len(args.runs):
        raise SystemExit("error: --labels needs one label per run directory")
    fig, axes = plt.subplots(2, len(args.runs), figsize=(5.5 * len(args.runs), 6),
                             sharex="col", squeeze=False,
                             gridspec_kw={"height_ratios": [2, 1]})
    for j, (run, label) in enumerate(zip(args.runs, labels, strict=True)):
        rows = read_validation(run)
        steps = [r["step"] / 1e6 for r in rows]
        k = 0
        while f"val/trial_{k}_score" in rows[0]:
            axes[0, j].plot(steps, [r[f"val/trial_{k}_score"] for r in rows],
                            marker=".", label=f"trial {k}")
            k += 1
        axes[0, j].set_title(label)
        axes[0, j].set_ylim(0, 1.02)
        axes[0, j].set_ylabel("goal reached (validation)")
        axes[0, j].grid(alpha=0.3)
        axes[0, j].legend(loc="lower right")
        axes[1, j].plot(steps, [r["val/ada_delta_trial_1_minus_0"] for r in rows],
                        color="k", marker=".")
        axes[1, j].axhline(0.0, color="grey", lw=0.8)
        axes[1, j].set_ylabel("trial 1 - trial 0")
        axes[1, j].set_xlabel("agent-steps (millions)")
        axes[1, j].grid(alpha=0.3)
        last = rows[-1]
        scores = "  ".join(f"{last[f'val/trial_{i}_score']:.3f}" for i in range(k))
        print(f"{label}: step {last['step']:,}, trial scores {scores}, "
              f"delta {last['val/ada_delta_trial_1_minus_0']:+.3f}")
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

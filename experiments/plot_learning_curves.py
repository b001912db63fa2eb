"""Held-out learning curves (goal, collision, off-road) of training runs.

    python experiments/plot_learning_curves.py RUN_DIR [RUN_DIR ...] --out docs/img/FILE.png
        [--labels A,B,...] [--title TEXT] [--windows 8-12,16-20] [--rate-max 0.12]

Reads the validation rows (``val/goal_rate``, ``val/collision_rate``,
``val/offroad_rate``) of each run's metrics.jsonl and plots them against agent-steps,
one panel per rate, one line per run, with the issue-20 targets dashed. Prints each
run's last validation row, and with ``--windows`` the mean of each run's validations
whose agent-steps (in millions) fall in each window (single validations on 128 scenes
swing by a point or two; window means compare runs more fairly).
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
    p.add_argument("--rate-max", type=float, default=None,
                   help="upper y limit of the collision and off-road panels (the first "
                        "validations' large rates otherwise flatten the rest)")
    p.add_argument("--windows", default=None,
                   help="LO-HI[,LO-HI...] in millions of agent-steps: print window means")
    args = p.parse_args()
    windows = []
    for w in (args.windows.split(",") if args.windows else []):
        try:
            lo, hi = (float(x) for x in w.split("-"))
        except ValueError:
            raise SystemExit(f"error: --windows: {w!r} is not LO-HI (e.g. 8-12)") from None
        windows.append((lo, hi))
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
        for lo, hi in windows:
            sel = [r for r in rows if lo <= r["step"] / 1e6 <= hi]
            if not sel:
                print(f"  {lo:g}-{hi:g} M: no validation")
                continue
            mean = {k: sum(r[k] for r in sel) / len(sel) for k, _ in RATES}
            print(f"  {lo:g}-{hi:g} M ({len(sel)} validations): goal "
                  f"{mean['val/goal_rate']:.3f}, collision {mean['val/collision_rate']:.3f}, "
                  f"off-road {mean['val/offroad_rate']:.3f}")
    for ax, (_, name) in zip(axes, RATES, strict=True):
        ax.set_title(name)
        ax.set_xlabel("agent-steps (M)")
        ax.grid(alpha=0.3)
    axes[0].axhline(0.97, ls="--", c="gray", lw=0.8)
    axes[0].axhline(0.90, ls=":", c="gray", lw=0.8)
    for ax in axes[1:]:
        if args.rate_max:
            ax.set_ylim(0, args.rate_max)
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

"""Time to a good driver, for ``python -m jaxdrive.bench learn``.

Trains a config (default the quickstart preset) exactly as ``python -m jaxdrive.train``
does, into a fresh run directory, and stops at the first validation at which the
held-out scenes reach the targets (goal rate >= 0.90, collision and off-road rates <=
0.03 by default), or at ``train.total_steps`` (the cap). Reports the agent-steps and
the wall time to that point, from the command's start (set-up and compilation
included) and of training alone (``time/elapsed_s`` of the run).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from jaxdrive.runs.config import RunConfig


@dataclass(frozen=True)
class Targets:
    """Validation rates that count as a good driver."""

    goal: float = 0.90
    collision: float = 0.03
    offroad: float = 0.03

    def __post_init__(self):
        for name in ("goal", "collision", "offroad"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"--{name} must be a finite rate >= 0 (e.g. 0.9), got "
                                 f"{value}")

    def met(self, metrics: dict) -> bool:
        """Whether an iteration's metrics hold a validation that meets every target."""
        keys = ("val/goal_rate", "val/collision_rate", "val/offroad_rate")
        if not all(k in metrics for k in keys):
            return False
        return (metrics["val/goal_rate"] >= self.goal
                and metrics["val/collision_rate"] <= self.collision
                and metrics["val/offroad_rate"] <= self.offroad)


def bench_learn(config: RunConfig, run_dir: Path, targets: Targets = Targets(),
                quiet: bool = False) -> dict:
    """Train until ``targets`` hold at a validation (or the cap); the JSON-ready record.

    Raises:
      ValueError: the config has no validation (``validation.every: 0``).
    """
    from jaxdrive.train.run import train

    if not config.validation.every:
        raise ValueError("bench learn needs validation: set validation.every > 0 (the "
                         "held-out scenes are where the targets are checked)")
    seen: list[dict] = []

    def stop_when(metrics: dict) -> bool:
        if "val/goal_rate" in metrics:
            seen.append({k: metrics[k] for k in ("val/goal_rate", "val/collision_rate",
                                                 "val/offroad_rate")})
        return targets.met(metrics)

    tic = time.perf_counter()
    last = train(config, run_dir, quiet=quiet, stop_when=stop_when)
    wall = time.perf_counter() - tic
    reached = targets.met(last)
    return {
        "policy": config.policy.kind,
        "reached": reached,
        "agent_steps": int(last.get("step", 0)),
        "wall_s": wall,
        "train_s": float(last.get("time/elapsed_s", float("nan"))),
        "cap_agent_steps": config.train.total_steps,
        "targets": {"goal": targets.goal, "collision": targets.collision,
                    "offroad": targets.offroad},
        "final_validation": seen[-1] if seen else None,
        "validations": len(seen),
        "run_dir": str(run_dir),
    }


def learn_table(records: list[dict]) -> str:
    """Markdown table of ``bench_learn`` records."""
    lines = ["| config | policy | reached | agent-steps | wall s (command) | training s | "
             "val goal / collision / off-road |", "|---|---|---|---:|---:|---:|---|"]
    for r in records:
        v = r["final_validation"] or {}
        rates = " / ".join(f"{v.get(k, float('nan')):.3f}" for k in
                           ("val/goal_rate", "val/collision_rate", "val/offroad_rate"))
        lines.append(f"| {r.get('config')} | {r['policy']} | {'yes' if r['reached'] else 'no'}"
                     f" | {r['agent_steps']:,} | {r['wall_s']:.0f} | {r['train_s']:.0f} | "
                     f"{rates} |")
    return "\n".join(lines)

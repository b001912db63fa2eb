"""How close can an agent in each action space follow the human logs? (issue 38, item 2)

``log_follow`` drives every object with the log-replay controller through the env's
dynamics model and action space; the logged oracle (``log_replay``) is the ceiling. For
each candidate (dynamics model x action space x grid) this runs the WOSAC realism
evaluator (``configs/eval/realism.yaml``, section ``realism_womd``) on converted real
scenes and tabulates meta-metric, group scores, minADE and the collision / off-road
rates each candidate adds over the log.

    python experiments/log_follow_action_spaces.py --checkpoint RUN_DIR \
        --scenarios data/womd_train --num-scenarios 40 --rollouts 8 --out DIR

Choose on the training split (``data convert --split train``): never on the scenes you
validate on. The checkpoint only supplies the env's other settings; no policy acts.
``--tabulate DIR`` prints the table of an earlier run's results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SECTION = "realism_womd"
CANDIDATES = {
    "bicycle_discrete": [],  # today's default: 7 accel x 13 steer bins
    "bicycle_fine": ["env.dynamics.bicycle.accel_bins=21", "env.dynamics.bicycle.steer_bins=41"],
    "bicycle_continuous": ["env.dynamics.action_space=continuous"],
    "delta_local_discrete": ["env.dynamics.model=delta_local"],  # 21 x 5 x 11 bins
    "delta_local_continuous": ["env.dynamics.model=delta_local",
                               "env.dynamics.action_space=continuous"],
}
COLUMNS = ("meta_metric", "kinematic", "interactive", "map_based", "min_ade",
           "simulated_collision_rate", "simulated_offroad_rate")


def run_candidate(name: str, args, out: Path) -> Path:
    path = out / f"{name}.json"
    sets = [f"{SECTION}.scenarios=[{args.scenarios}]",
            f"{SECTION}.num_scenarios={args.num_scenarios}",
            f"{SECTION}.num_rollouts={args.rollouts}",
            f"{SECTION}.actors=[log_replay,log_follow]"]
    sets += [f"{SECTION}.{s}" for s in CANDIDATES[name]]
    cmd = [sys.executable, "-m", "jaxdrive.eval", "--config", "eval/realism", "--suite",
           SECTION, "--checkpoint", args.checkpoint, "--no-progress", "--out", str(path)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def rows(out: Path) -> list[dict]:
    table = []
    for name in CANDIDATES:
        path = out / f"{name}.json"
        if not path.exists():
            continue
        metrics = json.loads(path.read_text())["evaluators"][SECTION]["metrics"]
        if not table:  # the logged oracle: the same in every run
            table.append({"actor": "log_replay (the log)",
                          **{c: metrics[c] for c in COLUMNS}})
        table.append({"actor": f"log_follow, {name}",
                      **{c: metrics[f"log_follow/{c}"] for c in COLUMNS}})
    return table


def print_table(table: list[dict]) -> None:
    log = table[0]
    print("| actor | meta | kinematic | interactive | map-based | minADE (m) | collided "
          "(added) | off-road (added) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['actor']} | {r['meta_metric']:.3f} | {r['kinematic']:.3f} | "
              f"{r['interactive']:.3f} | {r['map_based']:.3f} | {r['min_ade']:.2f} | "
              f"{r['simulated_collision_rate']:.3f} "
              f"({r['simulated_collision_rate'] - log['simulated_collision_rate']:+.3f}) | "
              f"{r['simulated_offroad_rate']:.3f} "
              f"({r['simulated_offroad_rate'] - log['simulated_offroad_rate']:+.3f}) |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="any run directory (supplies the env's settings)")
    p.add_argument("--scenarios", help="converted real scenes (the training split)")
    p.add_argument("--num-scenarios", type=int, default=40)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), default=None)
    p.add_argument("--out", required=True, help="directory for the results files")
    p.add_argument("--tabulate", action="store_true", help="only print the table of --out")
    args = p.parse_args()
    out = Path(args.out)
    if not args.tabulate:
        if not args.checkpoint or not args.scenarios:
            p.error("give --checkpoint and --scenarios (or --tabulate)")
        out.mkdir(parents=True, exist_ok=True)
        for name in args.only or CANDIDATES:
            run_candidate(name, args, out)
    table = rows(out)
    if not table:
        p.error(f"no results in {out}")
    print_table(table)
    (out / "table.json").write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

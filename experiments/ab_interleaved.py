"""Interleaved A/B of `python -m jaxdrive.bench` between two source trees.

A speed claim here is a ratio from interleaved runs in one session. This script runs
the same bench command from two checkouts (e.g. `git worktree add /tmp/before REV`)
in rounds, alternating which version goes first (ABBA), and reports for every case
the median of the per-round ratios after/before. Pairing each after-run with the
before-run next to it cancels the slow drift of a shared machine, which is larger
than the differences being measured (see docs/benchmarks.md).

    python experiments/ab_interleaved.py --before /tmp/before --after . --rounds 10 \
        --bench "env --envs 64 --trials 0 4 --repeats 7" --bench "train --repeats 5" \
        --json docs/bench/ab.json

Both trees run with this interpreter and `PYTHONPATH` set to the tree, so the same
venv serves both (its editable install is shadowed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The throughput field each benchmark reports, and the fields naming one case.
# (policy records carry one rate per path: each becomes its own case).
_RATE = {"env": ("agent_steps_per_s",), "train": ("steps_per_s",),
         "policy": ("step_agent_steps_per_s", "sequence_agent_steps_per_s")}
_CASE_KEYS = {
    "env": ("envs", "agents", "partners", "road_obs", "road_points", "dynamics", "trials",
            "scenes"),
    "train": ("policy",),
    "policy": ("policy", "batch"),
}
# Fields older trees do not write, with the value they meant (before `bench env
# --scenario` every record timed procedural scenes).
_CASE_DEFAULTS = {"env": {"scenes": "procedural"}}


def _run_bench(tree: Path, bench: str, out: Path) -> dict:
    """Runs `python -m jaxdrive.bench BENCH --json OUT` from `tree`; returns the JSON."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    cmd = [sys.executable, "-m", "jaxdrive.bench", *shlex.split(bench), "--json", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _cases(result: dict) -> dict[str, float]:
    """Maps a readable case name to its throughput for one bench JSON."""
    kind = result["benchmark"]
    rates, keys = _RATE[kind], _CASE_KEYS[kind]
    cases = {}
    for record in result["records"]:
        record = {**_CASE_DEFAULTS.get(kind, {}), **record}
        name = " ".join(f"{k}={record[k]}" for k in keys if k in record)
        for rate in rates:
            path = "" if len(rates) == 1 else " " + rate.split("_")[0]
            case = f"{kind} {name}{path}"
            if case in cases:  # two configurations under one name would mix their runs
                raise ValueError(f"two records of one bench run are both named {case!r}; "
                                 f"add the field that tells them apart to _CASE_KEYS")
            cases[case] = float(record[rate])
    return cases


def main(argv: list[str] | None = None) -> None:
    """Runs the rounds, prints a table and writes the raw numbers as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree A")
    parser.add_argument("--after", type=Path, required=True, help="source tree B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--bench", action="append", required=True,
                        help="arguments after `python -m jaxdrive.bench` (repeatable)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for bench in args.bench:
                got = {}
                for version in order:
                    tree = args.before if version == "before" else args.after
                    out = Path(tmp) / f"{version}.json"
                    got[version] = _cases(_run_bench(tree, bench, out))
                    for case, rate in got[version].items():
                        runs[version].setdefault(case, []).append(rate)
                for case in got["after"]:
                    ratios.setdefault(case, []).append(got["after"][case] / got["before"][case])
            stamp = time.strftime("%H:%M:%S")
            print(f"[{stamp}] round {round_index + 1}/{args.rounds} done", flush=True)
            rows = _rows(runs, ratios)
            if args.json is not None:  # after every round: a stopped run keeps its rounds
                args.json.write_text(json.dumps({
                    "command": " ".join(sys.argv), "rounds": round_index + 1,
                    "before": str(args.before), "after": str(args.after),
                    "runs": runs, "rows": rows}, indent=1))
    _print_table(rows)
    if args.json is not None:
        print(f"\nwrote {args.json}")


def _rows(runs: dict, ratios: dict) -> list[dict]:
    """Per case: medians of each version's runs and of the paired after/before ratios."""
    rows = []
    for case, case_ratios in ratios.items():
        rows.append({
            "case": case,
            "before_median": statistics.median(runs["before"][case]),
            "after_median": statistics.median(runs["after"][case]),
            "paired_ratio_median": statistics.median(case_ratios),
            "paired_ratio_min": min(case_ratios),
            "paired_ratio_max": max(case_ratios),
            "ratios": case_ratios,
        })
    return rows


def _print_table(rows: list[dict]) -> None:
    """The summary table: one line per case."""
    print(f"\n{'case':<40} {'before':>10} {'after':>10} {'ratio (median of pairs)':>24} "
          f"{'range':>14}")
    for row in rows:
        print(f"{row['case']:<40} {row['before_median']:>10,.0f} {row['after_median']:>10,.0f} "
              f"{row['paired_ratio_median']:>24.3f} "
              f"{row['paired_ratio_min']:>6.3f}-{row['paired_ratio_max']:.3f}")


if __name__ == "__main__":
    main()

"""Where the test suite's time goes: a per-module table from ``tests/compile_profile.py``.

    PYTHONPATH=tests python -m pytest -p compile_profile          # writes test_profile/
    python experiments/test_time_report.py [test_profile] [--tests N] [--json OUT]

Per module: summed test wall time (setup + call + teardown, over both xdist workers),
XLA backend compile seconds and counts (compiles over 0.5 s counted apart: they are the
programs; the small ones are mostly eager ``jnp`` operations), tracing + lowering
seconds, and what is left (running the compiled code, numpy references, I/O). With
``--tests N`` the N most expensive tests follow, with their largest compiles.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys

BIG_S = 0.5


def load(directory: str) -> dict[str, dict]:
    """Test id -> record, merged over the worker files in ``directory``."""
    files = sorted(glob.glob(os.path.join(directory, "compile_profile_*.json")))
    if not files:
        raise SystemExit(f"error: no compile_profile_*.json in {directory!r}; run pytest with "
                         "'-p compile_profile' (PYTHONPATH=tests) first.")
    merged: dict[str, dict] = {}
    for path in files:
        with open(path) as f:
            for test, rec in json.load(f).items():
                if test in merged:  # '<collection>' appears once per worker
                    merged[test]["wall_s"] += rec["wall_s"]
                    merged[test]["trace_lower_s"] += rec["trace_lower_s"]
                    merged[test]["compiles"] += rec["compiles"]
                else:
                    merged[test] = rec
    return merged


def module_rows(records: dict[str, dict]) -> list[dict]:
    """One row per test module, most expensive first."""
    rows = collections.defaultdict(lambda: collections.Counter())
    for test, rec in records.items():
        module = test.split("::")[0]
        row = rows[module]
        row["tests"] += 1
        row["wall_s"] += rec["wall_s"]
        row["trace_lower_s"] += rec["trace_lower_s"]
        for _, seconds in rec["compiles"]:
            big = seconds > BIG_S
            row["big_n" if big else "small_n"] += 1
            row["big_s" if big else "small_s"] += seconds
    out = []
    for module, row in rows.items():
        compile_s = row["big_s"] + row["small_s"]
        out.append({"module": module, "tests": row["tests"], "wall_s": row["wall_s"],
                    "compile_s": compile_s, "big_n": row["big_n"], "big_s": row["big_s"],
                    "small_n": row["small_n"], "small_s": row["small_s"],
                    "trace_lower_s": row["trace_lower_s"],
                    "rest_s": max(0.0, row["wall_s"] - compile_s - row["trace_lower_s"])})
    return sorted(out, key=lambda r: -r["wall_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default="test_profile")
    parser.add_argument("--tests", type=int, default=0, help="also list the N costliest tests")
    parser.add_argument("--json", help="write the module rows to this JSON file")
    args = parser.parse_args(argv)
    records = load(args.directory)
    rows = module_rows(records)
    head = (f"{'module':<44} {'tests':>5} {'wall s':>7} {'compile s':>9} {'big n/s':>11} "
            f"{'small n/s':>12} {'trace s':>7} {'rest s':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['module']:<44} {r['tests']:>5} {r['wall_s']:>7.1f} {r['compile_s']:>9.1f} "
              f"{r['big_n']:>4}/{r['big_s']:>6.1f} {r['small_n']:>5}/{r['small_s']:>6.1f} "
              f"{r['trace_lower_s']:>7.1f} {r['rest_s']:>7.1f}")
    total = {k: sum(r[k] for r in rows) for k in ("wall_s", "compile_s", "big_n", "big_s",
                                                   "small_n", "small_s", "trace_lower_s",
                                                   "rest_s")}
    print("-" * len(head))
    print(f"{'all':<44} {sum(r['tests'] for r in rows):>5} {total['wall_s']:>7.1f} "
          f"{total['compile_s']:>9.1f} {total['big_n']:>4}/{total['big_s']:>6.1f} "
          f"{total['small_n']:>5}/{total['small_s']:>6.1f} {total['trace_lower_s']:>7.1f} "
          f"{total['rest_s']:>7.1f}")
    if args.tests:
        print()
        costly = sorted(records.items(), key=lambda kv: -kv[1]["wall_s"])[:args.tests]
        for test, rec in costly:
            big = sorted((c for c in rec["compiles"] if c[1] > BIG_S), key=lambda c: -c[1])
            names = ", ".join(f"{name} {s:.1f}" for name, s in big[:5])
            print(f"{rec['wall_s']:7.1f}  {test}  [{len(rec['compiles'])} compiles; {names}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"modules": rows, "total": total}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

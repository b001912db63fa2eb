"""Interleaved A/B of dense rows (``train.dense_rows``) in end-to-end PPO training.

Builds one ``TrainBench`` per (policy, dense_rows) setting of a config (default the
quickstart preset), compiles each, then times their iterations round robin (one
iteration of each setting per round), so that a machine's drift hits every setting
alike. Prints a table (median steps/s, trained steps/s, ratio to ``off``) and writes
JSON.

    python experiments/dense_rows_ab.py [--config quickstart] [--policy mlp transformer]
        [--settings off auto] [--rounds 9] [--set KEY=VALUE ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform

import jax
import numpy as np

from jaxdrive.bench.train import TrainBench
from jaxdrive.config import parse_overrides
from jaxdrive.runs.config import load_run_config


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="quickstart")
    ap.add_argument("--policy", nargs="+", default=["mlp", "transformer"])
    ap.add_argument("--settings", nargs="+", default=["off", "auto"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", default="dense_rows_ab.json")
    args = ap.parse_args(argv)
    benches = {}
    for kind in args.policy:
        for setting in args.settings:
            value = setting if setting in ("off", "auto") else float(setting)
            overrides = parse_overrides(args.set + [f"policy.kind={kind}"])
            overrides.setdefault("train", {})["dense_rows"] = value
            config = load_run_config(args.config, overrides)
            bench = TrainBench(config)
            benches[(kind, setting)] = bench
            print(f"built {kind} dense_rows={setting}: compile {bench.compile_s:.1f} s",
                  flush=True)
    for r in range(args.rounds):
        for bench in benches.values():
            bench.time_once()
        print(f"round {r + 1}/{args.rounds}", flush=True)
    rows = []
    for (kind, setting), bench in benches.items():
        rec = bench.record()
        base = benches[(kind, args.settings[0])].record()
        ratios = np.asarray(benches[(kind, args.settings[0])].times) / np.asarray(bench.times)
        rows.append({"policy": kind, "dense_rows": setting, **rec,
                     "ratio_vs_first_median": float(np.median(ratios)),
                     "ratio_vs_first_per_round": ratios.tolist(),
                     "baseline_steps_per_s": base["steps_per_s"]})
    print(f"\n| policy | dense_rows | steps/s | trained steps/s | ratio (median of "
          f"{args.rounds} rounds) |\n|---|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['policy']} | {row['dense_rows']} | {row['steps_per_s']:,.0f} | "
              f"{row['trained_steps_per_s']:,.0f} | {row['ratio_vs_first_median']:.2f} |")
    out = {"machine": platform.processor() or platform.machine(), "jax": jax.__version__,
           "devices": [str(d) for d in jax.devices()], "config": args.config,
           "overrides": args.set, "rounds": args.rounds, "results": rows}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

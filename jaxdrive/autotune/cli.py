"""Recommend ``train.num_envs`` for this machine.

    python -m jaxdrive.autotune --config quickstart [--set key=value ...]
    python -m jaxdrive.autotune --config FILE --max-envs 1024 --repeats 3 --json out.json
    python -m jaxdrive.autotune --config FILE --quick          # 3 candidates, 1 repeat

Probes the devices (kind, count, processes, memory), compiles the training step for
doubling ``train.num_envs`` (multiples of the device count), reads each compiled
program's memory and times ``--repeats`` iterations, then recommends the largest
num_envs within 10% of the best agent-steps/s whose compiled memory fits 80% of the
device's memory (host RAM on CPU), printing a paste-ready ``python -m jaxdrive.train``
line. ``--eval`` also sweeps the ``batch_size`` of an evaluator's rollout. Writes a table
to the console and everything to ``--json`` (default autotune.json). See
``jaxdrive.autotune`` for the rule and docs/autotune.md.

Exit codes: 0 a recommendation was printed; 1 no candidate ran and fit; 2 bad input
(config, arguments, unwritable --json).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax

from jaxdrive.autotune import (
    FRACTION,
    TOLERANCE,
    batch_candidates,
    device_line,
    env_candidates,
    eval_table,
    probe_devices,
    recommend,
    train_command,
    training_table,
    tune_eval,
    tune_training,
)
from jaxdrive.command import add_debug_flag
from jaxdrive.config import ConfigError, int_arg, parse_overrides
from jaxdrive.files import OutputError, check_writable_file, write_or_fallback
from jaxdrive.runs.config import load_run_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.autotune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    p.add_argument("--config", required=True,
                   help="YAML run config: a file or a preset name (quickstart, ...)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override a config key (kept in the command)")
    p.add_argument("--start-envs", type=int_arg(1), default=None,
                   help="first num_envs tried (default a quarter of the config's)")
    p.add_argument("--max-envs", type=int_arg(1), default=None,
                   help="largest num_envs tried (default 8x the config's)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed iterations per candidate after a warm-up (median)")
    p.add_argument("--fraction", type=float, default=FRACTION,
                   help="share of the device memory a setting may use (default 0.8)")
    p.add_argument("--quick", action="store_true",
                   help="at most 3 candidates from the config's num_envs / 4, 1 repeat")
    p.add_argument("--eval", action="store_true",
                   help="also sweep an evaluator rollout's batch_size")
    p.add_argument("--eval-max-batch", type=int, default=256,
                   help="largest eval batch_size tried (from 16; default 256)")
    p.add_argument("--json", default="autotune.json", help="output file (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.autotune``; returns the exit code."""
    p = _parser()
    args = p.parse_args(argv)
    if args.repeats < 1 or not 0 < args.fraction <= 1:
        p.error("--repeats must be >= 1 and --fraction in (0, 1]")
    if (args.start_envs is not None and args.max_envs is not None
            and args.start_envs > args.max_envs):
        p.error(f"--start-envs {args.start_envs} is above --max-envs {args.max_envs}: "
                "the sweep doubles from the first up to the second")
    try:
        config = load_run_config(args.config, parse_overrides(args.overrides))
        check_writable_file(args.json)  # before minutes of compiling
    except (ConfigError, FileNotFoundError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = probe_devices()
    print(device_line(info), flush=True)
    repeats = 1 if args.quick else args.repeats
    candidates = env_candidates(config, info["count"], args.start_envs, args.max_envs)
    if args.quick:
        candidates = candidates[:3]
    print(f"candidates num_envs: {candidates} (config: {config.train.num_envs}; "
          f"{repeats} timed iteration(s) each)", flush=True)
    log = lambda s: print("  " + s, flush=True)  # noqa: E731
    records = tune_training(config, candidates, repeats, info["memory_bytes"],
                            args.fraction, log)
    print()
    print(training_table(records))
    pick = recommend(records)
    out = {"argv": ["python", "-m", "jaxdrive.autotune"] + list(sys.argv[1:] if argv is None
                                                               else argv),
           "config": args.config, "overrides": args.overrides, "jax": jax.__version__,
           "devices": info, "rule": {"fraction": args.fraction, "tolerance": TOLERANCE},
           "training": records, "recommendation": pick, "command": None}
    print()
    code = 0
    if pick is None:
        print("no recommendation: no candidate ran within the memory budget; lower "
              "--start-envs or train.rollout_steps / the policy size", file=sys.stderr)
        code = 1
    else:
        n = pick["num_envs"]
        iters = config.replace(train=config.train.replace(num_envs=n)).num_iterations
        out["command"] = train_command(args.config, args.overrides, n)
        print(f"recommendation: train.num_envs={n} ({pick['reason']})")
        print(f"  kept: train.minibatches={config.train.minibatches}, "
              f"train.total_steps={config.train.total_steps:,} (now {iters:,} iterations)")
        print(f"  {out['command']}")
    if args.eval:
        batches = batch_candidates(16, args.eval_max_batch, info["local_count"])
        if args.quick:
            batches = batches[:3]
        print(f"\neval batch sizes: {batches}", flush=True)
        out["eval"] = tune_eval(config, batches, repeats, info["memory_bytes"],
                                args.fraction, log)
        print()
        print(eval_table(out["eval"]))
        out["eval_recommendation"] = recommend(out["eval"], key="batch_size")
        if out["eval_recommendation"] is not None:
            r = out["eval_recommendation"]
            print(f"eval recommendation: batch_size: {r['batch_size']} in the suite "
                  f"file's sections ({r['reason']})")
    try:
        written, problem = write_or_fallback(args.json, json.dumps(out, indent=2))
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"\nwrote {written}")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
    return code

"""A/B of two source trees' compiled programs, timed alternately in ONE process.

`ab_interleaved.py` alternates whole bench processes; on a shared machine their speed
drifts by 10-30% between runs, more than a few-percent difference. This script removes
the drift: each tree exports its benchmarked function (`jax.export`, StableHLO) with its
inputs, then one process compiles both programs and times them call by call, A B B A ...,
so both see the same machine state. It reports the median of the per-round ratios.

    # 1. in each tree, export (PYTHONPATH picks the tree)
    PYTHONPATH=/tmp/before python experiments/ab_exported.py export --what env --out /tmp/x/A
    PYTHONPATH=/tmp/after  python experiments/ab_exported.py export --what env --out /tmp/x/B
    # 2. time both in one process (any tree, or none: only jax is imported)
    python experiments/ab_exported.py time /tmp/x/A /tmp/x/B --rounds 40 --json out.json

`--what env`: the `bench env` program (64 envs x 64 agents, 63 partners, 200 road
observations, 4096 road points, bicycle, 20 steps of random actions in one scan;
`--trials 4` for the trial mode). `--what train`: one `PPO.train_step` of the quickstart
preset (`--policy mlp|transformer`). Typed PRNG keys cross the export boundary as raw key
data. The exported call does not donate its inputs, in both versions alike. Serialising
an export needs the `flatbuffers` package (`pip install flatbuffers`; not a dependency of
jaxdrive).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np


def _env_program(trials: int):
    """(jitted function, args) of the env benchmark, from whichever layout the tree has."""
    try:
        from jaxdrive.bench.cli import EnvBench  # after the redesign
    except ImportError:
        from jaxdrive.bench import EnvBench  # before: jaxdrive/bench.py
    bench = EnvBench(64, 64, 63, 200, 4096, "bicycle", trials=trials, steps=20, repeats=1)
    return bench._run, (*bench._carry, bench._actions[1])


def _train_program(policy: str):
    """(function, args) of one PPO iteration of the quickstart preset with ``policy``."""
    try:
        from jaxdrive.runs.config import load_run_config  # after the redesign
    except ImportError:
        from jaxdrive.train.config import load_run_config
    from jaxdrive.models.policy import Policy
    from jaxdrive.train.ppo import PPO
    from jaxdrive.train.run import build_env

    here = Path(__import__("jaxdrive").__file__).resolve().parents[1]
    config = load_run_config(str(here / "configs" / "quickstart.yaml"),
                             {"policy": {"kind": policy}})
    t = config.train
    env, env_params = build_env(config, t.seed, t.num_scenes)
    ppo = PPO(config, env, Policy.for_env(config.policy, env))
    state = ppo.init(jax.random.key(t.seed + 1), env_params)
    return ppo.train_step, (state, env_params)


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def export(args: argparse.Namespace) -> None:
    """Exports the chosen program of the tree on PYTHONPATH and its inputs into args.out."""
    fn, call_args = (_env_program(args.trials) if args.what == "env"
                     else _train_program(args.policy))
    leaves, treedef = jax.tree.flatten(call_args)
    impls = [jax.random.key_impl(x) if _is_key(x) else None for x in leaves]
    flat = [jax.random.key_data(x) if _is_key(x) else x for x in leaves]

    def flat_fn(*xs):
        xs = [jax.random.wrap_key_data(x, impl=i) if i is not None else x
              for x, i in zip(xs, impls, strict=True)]
        out = fn(*jax.tree.unflatten(treedef, xs))
        return [jax.random.key_data(x) if _is_key(x) else x for x in jax.tree.leaves(out)]

    exported = jax.export.export(jax.jit(flat_fn))(*flat)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "program.bin").write_bytes(exported.serialize())
    np.savez(out / "inputs.npz", *[np.asarray(x) for x in flat])
    (out / "source.json").write_text(json.dumps({
        "tree": str(Path(__import__("jaxdrive").__file__).resolve().parents[1]),
        "what": args.what, "trials": args.trials, "policy": args.policy,
        "inputs": len(flat)}))
    print(f"exported {args.what} from {__import__('jaxdrive').__file__} to {out}")


def _load(directory: str):
    """(compiled call, device inputs, source record) of an exported program."""
    d = Path(directory)
    exported = jax.export.deserialize(bytearray((d / "program.bin").read_bytes()))
    with np.load(d / "inputs.npz") as z:
        inputs = [jax.device_put(z[f"arr_{i}"]) for i in range(len(z.files))]
    call = jax.jit(exported.call).lower(*inputs).compile()
    jax.block_until_ready(call(*inputs))  # warm up
    return call, inputs, json.loads((d / "source.json").read_text())


def _time_call(call, inputs) -> float:
    tic = time.perf_counter()
    jax.block_until_ready(call(*inputs))
    return time.perf_counter() - tic


def time_both(args: argparse.Namespace) -> None:
    """Times A and B alternately (ABBA) in this process; prints and writes the ratios."""
    a, b = _load(args.a), _load(args.b)
    times = {"a": [], "b": []}
    ratios = []
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        got = {}
        for which in order:
            call, inputs, _ = a if which == "a" else b
            got[which] = statistics.median(_time_call(call, inputs) for _ in range(args.calls))
            times[which].append(got[which])
        ratios.append(got["a"] / got["b"])  # B's speed relative to A's (time ratio)
    result = {
        "command": " ".join(sys.argv), "a": a[2], "b": b[2], "rounds": args.rounds,
        "calls_per_round": args.calls, "backend": jax.default_backend(),
        "a_median_s": statistics.median(times["a"]), "b_median_s": statistics.median(times["b"]),
        "speed_ratio_b_over_a_median": statistics.median(ratios),
        "speed_ratio_quartiles": [float(q) for q in np.percentile(ratios, [25, 75])],
        "ratios": ratios, "times": times,
    }
    print(f"{a[2]['what']} ({a[2]}):\n  A {result['a_median_s'] * 1e3:.2f} ms, "
          f"B {result['b_median_s'] * 1e3:.2f} ms per call (medians of {args.rounds} rounds "
          f"x {args.calls} calls)\n  speed B/A, median of paired rounds: "
          f"{result['speed_ratio_b_over_a_median']:.4f} (quartiles "
          f"{result['speed_ratio_quartiles'][0]:.4f}-{result['speed_ratio_quartiles'][1]:.4f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")


def main(argv: list[str] | None = None) -> None:
    """``export`` (run with PYTHONPATH=TREE) or ``time A B``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--what", choices=("env", "train"), required=True)
    e.add_argument("--trials", type=int, default=0)
    e.add_argument("--policy", choices=("mlp", "transformer"), default="mlp")
    e.add_argument("--out", required=True)
    t = sub.add_parser("time")
    t.add_argument("a")
    t.add_argument("b")
    t.add_argument("--rounds", type=int, default=30)
    t.add_argument("--calls", type=int, default=3, help="calls per version per round")
    t.add_argument("--json", default=None)
    args = p.parse_args(argv)
    export(args) if args.cmd == "export" else time_both(args)


if __name__ == "__main__":
    main()

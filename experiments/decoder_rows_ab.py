"""In-process A/B of the transformer's PPO minibatches with the temporal decoder on the
packed live rows (``PPO.update_buffers``, today's default) against the decoder on every
row of the minibatch (the encoder and heads packed either way: the buffers before).

Both programs are built and compiled in one process from the same initial state, then
timed one iteration each per round, alternated, so that drift hits both alike.

    python experiments/decoder_rows_ab.py [--rounds 15] [--set KEY=VALUE ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import numpy as np

from jaxdrive.config import parse_overrides
from jaxdrive.models.dense import row_step_buffers
from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import load_run_config
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env


class AllRowsPPO(PPO):
    """The decoder on every row of a minibatch (steps still packed)."""

    @property
    def update_buffers(self):
        t = self.config.train
        if min(self.update_capacities) >= self.num_rows // t.minibatches * t.rollout_steps:
            return ()
        return row_step_buffers(self.dense_shares, self.num_rows // t.minibatches,
                                t.rollout_steps, pack_rows=False)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="quickstart")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", default="decoder_rows_ab.json")
    args = ap.parse_args(argv)
    config = load_run_config(args.config, parse_overrides(["policy.kind=transformer"]
                                                           + args.set))
    t = config.train
    env, env_params = build_env(config, t.seed, t.num_scenes)
    runs = {}
    for name, cls in (("all rows", AllRowsPPO), ("live rows", PPO)):
        ppo = cls(config, env, Policy.for_env(config.policy, env))
        state = ppo.init(jax.random.key(t.seed + 1), env_params)
        step = jax.jit(ppo.train_step, donate_argnums=0)
        tic = time.perf_counter()
        state, m = step(state, env_params)
        jax.device_get(m)
        runs[name] = {"step": step, "state": state, "times": [], "valid": [],
                      "compile_s": time.perf_counter() - tic,
                      "buffers": [list(b) for b in ppo.update_buffers]}
        print(f"{name}: buffers {ppo.update_buffers}, compile {runs[name]['compile_s']:.1f} s",
              flush=True)
    for _ in range(args.rounds):
        for run in runs.values():
            tic = time.perf_counter()
            run["state"], m = run["step"](run["state"], env_params)
            m = jax.device_get(m)
            run["times"].append(time.perf_counter() - tic)
            run["valid"].append(float(m["rollout/valid_steps"]))
    base = np.asarray(runs["all rows"]["times"])
    rows = []
    print("\n| decoder on | iteration s | agent-steps/s | trained steps/s | compile s | "
          "median ratio to all rows |\n|---|---:|---:|---:|---:|---:|")
    for name, run in runs.items():
        dt = float(np.median(run["times"]))
        ratio = float(np.median(base / np.asarray(run["times"])))
        rec = {"decoder_on": name, "iteration_s": dt,
               "steps_per_s": config.steps_per_iteration / dt,
               "trained_steps_per_s": float(np.median(run["valid"])) / dt,
               "compile_s": run["compile_s"], "buffers": run["buffers"],
               "iteration_s_all": run["times"], "ratio_median": ratio,
               "ratio_per_round": (base / np.asarray(run["times"])).tolist()}
        rows.append(rec)
        print(f"| {name} | {dt:.3f} | {rec['steps_per_s']:,.0f} | "
              f"{rec['trained_steps_per_s']:,.0f} | {rec['compile_s']:.1f} | {ratio:.2f} |")
    out = {"machine": platform.machine(), "processor": platform.processor(),
           "jax": jax.__version__, "config": args.config, "overrides": args.set,
           "rounds": args.rounds, "results": rows}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

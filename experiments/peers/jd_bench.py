"""jaxdrive env throughput through `bench env`'s own EnvBench (the code path of
`python -m jaxdrive.bench env`: compile + warm-up call, then timed calls of STEPS batched steps in a
lax.scan on pre-drawn random actions), timed by wall clock AND by process CPU time (all threads)
around every timed call, on procedural and/or real scenes, interleaved round robin.

`bench env` counts envs x agent slots ("agent_steps_per_s"), padding included. This script also
records env-steps/s (scene-steps/s) and the controlled agents actually present in the batch after
each timed call; compare.sh turns env-steps/s into controlled agent-steps/s with
count_controlled.py's exact per-scene counts. Run with the python of a jaxdrive venv.

Timed calls continue until every configuration has at least --min-repeats calls and --seconds of
timed wall time. Set JD_JAX_CACHE_DIR to a folder to reuse compiled programs across rounds
(JAX's persistent compilation cache; compile time is never part of the timed calls anyway).

Usage: python jd_bench.py OUT.json [--scenes procedural|real|both] [--scenario FILE_OR_DIR ...]
       [--envs 16] [--real-envs N] [--agents 64] [--partners 63] [--road-obs 200] [--road-points 4096]
       [--steps 20] [--seconds 10] [--min-repeats 3]"""
import argparse
import json
import os
import time

import jax
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--scenes", choices=["procedural", "real", "both"], default="both")
p.add_argument("--scenario", nargs="+", default=None, metavar="FILE_OR_DIR")
p.add_argument("--envs", type=int, default=16)
p.add_argument("--real-envs", type=int, default=0,
               help="envs per step on the real scenes (default: --envs); e.g. enough envs "
                    "that the batch holds as many controlled agents as the peer's")
p.add_argument("--agents", type=int, default=64)
p.add_argument("--partners", type=int, default=63)
p.add_argument("--road-obs", type=int, default=200)
p.add_argument("--road-points", type=int, default=4096)
p.add_argument("--dynamics", default="bicycle")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--seconds", type=float, default=10.0)
p.add_argument("--min-repeats", type=int, default=3)
p.add_argument("--max-repeats", type=int, default=1000)
p.add_argument("--label", default="")
p.add_argument("--real-rows", type=int, default=0,
               help="agent rows per env on the real scenes (env.max_controlled: the "
                    "controlled agents packed, every other object background); 0 = one row "
                    "per slot. Keep it >= the most controlled agents of a scene, so that "
                    "both sides drive the same agents (count_controlled.py's max)")
a = p.parse_args()
if a.scenes in ("real", "both") and not a.scenario:
    p.error("--scenes real/both needs --scenario")
if os.environ.get("JD_JAX_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", os.environ["JD_JAX_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

from jaxdrive.bench.cli import EnvBench  # noqa: E402

kinds = {"procedural": [None], "real": [a.scenario], "both": [None, a.scenario]}[a.scenes]
benches, cpu = [], []
for scenario in kinds:
    rows = a.real_rows if scenario is not None and a.real_rows > 0 else None
    envs = a.real_envs if scenario is not None and a.real_envs > 0 else a.envs
    b = EnvBench(envs, a.agents, a.partners, a.road_obs, a.road_points, a.dynamics, 0,
                 steps=a.steps, repeats=max(a.min_repeats, 3), scenario=scenario, rows=rows)
    benches.append(b)
    cpu.append([])
    print(f"compiled {b.size} in {b.compile_s:.1f} s", flush=True)
ctrl = [[] for _ in benches]
t_start = time.perf_counter()
c_start = time.process_time()
while True:
    for i, b in enumerate(benches):
        c0 = time.process_time()
        b.time_once()
        cpu[i].append(time.process_time() - c0)
        ctrl[i].append(int(np.asarray(b._carry[0].controlled).sum()))  # untimed
    n = len(benches[0].times)
    if n >= a.max_repeats or (n >= a.min_repeats and min(sum(b.times) for b in benches) >= a.seconds):
        break
keep = ("envs", "agents", "rows", "controlled_agent_steps_per_s", "mean_controlled_per_env",
        "partners", "road_obs", "road_points", "dynamics", "scenes",
        "num_real_scenes", "truncated_agents", "truncated_road_points", "batch_agents",
        "agent_steps_per_s", "env_steps_per_s", "step_ms", "timed_runs_s", "steps_per_run",
        "compile_s", "pool_build_s", "mean_valid_road_points", "mean_vehicles")
records = []
for i, b in enumerate(benches):
    r = {k: v for k, v in b.record().items() if k in keep}
    med_cpu = float(np.median(cpu[i]))
    r.update(cpu_runs_s=cpu[i], cpu_share=sum(cpu[i]) / sum(b.times),
             env_steps_per_cpu_s=r["envs"] * b.steps / med_cpu,
             slot_steps_per_cpu_s=r["batch_agents"] * b.steps / med_cpu,
             controlled_in_batch_after_call=ctrl[i],
             observed_controlled_agent_steps_per_s=float(np.mean(ctrl[i])) * b.steps / float(np.median(b.times)))
    records.append(r)
rec = dict(peer="jaxdrive", label=a.label, jax=jax.__version__, backend=jax.default_backend(),
           affinity=sorted(os.sched_getaffinity(0)), loadavg=os.getloadavg(),
           wall_s_total=time.perf_counter() - t_start, cpu_s_total=time.process_time() - c_start,
           records=records, t_end=time.time())
with open(a.out, "w") as fh:
    json.dump(rec, fh, indent=1)
for r in records:
    print(f"{r['scenes']:>10}: {r['env_steps_per_s']:,.1f} env-steps/s, {r['agent_steps_per_s']:,.0f} slot-steps/s, "
          f"cpu share {r['cpu_share']:.2f}, controlled in batch {np.mean(r['controlled_in_batch_after_call']):.1f}")

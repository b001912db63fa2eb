"""Benchmarks: ``python -m jaxdrive.bench env [...]``.

``env`` times a full batched environment step (dynamics, collisions, off-road,
observations, rewards, auto-reset) inside a ``lax.scan`` whose carry holds the
observations, as in a real rollout, on procedural 4-way intersections filled with the
requested number of vehicles and road points. Each configuration: one warm-up call
(its wall time is reported as ``compile_s``), then ``--repeats`` timed calls with
``block_until_ready``; the median is reported. The timed calls of all configurations
are interleaved (round robin), so that the machine's drifting speed affects each
alike and ratios between configurations are fair. Prints a table and writes JSON.

With no size options a default sweep runs; any of ``--envs --agents --partners
--road-obs --road-points --dynamics --trials`` takes one or more values and the product
of the given values (others at their defaults) is measured. ``--trials K`` runs
multi-trial episodes (``goal_behavior: trial``, K trials of the default timeout);
``--trials 0`` (the default) the plain step with ``goal_behavior: stop``.

Throughput is reported per **controlled agent** (``controlled/s``: each step's agents
of kind ``CONTROLLED``, done or not, summed on device over the timed steps), the count
peers such as PufferDrive report, beside row-steps/s (envs x agent rows x steps, padding
included). ``--rows C`` packs each env's controlled agents into C rows
(``env.max_controlled``) and keeps every other object as background; on real scenes,
where a handful of a scene's objects drive, that is what pays.

``policy``, ``train``, ``render`` and ``eval`` time the policy's paths, whole PPO
iterations, recordings (env steps with on-device frames) and evaluations; see
``jaxdrive.bench.policy``, ``jaxdrive.bench.train``, ``jaxdrive.bench.render`` and
``jaxdrive.bench.eval``. ``learn`` trains until the held-out validation first meets the
targets and reports the time and agent-steps to get there (``jaxdrive.bench.learn``).
``train --devices 1,2,4,8`` times the data-parallel step on that many (fake CPU)
devices, one worker process per count, interleaved; ``--mesh`` runs the data-mesh path
even on one device (``jaxdrive.bench.scale``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.agents.rollout import scan_rollout
from jaxdrive.command import add_debug_flag, run_command
from jaxdrive.config import ConfigError, list_presets, parse_overrides, resolve_config_path
from jaxdrive.env import Env, EnvConfig
from jaxdrive.files import OutputError, check_writable_file, write_or_fallback
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch, required_sizes

DEFAULTS = dict(envs=16, agents=64, partners=63, road_obs=200, road_points=4096,
                dynamics="bicycle", trials=0)
# (envs, agents, partners, road_obs, road_points, dynamics, trials)
DEFAULT_SWEEP = [
    (16, 64, 63, 200, 4096, "bicycle", 0),  # issue 2 acceptance (i): 1,024 agents
    (16, 64, 63, 200, 4096, "bicycle", 4),  # the same in trial mode
    (64, 64, 63, 200, 4096, "bicycle", 0),
    (256, 64, 63, 200, 4096, "bicycle", 0),
    (16, 64, 63, 200, 4096, "delta_local", 0),
    (32, 32, 16, 64, 2048, "bicycle", 0),
    (8, 128, 63, 200, 20480, "bicycle", 0),  # issue 2 acceptance (ii): WOMD-sized map
]


def scene_configs(agents: int, road_points: int) -> tuple[ScenarioConfig, ProceduralConfig]:
    """4-way intersections, 2 lanes each way, arms long enough for ``agents`` vehicles,
    road points spaced as densely as ``road_points`` allows (worst case)."""
    arm = 60.0
    while True:
        base = ProceduralConfig(
            topology={"straight": 0.0, "curve": 0.0, "t_junction": 0.0, "intersection": 1.0},
            lanes_per_direction=(2, 2), arm_length=arm, num_agents=(agents, agents),
        )
        if required_sizes(base)["spawn_slots"] >= agents:
            break
        arm *= 1.25
    lo, hi = 0.05, 20.0  # point spacing: the densest that fits
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if required_sizes(base.replace(point_spacing=mid))["max_road_points"] <= road_points:
            hi = mid
        else:
            lo = mid
    proc = base.replace(point_spacing=hi)
    need = required_sizes(proc)
    scen = ScenarioConfig(
        max_agents=agents, max_road_points=road_points, max_lanes=need["max_lanes"],
        max_lane_successors=need["max_lane_successors"],
    )
    return scen, proc


class EnvBench:
    """One configuration, compiled and warmed up: ``time_once()`` runs one timed call,
    ``record()`` summarises the calls so far as a JSON-ready dict."""

    def __init__(self, envs, agents, partners, road_obs, road_points, dynamics, trials=0,
                 steps=20, repeats=5, pool_size=16, seed=0, scenario=None, rows=None):
        self.size = dict(envs=envs, agents=agents, partners=partners, road_obs=road_obs,
                         road_points=road_points, dynamics=dynamics, trials=trials,
                         scenes="procedural" if scenario is None else "real",
                         rows=agents if rows is None else rows)
        self.steps = steps
        self.times: list[float] = []
        self.controlled_steps: list[int] = []
        self._setup(envs, agents, partners, road_obs, road_points, dynamics, trials, steps,
                    repeats, pool_size, seed, scenario, rows)

    def _setup(self, envs, agents, partners, road_obs, road_points, dynamics, trials, steps,
               repeats, pool_size, seed, scenario, rows):
        if scenario is None:
            scen, proc = scene_configs(agents, road_points)
        else:  # real scenes, padded to ``agents`` slots and ``road_points`` points
            from jaxdrive.data import load_scenarios, real_data_config

            scen = real_data_config(max_agents=agents, max_road_points=road_points)
        chunk = 10
        cfg = EnvConfig.from_dict({
            "scenario": scen.to_dict(),
            "dynamics": {"model": dynamics},
            "observation": {"num_partners": partners, "num_road": road_obs},
            "road_index": {"road_per_cell": max(chunk, math.ceil(road_obs / chunk) * chunk),
                           "chunk_size": chunk},
            **({"goal_behavior": "trial", "num_trials": trials} if trials else {}),
            **({} if rows is None else {"max_controlled": rows}),
        })
        t0 = time.perf_counter()
        if scenario is None:
            scenes = generate_batch(jax.random.key(seed), pool_size, proc, scen)
        else:
            scenes, report = load_scenarios(list(scenario), scen)
            scenes = jax.tree.map(jnp.asarray, scenes)  # host arrays -> device
            self.size["num_real_scenes"] = report["num_scenarios"]
            self.size["truncated_agents"] = report["truncated_agents"]
            self.size["truncated_road_points"] = report["truncated_road_points"]
        pool = make_pool(scenes, cfg.road_index)
        env = Env(cfg)
        params = env.make_params(pool)
        jax.block_until_ready(params)
        self.build_s = time.perf_counter() - t0

        def rollout(state, timestep, actions):
            # Controlled agent-steps: each step's controlled agents (done or not), the
            # count peers report (a sum of booleans per step; negligible beside a step).
            act = lambda c, s, t, action: (action, c + jnp.sum(s.controlled, dtype=jnp.int32),
                                           None)
            state, timestep, controlled, _ = scan_rollout(
                env, params, act, state, timestep, jnp.zeros((), jnp.int32), actions)
            return state, timestep, controlled

        # Random actions drawn up front, so that only the environment is timed.
        r = env.num_rows

        def draw_actions(key):
            if cfg.dynamics.action_space == "discrete":
                return jax.random.randint(key, (steps, envs, r), 0, env.num_actions)
            m = env.dynamics
            u = jax.random.uniform(key, (steps, envs, r, m.action_dim))
            return m.action_low + u * (m.action_high - m.action_low)

        self._actions = [draw_actions(jax.random.key(100 + r)) for r in range(repeats + 1)]
        self._run = jax.jit(rollout, donate_argnums=(0, 1))
        reset = jax.jit(env.reset_batch, static_argnums=2)
        self._carry = reset(params, jax.random.key(seed), envs)
        t0 = time.perf_counter()
        *self._carry, _ = self._run(*self._carry, self._actions[0])
        jax.block_until_ready(self._carry)
        self.compile_s = time.perf_counter() - t0
        self.pool = pool

    def time_once(self) -> float:
        """One timed call of ``steps`` batched env steps on pre-drawn random actions; appends
        its wall time, seconds, to ``times`` and returns it."""
        actions = self._actions[1 + len(self.times) % (len(self._actions) - 1)]
        t0 = time.perf_counter()
        *self._carry, controlled = self._run(*self._carry, actions)
        jax.block_until_ready(self._carry)
        self.times.append(time.perf_counter() - t0)
        self.controlled_steps.append(int(controlled))
        return self.times[-1]

    def record(self) -> dict:
        """The configuration's JSON-ready record: sizes, throughput from the median of
        ``times``, compile and pool-build seconds, pool / state / observation bytes and memory
        peaks."""
        s = self.size
        median = float(np.median(self.times))
        nbytes = lambda tree: int(sum(x.nbytes for x in jax.tree.leaves(tree)))
        pool = self.pool
        valid_points = float(jnp.mean(jnp.sum(pool.scenarios.roadgraph.valid, axis=-1)))
        valid_agents = float(jnp.mean(jnp.sum(pool.scenarios.objects.valid[..., 0], axis=-1)))
        mem = jax.devices()[0].memory_stats() or {}
        state, ts = self._carry
        batch = s["envs"] * s["rows"]
        controlled = float(np.mean(self.controlled_steps))
        return {
            **s, "partners": min(s["partners"], s["agents"] - 1),
            "batch_agents": batch,
            "controlled_agent_steps_per_s": controlled / median,
            "mean_controlled_per_env": controlled / (s["envs"] * self.steps),
            "controlled_steps_per_run": list(self.controlled_steps),
            "agent_steps_per_s": batch * self.steps / median,
            "env_steps_per_s": s["envs"] * self.steps / median,
            "step_ms": 1e3 * median / self.steps,
            "timed_runs_s": list(self.times), "steps_per_run": self.steps,
            "compile_s": self.compile_s, "pool_build_s": self.build_s,
            "mean_valid_road_points": valid_points, "mean_vehicles": valid_agents,
            "edge_overflow_cells": int(jnp.sum(pool.road_index.edge_overflow)),
            "pool_bytes": nbytes(pool), "state_bytes": nbytes(state),
            "obs_bytes": nbytes(ts.obs),
            "device_peak_bytes": mem.get("peak_bytes_in_use"),
            "host_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }


def bench_env(envs, agents, partners, road_obs, road_points, dynamics, trials=0, steps=20,
              repeats=5, pool_size=16, seed=0, rows=None) -> dict:
    """Time one configuration on its own; returns a JSON-ready record."""
    b = EnvBench(envs, agents, partners, road_obs, road_points, dynamics, trials, steps,
                 repeats, pool_size, seed, rows=rows)
    for _ in range(repeats):
        b.time_once()
    return b.record()


def _table(records: list[dict]) -> str:
    head = (f"{'envs':>5} {'agents':>6} {'rows':>5} {'partners':>8} {'road_obs':>8} "
            f"{'road_pts':>8} {'dynamics':>11} {'trials':>6} {'scenes':>10} "
            f"{'ctrl/env':>8} {'controlled/s':>13} {'row-steps/s':>12} "
            f"{'step ms':>8} {'compile s':>9} {'pool MB':>8}")
    rows = [head, "-" * len(head)]
    for r in records:
        rows.append(
            f"{r['envs']:>5} {r['agents']:>6} {r['rows']:>5} {r['partners']:>8} "
            f"{r['road_obs']:>8} {r['road_points']:>8} {r['dynamics']:>11} {r['trials']:>6} "
            f"{r.get('scenes', 'procedural'):>10} {r['mean_controlled_per_env']:>8.1f} "
            f"{r['controlled_agent_steps_per_s']:>13,.0f} {r['agent_steps_per_s']:>12,.0f} "
            f"{r['step_ms']:>8.2f} {r['compile_s']:>9.1f} {r['pool_bytes'] / 2**20:>8.1f}"
        )
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per benchmark."""
    p = argparse.ArgumentParser(prog="python -m jaxdrive.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("env", help="time the batched environment step")
    e.add_argument("--envs", type=int, nargs="+")
    e.add_argument("--agents", type=int, nargs="+")
    e.add_argument("--partners", type=int, nargs="+")
    e.add_argument("--road-obs", type=int, nargs="+")
    e.add_argument("--road-points", type=int, nargs="+")
    e.add_argument("--dynamics", nargs="+", choices=["bicycle", "delta_local"])
    e.add_argument("--trials", type=int, nargs="+",
                   help="trials per episode (goal_behavior: trial); 0 = the plain step")
    e.add_argument("--scenario", nargs="+", default=None, metavar="FILES_OR_DIR",
                   help="also time every configuration on these real scenes (JSON, WOMD "
                        "TFRecord or converted shard directories), padded to --agents "
                        "slots and --road-points points, interleaved with the procedural "
                        "ones")
    e.add_argument("--rows", type=int, nargs="+", default=[0],
                   help="agent rows per env (env.max_controlled: the controlled agents, "
                        "packed; the other objects are background); 0 = one row per "
                        "agent slot. Each value is timed with every configuration")
    e.add_argument("--steps", type=int, default=20, help="steps per timed call (a scan)")
    e.add_argument("--repeats", type=int, default=5, help="timed calls (median reported)")
    e.add_argument("--json", default="bench_env.json", help="output file")
    q = sub.add_parser("policy", help="time the policy's step and sequence paths")
    q.add_argument("--policy", nargs="+", default=["transformer", "mlp"],
                   choices=["transformer", "mlp"])
    q.add_argument("--batch", type=int, nargs="+", default=[4096], help="agents per step")
    q.add_argument("--partners", type=int, default=63)
    q.add_argument("--road-obs", type=int, default=200)
    q.add_argument("--seq-len", type=int, default=32, help="segment length (sequence path)")
    q.add_argument("--steps", type=int, default=8, help="steps per timed call (step path)")
    q.add_argument("--repeats", type=int, default=5, help="timed calls (median reported)")
    q.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="policy config override, e.g. model_dim=128")
    q.add_argument("--json", default="bench_policy.json", help="output file")
    t = sub.add_parser("train", help="time end-to-end PPO iterations (env + policy + PPO)")
    t.add_argument("--config", default=None,
                   help="run config: a file or a preset name (quickstart, selfplay_gpu, "
                        "...); default: the quickstart preset")
    t.add_argument("--policy", nargs="+", default=["mlp", "transformer"],
                   choices=["transformer", "mlp"])
    t.add_argument("--repeats", type=int, default=5, help="timed iterations (median reported)")
    t.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="run config override, e.g. train.num_envs=256")
    t.add_argument("--devices", default=None, metavar="N[,N...]",
                   help="device counts, e.g. 1,2,4,8: one worker process per count (fake "
                        "CPU devices via XLA_FLAGS=--xla_force_host_platform_device_count), "
                        "timed iterations interleaved round robin; see jaxdrive.bench.scale")
    t.add_argument("--mesh", nargs="?", const="on", default="off",
                   choices=["off", "on", "both"],
                   help="--mesh (on): the data-mesh path even on one device; --mesh both "
                        "(with --devices): one device both plain and with the mesh. More "
                        "than one device always uses the mesh")
    t.add_argument("--json", default="bench_train.json", help="output file")
    g = sub.add_parser("learn", help="time to a good driver: train until the held-out "
                       "validation meets the targets (or train.total_steps)")
    g.add_argument("--config", default=None,
                   help="run config: a file or a preset name; default: the quickstart preset")
    g.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="run config override, e.g. "
                   "train.total_steps=20000000 (the cap)")
    g.add_argument("--goal", type=float, default=0.90, help="target goal rate (>=)")
    g.add_argument("--collision", type=float, default=0.03,
                   help="target collision rate (<=)")
    g.add_argument("--offroad", type=float, default=0.03, help="target off-road rate (<=)")
    g.add_argument("--json", default="bench_learn.json", help="output file")
    r = sub.add_parser("render", help="time recordings: env steps + on-device frames")
    r.add_argument("--envs", type=int, default=64)
    r.add_argument("--steps", type=int, default=91, help="frames per env, one jitted call")
    r.add_argument("--size", type=int, default=256, help="frame width and height")
    r.add_argument("--views", nargs="+", default=["scene"], choices=["scene", "ego"])
    r.add_argument("--repeats", type=int, default=3, help="timed calls (median reported)")
    r.add_argument("--json", default="bench_render.json", help="output file")
    v = sub.add_parser("eval", help="time a multi_scenario or realism evaluation (after "
                       "compile)")
    v.add_argument("--evaluator", default="multi_scenario",
                   choices=["multi_scenario", "realism"])
    v.add_argument("--rollouts", type=int, default=32,
                   help="rollouts per scenario (realism)")
    v.add_argument("--scenarios", type=int, default=256)
    v.add_argument("--steps", type=int, default=91,
                   help="steps per scenario (multi_scenario; realism plays the 80 after "
                        "init_step 10)")
    v.add_argument("--batch", type=int, default=64, help="scenarios per compiled call")
    v.add_argument("--policy", default="transformer", choices=["transformer", "mlp"])
    v.add_argument("--repeats", type=int, default=3, help="timed evaluations (median)")
    v.add_argument("--json", default="bench_eval.json", help="output file")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.bench``; returns the exit code (2 on a bad
    configuration)."""
    p = _parser()
    args = p.parse_args(argv)
    if getattr(args, "repeats", 1) < 1 or getattr(args, "steps", 1) < 1:
        p.error("--repeats and --steps must be >= 1")
    try:
        check_writable_file(args.json)  # before minutes of benchmarking
    except OutputError as err:
        print(f"error: --json {args.json}: {err}", file=sys.stderr)
        return 2
    if args.what == "policy":
        return _main_policy(p, args, argv)
    if args.what == "train":
        return _main_train(args, argv)
    if args.what == "learn":
        return _main_learn(args, argv)
    if args.what == "render":
        return _main_render(args, argv)
    if args.what == "eval":
        return _main_eval(args, argv)

    keys = ["envs", "agents", "partners", "road_obs", "road_points", "dynamics", "trials"]
    given = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    if given:
        values = [given.get(k, [DEFAULTS[k]]) for k in keys]
        configs = list(itertools.product(*values))
    else:
        configs = DEFAULT_SWEEP
    for c in configs:
        if min(c[:5]) < 1 or c[6] < 0:
            p.error(f"sizes must be >= 1 and --trials >= 0, got "
                    f"{dict(zip(keys, c, strict=True))}")
    if min(args.rows) < 0:
        p.error(f"--rows must be >= 0 (0: one row per agent slot), got {args.rows}")

    print(f"jaxdrive bench env: backend {jax.default_backend()}, "
          f"{jax.devices()[0].device_kind}, {len(configs)} configuration(s), median of "
          f"{args.repeats} runs of {args.steps} steps", flush=True)
    benches = []
    for c, scenario, rows in itertools.product(configs, [None] + (
            [args.scenario] if args.scenario else []), args.rows):
        try:
            b = EnvBench(*c, steps=args.steps, repeats=args.repeats, scenario=scenario,
                         rows=rows or None)
        except ConfigError as err:
            print(f"error: {dict(zip(keys, c, strict=True))}, rows {rows}: {err}",
                  file=sys.stderr)
            return 2
        benches.append(b)
        print(f"  compiled {b.size} in {b.compile_s:.1f} s", flush=True)
    for r in range(args.repeats):
        for b in benches:
            b.time_once()
        print(f"  round {r + 1}/{args.repeats}: " + ", ".join(
            f"{b.controlled_steps[-1] / b.times[-1]:,.0f}"
            for b in benches) + " controlled agent-steps/s", flush=True)
    records = [b.record() for b in benches]
    print()
    print(_table(records))
    return _write(args.json, "env", records, argv)


def _write(path: str, what: str, records: list[dict], argv, top_level: bool = False) -> int:
    """JSON with the machine, the command and the records (``top_level``: a single
    record's fields are repeated at the top level too), written atomically; if ``path``
    cannot be written, saved next to its directory or in the system temp directory with
    an error line. Returns the exit code (1 when saved elsewhere)."""
    out = {**(records[0] if top_level and len(records) == 1 else {}),
        "benchmark": what,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
                    "device": jax.devices()[0].device_kind, "jax": jax.__version__},
        "command": " ".join(["python -m jaxdrive.bench"] + (argv or sys.argv[1:])),
        "records": records,
    }
    try:
        written, problem = write_or_fallback(path, json.dumps(out, indent=2))
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"\nwrote {written}")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


def _main_policy(p, args, argv) -> int:
    from jaxdrive.bench.policy import bench_policy, policy_table
    from jaxdrive.models.policy import PolicyConfig

    if min(args.batch) < 1 or args.seq_len < 1 or args.partners < 0 or args.road_obs < 0:
        p.error("--batch and --seq-len must be >= 1, --partners and --road-obs >= 0")
    try:
        config = PolicyConfig.from_dict(parse_overrides(args.overrides))
    except ConfigError as err:
        print(f"error: policy config: {err}", file=sys.stderr)
        return 2
    print(f"jaxdrive bench policy: backend {jax.default_backend()}, "
          f"{jax.devices()[0].device_kind}, {args.partners} partner + {args.road_obs} road "
          f"tokens, median of {args.repeats} calls", flush=True)
    records = []
    for kind in args.policy:
        for batch in args.batch:
            rec = bench_policy(kind, batch, args.partners, args.road_obs, args.steps,
                               args.seq_len, args.repeats, config)
            records.append(rec)
            print(f"  {kind} batch {batch}: step {rec['step_agent_steps_per_s']:,.0f}, "
                  f"sequence {rec['sequence_agent_steps_per_s']:,.0f} agent-steps/s",
                  flush=True)
    print()
    print(policy_table(records))
    return _write(args.json, "policy", records, argv)


def _main_learn(args, argv) -> int:
    from jaxdrive.bench.learn import Targets, bench_learn, learn_table
    from jaxdrive.runs.config import load_run_config
    from jaxdrive.train.run import new_run_dir

    path = args.config or ("quickstart" if "quickstart" in list_presets() else None)
    try:
        path = resolve_config_path(path) if path else None
        config = load_run_config(path, parse_overrides(args.overrides))
        targets = Targets(args.goal, args.collision, args.offroad)
        run_dir = new_run_dir(config, "bench-learn")
        print(f"jaxdrive bench learn: {config.policy.kind}, backend "
              f"{jax.default_backend()}, targets goal >= {targets.goal}, collision <= "
              f"{targets.collision}, off-road <= {targets.offroad} at a validation (every "
              f"{config.validation.every} iterations), cap {config.train.total_steps:,} "
              f"agent-steps; run directory {run_dir}", flush=True)
        rec = bench_learn(config, run_dir, targets)
    except (ConfigError, OutputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rec["config"] = str(path)
    print()
    print(learn_table([rec]))
    return _write(args.json, "learn", [rec], argv, top_level=True)


def _main_train(args, argv) -> int:
    from jaxdrive.bench.train import bench_train, train_table
    from jaxdrive.runs.config import load_run_config

    path = args.config
    if path is None and "quickstart" in list_presets():
        path = "quickstart"  # else no presets at all: the built-in defaults
    try:
        path = resolve_config_path(path) if path else None
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configs = {}
    for kind in args.policy:
        try:
            overrides = parse_overrides(args.overrides + [f"policy.kind={kind}"])
            configs[kind] = load_run_config(path, overrides)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.devices is not None:
        return _main_train_devices(args, argv, path, configs)
    if args.mesh == "both":
        print("error: --mesh both needs --devices (one worker process per configuration)",
              file=sys.stderr)
        return 2
    mesh = None
    if args.mesh == "on":
        from jaxdrive.train.placement import default_mesh

        mesh = default_mesh(force=True)
    records = []
    for kind, config in configs.items():
        print(f"jaxdrive bench train: {kind}, backend {jax.default_backend()}, "
              f"{config.train.num_envs} envs x {config.env.describe_rows()} x "
              f"{config.train.rollout_steps} steps per iteration, median of {args.repeats}"
              + ("" if mesh is None else f", data mesh over {mesh.size} device(s)"),
              flush=True)
        try:
            rec = bench_train(config, args.repeats, mesh)
        except ValueError as err:  # e.g. num_envs does not divide over the mesh
            print(f"error: {err}", file=sys.stderr)
            return 2
        rec["config"] = path
        records.append(rec)
        print(f"  {kind}: compile {rec['compile_s']:.1f} s, {rec['steps_per_s']:,.0f} "
              f"agent-steps/s", flush=True)
    print()
    print(train_table(records))
    return _write(args.json, "train", records, argv, top_level=True)


def _main_train_devices(args, argv, path, configs) -> int:
    """``bench train --devices``: one worker process per configuration, interleaved."""
    from jaxdrive.bench.scale import configurations, run_scale, scale_table

    try:
        counts = [int(x) for x in args.devices.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        print(f"error: --devices {args.devices!r}: distinct counts >= 1, e.g. 1,2,4,8",
              file=sys.stderr)
        return 2
    for kind, config in configs.items():
        bad = [n for n in counts if config.train.num_envs % n]
        if bad:
            print(f"error: train.num_envs={config.train.num_envs} ({kind}) does not divide "
                  f"over {bad} device(s)", file=sys.stderr)
            return 2
    runs = configurations(list(configs), counts, args.mesh)
    first = next(iter(configs.values()))
    print(f"jaxdrive bench train --devices {','.join(map(str, counts))}: {len(runs)} worker "
          f"process(es), {first.train.num_envs} envs x {first.env.scenario.max_agents} slots "
          f"x {first.train.rollout_steps} steps per iteration, median of {args.repeats} "
          f"interleaved rounds", flush=True)
    try:
        records = run_scale(path, args.overrides, runs, args.repeats,
                            log=lambda s: print(s, flush=True))
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for rec in records:
        rec["config"] = path
    print()
    print(scale_table(records))
    return _write(args.json, "train_scale", records, argv)


def _run_one(what: str, header: str, bench, table, args, argv) -> int:
    """Print ``header``, run ``bench()`` (one record), print its table, write the JSON."""
    print(f"jaxdrive bench {what}: backend {jax.default_backend()}, "
          f"{jax.devices()[0].device_kind}, {header}, median of {args.repeats}", flush=True)
    try:
        rec = bench()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print()
    print(table([rec]))
    return _write(args.json, what, [rec], argv, top_level=True)


def _main_render(args, argv) -> int:
    from jaxdrive.bench.render import bench_render, render_table

    return _run_one(
        "render", f"{args.envs} envs x {args.steps} steps at {args.size}x{args.size}, "
        f"views {args.views}",
        lambda: bench_render(args.envs, args.steps, args.size, tuple(args.views),
                             args.repeats), render_table, args, argv)


def _main_eval(args, argv) -> int:
    from jaxdrive.bench.eval import bench_eval, eval_table

    return _run_one(
        "eval", f"{args.evaluator}: {args.scenarios} scenarios"
        + (f" x {args.rollouts} rollouts" if args.evaluator == "realism"
           else f" x {args.steps} steps") + f", {args.policy}, batch {args.batch}",
        lambda: bench_eval(args.scenarios, args.steps, args.batch, args.policy,
                           args.repeats, args.evaluator, args.rollouts), eval_table, args,
        argv)


if __name__ == "__main__":
    sys.exit(run_command(main, "bench", compilation_cache=False))


"""Roll out procedural scenarios with a built-in controller and report rates and speed.

    python -m jaxdrive.simulate [--scenes N] [--steps T] [--envs B] [--config FILE]
        [--controller lane_follow|log_replay|random] [--seed S] [--set key=value ...]

``--config`` reads a YAML file with ``env:`` (``EnvConfig`` keys) and ``procedural:``
(``ProceduralConfig`` keys) sections, or a preset (``simulate_default``, ``human_replay``,
``adaptive_simulate``, ...); ``--set`` overrides keys on top of it:
``--set env.collision_behavior=stop``, ``--set procedural.arm_length=80``.

``--json PATH`` is checked for writability before anything is built and written
atomically at the end; if it cannot be written then, the summary is
saved next to its directory or in the system temp directory, the message says where,
and the exit code is 1. Exit code 2: bad input or an unwritable ``--json`` path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import NamedTuple

import jax
import numpy as np
import yaml

from jaxdrive.agents.controllers import CONTROLLERS
from jaxdrive.agents.rollout import RolloutStats, make_rollout
from jaxdrive.command import add_debug_flag, run_command
from jaxdrive.config import (
    MAX_SEED,
    ConfigError,
    int_arg,
    load_yaml,
    local_path_arg,
    merge,
    parse_overrides,
    resolve_config_path,
)
from jaxdrive.env import Env, EnvConfig
from jaxdrive.files import OutputError, check_writable_file, write_or_fallback
from jaxdrive.resources import check_fits
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch


def load_config(path: str | None, overrides: dict) -> dict:
    """The YAML file or preset (if any, with ``inherits:`` resolved) merged with ``--set``
    overrides; top-level keys checked."""
    data = load_yaml(resolve_config_path(path)) if path else {}
    data = merge(data, overrides)
    unknown = sorted(set(data) - {"env", "procedural"})
    if unknown:
        raise ConfigError(f"unknown config section '{unknown[0]}'; allowed sections: env, "
                          "procedural (e.g. --set env.goal_radius=3).")
    return data


def build(
    num_scenes: int, config: dict, seed: int
) -> tuple[Env, object, ProceduralConfig]:
    """Env and params over a pool of ``num_scenes`` procedural scenarios."""
    env_cfg = EnvConfig.from_dict(config.get("env") or {}, "env")
    proc_cfg = ProceduralConfig.from_dict(config.get("procedural") or {}, "procedural")
    # The pool is generated at once: its scenes, the generator's intermediates and the
    # road index (about 3x the scenes' own bytes).
    check_fits(f"--scenes {num_scenes:,}", 3 * num_scenes * env_cfg.scenario.nbytes(),
               "lower --scenes (envs draw their scenes from the pool)")
    scenes = generate_batch(jax.random.key(seed), num_scenes, proc_cfg, env_cfg.scenario)
    pool = make_pool(scenes, env_cfg.road_index)
    env = Env(env_cfg)
    return env, env.make_params(pool), proc_cfg


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """Command-line arguments and the number of parallel envs; exits (code 2) on bad
    counts."""
    p = argparse.ArgumentParser(prog="python -m jaxdrive.simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    p.add_argument("--scenes", type=int, default=256, help="procedural scenarios in the pool")
    p.add_argument("--steps", type=int, default=400, help="steps per environment")
    p.add_argument("--envs", type=int, default=None, help="parallel envs (default: --scenes)")
    p.add_argument("--controller", default="lane_follow", choices=sorted(CONTROLLERS))
    p.add_argument("--seed", type=int_arg(0, MAX_SEED), default=0)
    p.add_argument("--chunk", type=int, default=80, help="steps per compiled chunk")
    p.add_argument("--config", default=None,
                   help="YAML config with env: / procedural: sections: a file or a preset "
                        "name (simulate_default, human_replay, adaptive_simulate, ...)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", type=local_path_arg, default=None,
                   help="also write the summary to this file")
    args = p.parse_args(argv)
    for name in ("scenes", "steps", "chunk"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.envs is not None and args.envs < 1:
        p.error("--envs must be >= 1 (leave it out for one env per scene)")
    num_envs = args.envs or args.scenes
    return args, num_envs


class _RunResult(NamedTuple):
    """What ``_run`` measured."""

    stats: RolloutStats
    n_valid: int  # controlled agents at the start
    compile_s: float  # s, the first chunk (includes compilation)
    run_s: float  # s, the later chunks
    t_start: float  # perf_counter after the reset


def _run(env: Env, params, args: argparse.Namespace, num_envs: int) -> _RunResult:
    """Reset ``num_envs`` envs and roll them out ``args.steps`` steps in compiled chunks,
    printing progress after each chunk."""
    controller = CONTROLLERS[args.controller](env)
    chunk = min(args.chunk, args.steps)
    rollout = jax.jit(make_rollout(env, controller, chunk), donate_argnums=(1, 2, 3))
    key = jax.random.key(args.seed + 1)
    key, k_reset = jax.random.split(key)
    state, ts = jax.jit(env.reset_batch, static_argnums=2)(params, k_reset, num_envs)
    stats = RolloutStats.zeros(env)
    n_valid = int(np.sum(np.asarray(ts.active)))

    t_start = time.perf_counter()
    compile_s = None
    done_steps = 0
    run_s = 0.0
    while done_steps < args.steps:
        n = min(chunk, args.steps - done_steps)
        if n != chunk:  # last partial chunk: its own (smaller) program
            rollout = jax.jit(make_rollout(env, controller, n), donate_argnums=(1, 2, 3))
        key, k = jax.random.split(key)
        t = time.perf_counter()
        state, ts, stats = rollout(params, state, ts, stats, k)
        jax.block_until_ready(stats)
        dt = time.perf_counter() - t
        if compile_s is None:
            compile_s = dt  # first call includes compilation; not counted in speed
        else:
            run_s += dt
        done_steps += n
        summary = jax.device_get(stats).rates()
        rate = "" if run_s == 0 else f", {(done_steps - chunk) * num_envs / run_s:,.0f} env-steps/s"
        print(f"  step {done_steps:>6}/{args.steps}: {summary['agent_episodes']} agent-episodes"
              f", goal {summary['goal_rate']:.3f}{rate}", flush=True)
    return _RunResult(stats, n_valid, compile_s, run_s, t_start)


def _summary(env: Env, args: argparse.Namespace, num_envs: int, run: _RunResult) -> dict:
    """The final rates plus run sizes and timings (the ``--json`` fields)."""
    a = env.num_rows
    summary = jax.device_get(run.stats).rates()
    timed_steps = args.steps - min(args.chunk, args.steps)
    run_s = run.run_s
    env_sps = timed_steps * num_envs / run_s if run_s > 0 else float("nan")
    summary.update(
        controller=args.controller, scenes=args.scenes, envs=num_envs, steps=args.steps,
        controlled_agents_at_start=run.n_valid, agent_slots=a, compile_s=run.compile_s,
        env_steps_per_s=env_sps, agent_steps_per_s=env_sps * a,
        wall_s=time.perf_counter() - run.t_start,
    )
    return summary


def _print_summary(summary: dict, num_trials: int, run_s: float) -> None:
    """The human-readable report of ``_summary``'s fields."""
    a, env_sps = summary["agent_slots"], summary["env_steps_per_s"]
    print()
    print(f"agent-episodes completed : {summary['agent_episodes']} "
          f"({summary['env_episodes']} env episodes)")
    print(f"goal rate                : {summary['goal_rate']:.3f}")
    print(f"collision rate           : {summary['collision_rate']:.3f}")
    print(f"off-road rate            : {summary['offroad_rate']:.3f}")
    print(f"mean episode return      : {summary['mean_return']:.3f}")
    if "co_player_goal_rate" in summary:
        print(f"co-player goal rate      : {summary['co_player_goal_rate']:.3f} "
              f"({summary['co_player_agent_episodes']} co-player agent-episodes)")
    if "trial_0_score" in summary:
        scores = "  ".join(f"{summary[f'trial_{k}_score']:.3f}" for k in range(num_trials))
        print(f"trial scores (ego)       : {scores}")
        if num_trials > 1:
            print(f"adaptation delta K-1 - 0 : "
                  f"{summary[f'ada_delta_trial_{num_trials - 1}_minus_0']:+.3f}")
        print(f"trials per episode       : {summary['trials_completed']:.2f} completed, "
              f"{summary['trials_goal_reached']:.2f} all goals reached, "
              f"{summary['trials_timed_out']:.2f} timed out; mean trial length "
              f"{summary['trial_mean_length']:.1f} steps")
    print(f"compile (first chunk)    : {summary['compile_s']:.1f} s")
    if run_s > 0:
        print(f"steps/s                  : {env_sps:,.0f} env-steps/s = "
              f"{env_sps * a:,.0f} agent-steps/s ({a} agent slots per env)")
    else:
        print("steps/s                  : n/a (raise --steps above --chunk to time a chunk "
              "after compilation)")


def _write_json(path: str, summary: dict) -> int:
    """Write the summary to ``path`` (or a fallback, with an error line); the exit code."""
    try:
        written, problem = write_or_fallback(path, json.dumps(summary, indent=2))
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"summary: {written}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxdrive.simulate``: 0 on success, 1 when the ``--json`` summary had to
    be saved elsewhere, 2 on a config error or an unwritable ``--json`` path."""
    args, num_envs = _parse_args(argv)
    try:
        config = load_config(args.config, parse_overrides(args.overrides))
        if args.json:
            try:
                check_writable_file(args.json)
            except OutputError as e:
                raise OutputError(f"--json {args.json}: {e}") from None
        t0 = time.perf_counter()
        env, params, _ = build(args.scenes, config, args.seed)
    except (ConfigError, OSError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jax.block_until_ready(params)
    t_build = time.perf_counter() - t0
    print(f"jaxdrive.simulate: {args.scenes} procedural scenes built in {t_build:.1f} s; "
          f"{num_envs} envs x {env.config.scenario.max_agents} agent slots, {args.steps} "
          f"steps, controller '{args.controller}', backend {jax.default_backend()}")
    run = _run(env, params, args, num_envs)
    summary = _summary(env, args, num_envs, run)
    _print_summary(summary, env.config.num_trials, run.run_s)
    return _write_json(args.json, summary) if args.json else 0


if __name__ == "__main__":
    sys.exit(run_command(main, "simulate"))

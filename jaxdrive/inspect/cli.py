"""Inspect what a policy's memory does over one multi-trial episode.

    python -m jaxdrive.inspect --checkpoint RUN_DIR [--scenario N] [--seed S]
                               [--scenes FILE ...] [--trials K] [--agent A] [--out DIR]
                               [--set KEY=VALUE ...]

Plays one episode of the run's env in trial mode (``env.goal_behavior: trial`` with
``--trials`` trials; the run's own count when it trained in trial mode) on held-out
procedural scene ``--scenario`` (scene N of the validation scenes: seed
``validation.seed`` unless ``--seed``; or scene N of ``--scenes`` files), the policy
acting with its mode actions, in one jitted scan. Writes into ``--out`` (default
``RUN_DIR/inspect/``):

- ``attention.png``: the inspected agent's temporal-decoder attention over its memory
  at every step (query step x key step, per layer: head mean and each head), trial
  boundaries dashed, garbage keys red;
- ``cache.png``: its KV cache's held / attendable / garbage slot counts per step and
  every slot's state per step;
- ``trace.txt``: the per-step trial events (goals, collisions, off-road, removals, trial
  and episode ends) after a summary, which is also printed;
- ``probe.npz``: the recorded arrays.

A policy without memory (``policy.kind: mlp``) has no attention or cache: the command
says so and writes the trace only. The inspected agent (``--agent``) defaults to the
SDC when it is a controlled ego agent, else the first controlled agent. Exit code 2: bad
input (run directory, flags, unwritable ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jaxdrive.command import add_debug_flag
from jaxdrive.config import MAX_SEED, ConfigError, int_arg, local_path_arg, merge, parse_overrides
from jaxdrive.env import Env, episode_steps
from jaxdrive.files import OutputError, atomic_open, atomic_write_text, check_writable
from jaxdrive.inspect.plots import plot_attention, plot_cache
from jaxdrive.inspect.probe import (
    collect,
    default_agent,
    make_probe,
    scene_is_sdc,
)
from jaxdrive.inspect.trace import summary_lines, trace_text
from jaxdrive.runs.load import load_policy, read_run_config
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch

INPUT_ERRORS = (ConfigError, OSError, ValueError, yaml.YAMLError, OutputError)
DEFAULT_TRIALS = 2
# Procedural scenes past the held-out set are generated on request up to this index (a
# batch of that many scenes: about 0.25 MB each at the default sizes).
MAX_PROCEDURAL_INDEX = 1023


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.inspect", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    p.add_argument("--checkpoint", type=local_path_arg, metavar="RUN_DIR", required=True,
                   help="a training run directory")
    p.add_argument("--which", default="best", choices=("best", "last"),
                   help="checkpoint of the run to load (default best)")
    p.add_argument("--scenario", type=int_arg(0, 2**31 - 1), default=0, metavar="N",
                   help="held-out procedural scene index (default 0)")
    p.add_argument("--scenes", nargs="+", metavar="FILE",
                   help="play scene --scenario of these files (WOMD JSON / TFRecord or a "
                        "converted shard directory) instead of a procedural scene")
    p.add_argument("--seed", type=int_arg(0, MAX_SEED), default=None, metavar="S",
                   help="seed of the procedural scenes (default: the run's validation.seed)")
    p.add_argument("--trials", type=int, default=None, metavar="K",
                   help="trials in the episode (default: the run's env.num_trials in trial "
                        f"mode, else {DEFAULT_TRIALS})")
    p.add_argument("--agent", type=int, default=None, metavar="A",
                   help="agent slot to inspect (default: the SDC, else the first controlled)")
    p.add_argument("--out", type=local_path_arg, default=None, metavar="DIR",
                   help="output directory (default RUN_DIR/inspect)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set env.trial_timeout=40")
    return p


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    for flag, value, low in (("--scenario", args.scenario, 0), ("--trials", args.trials, 1),
                             ("--seed", args.seed, 0), ("--agent", args.agent, 0)):
        if value is not None and value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    return args


def load(args):
    """(run config in trial mode, loaded policy) for the parsed arguments."""
    loaded = load_policy(args.checkpoint, which=args.which)
    env = loaded.config.env
    trials = args.trials
    if trials is None:
        trials = env.num_trials if env.goal_behavior == "trial" else DEFAULT_TRIALS
    overrides = merge({"env": {"goal_behavior": "trial", "num_trials": trials}},
                      parse_overrides(args.overrides))
    return read_run_config(loaded.run_dir, overrides), loaded


def _scene(args, config, seed):
    """The one scene to play (a Scenario with a leading axis of 1)."""
    if args.scenes:
        from jaxdrive.data import load_scenarios

        scenes, _ = load_scenarios(list(args.scenes), config.env.scenario)
        n = int(scenes.objects.xy.shape[0])
        if args.scenario >= n:
            raise ValueError(f"--scenario {args.scenario} is out of range: --scenes holds "
                             f"{n} scene(s), so pick 0 to {n - 1}.")
        return jax.tree.map(lambda x: x[args.scenario:args.scenario + 1], scenes)
    if args.scenario >= max(config.validation.num_scenes, MAX_PROCEDURAL_INDEX + 1):
        raise ValueError(
            f"--scenario {args.scenario} is out of range: the held-out procedural scenes "
            f"are 0 to {config.validation.num_scenes - 1} (validation.num_scenes), and "
            f"scenes up to {MAX_PROCEDURAL_INDEX} are generated on request; a higher index "
            "would generate that many scenes first.")
    num = max(config.validation.num_scenes, args.scenario + 1)
    # Scene N of the held-out set: the same scene whatever N (generate_batch's part).
    return generate_batch(jax.random.key(seed), num, config.procedural, config.env.scenario,
                          part=(args.scenario, args.scenario + 1))


def build(args, config):
    """(env, env_params, initial state and timestep with one env, SDC flags)."""
    env = Env(config.env)
    seed = config.validation.seed if args.seed is None else args.seed
    scenes = _scene(args, config, seed)
    env_params = env.make_params(make_pool(scenes, config.env.road_index))
    reset = jax.jit(jax.vmap(env.reset_to, in_axes=(None, 0, 0)))
    state, timestep = reset(env_params, jnp.zeros((1,), jnp.int32),
                            jax.random.split(jax.random.key(seed), 1))
    return env, env_params, state, timestep, scene_is_sdc(env_params, 0)


def pick_agent(args, state0, is_sdc) -> int:
    """``--agent`` (checked: a controlled agent of the scene) or the default."""
    if args.agent is None:
        return default_agent(state0, is_sdc)
    controlled = np.asarray(state0.controlled)
    if args.agent >= controlled.shape[0] or not controlled[args.agent]:
        raise ValueError(f"--agent {args.agent} is not a controlled agent of this scene; "
                         f"controlled slots: {np.flatnonzero(controlled).tolist()}.")
    return args.agent


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.inspect``; returns the exit code."""
    args = _parse_args(argv)
    try:
        config, loaded = load(args)
        out = check_writable(args.out if args.out is not None else loaded.run_dir / "inspect")
        env, env_params, state, timestep, is_sdc = build(args, config)
        state0 = jax.device_get(jax.tree.map(lambda x: x[0], state))
        agent = pick_agent(args, state0, is_sdc)
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    policy = loaded.policy
    memory = policy.config.kind == "transformer"
    if not memory:
        print(f"policy kind '{policy.config.kind}' has no memory: there is no attention or "
              "KV cache to inspect; writing the event trace only.")
    run = make_probe(env, policy, with_attention=memory)
    outs = run(loaded.params, env_params, state, timestep, jnp.int32(agent))
    probe = collect(outs, agent, state0, is_sdc)
    c = config.env
    source = (" ".join(args.scenes) if args.scenes else
              f"seed {config.validation.seed if args.seed is None else args.seed}")
    header = [f"run: {loaded.run_dir} (step {loaded.step}), policy: {policy.config.kind}",
              f"scene: {args.scenario} of {source}, trials: "
              f"{c.num_trials} x {c.trial_length} steps (episode {episode_steps(env)})"]
    paths = []
    trace = out / "trace.txt"
    atomic_write_text(trace, trace_text(probe, c.trial_length, header))
    paths.append(trace)
    if memory:
        paths.append(plot_attention(probe, out / "attention.png"))
        paths.append(plot_cache(probe, out / "cache.png"))
    arrays = {k: v for k, v in dataclasses.asdict(probe).items() if v is not None}
    with atomic_open(out / "probe.npz", "wb") as f:
        np.savez_compressed(f, **arrays)
    paths.append(out / "probe.npz")
    print("\n".join(header + summary_lines(probe)))
    for path in paths:
        print(path)
    return 0

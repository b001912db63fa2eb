"""End-to-end training throughput for ``python -m jaxdrive.bench train``.

Builds the run of a config file or preset (default the ``quickstart`` preset,
``configs/quickstart.yaml``) with the chosen policy kind, compiles ``PPO.train_step``
(timed: ``compile_s``, the first call) and times ``repeats`` further iterations
(rollout + GAE + PPO epochs, all on device), reporting agent-steps per second of wall
time (env steps x agent slots, the unit of ``train.total_steps``) and trained steps per
second (valid ego steps only).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxdrive.models.policy import Policy, param_count
from jaxdrive.runs.config import RunConfig
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env


def bench_train(config: RunConfig, repeats: int) -> dict:
    """One record for ``config`` (its ``train.num_scenes`` scenes are built first)."""
    t = config.train
    env, env_params = build_env(config, t.seed, t.num_scenes)
    policy = Policy.for_env(config.policy, env)
    ppo = PPO(config, env, policy)
    state = ppo.init(jax.random.key(t.seed + 1), env_params)
    step = jax.jit(ppo.train_step, donate_argnums=0)
    tic = time.perf_counter()
    state, metrics = step(state, env_params)
    jax.device_get(metrics)
    compile_s = time.perf_counter() - tic
    times, valid = [], []
    for _ in range(repeats):
        tic = time.perf_counter()
        state, metrics = step(state, env_params)
        m = jax.device_get(metrics)
        times.append(time.perf_counter() - tic)
        valid.append(float(m["rollout/valid_steps"]))
    dt = float(np.median(times))
    per_it = config.steps_per_iteration
    obs = config.env.observation
    return {
        "policy": config.policy.kind,
        "steps_per_s": per_it / dt,
        "trained_steps_per_s": float(np.median(valid)) / dt,
        "compile_s": compile_s,
        "iteration_s": dt,
        "iteration_s_all": times,
        "agent_steps_per_iteration": per_it,
        "num_envs": t.num_envs,
        "agent_slots": config.env.scenario.max_agents,
        "rollout_steps": t.rollout_steps,
        "epochs": t.epochs,
        "minibatches": t.minibatches,
        "num_partners": obs.num_partners,
        "num_road": obs.num_road,
        "params": param_count(state.params),
    }


def train_table(records: list[dict]) -> str:
    """The ``bench_train`` records as a fixed-width text table."""
    head = (f"{'policy':<12}{'params':>9}{'obs (K+M)':>11}{'agents/iter':>13}"
            f"{'compile s':>11}{'iter s':>9}{'steps/s':>11}{'trained/s':>11}")
    rows = [head, "-" * len(head)]
    for r in records:
        rows.append(f"{r['policy']:<12}{r['params']:>9,}{r['num_partners']:>5}+"
                    f"{r['num_road']:<5}{r['agent_steps_per_iteration']:>13,}"
                    f"{r['compile_s']:>11.1f}{r['iteration_s']:>9.3f}"
                    f"{r['steps_per_s']:>11,.0f}{r['trained_steps_per_s']:>11,.0f}")
    return "\n".join(rows)

"""End-to-end training throughput for ``python -m jaxdrive.bench train``.

Builds the run of a config file or preset (default the ``quickstart`` preset,
``configs/quickstart.yaml``) with the chosen policy kind, compiles ``PPO.train_step``
(timed: ``compile_s``, the first call) and times ``repeats`` further iterations
(rollout + GAE + PPO epochs, all on device), reporting agent-steps per second of wall
time (env steps x agent rows, the unit of ``train.total_steps``) and trained steps per
second (valid ego steps only: the controlled agents the learner drives). With
``data.path`` the run's first pool of converted real scenes is timed; with
``env.max_controlled`` their controlled agents are packed into that many rows per env.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxdrive.env import Env
from jaxdrive.models.policy import Policy, param_count
from jaxdrive.runs.config import RunConfig
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import SceneStream, build_env


class TrainBench:
    """One configuration built and compiled (the first call, timed: ``compile_s``):
    ``time_once()`` runs one timed iteration, ``record()`` summarises the iterations so far.

    ``mesh`` None (the default) builds exactly the single-device program: ``PPO.init`` and
    ``jax.jit`` of ``train_step`` with the state donated. With a ``data`` mesh
    (``jaxdrive.train.placement.default_mesh``) the run is placed as training places it
    (``Placement``: state in its shardings, the scene pool replicated, the step jitted
    with those shardings), even on one device.
    """

    def __init__(self, config: RunConfig, mesh=None):
        self.config = config
        self.mesh = mesh
        t = config.train
        if mesh is None and config.data.path:
            # The run's first pool of converted scenes, as training builds it.
            env = Env(config.env)
            stream = SceneStream(config, env, 0)
            env_params = stream.params
            stream.close()
        if mesh is None:
            if not config.data.path:
                env, env_params = build_env(config, t.seed, t.num_scenes)
            policy = Policy.for_env(config.policy, env)
            ppo = PPO(config, env, policy)
            state = ppo.init(jax.random.key(t.seed + 1), env_params)
            step = jax.jit(ppo.train_step, donate_argnums=0)
        else:
            from jaxdrive.train.placement import Placement, procedural_params

            if config.data.path:
                raise ValueError("bench train --mesh times procedural scenes only; drop "
                                 f"data.path ({config.data.path}) or the mesh")
            env = Env(config.env)
            policy = Policy.for_env(config.policy, env)
            ppo = PPO(config, env, policy, mesh=mesh)
            placement = Placement(ppo)
            env_params = placement.env_params(
                procedural_params(config, env, t.seed, t.num_scenes))
            state = placement.init(t.seed + 1, env_params)
            step = placement.jit_step(ppo.train_step, env_params)
        self._step, self._env_params = step, env_params
        tic = time.perf_counter()
        state, metrics = step(state, env_params)
        jax.device_get(metrics)
        self.compile_s = time.perf_counter() - tic
        self._state = state
        self.times: list[float] = []
        self.valid: list[float] = []

    def time_once(self) -> float:
        """One timed iteration (until its metrics are on the host); appends its wall
        time, seconds, to ``times`` and returns it."""
        tic = time.perf_counter()
        self._state, metrics = self._step(self._state, self._env_params)
        m = jax.device_get(metrics)
        self.times.append(time.perf_counter() - tic)
        self.valid.append(float(m["rollout/valid_steps"]))
        return self.times[-1]

    def record(self) -> dict:
        """The JSON-ready record of the iterations timed so far (medians)."""
        config, t = self.config, self.config.train
        dt = float(np.median(self.times))
        per_it = config.steps_per_iteration
        obs = config.env.observation
        rec = {
            "policy": config.policy.kind,
            "steps_per_s": per_it / dt,
            "trained_steps_per_s": float(np.median(self.valid)) / dt,
            "compile_s": self.compile_s,
            "iteration_s": dt,
            "iteration_s_all": list(self.times),
            "agent_steps_per_iteration": per_it,
            "num_envs": t.num_envs,
            "agent_slots": config.env.scenario.max_agents,
            "agent_rows": config.env.num_rows,
            "scenes": config.data.path or "procedural",
            "rollout_steps": t.rollout_steps,
            "epochs": t.epochs,
            "minibatches": t.minibatches,
            "num_partners": obs.num_partners,
            "num_road": obs.num_road,
            "params": param_count(self._state.params),
        }
        rec["devices"] = 1 if self.mesh is None else int(self.mesh.size)
        rec["mesh"] = self.mesh is not None
        rec["per_device_steps_per_s"] = rec["steps_per_s"] / rec["devices"]
        return rec


def bench_train(config: RunConfig, repeats: int, mesh=None) -> dict:
    """One record for ``config`` (its ``train.num_scenes`` scenes are built first);
    ``mesh``: see ``TrainBench``."""
    b = TrainBench(config, mesh)
    for _ in range(repeats):
        b.time_once()
    return b.record()


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

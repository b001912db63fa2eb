"""Where a training run's arrays live: one device, or split over the ``data`` mesh.

``Placement`` wraps a ``PPO`` with its mesh (``jaxdrive.parallel``). Without a mesh
(one device) it is exactly the single-device run: ``PPO.init`` and ``jax.jit`` of the
step, nothing else. With a mesh, the initial state is computed by one jitted program
straight into its shardings (envs, agent rows, KV caches and statistics split along
``data``; parameters, optimiser state and keys replicated; the same numbers as
``PPO.init``), the scene pool is split along its scenes with the envs that draw from
it (``train.pool_shards``, one shard per device by default; whole on every device with
``pool_shards: 1``), and the step is jitted with those shardings in and out, so nothing
moves between iterations.

Scenes in a multi-process job: each process generates or loads only its share
(``jaxdrive.parallel.share``; procedural scene ``i`` comes from the same key in every
layout), and the shares are gathered into the replicated pool once per pool.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxdrive.env import Env, EnvParams
from jaxdrive.parallel import data_mesh, gather_shares, replicated, share, to_global
from jaxdrive.runs.config import RunConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch
from jaxdrive.train.ppo import PPO, TrainState


def default_mesh(force: bool = False):
    """The ``data`` mesh over every device of every process, or None on a single device
    (the plain single-device program) unless ``force``."""
    if jax.device_count() == 1 and not force:
        return None
    return data_mesh()


def procedural_params(config: RunConfig, env: Env, seed: int, num_scenes: int,
                      mesh=None, gather: bool = True) -> EnvParams:
    """``env``'s params over ``num_scenes`` procedural scenes drawn with ``seed``.

    One process: all scenes (replicated over ``mesh`` when given). Several: this process
    generates scenes ``share(num_scenes)`` only; the shares are gathered (the same pool
    as one process would build) and replicated over ``mesh``, or, without ``gather``,
    this process's share is returned as it is (for ``Placement.pool_params``).
    """
    part = share(num_scenes, "train.num_scenes") if jax.process_count() > 1 else None
    scenes = generate_batch(jax.random.key(seed), num_scenes, config.procedural,
                            config.env.scenario, part=part)
    pool = make_pool(scenes, config.env.road_index)
    if not gather:
        return env.make_params(pool)
    pool = gather_shares(pool)
    params = env.make_params(pool)
    return params if mesh is None else to_global(params, replicated(mesh))


class Placement:
    """The arrays of one ``PPO`` run on its mesh (or on one device when ``ppo.mesh`` is
    None)."""

    def __init__(self, ppo: PPO):
        self.ppo = ppo
        self.mesh = ppo.mesh
        self._shardings = None

    def env_params(self, params: EnvParams) -> EnvParams:
        """The training pool's ``params`` laid out on the mesh (``PPO.env_param_shardings``:
        split over the devices with ``train.pool_shards`` > 1, else replicated; unchanged
        without a mesh). ``params`` holds the whole pool as host or single-device
        arrays, the same in every process."""
        if self.mesh is None:
            return params
        return to_global(params, self.ppo.env_param_shardings(params))

    def pool_params(self, local: EnvParams) -> EnvParams:
        """The training pool laid out on the mesh from this process's share of it
        (``local``: scenes ``share(S)`` of the S, the shares in process order; the whole
        pool in a one-process job). Where the pool is split over the devices and each
        process's devices hold its own share's scenes (a 1-D mesh in process order, as
        ``jax.make_mesh`` builds), each process places its share straight onto its
        devices: no process ever holds the whole pool. Otherwise the shares are gathered
        on every host first (``env_params``)."""
        if jax.process_count() == 1:
            return self.env_params(local)
        shardings = self.ppo.env_param_shardings(local)
        if not (self.ppo.pool_shards > 1 and _devices_in_process_order(self.mesh)):
            return self.env_params(gather_shares(local))
        pool = jax.tree.map(
            lambda x, s: jax.make_array_from_process_local_data(s, np.asarray(x)),
            local.pool, shardings.pool)
        return EnvParams(pool=pool, reward=to_global(local.reward, shardings.reward))

    def shardings(self, env_params: EnvParams) -> TrainState:
        """The ``TrainState`` of ``NamedSharding`` the state lives in (needs a mesh)."""
        if self._shardings is None:
            shape = jax.eval_shape(self.ppo.init, jax.random.key(0), env_params)
            self._shardings = self.ppo.state_shardings(shape)
        return self._shardings

    def init(self, seed: int, env_params: EnvParams) -> TrainState:
        """``PPO.init(jax.random.key(seed), env_params)``, placed on the mesh."""
        if self.mesh is None:
            return self.ppo.init(jax.random.key(seed), env_params)
        init = jax.jit(lambda p: self.ppo.init(jax.random.key(seed), p),
                       out_shardings=self.shardings(env_params))
        return init(env_params)

    def place_state(self, state: TrainState, env_params: EnvParams) -> TrainState:
        """A host or single-device ``state`` (e.g. restored) moved into its shardings."""
        if self.mesh is None:
            return state
        return to_global(state, self.shardings(env_params))

    def jit_step(self, step, env_params: EnvParams, donate: bool = True):
        """``step(state, env_params) -> (state, metrics)`` jitted for this placement
        (the state donated when ``donate``): state shardings in and out, env params
        and metrics replicated."""
        donate_argnums = (0,) if donate else ()
        if self.mesh is None:
            return jax.jit(step, donate_argnums=donate_argnums)
        sh, rep = self.shardings(env_params), replicated(self.mesh)
        pool = self.ppo.env_param_shardings(env_params)
        return jax.jit(step, donate_argnums=donate_argnums, in_shardings=(sh, pool),
                       out_shardings=(sh, rep))

    def jit_restart(self, restart, env_params: EnvParams):
        """``restart(state, env_params) -> state`` jitted for this placement (state
        donated), e.g. ``PPO.restart_envs`` when the training pool is replaced."""
        if self.mesh is None:
            return jax.jit(restart, donate_argnums=0)
        sh = self.shardings(env_params)
        return jax.jit(restart, donate_argnums=0,
                       in_shardings=(sh, self.ppo.env_param_shardings(env_params)),
                       out_shardings=sh)


def _devices_in_process_order(mesh) -> bool:
    """Whether each process's devices form one block of the 1-D mesh, the blocks in
    process order (so that process p's share of the pool is its devices' part)."""
    owners = [d.process_index for d in mesh.devices.flat]
    return owners == sorted(owners) and len(set(owners)) == jax.process_count()


__all__ = ["Placement", "data_mesh", "default_mesh", "procedural_params"]

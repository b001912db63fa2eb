"""Actors: who drives the controlled agents of a batch of environments in a rollout.

An ``Actor`` wraps a built-in controller (``jaxdrive.agents.controllers``) or a policy
(``jaxdrive.models.Policy`` with its KV cache) behind one interface, so that recordings
(``jaxdrive.render``) and evaluators (``jaxdrive.eval``) run either the same way.

Frozen partners (a population of co-player policies) drive the co-player rows of a
batch in fixed contiguous blocks of environments: env ``i`` of ``B`` is driven by member
``i * M // B`` (``env_members``), so member ``m``'s policy runs only on its block's static
slice of rows (``member_blocks``), never on the whole batch. ``partner_actions`` is that
step; training (``jaxdrive.train.ppo``) and evaluation (``with_partners``) share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.env import Env
from jaxdrive.models.dense import DenseRows, capacities_for
from jaxdrive.models.policy import policy_inputs

MEMORY_RESETS = ("episode", "trial")


@dataclasses.dataclass(frozen=True)
class Actor:
    """How the controlled agents act.

    Attributes:
      init: ``num_envs -> carry`` (e.g. a policy's KV cache; ``()`` for controllers).
      act: ``(params, carry, env_params, state, timestep, key) -> (action, carry)`` over a
        batch of B environments (``action`` shaped like ``Env.step_batch`` expects).
    """

    init: Callable[[int], Any]
    act: Callable[..., tuple[jax.Array, Any]]


def controller_actor(env: Env, controller) -> Actor:
    """An ``Actor`` from a controller of ``jaxdrive.agents.controllers`` (ignores ``params``)."""
    act_batch = jax.vmap(controller, in_axes=(None, 0, 0, 0))

    def act(params, carry, env_params, state, timestep, key):
        del params
        keys = jax.random.split(key, state.step.shape[0])
        return act_batch(env_params, state, timestep, keys), carry

    return Actor(init=lambda num_envs: (), act=act)


def policy_actor(env: Env, policy, deterministic: bool = True,
                 memory_reset: str = "episode") -> Actor:
    """An ``Actor`` running ``policy`` on every controlled agent, with its KV cache as the
    carry.

    Args:
      env: the environment (for the agent count).
      policy: a ``jaxdrive.models.Policy``.
      deterministic: act with the distribution's mode (else sample).
      memory_reset: ``episode`` (memory starts afresh only with an episode, as in
        training) or ``trial`` (also at every trial boundary: the no-memory control of
        the adaptation evaluator).
    """
    if memory_reset not in MEMORY_RESETS:
        raise ValueError(f"memory_reset must be one of {MEMORY_RESETS}, got {memory_reset!r}")
    a = env.num_rows
    rows = lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])  # zero-size too

    def act(params, cache, env_params, state, timestep, key):
        del env_params
        b = state.step.shape[0]
        first, removed = policy_inputs(timestep)
        if memory_reset == "trial":
            # The observation after a trial boundary starts the next trial.
            first = first | timestep.info.trial_done[:, None]
        out, cache = policy.step(params, cache, jax.tree.map(rows, timestep.obs),
                                 rows(first), rows(removed))
        dist = policy.distribution(out)
        action = dist.mode() if deterministic else dist.sample(key)
        return action.reshape((b, a) + action.shape[1:]), cache

    return Actor(init=lambda num_envs: policy.init_cache(num_envs * a), act=act)


def env_members(num_envs: int, num_members: int) -> np.ndarray:
    """(B,) int32: the partner driving each env's co-players, ``i * M // B`` (contiguous
    blocks, sizes differing by at most one; equal when M divides B)."""
    return (np.arange(num_envs, dtype=np.int64) * num_members // num_envs).astype(np.int32)


def member_blocks(num_envs: int, num_members: int) -> tuple[tuple[int, int], ...]:
    """Per member, its envs ``[lo, hi)`` under ``env_members`` (an empty block when
    M > B). The blocks tile ``[0, B)`` in member order."""
    members = env_members(num_envs, num_members)
    return tuple((int(np.searchsorted(members, m, "left")),
                  int(np.searchsorted(members, m, "right"))) for m in range(num_members))


def partner_caches(partners, num_envs: int, num_agents: int) -> tuple:
    """One ``KVCache`` per partner over its block's rows ((hi - lo) x A)."""
    blocks = member_blocks(num_envs, len(partners))
    return tuple(pol.init_cache((hi - lo) * num_agents)
                 for (pol, _), (lo, hi) in zip(partners, blocks, strict=True))


def partner_actions(partners, caches: tuple, obs, first: jax.Array, removed: jax.Array,
                    num_envs: int, key: jax.Array, deterministic: bool = False,
                    rows: jax.Array | None = None, dense_shares: tuple[float, ...] | None = None):
    """Every partner's actions on the rows of its own block of envs.

    Args:
      partners: sequence of M ``(Policy, params)`` frozen policies.
      caches: their ``KVCache`` s (``partner_caches``).
      obs: ``Observation`` over N = B x A rows (env-major); first, removed: (N,) bool.
      num_envs: B.
      key: PRNG key (member m samples with ``fold_in(key, m)``).
      deterministic: act with each distribution's mode.
      rows: (N,) bool, the rows whose actions count (co-players not removed), with
        ``dense_shares``: each member's encoder runs on dense buffers of those shares of
        its block's rows (``jaxdrive.models.dense``); None: on every row of its block.
    Returns:
      ``(actions, caches)``: (N,) int32 or (N, D) float32, each row acted on by its
      env's member (concatenated blocks), and the new caches.
    """
    n = first.shape[0]
    a = n // num_envs
    actions, new_caches = [], []
    for m, ((pol, params), cache, (lo, hi)) in enumerate(
            zip(partners, caches, member_blocks(num_envs, len(partners)), strict=True)):
        if hi == lo:
            new_caches.append(cache)
            continue
        block = slice(lo * a, hi * a)  # static: only this block's rows are computed
        dense = None
        if rows is not None and dense_shares is not None:
            dense = DenseRows(rows[block], capacities_for(dense_shares, (hi - lo) * a))
        out, cache = pol.step(params, cache, jax.tree.map(lambda x, r=block: x[r], obs),
                              first[block], removed[block], rows=dense)
        dist = pol.distribution(out)
        actions.append(dist.mode() if deterministic
                       else dist.sample(jax.random.fold_in(key, m)))
        new_caches.append(cache)
    return jnp.concatenate(actions, axis=0), tuple(new_caches)


def with_partners(env: Env, actor: Actor, partners, deterministic: bool = True) -> Actor:
    """``actor`` with its co-player rows (``EnvState.co_player``) driven by frozen
    ``partners`` (M ``(Policy, params)``, member per env as ``env_members``); ego rows
    keep ``actor`` 's actions. The carry is ``(actor's carry, partner caches)``; partner
    memories start afresh with each episode, as in training. ``partners`` empty: ``actor``
    itself."""
    partners = tuple(partners)
    if not partners:
        return actor
    a = env.num_rows
    rows = lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

    def init(num_envs):
        return actor.init(num_envs), partner_caches(partners, num_envs, a)

    def act(params, carry, env_params, state, timestep, key):
        inner, caches = carry
        k_actor, k_partner = jax.random.split(key)
        action, inner = actor.act(params, inner, env_params, state, timestep, k_actor)
        b = state.step.shape[0]
        first, removed = (rows(x) for x in policy_inputs(timestep))
        co_action, caches = partner_actions(partners, caches, jax.tree.map(rows, timestep.obs),
                                            first, removed, b, k_partner, deterministic)
        co_action = co_action.reshape(action.shape).astype(action.dtype)
        is_co = state.co_player.reshape(state.co_player.shape + (1,) * (action.ndim - 2))
        return jnp.where(is_co, co_action, action), (inner, caches)

    return Actor(init=init, act=act)

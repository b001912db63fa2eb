"""Actors: who drives the controlled agents of a batch of environments in a rollout.

An ``Actor`` wraps a built-in controller (``jaxdrive.agents.controllers``) or a policy
(``jaxdrive.models.Policy`` with its KV cache) behind one interface, so that recordings
(``jaxdrive.render``) and evaluators (``jaxdrive.eval``) run either the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxdrive.env import Env
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
    a = env.config.scenario.max_agents
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

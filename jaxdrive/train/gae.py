"""Generalised advantage estimation over (T, N) rollouts with per-agent stops.

Step t of agent n is the transition (obs_t, action_t) -> (reward_t, obs_{t+1}). Its
bootstrap from ``value_{t+1}`` is cut (``stop_t``) when the episode terminated or was
truncated on that step (time limit, trial end: the next observation belongs to another
episode or trial), and when step t+1 is not a valid step of the agent (it was removed
after reaching its goal, stopped, or is not controlled): the value of such an
observation is garbage and must not leak backwards.

    delta_t = r_t + gamma * (1 - stop_t) * V_{t+1} - V_t
    A_t     = delta_t + gamma * lambda * (1 - stop_t) * A_{t+1}

(Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation"). Computed by a reverse ``lax.scan``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bootstrap_stop(terminated: jax.Array, truncated: jax.Array, valid: jax.Array,
                   next_valid: jax.Array) -> jax.Array:
    """(T, N) bool: where the advantage recursion must not look past step t.

    Args:
      terminated, truncated: (T, N) bool, emitted by the step taken at t.
      valid: (T, N) bool, step t counts (the agent acted and was not removed).
      next_valid: (N,) bool, validity of the step after the last one.
    """
    following = jnp.concatenate([valid[1:], next_valid[None]], axis=0)
    return terminated | truncated | ~following


def gae(rewards: jax.Array, values: jax.Array, bootstrap_value: jax.Array, stop: jax.Array,
        gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets.

    Args:
      rewards: (T, N) float32, reward of the step taken at t.
      values: (T, N) float32, V(obs_t).
      bootstrap_value: (N,) float32, V(obs_T) after the last step.
      stop: (T, N) bool, from ``bootstrap_stop``.
      gamma, lam: discount and GAE lambda.
    Returns:
      (advantages (T, N), returns = advantages + values (T, N)), float32.
    """
    next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    cont = 1.0 - stop.astype(jnp.float32)
    deltas = rewards + gamma * cont * next_values - values

    def back(carry, x):
        delta, c = x
        adv = delta + gamma * lam * c * carry
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros_like(bootstrap_value), (deltas, cont), reverse=True)
    return adv.astype(jnp.float32), (adv + values).astype(jnp.float32)

"""Periodic validation: one deterministic episode on each held-out procedural scene.

Every held-out scene gets its own environment, started at the scene's first step, and
the policy acts with its mode (argmax / Beta mode) for one full episode (all trials in
trial mode). Only that first episode counts: an environment that finishes early is
auto-reset by the env, and its later steps are ignored. Rates are over ego
agent-episodes, as in training. Small and replaceable by the evaluation framework.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdrive.env import Env, EnvParams
from jaxdrive.models.policy import Policy, policy_inputs
from jaxdrive.rollout import RolloutStats


def episode_steps(env: Env) -> int:
    """Steps that cover one whole episode (every trial in trial mode)."""
    c = env.config
    if c.goal_behavior == "trial":
        return c.num_trials * c.trial_length
    return c.num_episode_steps


def make_validator(env: Env, policy: Policy, num_scenes: int):
    """``validate(params, env_params) -> RolloutStats`` over scenes ``0..num_scenes-1`` of
    ``env_params``' pool (pure; jit it). The key is fixed: results depend on the
    parameters only."""
    num_steps = episode_steps(env)
    a = env.config.scenario.max_agents

    def validate(params, env_params: EnvParams) -> RolloutStats:
        sids = jnp.arange(num_scenes, dtype=jnp.int32)
        keys = jax.random.split(jax.random.key(0), num_scenes)
        state, ts = jax.vmap(env.reset_to, in_axes=(None, 0, 0))(env_params, sids, keys)
        rows = lambda x: x.reshape((-1,) + x.shape[2:])

        def body(carry, _):
            state, ts, cache, stats, finished = carry
            obs = jax.tree.map(rows, ts.obs)
            first, removed = (rows(x) for x in policy_inputs(ts))
            out, cache = policy.step(params, cache, obs, first, removed)
            action = policy.distribution(out).mode()
            state, ts = env.step_batch(env_params, state,
                                       action.reshape((num_scenes, a) + action.shape[1:]))
            counted = ts.replace(episode_done=ts.episode_done & ~finished)
            return (state, ts, cache, stats.update(counted), finished | ts.episode_done), None

        carry = (state, ts, policy.init_cache(num_scenes * a), RolloutStats.zeros(env),
                 jnp.zeros((num_scenes,), bool))
        (_, _, _, stats, _), _ = jax.lax.scan(body, carry, None, length=num_steps)
        return stats

    return validate


def validation_metrics(stats: RolloutStats, prefix: str = "val/") -> dict[str, float]:
    """Host-side rates (after ``jax.device_get``) under ``prefix``."""
    return {f"{prefix}{k}": v for k, v in stats.rates().items()}

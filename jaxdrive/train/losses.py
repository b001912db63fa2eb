"""PPO losses with a validity mask (Schulman et al. 2017, clipped surrogate objective),
and the behaviour-cloning loss (negative log-likelihood of expert actions).

Only valid steps (the agent acted, was controlled by the learning policy and not
removed) contribute to any term or statistic; every mean divides by the number of
valid steps. Inputs at masked steps are replaced by neutral values before any
arithmetic, so garbage there (even inf or NaN) changes neither the losses nor their
gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class LossStats:
    """() float32 each: the terms and diagnostics of one minibatch."""

    total: jax.Array
    policy: jax.Array
    value: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array
    clip_fraction: jax.Array
    valid_steps: jax.Array
    aux_goal: jax.Array | None = None  # ``train.aux_goal_coef`` > 0 only
    bc_kl: jax.Array | None = None  # ``train.bc_kl_coef`` > 0 only: KL(pi_bc || pi)
    dense_overflow: jax.Array | None = None  # 1.0: the minibatch overflowed its dense rows


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``x`` over ``mask`` (0 when nothing is valid)."""
    m = mask.astype(jnp.float32)
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(m), 1.0)


def normalize_advantages(adv: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Zero mean, unit std over valid steps; 0 at masked steps."""
    adv = jnp.where(mask, adv, 0.0)
    mean = masked_mean(adv, mask)
    std = jnp.sqrt(masked_mean(jnp.square(adv - mean), mask))
    return jnp.where(mask, (adv - mean) / (std + eps), 0.0)


def ppo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    entropy: jax.Array,
    mask: jax.Array,
    clip_eps: float = 0.2,
    value_clip_eps: float | None = None,
    value_coef: float = 0.5,
    entropy_coef: float = 0.01,
) -> tuple[jax.Array, LossStats]:
    """Clipped PPO objective over valid steps.

    Args:
      logp: (...) log-probabilities of the taken actions under the current policy.
      old_logp: (...) the same under the rollout policy.
      advantages: (...) (normalised) advantages; values: (...) current value estimates;
      old_values: (...) rollout values; returns: (...) value targets.
      entropy: (...) entropy of the current policy.
      mask: (...) bool, valid steps.
      value_clip_eps: clip the value update to +- this around ``old_values`` (None = off).
    Returns:
      (total loss (), ``LossStats``).
    """
    safe = lambda x: jnp.where(mask, x, 0.0)
    logp, old_logp, adv = safe(logp), safe(old_logp), safe(advantages)
    values, old_values, returns, entropy = (safe(values), safe(old_values), safe(returns),
                                            safe(entropy))
    log_ratio = logp - old_logp
    ratio = jnp.exp(log_ratio)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    policy = -masked_mean(surrogate, mask)
    v_err = jnp.square(values - returns)
    if value_clip_eps is not None:
        clipped = old_values + jnp.clip(values - old_values, -value_clip_eps, value_clip_eps)
        v_err = jnp.maximum(v_err, jnp.square(clipped - returns))
    value = 0.5 * masked_mean(v_err, mask)
    ent = masked_mean(entropy, mask)
    total = policy + value_coef * value - entropy_coef * ent
    stats = LossStats(
        total=total, policy=policy, value=value, entropy=ent,
        approx_kl=jax.lax.stop_gradient(masked_mean((ratio - 1.0) - log_ratio, mask)),
        clip_fraction=jax.lax.stop_gradient(
            masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask)),
        valid_steps=jnp.sum(mask.astype(jnp.float32)),
    )
    return total, stats


def aux_goal_loss(pred: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """() mean over valid steps of the squared error summed over the last axis (the goal
    rows): ``pred``, ``target`` (..., 3), ``mask`` (...) bool. Masked steps contribute
    nothing, not even a NaN."""
    err = jnp.where(mask[..., None], pred - target, 0.0)
    return masked_mean(jnp.sum(jnp.square(err), axis=-1), mask)


def bc_loss(logp: jax.Array, entropy: jax.Array, mask: jax.Array) -> tuple[jax.Array,
                                                                           LossStats]:
    """Behaviour cloning: the mean negative log-likelihood of the expert's actions over
    valid steps.

    Args:
      logp: (...) log-probabilities of the expert's actions under the current policy.
      entropy: (...) entropy of the current policy (reported, not optimised).
      mask: (...) bool, valid steps (an expert label exists there).
    Returns:
      (total loss (), ``LossStats`` with the NLL as ``policy``; the PPO-only terms 0).
    """
    nll = -masked_mean(jnp.where(mask, logp, 0.0), mask)
    zero = jnp.zeros((), jnp.float32)
    stats = LossStats(total=nll, policy=nll, value=zero,
                      entropy=jax.lax.stop_gradient(masked_mean(entropy, mask)),
                      approx_kl=zero, clip_fraction=zero,
                      valid_steps=jnp.sum(mask.astype(jnp.float32)))
    return nll, stats

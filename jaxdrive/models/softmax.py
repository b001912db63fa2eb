"""Masked softmax over several score blocks sharing one normaliser (used by the scene
encoder: null / partner / road tokens, and the temporal decoder: cache / segment)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Masked score: exp underflows to exactly 0; unlike -inf it gives no NaN in gradients.
MASKED_SCORE = -1e30


def joint_softmax(scores, masks) -> list[jax.Array]:
    """Softmax over the last axis of all blocks together.

    Args:
      scores: sequence of (..., S_i) arrays with the same leading dims.
      masks: matching sequence of bool arrays broadcastable to them; every row must
        have at least one True over all blocks.
    Returns:
      A list of float32 weights, one per block, masked entries exactly 0.
    """
    scores = [jnp.where(m, s.astype(jnp.float32), MASKED_SCORE)
              for s, m in zip(scores, masks, strict=True)]
    top = jax.lax.stop_gradient(
        jnp.max(jnp.stack([jnp.max(s, axis=-1, initial=MASKED_SCORE) for s in scores]),
                axis=0))
    exps = [jnp.exp(s - top[..., None]) for s in scores]
    z = sum(jnp.sum(e, axis=-1) for e in exps)
    return [e / z[..., None] for e in exps]

"""Action distributions for the policy heads: categorical (action grid) and scaled Beta.

Both are small pytrees with ``sample``, ``log_prob``, ``entropy`` and ``mode``; the
leading dims are any batch shape (agents, time, ...).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Categorical:
    """Categorical over a discrete action grid. ``logits``: (..., num_actions) float32."""

    logits: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        """(...) int32 action indices."""
        return jax.random.categorical(key, self.logits).astype(jnp.int32)

    def log_prob(self, action: jax.Array) -> jax.Array:
        """(...) float32 for (...) int action indices."""
        logp = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        """(...) float32, nats."""
        logp = jax.nn.log_softmax(self.logits)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

    def mode(self) -> jax.Array:
        """(...) int32, the most likely action index."""
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

    def kl(self, other: Categorical) -> jax.Array:
        """(...) float32, KL(self || other) in nats."""
        logp, logq = jax.nn.log_softmax(self.logits), jax.nn.log_softmax(other.logits)
        return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)


@struct.dataclass
class ScaledBeta:
    """Independent Beta per action dimension, mapped affinely onto ``[low, high]``.

    Attributes:
      alpha, beta: (..., D) float32, both > 1 (unimodal, no mass piled on the bounds).
      low, high: (D,) float32 action bounds.
    """

    alpha: jax.Array
    beta: jax.Array
    low: jax.Array
    high: jax.Array

    def _to_unit(self, action):
        u = (action - self.low) / (self.high - self.low)
        eps = 1e-6  # actions exactly on a bound would give log(0)
        return jnp.clip(u, eps, 1.0 - eps)

    def sample(self, key: jax.Array) -> jax.Array:
        """(..., D) float32 actions within ``[low, high]``."""
        u = jax.random.beta(key, self.alpha, self.beta)
        return (self.low + u * (self.high - self.low)).astype(jnp.float32)

    def log_prob(self, action: jax.Array) -> jax.Array:
        """(...) float32: summed over dimensions, with the affine map's Jacobian."""
        u = self._to_unit(action)
        a, b = self.alpha, self.beta
        logp = ((a - 1) * jnp.log(u) + (b - 1) * jnp.log1p(-u)
                - _log_beta_fn(a, b) - jnp.log(self.high - self.low))
        return jnp.sum(logp, axis=-1)

    def entropy(self) -> jax.Array:
        """(...) float32 differential entropy of the scaled distribution."""
        a, b = self.alpha, self.beta
        dg = jax.scipy.special.digamma
        h = (_log_beta_fn(a, b) - (a - 1) * dg(a) - (b - 1) * dg(b) + (a + b - 2) * dg(a + b)
             + jnp.log(self.high - self.low))
        return jnp.sum(h, axis=-1)

    def mode(self) -> jax.Array:
        """(..., D) float32, each dimension's mode ``(alpha - 1) / (alpha + beta - 2)`` mapped
        onto ``[low, high]``."""
        u = (self.alpha - 1) / jnp.maximum(self.alpha + self.beta - 2, 1e-6)
        return (self.low + u * (self.high - self.low)).astype(jnp.float32)

    def kl(self, other: ScaledBeta) -> jax.Array:
        """(...) float32, KL(self || other) in nats, summed over dimensions (both on the
        same bounds: the affine map cancels). The closed form of two Beta densities:
        ln B(a2, b2) - ln B(a1, b1) + (a1 - a2) psi(a1) + (b1 - b2) psi(b1)
        + (a2 - a1 + b2 - b1) psi(a1 + b1)."""
        a1, b1, a2, b2 = self.alpha, self.beta, other.alpha, other.beta
        dg = jax.scipy.special.digamma
        kl = (_log_beta_fn(a2, b2) - _log_beta_fn(a1, b1) + (a1 - a2) * dg(a1)
              + (b1 - b2) * dg(b1) + (a2 - a1 + b2 - b1) * dg(a1 + b1))
        return jnp.sum(kl, axis=-1)


def _log_beta_fn(a, b):
    g = jax.scipy.special.gammaln
    return g(a) + g(b) - g(a + b)

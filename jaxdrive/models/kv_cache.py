"""Per-agent KV cache of the temporal decoder, and the attention masks built from it.

Every agent row has its own ring buffer of ``S`` slots (the horizon), its own write
index and per-slot episode positions, so agents reset at different times (gemma-style
caches with one write index per batch cannot). A slot is attended from a query at
position ``p`` iff it holds a position of the same episode within the horizon and was
not written while the agent was removed:

    attend = (pos >= 0) & (pos <= p) & (p - pos < S) & ~garbage      (plus the own slot)

Resetting an agent sets its positions to -1; K and V need not be cleared.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
    """Cached keys/values of N agents.

    Attributes:
      k, v: (L, N, heads, S, head_dim) keys and values per decoder layer, agent, head
        and slot (layer-major, so that one layer's block is contiguous; head-major
        within a row, so that one query's attention is one contraction over contiguous
        slots).
      pos: (N, S) int32, position within the episode of each slot's step; -1 = empty.
      garbage: (N, S) bool, the slot was written while the agent was removed.
      next_pos: (N,) int32, position of the agent's next step (steps so far this episode).
    """

    k: jax.Array
    v: jax.Array
    pos: jax.Array
    garbage: jax.Array
    next_pos: jax.Array

    @property
    def horizon(self) -> int:
        """() int: S, cache slots per agent."""
        return self.pos.shape[-1]

    @classmethod
    def create(cls, num_agents: int, num_layers: int, horizon: int, heads: int,
               head_dim: int, dtype=jnp.float32) -> KVCache:
        """An empty cache (every slot empty, positions start at 0)."""
        shape = (num_layers, num_agents, heads, horizon, head_dim)
        return cls(
            k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
            pos=jnp.full((num_agents, horizon), -1, jnp.int32),
            garbage=jnp.zeros((num_agents, horizon), bool),
            next_pos=jnp.zeros((num_agents,), jnp.int32),
        )

    def rows(self, idx: jax.Array) -> KVCache:
        """The cache of the agent rows ``idx`` (M,) int, in that order (M agents)."""
        return KVCache(k=self.k[:, idx], v=self.v[:, idx], pos=self.pos[idx],
                       garbage=self.garbage[idx], next_pos=self.next_pos[idx])

    def reset(self, mask: jax.Array) -> KVCache:
        """Empty the rows where ``mask`` (N,) bool: a new episode starts there."""
        return self.replace(
            pos=jnp.where(mask[:, None], -1, self.pos),
            garbage=self.garbage & ~mask[:, None],
            next_pos=jnp.where(mask, 0, self.next_pos),
        )


# The agent-row axis of each ``KVCache`` leaf: k, v are (layers, rows, ...), the rest
# rows first (for splitting a cache over devices or groups of rows).
ROW_AXES = KVCache(k=1, v=1, pos=0, garbage=0, next_pos=0)


def slot_mask(slot_pos: jax.Array, slot_garbage: jax.Array, query_pos: jax.Array,
              horizon: int) -> jax.Array:
    """Which slots a query may attend (before adding its own slot).

    Args:
      slot_pos: (..., S) int32 slot positions (-1 = empty); slot_garbage: (..., S) bool.
      query_pos: (...) int32 position of the query.
    Returns:
      (..., S) bool.
    """
    q = query_pos[..., None]
    return (slot_pos >= 0) & (slot_pos <= q) & (q - slot_pos < horizon) & ~slot_garbage


def positions_in_segment(first: jax.Array, start_pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Positions within the episode and episode ids of a (B, T) segment.

    Args:
      first: (B, T) bool, the step starts a new episode (the cache is reset before it).
      start_pos: (B,) int32, the cache's ``next_pos`` at the segment start.
    Returns:
      pos: (B, T) int32; the step count since the episode start (continuing
        ``start_pos`` until the first ``first``).
      episode: (B, T) int32, 0 for steps of the episode in the cache, k after the k-th
        ``first`` of the segment.
    """
    t = jnp.arange(first.shape[1], dtype=jnp.int32)
    last_first = jax.lax.cummax(jnp.where(first, t, -1), axis=1)
    pos = jnp.where(last_first >= 0, t - last_first, start_pos[:, None] + t)
    episode = jnp.cumsum(first.astype(jnp.int32), axis=1)
    return pos.astype(jnp.int32), episode

"""Temporal decoder: causal attention over an agent's own past step embeddings.

Two paths share one set of parameters:

- ``step``: one step of N agents; reads and writes a ``KVCache`` (rollout).
- ``sequence``: a (B, T) segment at once with the cache at the segment start as context
  (training); episode boundaries come from ``first``, positions continue the cache's.

Both build the same mask (``kv_cache`` module doc): same episode, causal, within the
horizon, not garbage (except the query's own step), so at every step their outputs
agree to float rounding. Positions within the episode are added as sinusoidal
encodings; they keep counting across trial boundaries and restart with the episode.
``step(..., return_attention=True)`` also returns the attention weights over the cache
(``jaxdrive.inspect`` plots them); without it nothing is computed differently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxdrive.models.kv_cache import KVCache, positions_in_segment, slot_mask
from jaxdrive.models.softmax import joint_softmax
from jaxdrive.parallel import rows_are_split


def sinusoid(pos: jax.Array, dim: int) -> jax.Array:
    """(...) int positions -> (..., dim) float32 encodings (Vaswani et al. 2017)."""
    i = jnp.arange(dim // 2, dtype=jnp.float32)
    freq = jnp.exp(-jnp.log(10000.0) * 2.0 * i / dim)
    ang = pos.astype(jnp.float32)[..., None] * freq
    return jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], axis=-1)


def attention(q: jax.Array, blocks, batched: bool = False) -> jax.Array:
    """Softmax attention over several key blocks with one normaliser (training's
    segments: the cache block and the segment's own).

    Args:
      q: (B, T, heads, head_dim) queries.
      blocks: sequence of (k, v, mask): k, v (B, heads, S_i, head_dim) (head-major, as
        the cache stores them), mask (B, T, S_i) bool; every query must have at least
        one True over all blocks.
      batched: one contraction with a heads axis instead of one per head
        (``PolicyConfig.attention_heads``).
    Returns:
      (B, T, heads, head_dim).
    """
    scale = 1.0 / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
    if batched:
        scores = [jnp.einsum("bthd,bhsd->bths", q, k).astype(jnp.float32) * scale
                  for k, _, _ in blocks]
        weights = joint_softmax(scores, [mask[:, :, None, :] for _, _, mask in blocks])
        return sum(jnp.einsum("bths,bhsd->bthd", w.astype(v.dtype), v)
                   for w, (_, v, _) in zip(weights, blocks, strict=True))
    heads = []
    # One head at a time: XLA CPU runs these batched contractions much faster without
    # a heads axis.
    for h in range(q.shape[2]):
        scores = [jnp.einsum("btd,bsd->bts", q[:, :, h], k[:, h]).astype(jnp.float32)
                  * scale for k, _, _ in blocks]
        weights = joint_softmax(scores, [mask for _, _, mask in blocks])
        heads.append(sum(jnp.einsum("bts,bsd->btd", w.astype(v.dtype), v[:, h])
                         for w, (_, v, _) in zip(weights, blocks, strict=True)))
    return jnp.stack(heads, axis=2)


def attention_step(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array):
    """One query per row over its cache: the rollout's attention.

    One contraction with a heads axis over the head-major cache: on XLA CPU 2x faster
    than a contraction per head here (measured in ``docs/benchmarks.md``), whatever
    ``attention``'s layout.

    Args:
      q: (N, heads, head_dim); k, v: (N, heads, S, head_dim); mask: (N, S) bool, at
        least one True per row.
    Returns:
      (N, heads, head_dim) outputs and (N, heads, S) float32 weights (masked entries
      exactly 0).
    """
    scale = 1.0 / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
    scores = jnp.einsum("nhd,nhsd->nhs", q, k).astype(jnp.float32) * scale
    (weights,) = joint_softmax([scores], [mask[:, None, :]])
    return jnp.einsum("nhs,nhsd->nhd", weights.astype(v.dtype), v), weights


class DecoderLayer(nn.Module):
    """Pre-LayerNorm transformer layer whose attention is supplied by the caller."""

    model_dim: int
    heads: int
    mlp_ratio: int = 2
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        """Flax setup: LayerNorms, the fused QKV and output projections, the MLP."""
        d, dt = self.model_dim, self.dtype
        self.ln_attn = nn.LayerNorm(dtype=dt)
        self.qkv = nn.Dense(3 * d, dtype=dt)
        self.out = nn.Dense(d, dtype=dt)
        self.ln_mlp = nn.LayerNorm(dtype=dt)
        self.fc1 = nn.Dense(self.mlp_ratio * d, dtype=dt)
        self.fc2 = nn.Dense(d, dtype=dt)

    def project(self, x: jax.Array):
        """(..., d) -> q, k, v each (..., heads, head_dim)."""
        qkv = self.qkv(self.ln_attn(x))
        shape = x.shape[:-1] + (self.heads, self.model_dim // self.heads)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def finish(self, x: jax.Array, attended: jax.Array) -> jax.Array:
        """Residual attention output and MLP: (..., d), (..., heads, head_dim) -> (..., d)."""
        x = x + self.out(attended.reshape(x.shape))
        return x + self.fc2(nn.relu(self.fc1(self.ln_mlp(x))))

    def __call__(self, x):  # used only to create the parameters
        q, k, v = self.project(x)
        return self.finish(x, v)


class TemporalDecoder(nn.Module):
    """Causal attention over the agent's own past within the episode, through a cache."""

    model_dim: int
    heads: int
    num_layers: int
    mlp_ratio: int = 2
    dtype: jnp.dtype = jnp.float32
    batched_heads: bool = False  # ``attention``'s layout (no parameters depend on it)

    def setup(self):
        """Flax setup: ``num_layers`` ``DecoderLayer`` s."""
        self.layers = [DecoderLayer(self.model_dim, self.heads, self.mlp_ratio, self.dtype)
                       for _ in range(self.num_layers)]

    def __call__(self, x):  # used only to create the parameters
        for layer in self.layers:
            x = layer(x)
        return x

    def step(self, x: jax.Array, cache: KVCache, removed: jax.Array,
             return_attention: bool = False):
        """One step of N agents.

        Args:
          x: (N, d) scene embeddings of this step.
          cache: ``KVCache`` for N agents (already reset where this step starts an
            episode).
          removed: (N,) bool, agents removed in this step's observation (their slot is
            marked garbage for later queries).
          return_attention: also return each layer's attention weights (inspection).
        Returns:
          ((N, d) outputs, updated cache); with ``return_attention`` a third item, the
          (num_layers, N, heads, S) float32 weights of this step's query over the
          updated cache's slots (slot ``s`` holds the step at position
          ``cache.pos[:, s]``; empty, out-of-horizon and garbage slots get exactly 0,
          the own slot is always attended).
        """
        s = cache.horizon
        p = cache.next_pos
        x = (x + sinusoid(p, self.model_dim)).astype(self.dtype)
        slot = p % s
        own = jnp.arange(s)[None, :] == slot[:, None]
        pos = jnp.where(own, p[:, None], cache.pos)
        mask = slot_mask(pos, cache.garbage & ~own, p, s)  # (N, S)
        k_cache, v_cache = cache.k, cache.v
        # Each row writes its own slot. On one device a scatter at (row, slot) pairs,
        # done in place. With rows split over devices (``rows_split``) a per-row update
        # (vmapped over rows): XLA then sees that a row only touches its own cache and
        # writes without communication (the scatter becomes per-step all-gathers), but on
        # CPU it copies the cache, ~100x slower than the in-place scatter.
        rows = jnp.arange(x.shape[0])
        write = jax.vmap(lambda c, i, u: jax.lax.dynamic_update_index_in_dim(c, u, i, 1))
        split = rows_are_split()
        layer_weights = []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.project(x)  # (N, heads, head_dim)
            k, v = k.astype(k_cache.dtype), v.astype(v_cache.dtype)
            if split:
                k_cache = k_cache.at[i].set(write(k_cache[i], slot, k))
                v_cache = v_cache.at[i].set(write(v_cache[i], slot, v))
            else:
                k_cache = k_cache.at[i, rows, :, slot].set(k)
                v_cache = v_cache.at[i, rows, :, slot].set(v)
            a, w = attention_step(q, k_cache[i], v_cache[i], mask)
            if return_attention:
                layer_weights.append(w)
            x = layer.finish(x, a)
        cache = KVCache(
            k=k_cache, v=v_cache, pos=pos,
            garbage=jnp.where(own, removed[:, None], cache.garbage), next_pos=p + 1,
        )
        if return_attention:
            return x, cache, jnp.stack(layer_weights)
        return x, cache

    def sequence(self, x: jax.Array, cache: KVCache, first: jax.Array, removed: jax.Array):
        """A (B, T) segment at once.

        Args:
          x: (B, T, d) scene embeddings.
          cache: ``KVCache`` for B agents as it was before the segment's first step
            (not reset for it: ``first[:, 0]`` does that).
          first: (B, T) bool, the step starts a new episode.
          removed: (B, T) bool, the agent was removed in that step's observation.
        Returns:
          (B, T, d) outputs, equal to running ``step`` over the segment.
        """
        t_len, s = x.shape[1], cache.horizon
        pos, episode = positions_in_segment(first, cache.next_pos)
        x = (x + sinusoid(pos, self.model_dim)).astype(self.dtype)
        t = jnp.arange(t_len)
        own = t[:, None] == t[None, :]
        seg_mask = ((episode[:, :, None] == episode[:, None, :]) & (t[:, None] >= t[None, :])
                    & (pos[:, :, None] - pos[:, None, :] < s)
                    & (~removed[:, None, :] | own[None]))
        ctx_mask = (episode == 0)[:, :, None] & slot_mask(
            cache.pos[:, None, :], cache.garbage[:, None, :], pos, s)
        heads_first = lambda a: jnp.swapaxes(a, 1, 2)  # (B, T, heads, hd) -> (B, heads, T, hd)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.project(x)
            a = attention(q, [(cache.k[i].astype(k.dtype), cache.v[i].astype(v.dtype),
                               ctx_mask), (heads_first(k), heads_first(v), seg_mask)],
                          batched=self.batched_heads)
            x = layer.finish(x, a)
        return x

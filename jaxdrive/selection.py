"""Exact "k nearest" selection: the indices of the k smallest keys of each row, smallest
first, ties by the lower index (what ``lax.top_k(-key, k)`` returns).

On CPU, ``lax.top_k`` is a per-row partial sort whose cost grows with ``k``: choosing the
63 nearest of 127 partners spent ~40 % of the env step there (``docs/benchmarks.md``).
For many picks (``k > TOP_K_MAX_K``) ``smallest_k`` runs a bitonic sorting network
instead, with the rows on the minor axis so that every compare-exchange is a vector
operation over rows; its cost does not depend on ``k`` (1,024 rows of 127 keys: 1.7 ms
for 63 picks against top_k's 4.9 ms on their own; the env step of 128-vehicle procedural
scenes 1.2x faster). Up to 32 picks ``lax.top_k`` is faster inside the env step (the
whole step, 64-object scenes: 16 or 31 of 63 partners 1.7-2.6x, the 4 nearest of 32
lights, 7 or 8 partners); the k arg-min passes once used for a few picks were the
slowest way of all. Other backends, and rows of fewer than ``NETWORK_MIN_KEYS`` keys,
keep ``lax.top_k`` (``lax.platform_dependent``); all give the same indices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["NETWORK_MIN_KEYS", "TOP_K_MAX_K", "smallest_k", "smallest_k_network"]

# Rows shorter than this keep ``lax.top_k`` on CPU too: the network's gain there is tens
# of microseconds per step (e.g. 16 light slots), while its dozens of small fusions add
# about a second to every compilation of the env step.
NETWORK_MIN_KEYS = 32
# Up to this many picks ``lax.top_k`` beats the network in the env step on CPU (measured
# with ``bench env``: 16 and 31 of 63 keys, 31 of 127; the network wins at 63 of 127).
TOP_K_MAX_K = 32


def smallest_k(key: jax.Array, k: int) -> jax.Array:
    """(..., N) float32 keys -> (..., k) int32 indices of the k smallest, ascending, ties
    by lower index (``k <= N``). ``+inf`` keys (masked entries) come last, by index."""
    n = key.shape[-1]
    if not 0 <= k <= n:
        raise ValueError(f"smallest_k: k = {k} must be in [0, {n}] (the row length)")
    if k == 0:
        return jnp.zeros(key.shape[:-1] + (0,), jnp.int32)
    top_k = lambda x: jax.lax.top_k(-x, k)[1].astype(jnp.int32)  # noqa: E731
    if n < NETWORK_MIN_KEYS or k <= TOP_K_MAX_K:
        return top_k(key)
    return jax.lax.platform_dependent(key, cpu=lambda x: smallest_k_network(x, k),
                                      default=top_k)


def smallest_k_network(key: jax.Array, k: int) -> jax.Array:
    """``smallest_k`` by a bitonic sorting network on any backend (the CPU branch)."""
    lead, n = key.shape[:-1], key.shape[-1]
    p = 1 << max(n - 1, 0).bit_length()  # row length padded to a power of two
    rows = key.reshape(-1, n).astype(jnp.float32)
    r = rows.shape[0]
    # (P, R): keys of one position across all rows are contiguous.
    vals = jnp.pad(rows, ((0, 0), (0, p - n)), constant_values=jnp.inf).T
    idx = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[:, None], (p, r))
    size = 2
    while size <= p:  # bitonic sort: merge runs of ``size``
        half = size // 2
        while half >= 1:  # compare-exchange positions i and i + half within blocks of 2*half
            blocks = p // (2 * half)
            kv = vals.reshape(blocks, 2, half, r)
            iv = idx.reshape(blocks, 2, half, r)
            ka, kb, ia, ib = kv[:, 0], kv[:, 1], iv[:, 0], iv[:, 1]
            start = jnp.arange(blocks, dtype=jnp.int32) * (2 * half)
            ascending = ((start & size) == 0)[:, None, None]
            a_first = (ka < kb) | ((ka == kb) & (ia < ib))
            swap = a_first != ascending
            vals = jnp.stack([jnp.where(swap, kb, ka), jnp.where(swap, ka, kb)],
                             axis=1).reshape(p, r)
            idx = jnp.stack([jnp.where(swap, ib, ia), jnp.where(swap, ia, ib)],
                            axis=1).reshape(p, r)
            half //= 2
        size *= 2
    return idx[:k].T.reshape(lead + (k,))

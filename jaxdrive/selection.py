"""Exact "k nearest" selection: the indices of the k smallest keys of each row, smallest
first, ties by the lower index (what ``lax.top_k(-key, k)`` returns).

On CPU, ``lax.top_k`` is a per-row custom call: the partner selection of 128-agent scenes
spent ~40 % of the env step there (``docs/benchmarks.md``). ``smallest_k`` runs a bitonic
sorting network instead, with the rows on the minor axis so that every compare-exchange
is a vector operation over rows: 1.9x faster for 1,024 rows of 127 keys. For a few of
many (``k <= PASSES_MAX_K``: the 4 nearest of 32 traffic lights, 8 partners of 63) it
runs ``k`` selection passes instead (each a minimum over the row, then the first index
holding it): 2k reductions against the network's dozens of stages (the light tokens of
16 real-scene envs: 0.41 -> 0.14 ms a step). Other backends, and rows of fewer
than ``NETWORK_MIN_KEYS`` keys, keep ``lax.top_k`` (``lax.platform_dependent``); all give
the same indices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["NETWORK_MIN_KEYS", "PASSES_MAX_K", "smallest_k", "smallest_k_network",
           "smallest_k_passes"]

# Rows shorter than this keep ``lax.top_k`` on CPU too: the network's gain there is tens
# of microseconds per step (e.g. 16 light slots), while its dozens of small fusions add
# about a second to every compilation of the env step.
NETWORK_MIN_KEYS = 32
# Up to this many picks, k selection passes beat the sorting network on CPU.
PASSES_MAX_K = 8


def smallest_k(key: jax.Array, k: int) -> jax.Array:
    """(..., N) float32 keys -> (..., k) int32 indices of the k smallest, ascending, ties
    by lower index (``k <= N``). ``+inf`` keys (masked entries) come last, by index."""
    n = key.shape[-1]
    if not 0 <= k <= n:
        raise ValueError(f"smallest_k: k = {k} must be in [0, {n}] (the row length)")
    if k == 0:
        return jnp.zeros(key.shape[:-1] + (0,), jnp.int32)
    top_k = lambda x: jax.lax.top_k(-x, k)[1].astype(jnp.int32)  # noqa: E731
    if n < NETWORK_MIN_KEYS:
        return top_k(key)
    cpu = smallest_k_passes if k <= PASSES_MAX_K else smallest_k_network
    return jax.lax.platform_dependent(key, cpu=lambda x: cpu(x, k), default=top_k)


def smallest_k_passes(key: jax.Array, k: int) -> jax.Array:
    """``smallest_k`` by ``k`` selection passes on any backend (the CPU branch for small
    ``k``): each pass takes the smallest key not yet taken and the lowest index holding
    it. NaN keys count as ``+inf``."""
    lead, n = key.shape[:-1], key.shape[-1]
    rows = key.reshape(-1, n).astype(jnp.float32)
    # (N, R): a reduction over keys is an elementwise minimum of R-long vectors.
    vals = jnp.where(jnp.isnan(rows), jnp.inf, rows).T
    pos = jnp.arange(n, dtype=jnp.int32)[:, None]
    taken = jnp.zeros(vals.shape, bool)
    picks = []
    for _ in range(k):
        # The first position of the smallest key not taken, by one arg-min reduction: a
        # minimum followed by a search for a key equal to it found none at times, inside
        # the env's fused step (real scenes, 4 of 32 lights), and left the pick out of range.
        pick = jnp.argmin(jnp.where(taken, jnp.inf, vals), axis=0).astype(jnp.int32)
        # Where every key left is +inf the arg-min may land on a taken position: the
        # first position not taken holds the smallest key then.
        again = jnp.any(taken & (pos == pick), axis=0)
        pick = jnp.where(again, jnp.argmin(taken, axis=0).astype(jnp.int32), pick)
        picks.append(pick)
        taken = taken | (pos == pick)
    return jnp.stack(picks, axis=-1).reshape(lead + (k,))


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

"""Dense rows: run a per-row function only on the rows that matter, at fixed capacities.

Most rows of a driving batch are padding: empty agent slots, agents that already
finished, co-players the learner does not drive. ``dense_apply`` gathers the rows a
mask selects into a buffer of static size, runs the function there and scatters the
results back (zeros elsewhere). With several capacities (e.g. a quarter, half and three
quarters of the rows) the smallest that holds the selected rows runs (``lax.switch``:
one branch runs), so the work follows the number of live rows as agents finish, at the
price of one compiled copy of the function per capacity. When more rows are selected
than the largest buffer holds, the whole batch runs instead, so nothing is ever
dropped; the caller counts those fallbacks with ``overflowed``.

The function must treat rows independently (an encoder applied per agent-step): then
the selected rows' outputs equal the full batch's, up to the float rounding of a
different batch size.

Rows split over devices (a mesh, rows sharded along their axis) are packed in
``groups``: the M rows as G contiguous blocks of M / G (one per device), each block's
selected rows into its own M / G-th of a buffer, so every gather and scatter stays on
the device that holds the rows; the buffer that runs is the smallest that holds every
block's selection (one small reduction across devices picks it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class DenseRows:
    """Which rows to compute, and how many fit (a pytree: ``capacities`` are static).

    Attributes:
      mask: (M,) bool, rows whose outputs are needed.
      capacities: int or tuple of ints, sizes of the dense buffers (the smallest that
        holds the selected rows runs; any ``>= M`` means the full batch).
      fits: the caller guarantees that the selection fits the one capacity given (it
        chose the buffer itself, e.g. around a whole gradient computation, whose
        ``lax.switch`` would otherwise carry every branch's residuals): no branches.
      groups: G, pack each of G contiguous blocks of the rows into its own share of a
        buffer (rows split over G devices); M and every capacity below M must be
        multiples of G.
    """

    mask: jax.Array
    capacities: int | tuple[int, ...] = struct.field(pytree_node=False)
    fits: bool = struct.field(pytree_node=False, default=False)
    groups: int = struct.field(pytree_node=False, default=1)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The distinct capacities below M, ascending (empty: always the full batch)."""
        caps = (self.capacities,) if isinstance(self.capacities, int) else self.capacities
        sizes = tuple(sorted({int(c) for c in caps if c < self.mask.shape[0]}))
        if self.mask.shape[0] % self.groups or any(c % self.groups for c in sizes):
            raise ValueError(f"DenseRows of {self.mask.shape[0]} rows in {self.groups} "
                             f"groups: the rows and the capacities {sizes} must be "
                             "multiples of the groups")
        return sizes


def capacity_for(fraction: float | None, rows: int, multiple: int = 8) -> int:
    """Static capacity for ``fraction`` of ``rows``, rounded up to ``multiple`` (at most
    ``rows``; None = ``rows``, i.e. off)."""
    if fraction is None:
        return rows
    want = math.ceil(math.ceil(fraction * rows) / multiple) * multiple
    return int(min(rows, max(multiple, want)))


def capacities_for(fractions, rows: int, multiple: int = 8) -> tuple[int, ...]:
    """``capacity_for`` of each of ``fractions`` (None: ``(rows,)``, off)."""
    if fractions is None:
        return (rows,)
    return tuple(sorted({capacity_for(f, rows, multiple) for f in fractions}))


def row_step_buffers(shares, rows: int, steps_per_row: int, pack_rows: bool = True,
                     multiple: int = 8) -> tuple[tuple[int, int], ...]:
    """Buffers of a (rows, T) batch whose steps are computed per step except for one
    per-row pass (a temporal decoder): ``(row capacity, step capacity)`` pairs, ascending
    in both, each smaller than the batch in one of them; empty: no buffer (padded).

    For each share ``s`` (ascending) the pair (s of the rows, s of the steps), preceded
    by (s of the rows, the previous share of the steps): live rows usually take a larger
    share than live steps (a row is live when any of its T steps is), and one ladder
    instead of every combination keeps the compiled copies few. The last pair is (every
    row, the largest step share). Without ``pack_rows`` every pair has all rows.
    Capacities are multiples of ``multiple`` (``capacity_for``).
    """
    full = rows * steps_per_row
    pairs, last = [], None
    for share in sorted(shares or ()):
        row_cap = capacity_for(share, rows, multiple) if pack_rows else rows
        step_cap = capacity_for(share, full, multiple)
        if last is not None:
            pairs.append((row_cap, last))
        pairs.append((row_cap, step_cap))
        last = step_cap
    if last is not None:
        pairs.append((rows, last))
    kept = []
    for pair in pairs:
        if (pair[0] < rows or pair[1] < full) and pair not in kept:
            kept.append(pair)
    return tuple(kept)


def dense_indices(mask: jax.Array, capacity: int,
                  groups: int = 1) -> tuple[jax.Array, jax.Array]:
    """The rows ``mask`` (M,) selects, packed: ``(idx, used)``, both (capacity,): the
    selected rows' indices in order, then index 0 in the unused slots (``used`` False).
    With ``groups`` G: slots ``[g * capacity / G, (g + 1) * capacity / G)`` hold block
    g's rows, indices within the block (``take_rows`` / ``put_rows`` read them)."""
    if groups > 1:
        idx, used = jax.vmap(lambda m: dense_indices(m, capacity // groups))(
            mask.reshape(groups, -1))
        return idx.reshape(capacity), used.reshape(capacity)
    (idx,) = jnp.nonzero(mask, size=capacity, fill_value=0)
    return idx, jnp.arange(capacity) < jnp.sum(mask.astype(jnp.int32))


def take_rows(x: jax.Array, idx: jax.Array, groups: int = 1, axis: int = 0) -> jax.Array:
    """``x`` (M, ...) at the rows ``idx`` of ``dense_indices`` (same ``groups``):
    (capacity, ...), each block's rows gathered within the block; rows along ``axis``."""
    if axis:
        return jnp.moveaxis(take_rows(jnp.moveaxis(x, axis, 0), idx, groups), 0, axis)
    if groups == 1:
        return x[idx]
    blocks = x.reshape((groups, x.shape[0] // groups) + x.shape[1:])  # not -1: size-0 leaves
    return jax.vmap(lambda a, i: a[i])(blocks, idx.reshape(groups, -1)).reshape(
        idx.shape + x.shape[1:])


def put_rows(out: jax.Array, idx: jax.Array, used: jax.Array, m: int,
             groups: int = 1) -> jax.Array:
    """``take_rows``' inverse: (M, ...) zeros with ``out`` (capacity, ...) at the used
    slots' rows; unused slots (duplicates of a block's row 0) are dropped."""
    def put(o, i, u, rows):
        return jnp.zeros((rows,) + o.shape[1:], o.dtype).at[jnp.where(u, i, rows)].set(
            o, mode="drop")

    if groups == 1:
        return put(out, idx, used, m)
    split = lambda a: a.reshape((groups, a.shape[0] // groups) + a.shape[1:])
    return jax.vmap(lambda o, i, u: put(o, i, u, m // groups))(
        split(out), split(idx), split(used)).reshape((m,) + out.shape[1:])


def selected_count(mask: jax.Array, groups: int = 1) -> jax.Array:
    """() int32: the buffer size that ``mask`` (M,) needs: the number of selected rows,
    or with ``groups`` G, G times the most that one block selects (each block packs into
    its own 1/G of a buffer)."""
    if groups == 1:
        return jnp.sum(mask.astype(jnp.int32))
    return groups * jnp.max(jnp.sum(mask.reshape(groups, -1).astype(jnp.int32), axis=1))


def which_buffer(mask: jax.Array, sizes: tuple[int, ...], groups: int = 1) -> jax.Array:
    """() int32: index of the smallest of ``sizes`` (ascending) that holds the rows
    ``mask`` selects (in every one of ``groups`` blocks); ``len(sizes)`` when none does
    (the full batch)."""
    count = selected_count(mask, groups)
    return jnp.sum((jnp.asarray(sizes, jnp.int32) < count).astype(jnp.int32))


def which_row_step_buffer(mask: jax.Array, buffers: tuple[tuple[int, int], ...],
                          groups: int = 1) -> jax.Array:
    """() int32: index of the first of ``buffers`` (``row_step_buffers``) that holds the
    rows and the steps ``mask`` (R, T) selects (a row counts when any of its steps is
    selected; with ``groups``, in every block of R / G rows); ``len(buffers)`` when none
    does (the padded batch)."""
    # Both columns ascend: the first pair holding both counts is the later of the first
    # pairs holding each.
    return jnp.maximum(
        which_buffer(jnp.any(mask, axis=1), tuple(r for r, _ in buffers), groups),
        which_buffer(mask.reshape(-1), tuple(s for _, s in buffers), groups))


def overflowed(rows: DenseRows) -> jax.Array:
    """() bool: the mask selects more rows than the largest buffer holds (the full batch
    runs; never with no buffer below M)."""
    sizes = rows.sizes
    if not sizes:
        return jnp.zeros((), bool)
    return selected_count(rows.mask, rows.groups) > sizes[-1]


def dense_apply(fn, tree, rows: DenseRows | None):
    """``fn(tree)`` computed on the rows ``rows.mask`` selects.

    Args:
      fn: pytree with leading axis M -> pytree with leading axis M, row-independent.
      tree: its input.
      rows: ``DenseRows`` for the M rows, or None (the full batch).
    Returns:
      ``fn``'s output with leading axis M: equal to ``fn(tree)`` at selected rows; zeros
      at the others when a dense buffer ran, ``fn(tree)`` there when the full batch ran
      (more rows selected than the largest capacity).
    """
    if rows is None or not rows.sizes:
        return fn(tree)
    m, g = rows.mask.shape[0], rows.groups

    def dense(cap, tree):
        idx, used = dense_indices(rows.mask, cap, g)
        out = fn(jax.tree.map(lambda x: take_rows(x, idx, g), tree))
        return jax.tree.map(lambda o: put_rows(o, idx, used, m, g), out)

    sizes = rows.sizes
    if rows.fits:
        if len(sizes) != 1:
            raise ValueError(f"DenseRows(fits=True) needs one capacity below the {m} rows, "
                             f"got {rows.capacities}")
        return dense(sizes[0], tree)
    branches = [lambda t, c=c: dense(c, t) for c in sizes] + [fn]
    return jax.lax.switch(which_buffer(rows.mask, sizes, g), branches, tree)

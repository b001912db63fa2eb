"""Data parallelism: one ``data`` mesh axis over every device of every process.

Training and evaluation place batch-major arrays (environments, agent rows, scenarios)
along the ``data`` axis and replicate everything else (parameters, optimiser state, the
scene pool, PRNG keys). Programs stay written for the global batch: XLA partitions them
(GSPMD), and since JAX's PRNG is partitionable (``jax_threefry_partitionable``, on by
default) a sharded draw holds the same numbers as the unsharded one. So a run's results
depend on its global configuration, not on how many devices ran it (up to the order of
floating-point sums across devices).

On one device every helper here is the identity: the program is the single-device one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA = "data"


_ROWS_SPLIT = [False]


@contextlib.contextmanager
def rows_split(split: bool = True):
    """Within (at trace time): the batch rows being traced are split over devices, so
    per-row code should pick forms XLA partitions without communication (e.g. the KV
    cache write), even where another form is faster on one device."""
    before = _ROWS_SPLIT[0]
    _ROWS_SPLIT[0] = bool(split)
    try:
        yield
    finally:
        _ROWS_SPLIT[0] = before


def rows_are_split() -> bool:
    """Whether tracing happens inside ``rows_split()``."""
    return _ROWS_SPLIT[0]


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh named ``data`` over ``devices``, in that order; by default every
    device of every process, ordered by ``jax.make_mesh`` from the physical topology
    (on a TPU slice or a GPU node neighbours in the ring are neighbours on the
    interconnect, which the gradient all-reduce runs over)."""
    if devices is None:
        return jax.make_mesh((jax.device_count(),), (DATA,), axis_types=(AxisType.Auto,))
    return Mesh(np.array(list(devices)), (DATA,))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def along(mesh: Mesh, axis: int = 0) -> NamedSharding:
    """Split along array axis ``axis`` over the ``data`` devices."""
    return NamedSharding(mesh, PartitionSpec(*([None] * axis), DATA))


def check_divisible(count: int, key: str, mesh: Mesh) -> None:
    """Raises ValueError unless ``count`` (the value of config key ``key``) splits evenly
    over the mesh's devices; the message names both numbers and the nearest fits."""
    d = mesh.size
    if count % d == 0:
        return
    lower = max(d, count // d * d)
    raise ValueError(
        f"{key}={count} does not divide over the {d} devices of the data mesh "
        f"({jax.process_count()} process(es)); use a multiple of {d}, e.g. "
        f"--set {key}={lower} or --set {key}={lower + d}")


def constrain(tree, sharding):
    """``tree`` with its arrays laid out as ``sharding`` (inside jit): one
    ``NamedSharding`` for every leaf or a pytree of them matching ``tree``. None or a
    1-device mesh: unchanged."""
    leaves = jax.tree.leaves(sharding)
    if not leaves or leaves[0].mesh.size == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, sharding)


def to_global(tree, shardings):
    """Host or single-device arrays -> global arrays laid out as ``shardings`` (one
    ``NamedSharding`` or a matching pytree). Every process passes the same full values
    and each supplies the pieces its own devices hold; typed PRNG keys go through their
    key data. On one process this is ``jax.device_put``."""
    if not isinstance(shardings, NamedSharding):
        leaves, treedef = jax.tree.flatten(tree)
        sh = treedef.flatten_up_to(shardings)
        return treedef.unflatten([to_global(x, s) for x, s in zip(leaves, sh, strict=True)])
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: jax.device_put(x, shardings), tree)

    def one(x):
        if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
            data = one(jax.random.key_data(x))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, shardings, lambda idx: host[idx])

    return jax.tree.map(one, tree)


def gather_shares(local_tree):
    """Every process's ``local_tree`` (equal shapes), concatenated along axis 0 in process
    order, as host arrays on every process (the local tree itself on one process)."""
    if jax.process_count() == 1:
        return local_tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(local_tree, tiled=True)


def to_host(tree):
    """Global arrays (e.g. split over the devices of several processes) -> their whole
    values as numpy arrays on every process (``jax.device_get`` on one process)."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, jax.device_get(tree))
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def share(count: int, key: str) -> tuple[int, int]:
    """``[lo, hi)``: this process's equal part of ``count`` items (config key ``key``).

    Raises ValueError naming both numbers when ``count`` does not split over the
    processes."""
    n, p = jax.process_count(), jax.process_index()
    if count % n:
        raise ValueError(f"{key}={count} does not split over the {n} processes of this job; "
                         f"use a multiple of {n}")
    size = count // n
    return p * size, (p + 1) * size

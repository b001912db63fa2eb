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

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh named ``data`` over ``devices`` (default: every device of every
    process, ``jax.devices()``)."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.array(devices), (DATA,))


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

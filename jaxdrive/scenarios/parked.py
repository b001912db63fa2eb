"""Parked vehicles of a logged scene: vehicles that never move in their log.

Real WOMD scenes hold many parked cars (in lots and along kerbs, often outside the
mapped road edges). Rates quoted per vehicle mean little unless these are split off:
a parked car outside the road edges is "off-road" at every step without any driving.
``parked_vehicles`` gives the split used by ``experiments/real_scene_replay.py``
(rule and thresholds: ``docs/real_scene_replay.md``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdrive.types import ObjectLog, ObjectType

# Defaults, in gaps of the data (docs/real_scene_replay.md): the logged centres of
# parked vehicles in the real scenes stay within 0.36 m of each other and their logged
# speeds under 0.71 m/s; the slowest moving ones span 1.16 m or log 1.27 m/s.
PARKED_MAX_EXTENT = 0.5  # metres
PARKED_MAX_SPEED = 1.0  # m/s


def parked_vehicles(
    objects: ObjectLog,
    max_extent: float = PARKED_MAX_EXTENT,
    max_speed: float = PARKED_MAX_SPEED,
) -> jax.Array:
    """(..., A) bool: vehicles whose whole valid log stays put.

    A slot is parked when it is a vehicle (``ObjectType.VEHICLE``) with at least one
    valid step, every two of its valid logged centres lie less than ``max_extent``
    metres apart (the diameter of the set of centres, so the result does not depend on
    which step is taken as the reference), and its logged speed (``|vel|``) is below
    ``max_speed`` m/s at every valid step. The speed test catches vehicles seen for a
    step or two while driving, whose few centres are close together. Invalid steps are
    ignored (their positions are padding).

    Args:
      objects: an ``ObjectLog``, unbatched ((A, T) leaves) or with leading batch dims.
      max_extent: metres.
      max_speed: m/s.
    Returns:
      (..., A) bool.
    """
    xy = jnp.asarray(objects.xy, jnp.float32)
    valid = jnp.asarray(objects.valid, bool)
    diff = xy[..., :, None, :] - xy[..., None, :, :]  # (..., A, T, T, 2)
    both = valid[..., :, None] & valid[..., None, :]
    dist2 = jnp.where(both, jnp.sum(diff * diff, axis=-1), 0.0)
    extent2 = jnp.max(dist2, axis=(-1, -2))
    speed2 = jnp.sum(jnp.square(jnp.asarray(objects.vel, jnp.float32)), axis=-1)
    top_speed2 = jnp.max(jnp.where(valid, speed2, 0.0), axis=-1)
    vehicle = jnp.asarray(objects.type) == ObjectType.VEHICLE
    return (vehicle & jnp.any(valid, axis=-1) & (extent2 < max_extent ** 2)
            & (top_speed2 < max_speed ** 2))

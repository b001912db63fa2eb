"""The WOSAC challenge's reference agents, computed from the log (no simulation).

The Sim Agents Challenge (Montali et al., "The Waymo Open Sim Agents Challenge", NeurIPS
2023 Datasets and Benchmarks, arXiv 2305.12032) scores two reference agents beside the
submissions, and both are defined on the log alone:

- the **logged oracle**: the logged future itself. A simulated object must have a state
  at every future step, so where an object's log is invalid it is held at its last valid
  state (position and heading);
- **constant velocity**: each object keeps the velocity vector logged at the current step
  (the last step of the history) and its heading: ``xy(t) = xy(init) + v(init) t dt``.

The challenge simulates the objects valid at the current step; both functions return
those valid at every future step and every other object invalid (not simulated).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _simulated(valid: jax.Array, init_step: int, num_steps: int) -> jax.Array:
    """(A, T) -> (A, num_steps): the objects valid at ``init_step``, at every step."""
    return jnp.broadcast_to(valid[:, init_step, None], (valid.shape[0], num_steps))


def logged_oracle(
    xy: jax.Array, yaw: jax.Array, valid: jax.Array, init_step: int, num_steps: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The logged future, each object held at its last valid state across gaps.

    Args:
      xy: (A, T, 2) float32; yaw: (A, T) float32; valid: (A, T) bool, the log.
      init_step: the current step (the history is ``0 .. init_step``).
      num_steps: future steps wanted, ``init_step + num_steps < T``.
    Returns:
      xy (A, num_steps, 2), yaw (A, num_steps), valid (A, num_steps) of the steps
      ``init_step + 1 .. init_step + num_steps``.
    """
    t = jnp.arange(valid.shape[-1], dtype=jnp.int32)
    last = jax.lax.cummax(jnp.where(valid, t, -1), axis=1)  # last valid step so far
    last = jnp.maximum(last, 0)[:, init_step + 1:init_step + 1 + num_steps]
    held_xy = jnp.take_along_axis(xy, last[..., None], axis=1)
    held_yaw = jnp.take_along_axis(yaw, last, axis=1)
    return held_xy, held_yaw, _simulated(valid, init_step, num_steps)


def constant_velocity(
    xy: jax.Array, yaw: jax.Array, vel: jax.Array, valid: jax.Array, init_step: int,
    num_steps: int, dt: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Straight on at the velocity vector logged at ``init_step``, heading held.

    Args:
      xy: (A, T, 2) float32; yaw: (A, T) float32; vel: (A, T, 2) float32 world-frame
        m/s; valid: (A, T) bool, the log.
      init_step: the current step; num_steps: future steps wanted; dt: seconds per step.
    Returns:
      xy (A, num_steps, 2), yaw (A, num_steps), valid (A, num_steps) of the steps
      ``init_step + 1 .. init_step + num_steps``.
    """
    k = jnp.arange(1, num_steps + 1, dtype=jnp.float32)[None, :, None] * jnp.float32(dt)
    out_xy = xy[:, init_step, None, :] + vel[:, init_step, None, :] * k
    out_yaw = jnp.broadcast_to(yaw[:, init_step, None], (yaw.shape[0], num_steps))
    return out_xy, out_yaw, _simulated(valid, init_step, num_steps)


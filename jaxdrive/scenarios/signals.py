"""Traffic-light geometry and states shared by the simulator, observations, metrics and
rendering.

A scenario's lights (``jaxdrive.types.TrafficLights``) hold one state per logged step.
Logged lights replay with the scenario clock; procedural lights are written into the same
arrays from their phase cycle, so every consumer reads the light state of log step ``t``
the same way (``lights_at``) and a trial that rewinds the log clock rewinds the lights.

The stop line of light k is the segment through ``stop_xy[k]`` across its lane's
direction there (the direction of the lane's centre-line point nearest the stop point),
``STOP_LINE_HALF_WIDTH`` to either side. A light whose lane is absent from the roadgraph
has a zero direction and never counts a crossing.

Coarse colours (``LightColor``) group the WOMD states: red = ``STOP``, ``ARROW_STOP``,
``FLASHING_STOP`` is not red (it acts as a stop sign); yellow = ``CAUTION``,
``ARROW_CAUTION``, ``FLASHING_CAUTION``; green = ``GO``, ``ARROW_GO``.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

from jaxdrive.types import Roadgraph, RoadType, TrafficLights, TrafficLightState

# Half the width of the band across a lane within which crossing its stop line counts
# (WOMD lanes are ~3.5-4 m wide).
STOP_LINE_HALF_WIDTH = 2.0  # metres
RED_STATES = (TrafficLightState.STOP, TrafficLightState.ARROW_STOP)
YELLOW_STATES = (TrafficLightState.CAUTION, TrafficLightState.ARROW_CAUTION,
                 TrafficLightState.FLASHING_CAUTION)
GREEN_STATES = (TrafficLightState.GO, TrafficLightState.ARROW_GO)


class LightColor(enum.IntEnum):
    """Coarse light colour (observations, rendering)."""

    UNKNOWN = 0  # no valid state (or FLASHING_STOP / UNKNOWN)
    RED = 1
    YELLOW = 2
    GREEN = 3


NUM_LIGHT_COLORS = len(LightColor)


def _color_table() -> jax.Array:
    table = [int(LightColor.UNKNOWN)] * len(TrafficLightState)
    for states, color in ((RED_STATES, LightColor.RED), (YELLOW_STATES, LightColor.YELLOW),
                          (GREEN_STATES, LightColor.GREEN)):
        for s in states:
            table[int(s)] = int(color)
    return jnp.asarray(table, jnp.int32)


def color(state: jax.Array, valid: jax.Array) -> jax.Array:
    """(...) int32 ``LightColor`` of ``TrafficLightState`` values (UNKNOWN where invalid)."""
    c = _color_table()[jnp.clip(state, 0, len(TrafficLightState) - 1)]
    return jnp.where(valid, c, int(LightColor.UNKNOWN)).astype(jnp.int32)


def is_red(state: jax.Array, valid: jax.Array) -> jax.Array:
    """(...) bool: a valid ``STOP`` or ``ARROW_STOP``."""
    return valid & jnp.isin(state, jnp.asarray([int(s) for s in RED_STATES], jnp.int32))


def lights_at(lights: TrafficLights, t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """States of one scenario's lights at log step ``t`` (() int32, clipped to the log).

    Returns:
      state: (TL,) int32 ``TrafficLightState``; valid: (TL,) bool.
    """
    t = jnp.clip(t, 0, lights.state.shape[-1] - 1)
    state = jax.lax.dynamic_index_in_dim(lights.state, t, axis=-1, keepdims=False)
    valid = jax.lax.dynamic_index_in_dim(lights.valid, t, axis=-1, keepdims=False)
    return state, valid


def scenario_lights_at(lights: TrafficLights, scenario_id: jax.Array, t: jax.Array
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Lights of scenario ``scenario_id`` of a batch (leading axis N) at log step ``t``,
    gathering only that step (not the scenario's whole (TL, T) arrays).

    Returns:
      state: (TL,) int32; valid: (TL,) bool; stop_xy: (TL, 2) float32.
    """
    t = jnp.clip(t, 0, lights.state.shape[-1] - 1)
    return (lights.state[scenario_id, :, t], lights.valid[scenario_id, :, t],
            lights.stop_xy[scenario_id])


def stop_directions(lights: TrafficLights, roadgraph: Roadgraph) -> jax.Array:
    """(TL, 2) float32 unit direction of each light's lane at its stop point (the
    direction of the lane centre-line point nearest the stop point); zero where the lane
    has no centre-line point. One scenario (unbatched); vmap for a pool."""
    on_lane = (roadgraph.valid & (roadgraph.type == RoadType.LANE_CENTER))[None, :] & (
        roadgraph.id[None, :] == lights.lane_id[:, None])  # (TL, R)
    d2 = jnp.sum(jnp.square(roadgraph.xy[None] - lights.stop_xy[:, None]), axis=-1)
    nearest = jnp.argmin(jnp.where(on_lane, d2, jnp.inf), axis=-1)
    u = roadgraph.dir[nearest]
    has_lane = jnp.any(on_lane, axis=-1) & (jnp.sum(u * u, axis=-1) > 0)
    return jnp.where(has_lane[:, None], u, 0.0).astype(jnp.float32)


def stop_line_frame(xy: jax.Array, stop_xy: jax.Array, stop_dir: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """Positions relative to every stop line.

    Args:
      xy: (..., 2) positions; stop_xy, stop_dir: (TL, 2).
    Returns:
      along, across: (..., TL) metres along the lane direction past the stop point
      (negative before the line) and to its left.
    """
    rel = xy[..., None, :] - stop_xy  # (..., TL, 2)
    along = rel[..., 0] * stop_dir[:, 0] + rel[..., 1] * stop_dir[:, 1]
    across = stop_dir[:, 0] * rel[..., 1] - stop_dir[:, 1] * rel[..., 0]
    return along, across


def red_light_crossing(
    prev_xy: jax.Array, xy: jax.Array, yaw: jax.Array, stop_xy: jax.Array,
    stop_dir: jax.Array, red: jax.Array, half_width: float = STOP_LINE_HALF_WIDTH,
) -> jax.Array:
    """Objects that cross a red light's stop line on one step.

    Object a crosses light k's line when its centre goes from behind the line
    (``prev_xy``) to on or past it (``xy``), within ``half_width`` of the stop point across
    the lane, heading within 90 deg of the lane direction, while light k is red.

    Args:
      prev_xy, xy: (..., A, 2) centres before and after the step; yaw: (..., A).
      stop_xy, stop_dir: (TL, 2), stop points and their lane directions
        (``stop_directions``).
      red: (..., TL) bool, the light is red after the step (``is_red``).
    Returns:
      (..., A) bool.
    """
    before, _ = stop_line_frame(prev_xy, stop_xy, stop_dir)
    along, across = stop_line_frame(xy, stop_xy, stop_dir)
    aligned = (jnp.cos(yaw)[..., None] * stop_dir[:, 0]
               + jnp.sin(yaw)[..., None] * stop_dir[:, 1]) > 0
    cross = ((before < 0) & (along >= 0) & (jnp.abs(across) <= half_width) & aligned
             & red[..., None, :])
    return jnp.any(cross, axis=-1)

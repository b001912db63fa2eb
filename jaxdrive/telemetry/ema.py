"""Per-agent EMA population mean of episode metrics, on device.

Every agent slot (env x agent index) keeps its own exponential moving average of the
metrics of the episodes it completes: the first completion seeds the slot, later ones
update ``slot = a * slot + (1 - a) * episode``. An emission is the mean over the slots
that have data, so an agent that completes many short episodes weighs as much as one
that completes a single long one; nothing is reset on emission. (The per-agent logging
of the seed PR ``per-agent-logging-pr.txt``.)

``(init, update, emit)`` are pure functions over an ``EmaState`` pytree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class EmaState:
    """Attributes:
      values: dict name -> (S,) float32 slot averages.
      has_data: (S,) bool, the slot has completed at least one episode.
    """

    values: dict
    has_data: jax.Array


def init(names, num_slots: int) -> EmaState:
    """Empty state for the metrics ``names`` over ``num_slots`` agent slots."""
    return EmaState(values={n: jnp.zeros((num_slots,), jnp.float32) for n in names},
                    has_data=jnp.zeros((num_slots,), bool))


def update(state: EmaState, completed: jax.Array, metrics: dict, alpha: float) -> EmaState:
    """Fold in the episodes that slots completed on one step.

    Args:
      completed: (S,) bool, slots whose episode ended (and counts, e.g. ego agents).
      metrics: name -> (S,) values of those episodes (ignored elsewhere).
      alpha: weight of the old average, in [0, 1).
    """
    new = {}
    for name, old in state.values.items():
        x = metrics[name].astype(jnp.float32)
        blended = jnp.where(state.has_data, alpha * old + (1.0 - alpha) * x, x)
        new[name] = jnp.where(completed, blended, old)
    return EmaState(values=new, has_data=state.has_data | completed)


def emit(state: EmaState) -> dict:
    """name -> () float32 mean over slots with data (NaN before any completion), plus
    ``slots_with_data``."""
    n = jnp.sum(state.has_data.astype(jnp.float32))
    out = {name: jnp.where(n > 0, jnp.sum(jnp.where(state.has_data, v, 0.0))
                           / jnp.maximum(n, 1.0), jnp.nan)
           for name, v in state.values.items()}
    out["slots_with_data"] = n
    return out

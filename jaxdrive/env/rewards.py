"""Rewards derived from per-step metrics and events, with weights from config."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.config import ConfigBase, check_range


@dataclasses.dataclass(frozen=True)
class RewardConfig(ConfigBase):
    """Reward weights (per step, per controlled agent).

    Attributes:
      goal: paid on the step the goal is reached.
      collision: paid on every step the agent overlaps another agent (use a negative value).
      offroad: paid on every step the agent is off-road (negative).
      progress: per metre gained towards the goal.
      step: paid every step (a time penalty when negative).
      red_light: paid on every step the agent crosses the stop line of a red light
        (negative; 0 by default).
    """

    goal: float = 1.0
    collision: float = -0.5
    offroad: float = -0.5
    progress: float = 0.0
    step: float = 0.0
    red_light: float = 0.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check_range(f.name, getattr(self, f.name), -1e6, 1e6)

    def weights(self) -> RewardWeights:
        """The weights as a pytree of float32 scalars (traced, so sweeps need no recompile)."""
        return RewardWeights(
            **{f.name: jnp.float32(getattr(self, f.name)) for f in dataclasses.fields(self)}
        )


@struct.dataclass
class RewardWeights:
    """``RewardConfig`` as device scalars; field meanings as there."""

    goal: jax.Array
    collision: jax.Array
    offroad: jax.Array
    progress: jax.Array
    step: jax.Array
    red_light: jax.Array


def reward(
    weights: RewardWeights,
    goal_event: jax.Array,
    collided: jax.Array,
    offroad: jax.Array,
    progress: jax.Array,
    acting: jax.Array,
    red_light: jax.Array,
) -> jax.Array:
    """(A,) float32 reward; zero for agents not ``acting`` this step.

    Args:
      weights: ``RewardWeights``.
      goal_event: (A,) bool, the goal was reached on this step (and counts).
      collided, offroad: (A,) bool.
      progress: (A,) float32 metres towards the goal.
      acting: (A,) bool, controlled agents whose action moved them this step.
      red_light: (A,) bool, the agent crossed a red light's stop line on this step.
    """
    r = (
        weights.goal * goal_event
        + weights.collision * collided
        + weights.offroad * offroad
        + weights.progress * progress
        + weights.step
        # Last, so that a zero weight leaves every other term's sum bit-identical.
        + weights.red_light * red_light
    )
    return jnp.where(acting, r, 0.0).astype(jnp.float32)

"""Collision and goal behaviours, and per-agent kinematic selection, as pure functions.

Everything here works on one environment's (A,) agent axis; the ``Env`` composes it.

Collision behaviours: ``ignore`` (only counted), ``stop`` (the agent freezes in place and
is done), ``remove`` (it leaves the scene and is done). Goal behaviours: ``respawn``
(back to its initial pose), ``new_goal`` (a freshly sampled goal), ``stop`` (freezes at
the goal, done), ``remove`` (leaves the scene at the goal, done; GPUDrive's default, so
that finished vehicles are not obstacles), ``trial`` (removed until the trial ends, done
for the trial).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxdrive.types import AgentState

COLLISION_BEHAVIORS = ("ignore", "stop", "remove")
# "collision": an off-road step ends the agent as ``collision_behavior`` says.
OFFROAD_BEHAVIORS = ("ignore", "collision")
GOAL_BEHAVIORS = ("respawn", "new_goal", "stop", "remove", "trial")
# Where removed agents are parked: far outside any map, never collidable or observed.
REMOVED_XY = -1.0e5


def select(mask: jax.Array, a: AgentState, b: AgentState) -> AgentState:
    """Per-agent choice between two ``AgentState``s: ``a`` where ``mask`` (A,) bool."""

    def pick(x, y):
        m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        return jnp.where(m, x, y)

    return jax.tree.map(pick, a, b)


def park_removed(agents: AgentState, removed: jax.Array) -> AgentState:
    """``agents`` with those where ``removed`` (A,) bool parked at ``REMOVED_XY``, still
    (zero velocity) and not valid."""
    return agents.replace(
        xy=jnp.where(removed[:, None], REMOVED_XY, agents.xy),
        vel=jnp.where(removed[:, None], 0.0, agents.vel),
        valid=agents.valid & ~removed,
    )


class Outcome(NamedTuple):
    """Agents after the behaviours of one step.

    Attributes:
      agents: ``AgentState`` (A,); goal: (A, 2) float32;
      out: (A,) bool, agents whose episode (trial, in trial mode) stops on this step;
      done: (A,) bool, agents that no longer act; removed: (A,) bool.
    """

    agents: AgentState
    goal: jax.Array
    out: jax.Array
    done: jax.Array
    removed: jax.Array


def apply_behaviors(collision_behavior: str, goal_behavior: str, agents: AgentState,
                    goal: jax.Array, done: jax.Array, removed: jax.Array,
                    collided: jax.Array, goal_event: jax.Array,
                    start: AgentState | None = None,
                    new_goals: jax.Array | None = None) -> Outcome:
    """Apply the collision and goal behaviours (static strings) to one step's events.

    Args:
      agents: ``AgentState`` (A,) the step reached.
      goal: (A, 2) float32, metres; done, removed: (A,) bool before the step.
      collided, goal_event: (A,) bool events of acting agents on this step.
      start: the agents' initial state (``respawn`` only).
      new_goals: (A, 2) float32 freshly sampled goals (``new_goal`` only).
    Returns:
      ``Outcome`` of (A,) arrays.
    """
    out = jnp.zeros_like(collided)
    if collision_behavior in ("stop", "remove"):
        out = out | collided
    if collision_behavior == "remove":
        removed = removed | collided
    if goal_behavior in ("stop", "remove", "trial"):
        out = out | goal_event
    if goal_behavior in ("remove", "trial"):
        removed = removed | goal_event
    elif goal_behavior == "respawn":
        agents = select(goal_event, start.replace(valid=agents.valid), agents)
    elif goal_behavior == "new_goal":
        goal = jnp.where(goal_event[:, None], new_goals, goal)
    done = done | out
    agents = park_removed(agents, removed)
    stopped = done & ~removed
    agents = agents.replace(vel=jnp.where(stopped[:, None], 0.0, agents.vel))
    return Outcome(agents=agents, goal=goal, out=out, done=done, removed=removed)

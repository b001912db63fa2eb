"""Per-step metrics, computed once per step; rewards and logs are derived from them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive import geometry
from jaxdrive.scenarios import road_index
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.types import AgentState


@struct.dataclass
class StepMetrics:
    """Per-agent facts about the state reached by a step.

    Attributes:
      collided: (A,) bool, the agent's box overlaps another present agent's box.
      offroad: (A,) bool, a corner of the box lies beyond the road edges.
      goal_reached: (A,) bool, the centre is within the goal radius.
      goal_distance: (A,) float32, metres from the centre to the goal.
      progress: (A,) float32, metres gained towards the goal this step.
    """

    collided: jax.Array
    offroad: jax.Array
    goal_reached: jax.Array
    goal_distance: jax.Array
    progress: jax.Array


def compute_metrics(
    pool: ScenarioPool,
    scenario_id: jax.Array,
    agents: AgentState,
    present: jax.Array,
    length: jax.Array,
    width: jax.Array,
    goal: jax.Array,
    prev_goal_distance: jax.Array,
    goal_radius: float,
    trig=None,
) -> StepMetrics:
    """Metrics of one environment's state.

    Args:
      pool, scenario_id: the scenario's road graph and grid.
      agents: ``AgentState`` (A agents).
      present: (A,) bool, agents that exist physically (collidable); others get False.
      length, width: (A,) float32; goal: (A, 2) float32.
      prev_goal_distance: (A,) float32, the goal distance before this step.
      goal_radius: metres.
      trig: optional ``(cos(yaw), sin(yaw))`` (A,) each, materialised.
    """
    with jax.named_scope("metrics"):
        if trig is None:
            trig = geometry.cos_sin(agents.yaw)
        hit = geometry.pairwise_overlap(agents.xy, agents.yaw, length, width, present, trig)
        collided = jnp.any(hit, axis=-1)
        offroad = present & road_index.is_offroad(
            pool.road_index, pool.scenarios.roadgraph, agents.xy, agents.yaw, length, width,
            scenario_id, trig,
        )
        goal_distance = jnp.linalg.norm(goal - agents.xy, axis=-1)
        return StepMetrics(
            collided=collided,
            offroad=offroad,
            goal_reached=present & (goal_distance <= goal_radius),
            goal_distance=goal_distance.astype(jnp.float32),
            progress=(prev_goal_distance - goal_distance).astype(jnp.float32),
        )

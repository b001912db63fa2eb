"""Per-step metrics of one environment, computed once per step from the simulator state.

The built-in metrics (registered here, in this order) are:

- ``goal_reached`` (A,) bool: the centre is within the goal radius (episode: any;
  reported as ``goal_rate``, counted as ``goals``);
- ``collided`` (A,) bool: the box overlaps another present agent's box (any;
  ``collision_rate``, ``collisions``);
- ``offroad`` (A,) bool: a corner of the box lies beyond the road edges (any;
  ``offroad_rate``, ``offroads``);
- ``goal_distance`` (A,) float32: metres from the centre to the goal (per step);
- ``progress`` (A,) float32: metres gained towards the goal this step (per step);
- ``ran_red_light`` (A,) bool: the centre crossed the stop line of a lane whose light is
  red at the state reached (``jaxdrive.scenarios.signals.red_light_crossing``; any;
  ``red_light_rate``, ``red_lights``).

Rewards, events and logs are derived from these values; nothing recomputes them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxdrive import geometry
from jaxdrive.metrics import registry
from jaxdrive.metrics.named import NamedArrays
from jaxdrive.metrics.registry import Metric
from jaxdrive.scenarios import road_index, signals
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.types import AgentState, World


class StepView(NamedTuple):
    """What a metric may read about one environment's state after a step.

    Attributes:
      pool, scenario_id: the scenario's road graph and road index.
      agents: ``AgentState`` (A agents) reached by the step, before any reset.
      present: (A,) bool, agents that exist physically (collidable, observable).
      length, width: (A,) float32 box sizes; goal: (A, 2) float32.
      prev_goal_distance: (A,) float32, goal distances before the step.
      goal_radius: metres.
      trig: ``(cos(yaw), sin(yaw))``, (A,) each, computed once.
      prev_xy: (A, 2) float32 centres before the step (the centres reached where an
        agent was not present before, and at a reset: nothing moved).
      log_step: () int32 log index of the state reached (its light states).
      world: with packed agent rows (``EnvConfig.max_controlled``), every object of the
        scene (``jaxdrive.types.World``): the fields above then describe the C rows,
        and collisions are checked against the whole scene; None when every object is
        a row.
    """

    pool: ScenarioPool
    scenario_id: jax.Array
    agents: AgentState
    present: jax.Array
    length: jax.Array
    width: jax.Array
    goal: jax.Array
    prev_goal_distance: jax.Array
    goal_radius: float
    trig: tuple[jax.Array, jax.Array]
    prev_xy: jax.Array
    log_step: jax.Array
    world: World | None = None


class StepMetrics(NamedArrays):
    """Registered metric name -> (A,) per-step value of one env (see the module doc)."""


def _goal_distance(v: StepView) -> jax.Array:
    return jnp.linalg.norm(v.goal - v.agents.xy, axis=-1)


def _collided(v: StepView) -> jax.Array:
    if v.world is None:
        hit = geometry.pairwise_overlap(v.agents.xy, v.agents.yaw, v.length, v.width,
                                        v.present, v.trig)
    else:
        w = v.world
        hit = geometry.overlap_against(v.agents.xy, v.length, v.width, v.present, v.trig,
                                       w.agents.xy, w.length, w.width, w.visible, w.trig,
                                       w.self_index)
    return jnp.any(hit, axis=-1)


def _offroad(v: StepView) -> jax.Array:
    return v.present & road_index.is_offroad(
        v.pool.road_index, v.pool.scenarios.roadgraph, v.agents.xy, v.agents.yaw, v.length,
        v.width, v.scenario_id, v.trig)


def _ran_red_light(v: StepView) -> jax.Array:
    state, valid, stop_xy = signals.scenario_lights_at(
        v.pool.scenarios.traffic_lights, v.scenario_id, v.log_step)
    return v.present & signals.red_light_crossing(
        v.prev_xy, v.agents.xy, v.agents.yaw, stop_xy, v.pool.stop_dir[v.scenario_id],
        signals.is_red(state, valid))


registry.register(Metric("goal_reached",
                         lambda v: v.present & (_goal_distance(v) <= v.goal_radius),
                         reduce="any", rate="goal_rate", count="goals"))
registry.register(Metric("collided", _collided, reduce="any", rate="collision_rate",
                         count="collisions"))
registry.register(Metric("offroad", _offroad, reduce="any", rate="offroad_rate",
                         count="offroads"))
registry.register(Metric("goal_distance", lambda v: _goal_distance(v).astype(jnp.float32),
                         at_reset="compute"))
registry.register(Metric("progress", lambda v: (v.prev_goal_distance
                                                - _goal_distance(v)).astype(jnp.float32)))
registry.register(Metric("ran_red_light", _ran_red_light, reduce="any", rate="red_light_rate",
                         count="red_lights"))


def compute_metrics(view: StepView, metrics: tuple[Metric, ...]) -> StepMetrics:
    """Every metric of ``metrics`` (a registry snapshot) on one environment's state, (A,)
    each."""
    with jax.named_scope("metrics"):
        return StepMetrics({m.name: m.compute(view) for m in metrics})


def initial_metrics(view: StepView, metrics: tuple[Metric, ...]) -> StepMetrics:
    """The (A,) metrics a reset reports: zeros (no event yet) or, for
    ``at_reset="compute"`` metrics, their value on the initial state."""
    out = {}
    for m in metrics:
        if m.at_reset == "compute":
            out[m.name] = m.compute(view)
        else:
            shape = jax.eval_shape(m.compute, view)
            out[m.name] = jnp.zeros(shape.shape, shape.dtype)
    return StepMetrics(out)

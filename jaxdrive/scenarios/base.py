"""Fixed scenario shapes (``ScenarioConfig``), an all-invalid scenario, shape validation."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxdrive.config import ConfigBase, ConfigError, check_int
from jaxdrive.types import LaneGraph, ObjectLog, Roadgraph, Scenario, TrafficLights


@dataclasses.dataclass(frozen=True)
class ScenarioConfig(ConfigBase):
    """Padded sizes of every scenario array (see ``jaxdrive.types`` for the dims).

    Attributes:
      max_agents: A, agent slots per scenario.
      num_steps: T, logged steps (91 = 9.1 s at 10 Hz, as in WOMD).
      max_road_points: R, road points per scenario.
      max_lanes: L, lane polylines with connectivity.
      max_lane_successors: S, successors per lane.
      max_traffic_lights: TL.
    """

    max_agents: int = 64
    num_steps: int = 91
    max_road_points: int = 4096
    max_lanes: int = 128
    max_lane_successors: int = 4
    max_traffic_lights: int = 16

    def __post_init__(self):
        check_int("max_agents", self.max_agents, 1, 4096)
        check_int("num_steps", self.num_steps, 2, 100_000)
        check_int("max_road_points", self.max_road_points, 2, 10_000_000)
        check_int("max_lanes", self.max_lanes, 1, 1_000_000)
        check_int("max_lane_successors", self.max_lane_successors, 1, 64)
        check_int("max_traffic_lights", self.max_traffic_lights, 1, 4096)

    def nbytes(self) -> int:
        """Bytes of one unbatched ``Scenario`` at these sizes (every leaf counted at 4
        bytes: an upper bound, flags take 1)."""
        return 4 * sum(math.prod(s) for s in self.shapes().values())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Expected shape of every leaf of an unbatched ``Scenario``, keyed by path."""
        A, T, R = self.max_agents, self.num_steps, self.max_road_points
        L, S, TL = self.max_lanes, self.max_lane_successors, self.max_traffic_lights
        return {
            "roadgraph.xy": (R, 2), "roadgraph.dir": (R, 2), "roadgraph.type": (R,),
            "roadgraph.id": (R,), "roadgraph.valid": (R,),
            "lanes.successors": (L, S), "lanes.valid": (L,),
            "traffic_lights.lane_id": (TL,), "traffic_lights.stop_xy": (TL, 2),
            "traffic_lights.state": (TL, T), "traffic_lights.valid": (TL, T),
            "objects.xy": (A, T, 2), "objects.yaw": (A, T), "objects.vel": (A, T, 2),
            "objects.valid": (A, T), "objects.length": (A,), "objects.width": (A,),
            "objects.type": (A,), "objects.goal": (A, 2), "objects.is_sdc": (A,),
            "objects.of_interest": (A,), "objects.to_predict": (A,),
        }


def empty_scenario(config: ScenarioConfig) -> Scenario:
    """A scenario with every entry invalid, shaped by ``config``."""
    A, T, R = config.max_agents, config.num_steps, config.max_road_points
    L, S, TL = config.max_lanes, config.max_lane_successors, config.max_traffic_lights
    f32, i32 = jnp.float32, jnp.int32
    return Scenario(
        roadgraph=Roadgraph(
            xy=jnp.zeros((R, 2), f32), dir=jnp.zeros((R, 2), f32),
            type=jnp.zeros((R,), i32), id=jnp.full((R,), -1, i32),
            valid=jnp.zeros((R,), bool),
        ),
        lanes=LaneGraph(successors=jnp.full((L, S), -1, i32), valid=jnp.zeros((L,), bool)),
        traffic_lights=TrafficLights(
            lane_id=jnp.full((TL,), -1, i32), stop_xy=jnp.zeros((TL, 2), f32),
            state=jnp.zeros((TL, T), i32), valid=jnp.zeros((TL, T), bool),
        ),
        objects=ObjectLog(
            xy=jnp.zeros((A, T, 2), f32), yaw=jnp.zeros((A, T), f32),
            vel=jnp.zeros((A, T, 2), f32), valid=jnp.zeros((A, T), bool),
            length=jnp.zeros((A,), f32), width=jnp.zeros((A,), f32),
            type=jnp.zeros((A,), i32), goal=jnp.zeros((A, 2), f32),
            is_sdc=jnp.zeros((A,), bool), of_interest=jnp.zeros((A,), bool),
            to_predict=jnp.zeros((A,), bool),
        ),
    )


def validate_scenario(scenario: Scenario, config: ScenarioConfig, batch_dims: int = 0) -> None:
    """Raise ``ConfigError`` naming the first leaf whose shape disagrees with ``config``.

    Args:
      scenario: a Scenario, possibly with ``batch_dims`` leading batch axes.
      config: the expected sizes.
      batch_dims: number of leading batch axes to ignore.
    """
    expected = config.shapes()
    leaves = jax.tree_util.tree_flatten_with_path(scenario)[0]
    for path, leaf in leaves:
        name = ".".join(getattr(p, "name", str(p)) for p in path)
        want = expected[name]
        got = tuple(leaf.shape[batch_dims:])
        if got != want:
            raise ConfigError(
                f"scenario field '{name}' has shape {got}, expected {want} from ScenarioConfig "
                f"(max_agents={config.max_agents}, num_steps={config.num_steps}, "
                f"max_road_points={config.max_road_points}, max_lanes={config.max_lanes}). "
                "Pad or convert the scenario to these sizes, or change the config."
            )

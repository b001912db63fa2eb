"""Hand-built scenarios with known geometry for env tests (NumPy, no generator)."""

from __future__ import annotations

import functools

import jax
import numpy as np

from jaxdrive.scenarios.base import ScenarioConfig, empty_scenario
from jaxdrive.types import ObjectType, RoadType

HALF_WIDTH = 4.0  # road spans y in [-4, 4]
X_RANGE = (-100.0, 100.0)


@functools.cache
def _empty(config: ScenarioConfig):
    """``empty_scenario(config)`` as NumPy: one small jitted program per config (built
    eagerly it is ~20 compiles of single operations)."""
    return jax.tree.map(np.asarray, jax.jit(empty_scenario, static_argnums=0)(config))


def straight_road(config: ScenarioConfig, agents, dt: float = 0.1, sdc: int = 0, goals=None):
    """A straight two-lane road along x with edges at y = +-4 and lane centres at y = +-2.

    Args:
      config: shapes.
      agents: list of (x, y, yaw, speed, length, width); the log moves each agent at its
        constant speed along its heading for all T steps.
      sdc: index of the self-driving car.
      goals: optional list of (x, y) goals; default = the logged final position.
    Returns:
      An unbatched ``Scenario`` of NumPy arrays.
    """
    s = jax.tree.map(np.array, _empty(config))  # a writable copy
    xs = np.arange(X_RANGE[0], X_RANGE[1] + 0.5, 1.0, dtype=np.float32)
    n = len(xs)
    polylines = [
        (np.stack([xs, np.full(n, -HALF_WIDTH)], 1), RoadType.ROAD_EDGE),  # road on the left
        (np.stack([xs[::-1], np.full(n, HALF_WIDTH)], 1), RoadType.ROAD_EDGE),
        (np.stack([xs, np.full(n, -2.0)], 1), RoadType.LANE_CENTER),
        (np.stack([xs[::-1], np.full(n, 2.0)], 1), RoadType.LANE_CENTER),
    ]
    rg = s.roadgraph
    i = 0
    for pid, (pts, rtype) in enumerate(polylines):
        k = len(pts)
        assert i + k <= config.max_road_points
        d = np.diff(pts, axis=0)
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        rg.xy[i : i + k] = pts
        rg.dir[i : i + k] = np.concatenate([d, d[-1:]])
        rg.type[i : i + k] = rtype
        rg.id[i : i + k] = pid
        rg.valid[i : i + k] = True
        i += k
    s.lanes.valid[2:4] = True
    obj = s.objects
    t = np.arange(config.num_steps, dtype=np.float32) * dt
    for a, (x, y, yaw, speed, length, width) in enumerate(agents):
        h = np.array([np.cos(yaw), np.sin(yaw)], np.float32)
        obj.xy[a] = np.array([x, y], np.float32) + speed * t[:, None] * h
        obj.yaw[a] = yaw
        obj.vel[a] = speed * h
        obj.valid[a] = True
        obj.length[a] = length
        obj.width[a] = width
        obj.type[a] = ObjectType.VEHICLE
        obj.goal[a] = obj.xy[a, -1] if goals is None else goals[a]
    obj.is_sdc[sdc] = True
    return s


# A 4-slot, 31-step scenario on the straight road and an env config small enough to
# compile in seconds; shared by the env and trial tests.
SMALL_AGENTS = 4
SMALL_SCENARIO = ScenarioConfig(max_agents=SMALL_AGENTS, num_steps=31, max_road_points=1024)
SMALL_ENV = {
    "scenario": SMALL_SCENARIO.to_dict(),
    "observation": {"num_partners": 3, "num_road": 16},
    "road_index": {"road_per_cell": 32, "chunk_size": 8, "grid_size": 8},
    "init_step": 0,
    "goal_radius": 2.0,
    "reward": {"goal": 1.0, "collision": -0.5, "offroad": -0.25, "progress": 0.1},
}
CAR = (4.0, 2.0)  # length, width

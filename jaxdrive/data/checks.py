"""Sanity checks a loaded scenario must pass before the env sees it (host, NumPy).

``scenario_problems`` lists what is wrong with one (or every, when batched) scenario;
``check_scenarios`` raises ``ConfigError`` naming the scenario and the problem.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxdrive.config import ConfigError
from jaxdrive.data.raw import HEADING_DISAGREES, heading_motion_error
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.types import (
    NUM_OBJECT_TYPES,
    NUM_ROAD_TYPES,
    RoadType,
    Scenario,
    TrafficLightState,
)


def scenario_problems(scenario: Scenario, config: ScenarioConfig, init_step: int = 10,
                      index: int | None = None) -> list[str]:
    """Problems of one unbatched scenario (or scenario ``index`` of a batch).

    Checks: leaf shapes match ``config``; exactly one SDC; the SDC is valid at
    ``init_step``; road edges present; every float array finite; flags boolean; box sizes
    > 0 for agents valid at some step; object and road types and traffic-light states in
    range; lane-centre polyline ids in ``[0, L)`` and marked valid in the lane graph;
    headings that follow the direction of motion (``raw.heading_motion_error``).
    """
    def leaf(x):
        x = np.asarray(x)
        return x if index is None else x[index]

    problems = []
    shapes = config.shapes()
    for path, value in jax.tree_util.tree_flatten_with_path(scenario)[0]:
        name = ".".join(getattr(p, "name", str(p)) for p in path)
        got = leaf(value).shape
        if got != shapes[name]:
            problems.append(f"'{name}' has shape {got}, expected {shapes[name]}")
    if problems:
        return problems
    obj, rg = scenario.objects, scenario.roadgraph
    is_sdc = leaf(obj.is_sdc)
    n_sdc = int(is_sdc.sum())
    if n_sdc != 1:
        problems.append(f"{n_sdc} agents are marked SDC; exactly one is required")
    elif not leaf(obj.valid)[np.argmax(is_sdc), init_step]:
        problems.append(f"the SDC is not valid at init_step {init_step}")
    rg_valid = leaf(rg.valid)
    rg_type = leaf(rg.type)
    if not np.any(rg_valid & (rg_type == RoadType.ROAD_EDGE)):
        problems.append("no road-edge points (off-road detection needs them)")
    problems += _value_problems(scenario, leaf)
    heading = heading_motion_error(leaf(obj.yaw), leaf(obj.vel), leaf(obj.valid))
    if heading is not None and heading[0] > HEADING_DISAGREES:
        problems.append(f"headings disagree with the direction of motion (median error "
                        f"{heading[0]:.2f} rad over {heading[1]} moving steps)")
    valid_agent = leaf(obj.valid).any(axis=-1)
    types = leaf(obj.type)[valid_agent]
    if np.any((types < 0) | (types >= NUM_OBJECT_TYPES)):
        problems.append("object types out of range")
    if np.any((rg_type[rg_valid] < 0) | (rg_type[rg_valid] >= NUM_ROAD_TYPES)):
        problems.append("road types out of range")
    lane_ids = leaf(rg.id)[rg_valid & (rg_type == RoadType.LANE_CENTER)]
    if lane_ids.size:
        L = config.max_lanes
        if np.any((lane_ids < 0) | (lane_ids >= L)):
            problems.append(f"lane-centre polyline ids outside [0, {L})")
        elif not np.all(leaf(scenario.lanes.valid)[lane_ids]):
            problems.append("lane-centre polylines missing from the lane graph")
    return problems


def _value_problems(scenario: Scenario, leaf) -> list[str]:
    """Non-finite floats, non-boolean flags, box sizes <= 0 of agents valid at some step,
    traffic-light states out of range (``leaf`` picks one scenario of a batch)."""
    problems = []
    for path, value in jax.tree_util.tree_flatten_with_path(scenario)[0]:
        name = ".".join(getattr(p, "name", str(p)) for p in path)
        x = leaf(value)
        if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
            problems.append(f"non-finite values in '{name}'")
        if (name.endswith("valid") or name.startswith("objects.is_")) and x.dtype != bool:
            problems.append(f"'{name}' is {x.dtype}, not boolean")
    obj, tl = scenario.objects, scenario.traffic_lights
    present = leaf(obj.valid).any(axis=-1)
    for what in ("length", "width"):
        size = leaf(getattr(obj, what))[present]
        if np.any(~(size > 0)):
            problems.append(f"agent {what} <= 0 (or NaN) for {int(np.sum(~(size > 0)))} agents")
    states = leaf(tl.state)[leaf(tl.valid).astype(bool)]
    if np.any((states < 0) | (states >= len(TrafficLightState))):
        problems.append(f"traffic-light states outside 0..{len(TrafficLightState) - 1}")
    return problems


def check_scenarios(scenarios: Scenario, config: ScenarioConfig, init_step: int = 10,
                    names: list[str] | None = None) -> None:
    """Raise ``ConfigError`` if any scenario of a batch (leading axis N) fails a check."""
    n = np.asarray(scenarios.objects.xy).shape[0]
    for i in range(n):
        problems = scenario_problems(scenarios, config, init_step, index=i)
        if problems:
            who = names[i] if names else f"scenario {i}"
            raise ConfigError(f"{who}: {'; '.join(problems)}. Reconvert it or leave it out.")

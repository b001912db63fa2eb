"""Synthetic WOMD-like scenes for tests and benchmarks (seeded; no real data needed).

``synth_scenario`` builds a ``womd_schema.Scenario`` proto shaped like a real WOMD scene
(kilometre-scale world offset, ~0.5 m polyline spacing, tracks that appear and
disappear, traffic lights); ``raw_to_json`` writes a ``RawScene`` in the GPUDrive /
PufferDrive JSON layout, so both readers can be exercised on the same content.
"""

from __future__ import annotations

import math

import numpy as np

from jaxdrive.data import womd_schema as pb
from jaxdrive.data.raw import RawScene
from jaxdrive.types import ObjectType, RoadType, TrafficLightState


def synth_scenario(
    seed: int, num_objects: int = 64, num_steps: int = 91, num_lanes: int = 40,
    lane_points: int = 120, num_edges: int = 12, edge_points: int = 200,
    num_lines: int = 10, line_points: int = 100, num_lights: int = 4,
    offset: tuple[float, float] = (4000.0, -2500.0), scenario_id: str | None = None,
):
    """A WOMD ``Scenario`` proto with straight-line tracks and straight polylines.

    Object 0 is the SDC (valid throughout); other objects start or end invalid at random.
    Lanes run in parallel 3.5 m apart, each exiting to the next; edges and lines are
    scattered; lights control the first ``num_lights`` lanes with cycling states.
    """
    rng = np.random.default_rng(seed)
    s = pb.Scenario(scenario_id=scenario_id or f"synth{seed:08d}", sdc_track_index=0,
                    current_time_index=10)
    s.timestamps_seconds.extend((np.arange(num_steps) * 0.1).tolist())
    ox, oy = offset
    t = np.arange(num_steps) * 0.1
    for i in range(num_objects):
        track = s.tracks.add(id=1000 + i,
                             object_type=int(ObjectType.VEHICLE if i == 0 or i % 5
                                             else ObjectType.PEDESTRIAN))
        x0, y0 = rng.uniform(-80, 80, 2)
        yaw = rng.uniform(-math.pi, math.pi)
        v = rng.uniform(0, 15)
        if i == 0:
            x0, y0, start, stop = 0.0, 0.0, 0, num_steps
        else:
            start = int(rng.integers(0, 20)) if rng.random() < 0.3 else 0
            stop = num_steps - (int(rng.integers(0, 30)) if rng.random() < 0.3 else 0)
        xs = ox + x0 + v * math.cos(yaw) * t
        ys = oy + y0 + v * math.sin(yaw) * t
        vx, vy = v * math.cos(yaw), v * math.sin(yaw)
        length, width = (4.5, 2.0) if track.object_type == ObjectType.VEHICLE else (0.8, 0.8)
        for k in range(num_steps):
            ok = start <= k < stop
            if ok:
                track.states.add(center_x=xs[k], center_y=ys[k], center_z=1.0, length=length,
                                 width=width, height=1.5, heading=yaw, velocity_x=vx,
                                 velocity_y=vy, valid=True)
            else:  # WOMD fills invalid states too (with -1), flagged by valid = false
                track.states.add(center_x=-1.0, center_y=-1.0, center_z=-1.0, length=-1.0,
                                 width=-1.0, height=-1.0, heading=-1.0, velocity_x=-1.0,
                                 velocity_y=-1.0, valid=False)
    fid = 100
    lane_ids = []
    for j in range(num_lanes):
        f = s.map_features.add(id=fid)
        y = oy - 70 + 3.5 * j
        for x in np.linspace(ox - 30, ox - 30 + 0.5 * (lane_points - 1), lane_points):
            f.lane.polyline.add(x=float(x), y=float(y), z=0.0)
        lane_ids.append(fid)
        fid += 1
    for j in range(num_lanes - 1):
        s.map_features[j].lane.exit_lanes.append(lane_ids[j + 1])
    for _ in range(num_edges):
        f = s.map_features.add(id=fid)
        x0, y0 = ox + rng.uniform(-100, 100), oy + rng.uniform(-100, 100)
        ang = rng.uniform(-math.pi, math.pi)
        for k in range(edge_points):
            f.road_edge.polyline.add(x=x0 + 0.5 * k * math.cos(ang),
                                     y=y0 + 0.5 * k * math.sin(ang), z=0.0)
        f.road_edge.type = 1
        fid += 1
    for j in range(num_lines):
        f = s.map_features.add(id=fid)
        y = oy - 68.25 + 3.5 * j
        for k in range(line_points):
            f.road_line.polyline.add(x=ox - 30 + 0.5 * k, y=y, z=0.0)
        f.road_line.type = 1
        fid += 1
    f = s.map_features.add(id=fid)
    f.stop_sign.position.x, f.stop_sign.position.y = ox + 5.0, oy + 5.0
    f.stop_sign.lane.append(lane_ids[0])
    fid += 1
    f = s.map_features.add(id=fid)
    for dx, dy in ((0, 0), (4, 0), (4, 3), (0, 3)):
        f.crosswalk.polygon.add(x=ox + 20 + dx, y=oy + dy, z=0.0)
    cycle = [TrafficLightState.GO, TrafficLightState.CAUTION, TrafficLightState.STOP]
    for k in range(num_steps):
        dms = s.dynamic_map_states.add()
        for j in range(min(num_lights, num_lanes)):
            ls = dms.lane_states.add(lane=lane_ids[j], state=int(cycle[(k // 30 + j) % 3]))
            ls.stop_point.x, ls.stop_point.y = ox - 30.0, oy - 70 + 3.5 * j
    return s


_TYPE_NAMES = {int(t): t.name.lower() for t in ObjectType}
_ROAD_NAMES = {RoadType.LANE_CENTER: "lane", RoadType.ROAD_EDGE: "road_edge",
               RoadType.ROAD_LINE: "road_line", RoadType.CROSSWALK: "crosswalk",
               RoadType.STOP_SIGN: "stop_sign", RoadType.SPEED_BUMP: "speed_bump",
               RoadType.DRIVEWAY: "driveway", RoadType.UNKNOWN: "unknown"}


def raw_to_json(raw: RawScene) -> dict:
    """A ``RawScene`` in the GPUDrive/PufferDrive JSON layout (invalid steps: -10000)."""
    objects = []
    for i in range(raw.num_objects):
        ok = raw.valid[i]
        pos = [{"x": float(x), "y": float(y), "z": 0.0} if v else
               {"x": -10000.0, "y": -10000.0, "z": -10000.0}
               for (x, y), v in zip(raw.xy[i], ok, strict=True)]
        vel = [{"x": float(x), "y": float(y)} if v else {"x": -10000.0, "y": -10000.0}
               for (x, y), v in zip(raw.vel[i], ok, strict=True)]
        last = np.flatnonzero(ok)
        goal = raw.xy[i, last[-1]] if len(last) else np.zeros(2)
        objects.append({
            "position": pos, "width": float(raw.width[i]), "length": float(raw.length[i]),
            "height": 1.5,
            "heading": [float(h) if v else -10000.0 for h, v in zip(raw.yaw[i], ok,
                                                                      strict=True)],
            "velocity": vel, "valid": [bool(v) for v in ok],
            "goalPosition": {"x": float(goal[0]), "y": float(goal[1]), "z": 0.0},
            "type": _TYPE_NAMES[int(raw.object_type[i])], "id": int(raw.object_id[i]),
            "mark_as_expert": bool(raw.expert[i]),
        })
    roads = []
    for k in range(raw.num_polylines):
        pts = raw.road_xy[raw.road_start[k]:raw.road_start[k + 1]]
        roads.append({"geometry": [{"x": float(x), "y": float(y), "z": 0.0} for x, y in pts],
                      "type": _ROAD_NAMES[int(raw.road_type[k])],
                      "id": int(raw.road_id[k])})
    tl = {}
    for j in range(raw.tl_lane.shape[0]):
        steps = np.flatnonzero(raw.tl_valid[j])
        tl[str(int(raw.tl_lane[j]))] = {
            "state": [TrafficLightState(int(raw.tl_state[j, t])).name.lower() for t in steps],
            "x": [float(raw.tl_stop_xy[j, 0])] * len(steps),
            "y": [float(raw.tl_stop_xy[j, 1])] * len(steps),
            "z": [0.0] * len(steps), "time_index": [int(t) for t in steps],
        }
    return {
        "name": f"{raw.scenario_id}.json", "scenario_id": raw.scenario_id,
        "objects": objects, "roads": roads, "tl_states": tl,
        "metadata": {
            "sdc_track_index": int(raw.sdc_index),
            "objects_of_interest": [int(raw.object_id[i])
                                    for i in np.flatnonzero(raw.of_interest)],
            "tracks_to_predict": [{"track_index": int(i), "difficulty": 0}
                                  for i in np.flatnonzero(raw.to_predict)],
        },
    }

"""Score the rollout sets of ``export_rollouts.py`` with Waymo's own WOSAC 2025 metrics
and print them next to jaxdrive's (the comparison in docs/realism.md).

Runs in a separate, throwaway environment, never the project's (Waymo's package needs
TensorFlow and is under its own licence; jaxdrive does not depend on it):

    python3.11 -m venv /tmp/wod && /tmp/wod/bin/pip install waymo-open-dataset-tf-2-12-0
    /tmp/wod/bin/python experiments/wosac_waymo/score_with_waymo.py SCENE.tfrecord rollouts.npz

Only the package's public entry points are called (its 2025 config file,
``compute_scenario_metrics_for_bundle``, ``aggregate_metrics_to_buckets``). Heights, which
jaxdrive does not simulate, are the log's at each step (held at the last valid one), so
both sides see the same 2D motion.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from waymo_open_dataset.protos import (
    scenario_pb2,
    sim_agents_metrics_pb2,
    sim_agents_submission_pb2,
)
from waymo_open_dataset.utils.sim_agents import submission_specs
from waymo_open_dataset.wdl_limited.sim_agents_metrics import metrics

FIELDS = {  # Waymo's SimAgentMetrics field -> jaxdrive's score name
    "metametric": "metametric", "min_average_displacement_error": "min_ade",
    "average_displacement_error": "ade",
    "linear_speed_likelihood": "linear_speed",
    "linear_acceleration_likelihood": "linear_acceleration",
    "angular_speed_likelihood": "angular_speed",
    "angular_acceleration_likelihood": "angular_acceleration",
    "distance_to_nearest_object_likelihood": "distance_to_nearest_object",
    "collision_indication_likelihood": "collision_indication",
    "time_to_collision_likelihood": "time_to_collision",
    "distance_to_road_edge_likelihood": "distance_to_road_edge",
    "offroad_indication_likelihood": "offroad_indication",
    "traffic_light_violation_likelihood": "traffic_light_violation",
    "simulated_collision_rate": "simulated_collision_rate",
    "simulated_offroad_rate": "simulated_offroad_rate",
}


def main() -> None:
    scene_path, npz_path = sys.argv[1], sys.argv[2]
    record = next(iter(tf.data.TFRecordDataset(scene_path)))
    scenario = scenario_pb2.Scenario.FromString(record.numpy())
    data = np.load(npz_path)
    challenge = submission_specs.ChallengeType.SIM_AGENTS
    # load_metrics_config opens its file relative to the working directory; read the same
    # file from the installed package instead.
    config = sim_agents_metrics_pb2.SimAgentMetricsConfig()
    path = Path(metrics.__file__).parent / "challenge_2025_sim_agents_config.textproto"
    text_format.Parse(path.read_text(), config)
    sim_ids = list(submission_specs.get_sim_agent_ids(scenario, challenge))
    # jaxdrive reorders the tracks (the SDC first); match each simulated track to its slot
    # by the position at the current step.
    origin = data["origin"]
    world = data["log_xy"][:, 10] + origin  # (A, 2)
    slots, missing = {}, []
    for track in scenario.tracks:
        if track.id in sim_ids:
            s = track.states[10]
            gap = np.linalg.norm(world - [s.center_x, s.center_y], axis=-1)
            gap[~data["simulated"]] = np.inf
            i = int(np.argmin(gap))
            if gap[i] >= 1e-3 or i in slots.values():
                missing.append((track.id, round(float(gap[i]), 3)))
            else:
                slots[track.id] = i
    if missing or len(slots) != int(data["simulated"].sum()):
        raise SystemExit(
            f"{scene_path}: the export does not hold every object Waymo simulates (valid at "
            f"step 10): {len(sim_ids)} there, {int(data['simulated'].sum())} exported, "
            f"unmatched track ids (nearest exported object, m): {missing[:10]}. Export "
            "again with object slots for all of them.")
    z = {}
    for track in scenario.tracks:
        if track.id in slots:
            zs, last = [], track.states[10].center_z
            for s in track.states[11:91]:
                last = s.center_z if s.valid else last
                zs.append(last)
            z[track.id] = zs
    sets = [k[3:] for k in data.files if k.startswith("xy_")]
    worst = {}
    for name in sets:
        xy, yaw = data[f"xy_{name}"], data[f"yaw_{name}"]
        scenes = []
        for r in range(xy.shape[0]):
            trajs = [sim_agents_submission_pb2.SimulatedTrajectory(
                center_x=xy[r, i, :, 0].tolist(), center_y=xy[r, i, :, 1].tolist(),
                center_z=z[oid], heading=yaw[r, i].tolist(), object_id=oid)
                for oid, i in slots.items()]
            scenes.append(sim_agents_submission_pb2.JointScene(simulated_trajectories=trajs))
        rollouts = sim_agents_submission_pb2.ScenarioRollouts(
            scenario_id=scenario.scenario_id, joint_scenes=scenes)
        submission_specs.validate_scenario_rollouts(rollouts, scenario, challenge)
        theirs = metrics.compute_scenario_metrics_for_bundle(config, scenario, rollouts)
        buckets = metrics.aggregate_metrics_to_buckets(
            config, metrics.aggregate_scenario_metrics([theirs]))
        ours = json.loads(str(data[f"ours_{name}"]))
        rows = {ours_name: (float(getattr(theirs, field)), ours[ours_name])
                for field, ours_name in FIELDS.items()}
        for field, ours_name in (("kinematic_metrics", "kinematic"),
                                 ("interactive_metrics", "interactive"),
                                 ("map_based_metrics", "map_based")):
            rows[ours_name] = (float(getattr(buckets, field)), ours[ours_name])
        print(f"\n{name}: {'waymo':>8} {'jaxdrive':>9} {'diff':>8}")
        for k, (w, o) in rows.items():
            print(f"  {k:40s} {w:8.4f} {o:9.4f} {o - w:+8.4f}")
            if k not in ("ade", "min_ade"):
                worst[k] = max(worst.get(k, 0.0), abs(o - w))
    print("\nlargest |jaxdrive - waymo| over the sets:")
    for k, v in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"  {k:40s} {v:.4f}")


if __name__ == "__main__":
    main()

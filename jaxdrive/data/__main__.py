"""``python -m jaxdrive.data convert|inspect|subset``.

- ``convert INPUT... --out DIR``: JSON scenes, WOMD TFRecord files or directories (mixed)
  -> ``.npz`` shards and ``DIR/manifest.json``.
- ``inspect FILE``: summary of one scene (JSON, TFRecord with ``--index``, or a cache
  directory / scenario id), with its traffic lights' light-steps per state;
  ``inspect DIR --all``: the light-steps per state of every scene of a cache and in total.
- ``subset DIR --scores FILE.csv --threshold X --name NAME``: a behaviour-class subset.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import numpy as np

from jaxdrive.command import add_debug_flag, run_command
from jaxdrive.config import ConfigError, finite_float_arg, local_path_arg
from jaxdrive.data import shards as shards_lib
from jaxdrive.data import subsets as subsets_lib
from jaxdrive.data.checks import scenario_problems
from jaxdrive.data.convert import ConvertConfig, arrays_to_scenario, real_data_config
from jaxdrive.data.load import (
    MIRROR_VALIDATION,
    ConversionStopped,
    convert_one,
    convert_to_shards,
)
from jaxdrive.data.split import DEFAULT_VALIDATION_FRACTION, SPLITS, check_fraction
from jaxdrive.files import OutputError
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.signals import StopRequest
from jaxdrive.types import ObjectType, RoadType, TrafficLightState


def _fraction(text: str) -> float:
    try:
        return check_fraction(finite_float_arg(text))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _size_args(p: argparse.ArgumentParser) -> None:
    # Real-data sizes (every object and lane of a WOMD scene), not ScenarioConfig()'s
    # procedural defaults.
    d = real_data_config()
    p.add_argument("--max-agents", type=int, default=d.max_agents)
    p.add_argument("--num-steps", type=int, default=d.num_steps)
    p.add_argument("--max-road-points", type=int, default=d.max_road_points)
    p.add_argument("--max-lanes", type=int, default=d.max_lanes)
    p.add_argument("--max-lane-successors", type=int, default=d.max_lane_successors)
    p.add_argument("--max-traffic-lights", type=int, default=d.max_traffic_lights)
    p.add_argument("--init-step", type=int, default=ConvertConfig.init_step,
                   help="step whose SDC position is the origin (the env's init_step)")
    p.add_argument("--road-tolerance", type=float, default=ConvertConfig.road_tolerance,
                   help="metres; simplify polylines within this when over --max-road-points")
    p.add_argument("--road-spacing", type=float, default=ConvertConfig.road_spacing,
                   help="metres; resample polylines at this uniform spacing first, as "
                        "procedural maps are (procedural.point_spacing: 1.0); 0 = as logged")


def _configs(args) -> tuple[ScenarioConfig, ConvertConfig]:
    sc = ScenarioConfig(
        max_agents=args.max_agents, num_steps=args.num_steps,
        max_road_points=args.max_road_points, max_lanes=args.max_lanes,
        max_lane_successors=args.max_lane_successors,
        max_traffic_lights=args.max_traffic_lights)
    return sc, ConvertConfig(init_step=args.init_step, road_tolerance=args.road_tolerance,
                             road_spacing=args.road_spacing)


def cmd_convert(args) -> int:
    """``convert``: JSON scenes / WOMD TFRecords -> npz shards and a manifest, with a
    printed summary; returns 1 if no scenario could be converted, else 0."""
    if args.mirror and args.split == "validation":
        raise ConfigError(MIRROR_VALIDATION)
    sc, cc = _configs(args)
    t = time.perf_counter()
    notice = lambda name: (f"{name}: stopping; {args.out} stays as it was "  # noqa: E731
                           f"({name} again to stop at once)")
    with StopRequest(notice) as stop:
        try:
            m = convert_to_shards(args.inputs, args.out, sc, cc, shard_size=args.shard_size,
                                  compress=not args.no_compress, workers=args.workers,
                                  should_stop=lambda: stop.requested, split=args.split,
                                  validation_fraction=args.validation_fraction,
                                  mirror=args.mirror)
        except (ConversionStopped, KeyboardInterrupt):
            print(f"stopped by {stop.name}: nothing converted was kept, {args.out} is as "
                  "it was.", file=sys.stderr)
            return stop.exit_code if stop.requested else 130
    if stop.requested:
        print(f"{stop.name} arrived while the finished cache was put in place: it is "
              "complete and kept.", file=sys.stderr)
    dt = time.perf_counter() - t
    n = m["num_scenarios"]
    print(f"converted {n} scenarios from {len(m['source_files'])} files into "
          f"{m['num_shards']} shards ({m['total_bytes'] / 1e6:.1f} MB) in {dt:.1f} s "
          f"({n / max(dt, 1e-9):.1f} scenes/s)")
    tot = m["totals"]
    print(f"truncated: {m['truncated_agents']} agents, {m['truncated_road_points']} road "
          f"points ({tot['simplified_road_points']} of them simplified away within "
          f"{cc.road_tolerance:g} m), {tot['dropped_polylines']} polylines; dropped "
          f"never-valid agents: {tot['dropped_invalid_agents']}; SDC inferred in "
          f"{tot['inferred_sdc']} scenes")
    for s in m["skipped"]:
        source, reason = s["source"], s["reason"]  # most reasons name their source
        print(f"skipped {reason}" if reason.startswith(source) else
              f"skipped {source}: {reason}")
    if "split" in m:
        print(f"split: kept the {n} scenes of the {args.split} split; "
              f"{m['split']['scenes_of_the_other_split']} belong to the other one "
              f"(validation fraction {args.validation_fraction:g}, by scenario id)")
    if "augment" in m:
        print(f"mirror: {m['augment']['mirrored_scenes']} of the {n} scenes are mirrored "
              f"copies (ids ending {m['augment']['id_suffix']})")
    print(f"manifest: {args.out}/{shards_lib.MANIFEST}")
    if n == 0:
        print("error: no scenario could be converted (see the skip reasons above).",
              file=sys.stderr)
        return 1
    return 0


def _find_in_cache(directory: str, key: str | None, index: int):
    manifest = shards_lib.read_manifest(directory)
    records = manifest["scenarios"]
    if key is not None:
        matches = [i for i, r in enumerate(records) if r["scenario_id"] == key]
        if not matches:
            raise ConfigError(f"no scenario with id {key!r} in '{directory}'.")
        index = matches[0]
    if not 0 <= index < len(records):
        raise ConfigError(f"'{directory}' holds {len(records)} scenarios; index {index} is "
                          "out of range.")
    rec = records[index]
    stored = shards_lib.manifest_scenario_config(manifest)
    init_step = ConvertConfig.from_manifest(manifest["convert_config"],
                                            "manifest.convert_config").init_step
    shard = shards_lib.read_shard(shards_lib.shard_path(directory, manifest, rec["shard"]),
                                  stored, manifest["shards"][rec["shard"]]["num_scenarios"])
    arrays = {k: v[rec["index"]] for k, v in shard.items() if not k.startswith("meta.")}
    return arrays, rec, stored, init_step


def light_state_counts(state: np.ndarray, valid: np.ndarray) -> dict[str, int]:
    """Valid light-steps per ``TrafficLightState`` name, every state listed in enum order.

    Args:
      state: (..., TL, T) int ``TrafficLightState``; valid: (..., TL, T) bool.
    """
    n = len(TrafficLightState)
    counts = np.bincount(np.clip(state[valid], 0, n - 1), minlength=n)
    return {s.name: int(counts[s]) for s in TrafficLightState}


def _show_counts(counts: dict[str, int]) -> str:
    """``STOP 410, GO 500`` (states with light-steps only), or ``none``."""
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"


def _inspect_cache_lights(directory: str, as_json: bool) -> int:
    """``inspect DIR --all``: light-steps per state of every scene of a cache and their
    sum; returns 0."""
    manifest = shards_lib.read_manifest(directory)
    stored = shards_lib.manifest_scenario_config(manifest)
    by_shard = collections.defaultdict(list)
    for rec in manifest["scenarios"]:
        by_shard[rec["shard"]].append(rec)
    scenes = []
    total = dict.fromkeys((s.name for s in TrafficLightState), 0)
    for j, recs in sorted(by_shard.items()):
        shard = shards_lib.read_shard(shards_lib.shard_path(directory, manifest, j), stored,
                                      manifest["shards"][j]["num_scenarios"])
        for rec in recs:
            state = shard["traffic_lights.state"][rec["index"]]
            valid = shard["traffic_lights.valid"][rec["index"]]
            counts = light_state_counts(state, valid)
            scenes.append({"scenario_id": rec["scenario_id"],
                           "traffic_lights": int(valid.any(axis=1).sum()),
                           "traffic_light_states": counts})
            total = {k: total[k] + v for k, v in counts.items()}
    summary = {"scenarios": len(scenes),
               "traffic_lights": sum(s["traffic_lights"] for s in scenes),
               "traffic_light_states": total, "per_scenario": scenes}
    if as_json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"cache {directory}: {len(scenes)} scenarios, {summary['traffic_lights']} traffic "
          "lights")
    for sc in scenes:
        print(f"  {sc['scenario_id']}: {sc['traffic_lights']} lights; light-steps "
              f"{_show_counts(sc['traffic_light_states'])}")
    print(f"  total light-steps: {_show_counts(total)}")
    return 0


def cmd_inspect(args) -> int:
    """``inspect``: print a summary (text or ``--json``) of one scene of a source file or
    a converted directory, or ``--all`` scenes' light-state counts; returns 0, or 1 when
    the scene fails one of its checks (they are printed)."""
    if args.all:
        if not shards_lib.is_shard_dir(args.file):
            raise ConfigError(f"inspect --all needs a converted directory; '{args.file}' "
                              "holds no manifest.")
        return _inspect_cache_lights(args.file, args.json)
    if shards_lib.is_shard_dir(args.file):
        arrays, info, sc, init_step = _find_in_cache(args.file, args.id, args.index)
    else:
        sc, cc = _configs(args)
        arrays, info = convert_one(args.file, sc, cc, args.index)
        init_step = cc.init_step
    scen = arrays_to_scenario(arrays)
    obj, rg = arrays["objects.valid"], arrays["roadgraph.valid"]
    present = obj.any(axis=1)
    types = collections.Counter(ObjectType(int(t)).name.lower()
                                for t in arrays["objects.type"][present])
    rtypes = collections.Counter(RoadType(int(t)).name.lower()
                                 for t in arrays["roadgraph.type"][rg])
    sdc = int(np.argmax(arrays["objects.is_sdc"]))
    sdc_steps = int(obj[sdc].sum())
    ox, oy = info["origin"]
    n_tl = int(arrays["traffic_lights.valid"].any(axis=1).sum())
    summary = {
        "scenario_id": info["scenario_id"], "source": info.get("source"),
        "steps": int(obj.shape[1]), "init_step": init_step,
        "agents": int(present.sum()), "agents_in_source": info.get("num_objects_in"),
        "agent_types": dict(types),
        "sdc": {"slot": sdc, "valid_steps": sdc_steps, "inferred": info.get("sdc_inferred"),
                "type": ObjectType(int(arrays["objects.type"][sdc])).name.lower(),
                "length": float(arrays["objects.length"][sdc]),
                "width": float(arrays["objects.width"][sdc])},
        "origin_world": [ox, oy],
        "road_points": int(rg.sum()), "road_points_in_source": info.get("num_road_points_in"),
        "road_tolerance_edges_other": info.get("road_tolerance"),
        "simplified_road_points": info.get("simplified_road_points", 0),
        "road_point_types": dict(rtypes),
        "lanes": int(arrays["lanes.valid"].sum()),
        "traffic_lights": n_tl,
        "traffic_light_states": light_state_counts(arrays["traffic_lights.state"],
                                                   arrays["traffic_lights.valid"]),
        "of_interest": int(arrays["objects.of_interest"].sum()),
        "to_predict": int(arrays["objects.to_predict"].sum()),
        "truncated_agents": info.get("truncated_agents", 0),
        "truncated_road_points": info.get("truncated_road_points", 0),
        "problems": scenario_problems(scen, sc, init_step),
    }
    failed = 1 if summary["problems"] else 0  # the scene fails its own checks
    if args.json:
        print(json.dumps(summary, indent=1))
        return failed
    print(f"scenario {summary['scenario_id']}  ({summary['source']})")
    print(f"  steps: {summary['steps']} (init_step {init_step})")
    print(f"  agents: {summary['agents']} kept of {summary['agents_in_source']} "
          f"{dict(types)}; truncated {summary['truncated_agents']}")
    s = summary["sdc"]
    print(f"  SDC: slot {s['slot']}, {s['type']} {s['length']:.2f} x {s['width']:.2f} m, "
          f"valid {s['valid_steps']}/{summary['steps']} steps"
          + (f" (inferred: {s['inferred']})" if s["inferred"] else ""))
    print(f"  origin (world): ({ox:.3f}, {oy:.3f})")
    print(f"  road points: {summary['road_points']} kept of "
          f"{summary['road_points_in_source']} (simplified within tolerance edges/other "
          f"{summary['road_tolerance_edges_other']} m: {summary['simplified_road_points']}) "
          f"{dict(rtypes)}")
    print(f"  lanes: {summary['lanes']}, traffic lights: {n_tl}, objects of interest: "
          f"{summary['of_interest']}, tracks to predict: {summary['to_predict']}")
    print(f"  traffic-light steps by state: {_show_counts(summary['traffic_light_states'])}")
    print(f"  checks: {'ok' if not summary['problems'] else '; '.join(summary['problems'])}")
    return failed


def cmd_subset(args) -> int:
    """``subset``: list a converted directory's subsets (``--list``) or build one from a
    scores CSV and a threshold; returns 0 (``ConfigError`` on missing arguments)."""
    if args.list:
        manifest = shards_lib.read_manifest(args.dir)
        names = sorted(set(manifest.get("classes", {})) |
                       set(subsets_lib.list_subset_files(args.dir)))
        for name in names:
            print(f"{name}: {len(subsets_lib.subset_ids(args.dir, name, manifest))} scenarios")
        return 0
    if args.scores is None or args.threshold is None or args.name is None:
        raise ConfigError("subset needs --scores FILE.csv --threshold X --name NAME "
                          "(or --list).")
    rec = subsets_lib.build_subset_from_csv(args.dir, args.scores, args.threshold, args.name,
                                            above=not args.below, column=args.column)
    print(f"subset {rec['name']}: {len(rec['scenario_ids'])} scenarios ({rec['rule']}); "
          f"{rec['num_scored']} scored, {rec['num_unknown']} scored ids not in the cache, "
          f"{rec['num_missing']} cache scenarios without a score")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.data``; returns the exit code (2 on a
    ``ConfigError``)."""
    parser = argparse.ArgumentParser(prog="python -m jaxdrive.data",
                                     description="Convert and inspect real driving data.")
    add_debug_flag(parser)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("convert", help="JSON scenes / WOMD TFRecords -> npz shards")
    p.add_argument("inputs", type=local_path_arg, nargs="+",
                   help="files or directories (JSON, TFRecord, mixed)")
    p.add_argument("--out", type=local_path_arg, required=True, help="output directory")
    p.add_argument("--shard-size", type=int, default=128, help="scenarios per shard")
    p.add_argument("--no-compress", action="store_true", help="store shards uncompressed")
    p.add_argument("--workers", type=int, default=1, help="conversion processes")
    p.add_argument("--split", choices=SPLITS, default=None,
                   help="keep only the scenes of this split: a deterministic hash of the "
                        "scenario id puts --validation-fraction of the scenes in "
                        "'validation', the rest in 'train' (docs/data.md)")
    p.add_argument("--validation-fraction", type=_fraction,
                   default=DEFAULT_VALIDATION_FRACTION,
                   help="share of scenes in the validation split, in (0, 1)")
    p.add_argument("--mirror", action="store_true",
                   help="also write each scene reflected across its x axis, id suffixed "
                        "'~mirror' (training augmentation; not with --split validation)")
    _size_args(p)
    p.set_defaults(fn=cmd_convert)
    p = sub.add_parser("inspect", help="summary of one scene")
    p.add_argument("file", help="JSON scene, TFRecord file, or converted directory")
    p.add_argument("--index", type=int, default=0, help="scene index in the file/cache")
    p.add_argument("--id", default=None, help="scenario id (converted directory)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--all", action="store_true",
                   help="converted directory: traffic-light steps by state of every scene")
    _size_args(p)
    p.set_defaults(fn=cmd_inspect)
    p = sub.add_parser("subset", help="build or list behaviour-class subsets")
    p.add_argument("dir", help="converted directory")
    p.add_argument("--scores", help="CSV with scenario_id and a score column")
    p.add_argument("--column", default=None, help="score column (default: the only one)")
    p.add_argument("--threshold", type=finite_float_arg)
    p.add_argument("--below", action="store_true", help="keep scores <= threshold")
    p.add_argument("--name", help="subset (behaviour class) name")
    p.add_argument("--list", action="store_true", help="list the subsets")
    p.set_defaults(fn=cmd_subset)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run_command(main, "data"))

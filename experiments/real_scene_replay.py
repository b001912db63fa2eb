"""Collision and off-road of logged vehicles on real WOMD scenes: the log itself against
its replay through the env (issue 20, "Real scenes"; docs/real_scene_replay.md).

    python experiments/real_scene_replay.py [--data DIR ...] [--json PATH]
        [--variants bicycle/discrete bicycle/continuous delta_local/continuous]
        [--parked-extent 0.5] [--parked-speed 1.0] [--goal-behavior stop|remove]

``--data`` (JSON or ``.json.gz`` folders, WOMD TFRecords, or directories converted by
``python -m jaxdrive.data convert``, e.g. a validation split) defaults to the folders of
``../shared/data`` that exist (womd_json, womd_json_traffic_lights, womd_json_legacy,
womd_tfrecord). Scenes are loaded with
``jaxdrive.data.load_scenarios`` at the converter's real-data sizes (128 agents, 512
lanes, 32 lights) and ``init_step`` 10.

Population: every vehicle valid at ``init_step`` (the env's candidates), an agent-episode
from ``init_step`` to the end of the log, counted at the steps where the vehicle is valid
in its log. Every object present (any type) is an obstacle. Classes: the SDC, parked
vehicles (``jaxdrive.scenarios.parked.parked_vehicles``), moving vehicles (the rest).

- ``log``: the logged boxes themselves (exact positions and yaw).
- ``replay`` (one per variant): one episode per scene of the env with every vehicle under
  the ``log_replay`` controller (``control_mode: all``, ``collision_behavior: ignore``,
  ``goal_behavior: stop``, or ``remove`` with ``--goal-behavior remove``); objects the env
  does not control replay their log or stand
  (``static_threshold``). Steps after an early episode end (the env resets) are not
  counted; the log over the same steps is the baseline of the added error. Scored twice:
  with every object the env has present as an obstacle (what the env's metrics see; it
  keeps controlled vehicles after their log ends), and with only objects valid in the
  log at that step (``log obstacles``: what the motion alone adds).

Both use jaxdrive's metric code on the boxes: ``geometry.pairwise_overlap`` (collision) and
``road_index.is_offroad`` (a box corner beyond the road edges); the replay's recomputed
flags are checked against the env's own ``collided`` / ``offroad`` metrics. A collision
pair whose boxes already overlap at the first logged step where both are valid (from
``init_step``) is a labelling artefact, counted separately (``col_clean`` excludes them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive import geometry
from jaxdrive.agents.controllers import log_replay
from jaxdrive.config import ConfigError
from jaxdrive.data import load_scenarios
from jaxdrive.data.convert import ConvertConfig, real_data_config
from jaxdrive.data.shards import is_shard_dir, manifest_scenario_config, read_manifest
from jaxdrive.env import Env, EnvConfig
from jaxdrive.scenarios import road_index
from jaxdrive.scenarios.parked import PARKED_MAX_EXTENT, PARKED_MAX_SPEED, parked_vehicles
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.road_index import RoadIndexConfig
from jaxdrive.types import EntityKind, ObjectType

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DEFAULT_DIRS = ("womd_json", "womd_json_traffic_lights", "womd_json_legacy", "womd_tfrecord")
VARIANTS = ("bicycle/discrete", "bicycle/continuous", "delta_local/continuous")
CLASSES = ("sdc", "moving", "parked")
# Vehicles first valid after init_step: not agents of the episode (the env never controls
# them; they replay their log), reported apart.
LATE = ("late_moving", "late_parked")
KIND_NAMES = {int(k): k.name.lower() for k in EntityKind}


# ------------------------------------------------------------------ per-step geometry
def _events_fn():
    """jitted (index, roadgraph, xy (N, S, A, 2), yaw (N, S, A), length, width (N, A),
    present (N, S, A)) -> hit (N, S, A, A) bool, offroad (N, S, A) bool, depth (N, S, A)
    float32 (largest corner distance beyond the road edges, > 0 off-road)."""

    def one_step(index, sid, xy, yaw, length, width, present):
        hit = geometry.pairwise_overlap(xy, yaw, length, width, present)
        off = present & road_index.is_offroad(index, None, xy, yaw, length, width, sid)
        corners = geometry.box_corners(xy, yaw, length, width)
        depth = jnp.max(road_index.offroad_distance(index, None, corners, sid), axis=-1)
        return hit, off, depth

    def scene(index, sid, xy, yaw, length, width, present):
        return jax.vmap(one_step, in_axes=(None, None, 0, 0, None, None, 0))(
            index, sid, xy, yaw, length, width, present)

    def run(index, xy, yaw, length, width, present):
        sids = jnp.arange(xy.shape[0], dtype=jnp.int32)
        return jax.vmap(scene, in_axes=(None, 0, 0, 0, 0, 0, 0))(
            index, sids, xy, yaw, length, width, present)

    return jax.jit(run)


# ------------------------------------------------------------------ replay
def _env(variant: str, scenario_config, init_step: int, index: dict,
         goal_behavior: str = "stop") -> Env:
    model, space = variant.split("/")
    return Env(EnvConfig.from_dict({
        "scenario": scenario_config.to_dict(),
        "control_mode": "all", "collision_behavior": "ignore", "goal_behavior": goal_behavior,
        "dynamics": {"model": model, "action_space": space},
        # The controller reads the log, not the observation: keep it small.
        "observation": {"num_partners": 1, "num_road": 4, "num_lights": 1},
        "init_step": init_step, "road_index": index,
    }))


def replay(env: Env, pool, num: int) -> dict[str, np.ndarray]:
    """One episode per scene, every vehicle driven by ``log_replay``. Returns (N, S, A)
    arrays over the S = num_episode_steps + 1 states from the reset on: ``xy``, ``yaw``,
    ``present``, ``counted`` (within the first episode), the env's ``collided`` /
    ``offroad`` / ``goal`` metrics, ``active``; and (N, A) ``kind``."""
    params = env.make_params(pool)
    controller = log_replay(env)
    steps = env.config.num_episode_steps

    def episode(sid):
        state, ts = env.reset_to(params, sid, jax.random.key(0))
        a0 = state.agents

        def body(carry, _):
            state, ts, ended = carry
            live = ~ended
            nxt, nts = env.step(params, state, controller(params, state, ts, None))
            m = nts.info.metrics
            ag = nts.info.terminal  # the state reached, before any auto-reset
            out = dict(xy=ag.xy, yaw=ag.yaw, present=ag.valid, counted=live,
                       done=state.done,  # frozen at its goal during this step
                       collided=m["collided"], offroad=m["offroad"],
                       goal=m["goal_reached"], active=state.active & live)
            return (nxt, nts, ended | nts.info.episode_done), out

        _, out = jax.lax.scan(body, (state, ts, jnp.asarray(False)), None, steps)
        first = dict(xy=a0.xy, yaw=a0.yaw, present=a0.valid, counted=jnp.asarray(True),
                     collided=jnp.zeros_like(a0.valid), offroad=jnp.zeros_like(a0.valid),
                     goal=jnp.zeros_like(a0.valid), active=jnp.zeros_like(a0.valid),
                     done=jnp.zeros_like(a0.valid))
        out = {k: jnp.concatenate([first[k][None], v]) for k, v in out.items()}
        out["kind"] = state.kind
        return out

    run = jax.jit(jax.vmap(episode))
    out = jax.device_get(run(jnp.arange(num, dtype=jnp.int32)))
    out = {k: np.asarray(v) for k, v in out.items()}
    out["counted"] = np.broadcast_to(out["counted"][..., None], out["present"].shape)
    return out


# ------------------------------------------------------------------ statistics
def _rate(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def vehicle_stats(hit, off, depth, valid, counted, artefact, cls, agents) -> dict:
    """Per class: agent-episode rates and vehicle-step fractions.

    hit (N, S, A, A), off / depth / valid / counted (N, S, A): ``valid`` the vehicle is
    valid in its log at that step, ``counted`` the step is measured. artefact (N, A, A)
    bool, cls (N, A) class names ("" for non-vehicles), agents (N, A) bool: the
    population of the "all" row."""
    m = valid & counted  # (N, S, A)
    col_step = np.any(hit, axis=-1) & m
    clean_step = np.any(hit & ~artefact[:, None], axis=-1) & m
    art_step = np.any(hit & artefact[:, None], axis=-1) & m
    off_step = off & m
    out = {}
    for c in (*CLASSES, "all", *LATE):
        sel = agents if c == "all" else (cls == c)
        steps = m[:, :, :].transpose(0, 2, 1)[sel]  # (n, S)
        n = int(sel.sum())
        col = np.any(col_step.transpose(0, 2, 1)[sel], axis=-1)
        clean = np.any(clean_step.transpose(0, 2, 1)[sel], axis=-1)
        art = np.any(art_step.transpose(0, 2, 1)[sel], axis=-1)
        offv = np.any(off_step.transpose(0, 2, 1)[sel], axis=-1)
        d = np.where(off_step, depth, -np.inf).transpose(0, 2, 1)[sel].max(axis=-1,
                                                                           initial=-np.inf)
        vsteps = int(steps.sum())
        out[c] = {
            "vehicles": n, "vehicle_steps": vsteps,
            "collision": _rate(col), "collision_clean": _rate(clean),
            "collision_artefact": _rate(art),
            "offroad": _rate(offv),
            "collision_steps": (float(col_step.transpose(0, 2, 1)[sel].sum() / vsteps)
                                if vsteps else None),
            "offroad_steps": (float(off_step.transpose(0, 2, 1)[sel].sum() / vsteps)
                              if vsteps else None),
            "collided_vehicles": int(col.sum()), "collided_clean_vehicles": int(clean.sum()),
            "offroad_vehicles": int(offv.sum()),
            # Off-road vehicles whose deepest corner stays within 0.5 m of the edge, and
            # the median over off-road vehicles of their deepest corner (m).
            "offroad_shallow_vehicles": int((offv & (d <= 0.5)).sum()),
            "offroad_depth_median_m": (round(float(np.median(d[offv])), 2) if offv.any()
                                       else None),
        }
    return out


def collision_pairs(hit, valid, counted, artefact, cls, types, speed, scene_ids,
                    t0, extra: dict | None = None) -> list[dict]:
    """Every pair of objects that overlaps at some counted step where both are valid
    (the caller masks ``hit`` to pairs with an agent). ``types`` (N, A) type names name
    the non-vehicles; ``speed`` (N, S, A) logged speeds; ``extra``: name -> (N, S, A)
    array, each pair's two values at its first overlapping step, or (N, A): per slot."""
    m = valid & counted
    both = hit & m[..., :, None] & m[..., None, :]  # hit already requires presence
    pairs = []
    n, _, a, _ = hit.shape
    for i in range(n):
        ii, jj = np.nonzero(np.any(both[i], axis=0))
        for p, q in zip(ii, jj, strict=True):
            if p >= q:
                continue
            ts = np.flatnonzero(both[i, :, p, q])
            pairs.append({
                "scene": scene_ids[i], "slots": [int(p), int(q)],
                "classes": [str(cls[i, p]) or str(types[i, p]),
                            str(cls[i, q]) or str(types[i, q])],
                "first_step": int(ts[0]) + t0, "steps": int(ts.size),
                "artefact": bool(artefact[i, p, q]),
                "max_speed": [round(float(speed[i, ts, p].max()), 2),
                              round(float(speed[i, ts, q].max()), 2)],
            })
            for name, x in (extra or {}).items():
                v = x[i, ts[0]] if x.ndim == 3 else x[i]
                v = [v[p], v[q]]
                pairs[-1][name] = [round(float(u), 2) if isinstance(u, (float, np.floating))
                                   else (u.item() if hasattr(u, "item") else u) for u in v]
    return pairs


def offroad_list(off, depth, valid, counted, cls, scene_ids, t0,
                 offset=None) -> list[dict]:
    """Every vehicle (of a named class) off-road at some counted step where it is valid:
    its steps off-road, the deepest corner beyond the edge (m) and, for a replay, the
    largest distance from its logged centre at those steps (m)."""
    m = off & valid & counted
    rows = []
    for i, slot in zip(*np.nonzero(np.any(m, axis=1) & (cls != "")), strict=True):
        ts = np.flatnonzero(m[i, :, slot])
        row = {"scene": scene_ids[i], "slot": int(slot), "class": str(cls[i, slot]),
               "first_step": int(ts[0]) + t0, "steps": int(ts.size),
               "valid_steps": int((valid & counted)[i, :, slot].sum()),
               "max_depth_m": round(float(depth[i, ts, slot].max()), 2)}
        if offset is not None:
            row["max_offset_m"] = round(float(offset[i, ts, slot].max()), 2)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", default=None,
                   help=f"scene files or folders (default: the folders of {SHARED} that exist)")
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS,
                   help="replays to run: MODEL/ACTION_SPACE (none: the log only)")
    p.add_argument("--parked-extent", type=float, default=PARKED_MAX_EXTENT,
                   help="metres: parked if every two valid logged centres are closer")
    p.add_argument("--parked-speed", type=float, default=PARKED_MAX_SPEED,
                   help="m/s: ... and every valid logged speed is lower")
    p.add_argument("--init-step", type=int, default=10)
    p.add_argument("--goal-behavior", choices=("stop", "remove"), default="stop",
                   help="what a replayed vehicle does at its goal: stop there (frozen, an "
                        "obstacle to the end of the episode) or leave the scene (GPUDrive)")
    p.add_argument("--grid-size", type=int, default=64,
                   help="road index cells per side (the env default is 32)")
    p.add_argument("--edges-per-cell", type=int, default=128,
                   help="road index edge candidates per cell (the env default is 32); "
                        "large enough that no cell overflows, so the off-road test is exact")
    args = p.parse_args(argv)

    dirs = args.data or [str(SHARED / d) for d in DEFAULT_DIRS if (SHARED / d).is_dir()]
    missing = [d for d in dirs if not os.path.exists(d)]
    if not dirs or missing:
        print(f"no real scenes: {', '.join(missing) if missing else str(SHARED)} not found. "
              "Pass --data DIR (WOMD JSON scenes or TFRecords).", file=sys.stderr)
        return 2

    t_start = time.perf_counter()
    sc = real_data_config()
    # Converted caches keep the sizes they were written with (e.g. more road points with
    # a finer --road-spacing); load at the largest of theirs and the real-data sizes.
    for d in dirs:
        if is_shard_dir(d):
            stored = manifest_scenario_config(read_manifest(d))
            sc = sc.replace(**{f: max(getattr(sc, f), getattr(stored, f))
                               for f in ("max_agents", "max_road_points", "max_lanes",
                                         "max_traffic_lights", "max_lane_successors")})
    try:
        scen, report = load_scenarios(dirs, sc, ConvertConfig(init_step=args.init_step))
    except ConfigError as e:
        print(f"cannot load {', '.join(dirs)}: {e}", file=sys.stderr)
        return 2
    n = report["num_scenarios"]
    names = [os.path.basename(s.split("#")[0]) for s in report["sources"]]
    inferred = [r.get("sdc_inferred") for r in report["scenarios"]]
    print(f"{n} scenes from {len(dirs)} folder(s); skipped {len(report['skipped'])}, "
          f"truncated agents {report['truncated_agents']}, truncated road points "
          f"{report['truncated_road_points']}")
    scen = jax.tree.map(jnp.asarray, scen)
    ob = scen.objects
    t0 = args.init_step
    ri = {"grid_size": args.grid_size, "edges_per_cell": args.edges_per_cell}
    envs = {v: _env(v, sc, t0, ri, args.goal_behavior) for v in args.variants}
    ri_config = RoadIndexConfig(**ri)
    pool = make_pool(scen, ri_config)
    overflow = np.asarray(pool.road_index.edge_overflow)

    valid = np.asarray(ob.valid[:, :, t0:]).transpose(0, 2, 1)  # (N, S, A)
    vehicle = np.asarray(ob.type) == ObjectType.VEHICLE
    is_sdc = np.asarray(ob.is_sdc)
    parked = np.asarray(parked_vehicles(ob, args.parked_extent, args.parked_speed))
    agents = vehicle & valid[:, 0]  # vehicles valid at init_step
    late = vehicle & ~valid[:, 0] & valid.any(axis=1)
    cls = np.where(is_sdc, "sdc", np.where(parked, "parked", "moving"))
    cls = np.where(agents, cls, np.where(late, "late_" + cls, "")).astype(object)
    types = np.vectorize(lambda k: ObjectType(int(k)).name.lower())(np.asarray(ob.type))
    speed_log = np.linalg.norm(np.asarray(ob.vel[:, :, t0:]), axis=-1).transpose(0, 2, 1)

    events = _events_fn()
    length, width = ob.length, ob.width
    xy_log = jnp.swapaxes(ob.xy[:, :, t0:], 1, 2)
    yaw_log = jnp.swapaxes(ob.yaw[:, :, t0:], 1, 2)
    hit, off, depth = (np.asarray(x) for x in events(
        pool.road_index, xy_log, yaw_log, length, width, jnp.asarray(valid)))
    counted_all = np.ones_like(valid)
    xy_log_np = np.asarray(xy_log)

    # Labelling artefacts: pairs overlapping at the first step where both are valid.
    both = valid[:, :, :, None] & valid[:, :, None, :]  # (N, S, A, A)
    first = np.argmax(both, axis=1)  # (N, A, A)
    artefact = np.take_along_axis(hit, first[:, None], axis=1)[:, 0] & np.any(both, axis=1)

    mask_pairs = lambda h: h & (agents[:, None, :, None] | agents[:, None, None, :])
    results = {
        "command": "python experiments/real_scene_replay.py " + " ".join(argv or sys.argv[1:]),
        "data": dirs, "scenes": [], "init_step": t0,
        "parked_rule": {"max_extent_m": args.parked_extent, "max_speed_mps": args.parked_speed},
        "road_index": ri, "goal_behavior": args.goal_behavior,
        "log": {"stats": vehicle_stats(hit, off, depth, valid, counted_all, artefact, cls,
                                       agents),
                "pairs": collision_pairs(mask_pairs(hit), valid, counted_all, artefact, cls,
                                         types, speed_log, report["scenario_ids"], t0)},
        "replay": {},
    }
    results["log"]["offroad_vehicles"] = offroad_list(off, depth, valid, counted_all, cls,
                                                      report["scenario_ids"], t0)
    for i in range(n):
        results["scenes"].append({
            "scenario_id": report["scenario_ids"][i], "source": names[i],
            "sdc_inferred": inferred[i], "edge_overflow_cells": int(overflow[i]),
            "objects": int(np.asarray(ob.valid[i]).any(-1).sum()),
            "vehicles": int(agents[i].sum()),
            **{c: int((agents[i] & (cls[i] == c)).sum()) for c in CLASSES},
            "log_offroad_moving": int(
                (agents[i] & (cls[i] == "moving") & np.any(off[i] & valid[i], 0)).sum()),
        })

    for v, env in envs.items():
        t = time.perf_counter()
        out = replay(env, pool, n)
        # The same metric code on the replayed boxes; obstacles: everything the env has
        # present. Vehicles are measured where valid in their log.
        r_hit, r_off, r_depth = (np.asarray(x) for x in events(
            pool.road_index, jnp.asarray(out["xy"]), jnp.asarray(out["yaw"]), length,
            width, jnp.asarray(out["present"])))
        # Cross-check against the env's own metrics (steps after the reset, counted).
        chk = out["counted"][:, 1:] & out["present"][:, 1:]
        mism_col = int((np.any(r_hit, -1)[:, 1:] != out["collided"][:, 1:])[chk].sum())
        mism_off = int((r_off[:, 1:] != out["offroad"][:, 1:])[chk].sum())
        r_valid = valid & out["present"]
        stats = vehicle_stats(r_hit, r_off, r_depth, r_valid, out["counted"], artefact, cls,
                              agents)
        # Obstacles restricted to objects valid in the log at that step: what the replay
        # adds by its motion alone (the env keeps controlled vehicles present after
        # their log ends; those are counted above, not here).
        stats_lv = vehicle_stats(r_hit & valid[:, :, None, :], r_off, r_depth, r_valid,
                                 out["counted"], artefact, cls, agents)
        offset = np.linalg.norm(out["xy"] - xy_log_np, axis=-1)
        kind = out["kind"]
        kinds = {c: {KIND_NAMES[k]: int((agents & (cls == c) & (kind == k)).sum())
                     for k in (1, 2, 3)} for c in CLASSES}
        # The env's own accounting (controlled agents while acting, as training and
        # validation report it): goal / collision / off-road per agent-episode.
        ctrl = kind == EntityKind.CONTROLLED
        env_rates = {
            "agents": int(ctrl.sum()),
            **{name: float(np.any(out[key] & out["active"], axis=1)[ctrl].mean())
               for name, key in (("goal", "goal"), ("collision", "collided"),
                                 ("offroad", "offroad"))},
            # The same, counting only steps where the agent is valid in its log.
            **{f"{name}_log_valid": float(
                np.any(out[key] & out["active"] & valid, axis=1)[ctrl].mean())
               for name, key in (("collision", "collided"), ("offroad", "offroad"))},
        }
        # Controlled vehicles the env keeps after their log ends (or in a gap of it):
        # present in the env at counted steps where their log is invalid.
        ghost = out["present"] & out["counted"] & ~valid & ctrl[:, None]
        # Tracking: distance of controlled vehicles from their logged centres while
        # valid in the log and still driving (not yet stopped at the goal).
        track = ctrl[:, None] & valid & out["counted"] & ~out["done"]
        off_t = offset[track]
        tracking = {"steps": int(off_t.size),
                    **{f"p{q}_m": round(float(np.percentile(off_t, q)), 3)
                       for q in (50, 95, 99)},
                    "max_m": round(float(off_t.max()), 3)}
        results["replay"][v] = {
            "stats": stats, "stats_log_obstacles": stats_lv,
            # The log over the same counted steps: the baseline of the added error.
            "log_same_steps": vehicle_stats(hit, off, depth, valid, out["counted"],
                                            artefact, cls, agents),
            "kinds": kinds, "env_accounting": env_rates, "tracking": tracking,
            "outliving_vehicles": int(np.any(ghost, axis=1).sum()),
            "offroad_vehicles": offroad_list(r_off, r_depth, r_valid, out["counted"], cls,
                                             report["scenario_ids"], t0, offset),
            "uncounted_steps": int((~out["counted"][:, :, 0]).sum()),
            "metric_mismatch": {"collided": mism_col, "offroad": mism_off},
            "pairs": collision_pairs(
                mask_pairs(r_hit), out["present"], out["counted"], artefact, cls, types,
                speed_log,
                report["scenario_ids"], t0,
                extra={"kind": np.vectorize(KIND_NAMES.get)(kind),
                       "stopped_at_goal": out["done"],
                       "log_valid": valid,
                       "offset_m": offset,
                       "in_log": np.asarray(np.any(hit, -1))}),
            "seconds": round(time.perf_counter() - t, 1),
        }
        print(f"replay {v}: {results['replay'][v]['seconds']} s", flush=True)

    _print(results)
    results["seconds"] = round(time.perf_counter() - t_start, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _print(res: dict) -> None:
    print("\nscenes (vehicles valid at init_step: SDC / moving / parked):")
    for s in res["scenes"]:
        mark = f" (SDC inferred: {s['sdc_inferred']})" if s["sdc_inferred"] else ""
        print(f"  {s['scenario_id']} [{s['source']}]{mark}: {s['objects']} objects, "
              f"{s['sdc']} / {s['moving']} / {s['parked']}; edge-overflow cells "
              f"{s['edge_overflow_cells']}")
    rows = [("log", res["log"]["stats"])]
    for v, r in res["replay"].items():
        rows += [(f"replay {v}", r["stats"]),
                 (f"replay {v}, log obstacles", r["stats_log_obstacles"])]
    print("\nper agent-episode rates, % (collision: all / without artefact pairs / with "
          "artefact pairs; off-road; off-road vehicle-steps)")
    print("| source | class | vehicles | collision | col. clean | col. artefact | off-road "
          "| off-road steps |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, st in rows:
        for c in (*CLASSES, "all", *LATE):
            x = st[c]
            print(f"| {name} | {c} | {x['vehicles']} | {_pct(x['collision'])} | "
                  f"{_pct(x['collision_clean'])} | {_pct(x['collision_artefact'])} | "
                  f"{_pct(x['offroad'])} | {_pct(x['offroad_steps'])} |")
    if res["replay"]:
        print("\nreplay-added error = replay - log (the log over the replay's counted "
              "steps), percentage points (collision / clean / off-road)")
        for v, r in res["replay"].items():
            base = r["log_same_steps"]
            for label, key in (("env obstacles", "stats"),
                               ("log obstacles", "stats_log_obstacles")):
                cells = []
                for c in (*CLASSES, "all"):
                    d = [r[key][c][k] - base[c][k] if base[c][k] is not None else None
                         for k in ("collision", "collision_clean", "offroad")]
                    cells.append(f"{c} " + " / ".join(
                        "-" if x is None else f"{100 * x:+.1f}" for x in d))
                print(f"  {v}, {label}: " + "; ".join(cells))
            e = r["env_accounting"]
            print(f"    env accounting ({e['agents']} controlled): goal {e['goal']:.3f}, "
                  f"collision {e['collision']:.3f}, off-road {e['offroad']:.3f} (log-valid "
                  f"steps only: {e['collision_log_valid']:.3f}, "
                  f"{e['offroad_log_valid']:.3f}); controlled vehicles kept after their log "
                  f"ends: {r['outliving_vehicles']}")
            print(f"    tracking (controlled, before the goal): {r['tracking']}")
            print(f"    kinds {r['kinds']}; uncounted scene-steps {r['uncounted_steps']}; "
                  f"metric mismatches {r['metric_mismatch']}")
    for name, rows_ in [("log", res["log"]["offroad_vehicles"])] + [
            (f"replay {v}", r["offroad_vehicles"]) for v, r in res["replay"].items()]:
        moving = [q for q in rows_ if q["class"] in ("sdc", "moving", "late_moving")]
        print(f"\n{name}: off-road SDC / moving vehicles (scene, slot, class, steps "
              "off-road / valid, deepest corner m, largest offset from the log m):")
        for q in moving:
            print(f"  {q['scene']} {q['slot']} {q['class']} {q['steps']}/{q['valid_steps']} "
                  f"depth {q['max_depth_m']} offset {q.get('max_offset_m', '-')}")
    print("\nlogged collision pairs (scene, slots, classes, first step, steps, artefact, "
          "max speeds m/s):")
    for q in res["log"]["pairs"]:
        print(f"  {q['scene']} {q['slots']} {q['classes']} t={q['first_step']} "
              f"n={q['steps']} artefact={q['artefact']} v={q['max_speed']}")


if __name__ == "__main__":
    sys.exit(main())

"""How feasible are procedural scenes? Collision and off-road of the logged boxes
themselves and of their replay through each dynamics model (issue 20).

    python experiments/procedural_feasibility.py [--scenes 1024] [--set procedural.KEY=V]
        [--json PATH]

One episode per scene, every vehicle driven by the ``log_replay`` controller (inverse
dynamics, box matching), ``collision_behavior: ignore``, ``goal_behavior: stop``.
Rates are per agent-episode. ``--set procedural.log_conflicts=keep
--set procedural.corner_radius=[4,8]`` gives the distribution before issue 20.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.agents.controllers import log_replay
from jaxdrive.agents.rollout import first_episode_events
from jaxdrive.config import merge, parse_overrides
from jaxdrive.env import Env, EnvConfig
from jaxdrive.geometry import pairwise_overlap
from jaxdrive.scenarios import road_index
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch

MODELS = (("bicycle", "discrete"), ("bicycle", "continuous"), ("delta_local", "discrete"),
          ("delta_local", "continuous"))


def _env(model: str, space: str, max_agents: int) -> Env:
    return Env(EnvConfig.from_dict({
        "scenario": {"max_agents": max_agents}, "control_mode": "all",
        "collision_behavior": "ignore", "goal_behavior": "stop",
        "dynamics": {"model": model, "action_space": space},
        "observation": {"num_partners": 1, "num_road": 4, "num_lights": 1},
        "road_index": {"grid_size": 16, "road_per_cell": 10, "edges_per_cell": 48},
    }))


def logged_rates(env: Env, params) -> dict:
    """Collision / off-road of the logged boxes from init_step on, before the goal."""
    obj, pool = params.pool.scenarios.objects, params.pool
    t0, radius = env.config.init_step, env.config.goal_radius

    def scene(sid):
        def at(t):
            xy, yaw, valid = obj.xy[sid, :, t], obj.yaw[sid, :, t], obj.valid[sid, :, t]
            hit = jnp.any(pairwise_overlap(xy, yaw, obj.length[sid], obj.width[sid], valid), -1)
            off = valid & road_index.is_offroad(pool.road_index, pool.scenarios.roadgraph, xy,
                                                yaw, obj.length[sid], obj.width[sid], sid)
            goal = jnp.linalg.norm(obj.goal[sid] - xy, axis=-1) <= radius
            return hit, off, goal
        hit, off, goal = jax.vmap(at)(jnp.arange(t0 + 1, obj.xy.shape[2]))
        before = jnp.cumsum(goal, 0) - goal == 0  # up to and including the goal step
        return (obj.valid[sid, :, t0], jnp.any(hit & before, 0), jnp.any(off & before, 0))

    n, col, off = (np.asarray(x) for x in jax.jit(jax.vmap(scene))(jnp.arange(pool.size)))
    return {"agent_episodes": int(n.sum()), "collision_rate": float(col[n].mean()),
            "offroad_rate": float(off[n].mean())}


def replay_rates(env: Env, params) -> dict:
    events = jax.jit(first_episode_events(env, log_replay(env)))
    out = jax.device_get(events(params, jnp.arange(params.pool.size, dtype=jnp.int32)))
    n = np.asarray(out["controlled"])
    rate = lambda k: float(np.asarray(out[k])[n].mean())
    return {"agent_episodes": int(n.sum()), "goal_rate": rate("goal_reached"),
            "collision_rate": rate("collided"), "offroad_rate": rate("offroad")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenes", type=int, default=1024)
    p.add_argument("--max-agents", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.scenes < 1 or args.max_agents < 1:
        p.error("--scenes and --max-agents must be >= 1")
    over = merge({}, parse_overrides(args.overrides))
    unknown = sorted(set(over) - {"procedural"})
    if unknown:
        p.error(f"only procedural.* keys may be set, not {unknown[0]}")
    proc = ProceduralConfig.from_dict(over.get("procedural") or {}, "procedural")
    base = _env("bicycle", "discrete", args.max_agents)
    t = time.perf_counter()
    scenes = generate_batch(jax.random.key(args.seed), args.scenes, proc, base.config.scenario)
    pool = make_pool(scenes, base.config.road_index)
    print(f"{args.scenes} scenes generated and indexed in {time.perf_counter() - t:.1f} s")
    rows = {"log (exact positions)": logged_rates(base, base.make_params(pool))}
    for model, space in MODELS:
        env = _env(model, space, args.max_agents)
        rows[f"replay {model} {space}"] = replay_rates(env, env.make_params(pool))
        print(f"  {model} {space}: done", flush=True)
    print(f"\n{'':28s} {'agent-eps':>9s} {'goal':>6s} {'collision':>9s} {'off-road':>8s}")
    for name, r in rows.items():
        goal = f"{r['goal_rate']:.4f}" if "goal_rate" in r else "-"
        print(f"{name:28s} {r['agent_episodes']:9d} {goal:>6s} {r['collision_rate']:9.4f} "
              f"{r['offroad_rate']:8.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scenes": args.scenes, "procedural": over.get("procedural") or {},
                       "jax": jax.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

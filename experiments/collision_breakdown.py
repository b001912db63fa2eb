"""What kind of collisions and off-road events a trained policy has on held-out
procedural scenes (issue 20, docs/training.md "Training recipe"), or on converted real
scenes (issue 38).

    python experiments/collision_breakdown.py RUN_DIR [--scenes 256] [--seed 777]
        [--which best|last] [--json PATH]
    python experiments/collision_breakdown.py RUN_DIR --data data/womd_val --which last

With ``--data`` the scenes of a converted directory are driven as
``experiments/womd_val_suite.yaml``'s ``val_all`` drives them (the real-data sizes, one
agent row per object slot, every vehicle valid at the start driven, removed at its
goal).

One episode per scene from its start, every controlled vehicle driven by the policy's
mode (as validation does), in the run's own env config. For each agent's first collision
it finds the other box it overlaps (``geometry.pairwise_overlap``) and classes the pair:
the other vehicle moving, slow (< 0.5 m/s), done (stopped at its goal) or not
controlled; their headings the same (within 30 degrees), opposite or crossing; the other
ahead of or behind the agent. Both vehicles of a pair count, as the env's rates do. For
off-road events it reports the speed, how far the vehicle had turned, when in the
episode it left the road and how much of the straight-line way to its goal it had
covered by then.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive import geometry
from jaxdrive.agents.actors import policy_actor
from jaxdrive.config import merge
from jaxdrive.data import load_scenarios
from jaxdrive.env import Env, EnvConfig
from jaxdrive.runs.load import load_policy
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch

# experiments/womd_val_suite.yaml's val_all env: whole real scenes, every vehicle driven.
REAL_SCENES = {"scenario": {"max_agents": 128, "max_road_points": 4096, "max_lanes": 512,
                            "max_traffic_lights": 32},
               "goal_behavior": "remove", "max_controlled": None}


def rollout(env: Env, params, actor, policy_params, n: int):
    """(controlled (N, A), per-step records (S, N, A)) of one episode per scene."""
    steps = env.config.num_episode_steps

    @jax.jit
    def run(pp):
        sids = jnp.arange(n, dtype=jnp.int32)
        state, ts = jax.vmap(env.reset_to, in_axes=(None, 0, None))(
            params, sids, jax.random.key(0))

        def body(c, _):
            state, ts, cache, ended = c
            act, cache = actor.act(pp, cache, params, state, ts, jax.random.key(1))
            live = state.active & ~ended[:, None]
            nxt, nts = jax.vmap(env.step, in_axes=(None, 0, 0))(params, state, act)
            m, a = nts.info.metrics, nts.info.terminal
            rec = {"xy": a.xy, "yaw": a.yaw, "speed": a.speed, "valid": a.valid,
                   "goal_distance": state.goal_distance,
                   "collided": m.collided & live, "offroad": m.offroad & live,
                   "goal": m.goal_reached & live, "done": state.done}
            return (nxt, nts, cache, ended | nts.info.episode_done), rec

        init = (state, ts, actor.init(n), jnp.zeros(n, bool))
        _, out = jax.lax.scan(body, init, None, steps)
        return state.active, out

    controlled, out = run(policy_params)
    return np.asarray(controlled), jax.tree.map(np.asarray, out)


def classify(controlled, out, length, width) -> tuple[Counter, list[dict]]:
    overlap = jax.jit(geometry.pairwise_overlap)
    counts, events = Counter(), []
    for s, i in zip(*np.nonzero(controlled & out["collided"].any(0)), strict=True):
        t = int(np.argmax(out["collided"][:, s, i]))
        hit = np.asarray(overlap(out["xy"][t, s], out["yaw"][t, s], length[s], width[s],
                                 out["valid"][t, s]))[i]
        if not hit.any():
            counts["(no overlapping box found)"] += 1
            continue
        j = int(np.flatnonzero(hit)[0])
        if not controlled[s, j]:
            other = "not controlled"
        elif out["done"][t, s, j]:
            other = "done (at its goal)"
        elif abs(out["speed"][t, s, j]) < 0.5:
            other = "slow (< 0.5 m/s)"
        else:
            other = "moving"
        dyaw = abs((out["yaw"][t, s, j] - out["yaw"][t, s, i] + np.pi) % (2 * np.pi) - np.pi)
        geom = ("same heading" if dyaw < np.pi / 6 else
                "opposite" if dyaw > 5 * np.pi / 6 else "crossing")
        yaw = out["yaw"][t, s, i]
        ahead = (out["xy"][t, s, j] - out["xy"][t, s, i]) @ np.array([np.cos(yaw), np.sin(yaw)])
        where = "other ahead" if ahead > 0 else "other behind"
        counts[f"{other}, {geom}, {where}"] += 1
        events.append({"scene": int(s), "agent": int(i), "other": int(j), "step": t,
                       "speed": float(out["speed"][t, s, i]),
                       "other_speed": float(out["speed"][t, s, j])})
    return counts, events


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("--scenes", type=int, default=256)
    p.add_argument("--seed", type=int, default=777, help="held-out scene seed")
    p.add_argument("--which", choices=("best", "last"), default="best")
    p.add_argument("--json", default=None)
    p.add_argument("--data", default=None, metavar="DIR",
                   help="a converted real-scene directory instead of procedural scenes")
    args = p.parse_args(argv)
    if args.scenes < 1:
        p.error("--scenes must be >= 1")
    if args.seed == 0:
        print("note: seed 0 is the presets' training seed; these scenes may be training ones")
    lp = load_policy(args.run_dir, which=args.which)
    if args.data:
        env = Env(EnvConfig.from_dict(merge(lp.config.env.to_dict(), REAL_SCENES)))
        scenes, _ = load_scenarios([args.data], env.config.scenario)
        scenes = jax.tree.map(jnp.asarray, scenes)
        args.scenes = int(scenes.objects.length.shape[0])
    else:
        env = Env(lp.config.env)
        scenes = generate_batch(jax.random.key(args.seed), args.scenes, lp.config.procedural,
                                env.config.scenario)
    params = env.make_params(make_pool(scenes, env.config.road_index))
    controlled, out = rollout(env, params, policy_actor(env, lp.policy), lp.params,
                              args.scenes)
    counts, events = classify(controlled, out, np.asarray(scenes.objects.length),
                              np.asarray(scenes.objects.width))
    n = int(controlled.sum())
    rate = lambda k: float((out[k].any(0) & controlled).sum() / max(n, 1))
    print(f"{args.scenes} scenes, {n} agent-episodes: goal {rate('goal'):.3f}, collision "
          f"{rate('collided'):.3f}, off-road {rate('offroad'):.3f}")
    print("first collision of each agent, by the box it hit:")
    for k, v in counts.most_common():
        print(f"  {v:5d}  {k}")
    off = [(int(np.argmax(out["offroad"][:, s, i])), s, i)
           for s, i in zip(*np.nonzero(controlled & out["offroad"].any(0)), strict=True)]
    off_speed = np.array([out["speed"][t, s, i] for t, s, i in off])
    turned = np.array([abs((out["yaw"][t, s, i] - out["yaw"][0, s, i] + np.pi)
                           % (2 * np.pi) - np.pi) for t, s, i in off])
    when = np.array([t for t, _, _ in off])
    covered = np.array([1.0 - out["goal_distance"][t, s, i]
                        / max(float(out["goal_distance"][0, s, i]), 1e-3) for t, s, i in off])
    if off:
        print(f"off-road: {len(off)} agents in {len({s for _, s, _ in off})} scenes; speed "
              f"p10/50/90 {np.percentile(off_speed, [10, 50, 90]).round(1).tolist()} m/s; "
              f"turned since the start p10/50/90 "
              f"{np.degrees(np.percentile(turned, [10, 50, 90])).round(0).tolist()} deg; "
              f"step p10/50/90 {np.percentile(when, [10, 50, 90]).round(0).tolist()}; "
              f"share of the way to the goal covered p10/50/90 "
              f"{np.percentile(covered, [10, 50, 90]).round(2).tolist()}")
        for t, s, i in off:
            print(f"  scene {s} agent {i}: step {t}, {out['speed'][t, s, i]:.1f} m/s, "
                  f"goal {out['goal_distance'][0, s, i]:.0f} m away at the start, "
                  f"{out['goal_distance'][t, s, i]:.0f} m then")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run_dir": str(lp.run_dir), "step": lp.step, "scenes": args.scenes,
                       "seed": args.seed, "agent_episodes": n,
                       "rates": {k: rate(k) for k in ("goal", "collided", "offroad")},
                       "collisions": dict(counts), "collision_events": events,
                       "offroad_speed": off_speed.tolist(), "offroad_turned_rad":
                       turned.tolist(), "offroad_step": when.tolist(),
                       "offroad_way_covered": covered.tolist()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

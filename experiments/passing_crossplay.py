"""Cross-play of the narrow-passing family: scripted egos against each partner member.

Each partner member (``procedural.partner_convention``: ``keep_right`` or ``keep_left``)
meets each scripted ego strategy: keep to the right (1.75 m right of the centre line),
keep to the left, or hold the centre. The egos steer by pure pursuit towards a point 8 m
ahead on their line at 6 m/s, reading the road's axis from their own start pose (the
scene family starts the ego on the centre line, heading along it). One trial per scene.
The table shows that the partner's convention decides the right action: each fixed
strategy reaches the goal against one member and collides with the other.

    python experiments/passing_crossplay.py [--scenes 256] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json

import jax

from jaxdrive.agents.controllers import keep_line
from jaxdrive.agents.rollout import RolloutStats, make_rollout
from jaxdrive.env import Env
from jaxdrive.runs.config import load_run_config
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch

STRATEGIES = {"keep_right": -1.75, "keep_left": 1.75, "centre": 0.0}  # lateral target, m
MEMBERS = ("keep_right", "keep_left")


def crossplay(config_path: str, scenes: int, seed: int) -> dict:
    """{member: {strategy: rates}} over ``scenes`` scenes, one trial each."""
    out = {}
    for member in MEMBERS:
        config = load_run_config(config_path, {"procedural.partner_convention": member,
                                               "env.num_trials": 1})
        env = Env(config.env)
        params = env.make_params(make_pool(
            generate_batch(jax.random.key(seed), scenes, config.procedural,
                           config.env.scenario), config.env.road_index))
        steps = env.config.trial_length + 1  # every ego's trial ends
        out[member] = {}
        for name, lateral in STRATEGIES.items():
            rollout = jax.jit(make_rollout(env, keep_line(env, lateral), steps))
            state, ts = jax.jit(env.reset_batch, static_argnums=2)(
                params, jax.random.key(seed), scenes)
            _, _, stats = rollout(params, state, ts, RolloutStats.zeros(env),
                                  jax.random.key(seed + 1))
            r = jax.device_get(stats).rates()
            out[member][name] = {k: float(r[k]) for k in
                                 ("goal_rate", "collision_rate", "offroad_rate")}
            out[member][name]["agent_episodes"] = int(r["agent_episodes"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/adaptive_passing.yaml")
    p.add_argument("--scenes", type=int, default=256)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--json")
    args = p.parse_args()
    if args.scenes < 1:
        p.error("--scenes must be >= 1")
    res = crossplay(args.config, args.scenes, args.seed)
    print(f"{'partner member':<16}" + "".join(f"{'ego ' + s:>26}" for s in STRATEGIES))
    for member, row in res.items():
        cells = [f"{v['goal_rate']:.3f} / {v['collision_rate']:.3f} / {v['offroad_rate']:.3f}"
                 for v in row.values()]
        print(f"{member:<16}" + "".join(f"{c:>26}" for c in cells))
    print("cells: goal / collision / off-road rate per episode")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scenes": args.scenes, "seed": args.seed, "config": args.config,
                       "results": res}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

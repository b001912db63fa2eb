"""Compare the built-in controllers on the same procedural pool.

    python experiments/compare_controllers.py [--scenes 128] [--steps 240]

Prints goal / collision / off-road rates per controller. Log replay drives each
controlled vehicle along its logged route through inverse dynamics, so it should reach
nearly every goal; its collisions come from crossing routes at junctions (the
procedural logs have no right-of-way logic).
"""

import argparse

import jax

from jaxdrive.agents.controllers import CONTROLLERS
from jaxdrive.agents.rollout import RolloutStats, make_rollout
from jaxdrive.simulate import build


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenes", type=int, default=128)
    p.add_argument("--steps", type=int, default=240)
    args = p.parse_args()
    env, params, _ = build(args.scenes, {}, seed=0)
    print(f"{'controller':>12} {'episodes':>9} {'goal':>6} {'collision':>9} {'offroad':>8}")
    for name, make in CONTROLLERS.items():
        rollout = jax.jit(make_rollout(env, make(env), args.steps))
        state, ts = env.reset_batch(params, jax.random.key(1), args.scenes)
        _, _, stats = rollout(params, state, ts, RolloutStats.zeros(env), jax.random.key(2))
        r = jax.device_get(stats).rates()
        print(f"{name:>12} {r['agent_episodes']:>9} {r['goal_rate']:>6.3f} "
              f"{r['collision_rate']:>9.3f} {r['offroad_rate']:>8.3f}")


if __name__ == "__main__":
    main()

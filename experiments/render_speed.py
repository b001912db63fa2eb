"""Time the on-device rasteriser: envs x steps frames in one jitted call.

    python experiments/render_speed.py [--envs 64] [--steps 91] [--size 256] [--view scene]

One jitted function scans over time a render vmapped over envs: each env plays one
procedural scene (``generate_batch``, default shapes: 64 agent slots, 4096 road points)
and each step draws 64 random boxes on its road points, with goals. Prints the compile
time and the best run time after compile (the issue's target: 64 x 91 at 256 x 256 in
under 30 s on a 2-core CPU).
"""

import argparse
import time

import jax
import jax.numpy as jnp

from jaxdrive.render.raster import NUM_AGENT_COLOURS, RenderConfig, render_frame
from jaxdrive.scenarios.procedural import generate_batch
from jaxdrive.types import AgentState


def random_agents(key, roadgraph, num_agents):
    """Boxes centred near random valid road points, random yaw / size / colour."""
    k_pt, k_jit, k_yaw, k_len, k_wid, k_col, k_vis = jax.random.split(key, 7)
    p = roadgraph.valid / jnp.maximum(roadgraph.valid.sum(), 1)
    idx = jax.random.choice(k_pt, roadgraph.num_points, (num_agents,), p=p)
    xy = roadgraph.xy[idx] + jax.random.normal(k_jit, (num_agents, 2)) * 2.0
    f32 = jnp.float32
    zeros = jnp.zeros((num_agents,), f32)
    agents = AgentState(
        xy=xy.astype(f32), yaw=jax.random.uniform(k_yaw, (num_agents,), f32, -jnp.pi, jnp.pi),
        vel=jnp.zeros((num_agents, 2), f32), steer=zeros, accel=zeros,
        valid=jnp.ones((num_agents,), bool),
    )
    length = jax.random.uniform(k_len, (num_agents,), f32, 4.0, 5.5)
    width = jax.random.uniform(k_wid, (num_agents,), f32, 1.8, 2.2)
    colour = jax.random.randint(k_col, (num_agents,), 0, NUM_AGENT_COLOURS, jnp.int32)
    visible = jax.random.uniform(k_vis, (num_agents,)) < 0.9
    goal = jnp.roll(xy, 7, axis=0)
    return agents, length, width, visible, colour, goal


def make_render(config: RenderConfig, num_steps: int, num_agents: int):
    def frame(roadgraph, key):
        agents, length, width, visible, colour, goal = random_agents(key, roadgraph, num_agents)
        return render_frame(config, roadgraph, agents, length, width, visible, colour, goal,
                            visible & (colour == 0))

    def run(roadgraphs, key):
        num_envs = roadgraphs.xy.shape[0]

        def step(_, k):
            keys = jax.random.split(k, num_envs)
            return None, jax.vmap(frame)(roadgraphs, keys)

        _, frames = jax.lax.scan(step, None, jax.random.split(key, num_steps))
        return frames  # (T, B, H, W, 3) uint8

    return jax.jit(run)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=91)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--view", default="scene", choices=("scene", "ego"))
    p.add_argument("--line-samples", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    config = RenderConfig(width=args.size, height=args.size, view=args.view,
                          line_samples=args.line_samples)
    scenes = generate_batch(jax.random.key(0), args.envs)
    roadgraphs = scenes.roadgraph
    num_agents = scenes.objects.num_agents
    run = make_render(config, args.steps, num_agents)
    t0 = time.perf_counter()
    compiled = run.lower(roadgraphs, jax.random.key(1)).compile()
    print(f"compile: {time.perf_counter() - t0:.1f} s")
    best = float("inf")
    for i in range(args.repeats):
        t0 = time.perf_counter()
        frames = jax.block_until_ready(compiled(roadgraphs, jax.random.key(2 + i)))
        best = min(best, time.perf_counter() - t0)
    n = args.envs * args.steps
    print(f"frames {tuple(frames.shape)} {frames.dtype}; road points {roadgraphs.num_points}, "
          f"agents {num_agents}, patch {2 * config.patch_radius + 1} px, view {args.view}")
    print(f"render: {best:.2f} s for {n} frames ({1e3 * best / n:.2f} ms/frame, "
          f"best of {args.repeats})")


if __name__ == "__main__":
    main()

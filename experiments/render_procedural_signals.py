"""Render a procedural signalised intersection: docs/img/procedural_signals.png.

    python experiments/render_procedural_signals.py [--seed 0] [--out FILE] [--size 512]

Generates procedural intersections with lights (``signals: 1``), picks the first scene
whose log shows vehicles waiting at a red light, replays its log in the env (the SDC
controlled by the log-replay controller, everyone else replaying) through the recorder,
the same path as videos, and writes the frame at the log step with the most vehicles
standing at red stop lines: the whole scene (scene view) beside a close-up following the
SDC, at a step whose lights show two colours. Stop lines: red, yellow, green. Prints
the chosen scene, step and light states.
"""

import argparse
from pathlib import Path

import jax
import numpy as np
from render_lights import log_replay_views  # experiments/ is the script's directory

from jaxdrive.env import Env, EnvConfig
from jaxdrive.render.video import write_png
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch
from jaxdrive.scenarios.signals import color, is_red
from jaxdrive.types import TrafficLightState

ROOT = Path(__file__).resolve().parents[1]


def waiting_at_red(scenes, i: int, init: int) -> np.ndarray:
    """(T,) vehicles of scene ``i`` standing (< 0.2 m/s) within 12 m behind a red stop line."""
    o, tl = scenes.objects, scenes.traffic_lights
    speed = np.linalg.norm(np.asarray(o.vel[i]), axis=-1)  # (A, T)
    xy, valid = np.asarray(o.xy[i]), np.asarray(o.valid[i])
    red = np.asarray(is_red(tl.state[i], tl.valid[i]))  # (TL, T)
    d = np.linalg.norm(xy[:, None] - np.asarray(tl.stop_xy[i])[None, :, None], axis=-1)
    near_red = np.any((d < 12.0) & red[None], axis=1)  # (A, T)
    count = np.sum(valid & (speed < 0.2) & near_red, axis=0)
    count[:init] = 0
    return count


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "procedural_signals.png"))
    p.add_argument("--size", type=int, default=512)
    args = p.parse_args()
    env = Env(EnvConfig.from_dict({"control_mode": "sdc"}))
    pcfg = ProceduralConfig.from_dict({
        "signals": 1.0, "num_agents": [16, 24],
        "topology": {"straight": 0, "curve": 0, "t_junction": 0, "intersection": 1}})
    scenes = jax.device_get(generate_batch(jax.random.key(args.seed), 16, pcfg,
                                           env.config.scenario))
    init = env.config.init_step
    # Steps whose lights show a single colour (all-red clearance) are left out: the image
    # should show both phases.
    tl_all = scenes.traffic_lights
    mixed = [np.array([len(set(np.asarray(color(tl_all.state[i, :, t], tl_all.valid[i, :, t]))[
        np.asarray(tl_all.valid[i, :, t])].tolist())) > 1 for t in range(tl_all.state.shape[-1])])
        for i in range(16)]
    # The episode ends (and the recorder resets) once the SDC reaches its goal: only
    # steps before that show the same clock as the log.
    o = scenes.objects
    to_goal = np.linalg.norm(np.asarray(o.xy[:, 0]) - np.asarray(o.goal[:, 0])[:, None], axis=-1)
    before_goal = np.cumsum(to_goal <= env.config.goal_radius, axis=1) == 0  # (N, T)
    counts = [waiting_at_red(scenes, i, init) * mixed[i] * before_goal[i] for i in range(16)]
    sid = int(np.argmax([c.max() for c in counts]))
    step = int(np.argmax(counts[sid]))
    tl = scenes.traffic_lights
    lit = np.flatnonzero(np.asarray(tl.valid[sid]).any(axis=1))
    names = [TrafficLightState(int(tl.state[sid, k, step])).name for k in lit]
    colours = np.asarray(color(tl.state[sid, :, step], tl.valid[sid, :, step]))[lit]
    print(f"scene {sid}: log step {step} (frame {step - init}), {counts[sid][step]} vehicles "
          f"waiting at red; {len(lit)} lights: {', '.join(names)}; colours {colours.tolist()}")
    one = jax.tree.map(lambda x: x[sid:sid + 1], scenes)
    params = env.make_params(make_pool(one, env.config.road_index))
    image = log_replay_views(env, params, step - init, args.size, 0.12)
    print(f"wrote {write_png(args.out, image)}")

if __name__ == "__main__":
    main()

"""Render a real WOMD scene's traffic lights: docs/img/real_scene_lights.png.

    python experiments/render_lights.py [--scene FILE] [--out docs/img/real_scene_lights.png]
                                        [--step LOG_STEP] [--size 512]

Loads the scene (default: the JSON scene with ``tl_states`` in
``../shared/data/womd_json_traffic_lights``), replays its log in the env (SDC controlled,
log replay) through the recorder, the same path as videos, and writes the frame at log
step ``--step`` (default: the first step from ``init_step`` on whose valid lights show
the most distinct colours, then the most valid lights) as two views side by side: the
whole map (scene view) and a close-up following the SDC (ego view, 0.15 m per pixel).
Stop lines: red, yellow, green, grey = valid but unknown state. Prints the chosen step and
each light's state.
"""

import argparse
import glob
from pathlib import Path

import jax
import numpy as np

from jaxdrive.agents.controllers import log_replay
from jaxdrive.data import load_scenarios
from jaxdrive.data.convert import real_data_config
from jaxdrive.env import Env, EnvConfig
from jaxdrive.render.record import Recorder, VideoConfig, controller_actor, record
from jaxdrive.render.video import FrameGrabber, write_png
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.signals import LightColor, color
from jaxdrive.types import TrafficLightState

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENES = sorted(glob.glob(str(ROOT.parent / "shared" / "data"
                                      / "womd_json_traffic_lights" / "*.json")))


def pick_step(state: np.ndarray, valid: np.ndarray, init_step: int) -> int:
    """The log step >= init_step whose valid lights show the most distinct colours (ties:
    the most valid lights, then the earliest)."""
    colours = np.asarray(color(state, valid))  # (TL, T)
    best, key = init_step, (-1, -1)
    for t in range(init_step, state.shape[1]):
        k = (len(set(colours[valid[:, t], t].tolist())), int(valid[:, t].sum()))
        if k > key:
            best, key = t, k
    return best


def log_replay_views(env, params, frame: int, size: int, metres_per_pixel: float):
    """(size, 2 size + 4, 3) uint8: frame ``frame`` of a log-replay recording of scene 0
    of ``params``' pool, the scene view beside the ego view (a white gap between)."""
    video = VideoConfig(num_envs=1, views=("scene", "ego"), width=size, height=size,
                        ego_metres_per_pixel=metres_per_pixel, trail_steps=10,
                        chunk_steps=16)
    recorder = Recorder(env, controller_actor(env, log_replay(env)), video)
    grabs = [FrameGrabber(recorder, frame, view=v) for v in range(len(video.views))]

    def sink(first, frames, info):
        for g in grabs:
            g(first, frames, info)

    record(recorder, None, params, np.zeros(1, np.int32), frame + 1, sink, jax.random.key(0))
    gap = np.full((size, 4, 3), 255, np.uint8)
    return np.concatenate([grabs[0].image, gap, grabs[1].image], axis=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scene", default=DEFAULT_SCENES[0] if DEFAULT_SCENES else None)
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "real_scene_lights.png"))
    p.add_argument("--step", type=int, default=None, help="log step (default: picked)")
    p.add_argument("--size", type=int, default=512)
    args = p.parse_args()
    if args.scene is None:
        raise SystemExit("no scene: pass --scene (../shared/data is absent)")
    # Every light and lane of the scene; fewer agent / road slots than the converter's
    # defaults keep the compile short (the scene has 15 objects and 1,194 road points).
    scenario = real_data_config(max_agents=16, max_road_points=2048, max_lanes=128)
    env = Env(EnvConfig.from_dict({"scenario": scenario.to_dict(), "control_mode": "sdc"}))
    scenes, report = load_scenarios([args.scene], scenario)
    assert report["truncated_agents"] == 0 and report["totals"]["truncated_traffic_lights"] == 0
    tl = scenes.traffic_lights
    state, valid = tl.state[0], tl.valid[0]
    init = env.config.init_step
    step = pick_step(state, valid, init) if args.step is None else args.step
    lit = np.flatnonzero(valid.any(axis=1))
    names = [TrafficLightState(int(state[k, step])).name if valid[k, step] else "-"
             for k in lit]
    print(f"{report['scenario_ids'][0]}: log step {step} (frame {step - init}); "
          f"{len(lit)} lights: {', '.join(names)}")
    counts = np.bincount(np.asarray(color(state[:, step], valid[:, step]))[valid[:, step]],
                         minlength=len(LightColor))
    print("colours: " + ", ".join(f"{c.name} {counts[c]}" for c in LightColor if counts[c]))

    pool = make_pool(jax.tree.map(np.asarray, scenes), env.config.road_index)
    params = env.make_params(pool)
    image = log_replay_views(env, params, step - init, args.size, 0.15)
    print(f"wrote {write_png(args.out, image)}")

if __name__ == "__main__":
    main()

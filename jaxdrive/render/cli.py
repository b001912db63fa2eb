"""Render top-down videos (or one PNG) of a policy or of log replay.

    python -m jaxdrive.render [--checkpoint RUN_DIR] [--scenario FILE ...]
                              [--view scene|ego ...] [--png FILE] [--out DIR]

With ``--checkpoint`` the run's policy drives every controlled agent (mode actions) in
the run's env; without it, controlled agents replay their logs (``--policy replay``,
the default) or act at random (``--policy random``) in the env of ``--config`` (a run
config; built-in defaults otherwise). Scenes: held-out procedural scenes (the run's
validation seed unless ``--seed``), or ``--scenario`` files (WOMD JSON scenes, WOMD
TFRecords or a converted shard directory; see ``jaxdrive.data``). Writes
``OUT/render/VIEW/stepSTEP_envENV.mp4`` (one per env per view, never overwriting) and
prints the paths; with ``--png FILE`` writes frame ``--frame`` of the first env and view.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

from jaxdrive.config import ConfigError, parse_overrides

PRODUCER = "render"


def _scenes(args, config):
    """(batched Scenario, first-frame note) from --scenario files or procedural."""
    from jaxdrive.scenarios.procedural import generate_batch

    if args.scenario:
        from jaxdrive.data import load_scenarios

        scenes, _ = load_scenarios(list(args.scenario), config.env.scenario)
        return scenes
    seed = config.validation.seed if args.seed is None else args.seed
    return generate_batch(jax.random.key(seed), args.envs, config.procedural,
                          config.env.scenario)


def build(args):
    """(recorder, params, env_params, num_frames, step) for the parsed arguments."""
    from jaxdrive.agents.controllers import log_replay, random_actions
    from jaxdrive.env import Env, episode_steps
    from jaxdrive.render.record import Recorder, VideoConfig, controller_actor, policy_actor
    from jaxdrive.runs.config import load_run_config
    from jaxdrive.scenarios.pool import make_pool

    overrides = parse_overrides(args.overrides)
    if args.checkpoint:
        from jaxdrive.runs.load import load_policy, read_run_config

        loaded = load_policy(args.checkpoint, which=args.which)
        config = read_run_config(loaded.run_dir, overrides) if overrides else loaded.config
        step = loaded.step
    else:
        config = load_run_config(args.config, overrides)
        step = 0
    scenes = _scenes(args, config)
    env = Env(config.env)
    env_params = env.make_params(make_pool(scenes, config.env.road_index))
    num_envs = min(args.envs, int(scenes.objects.xy.shape[0]))
    video = VideoConfig(num_envs=num_envs, views=tuple(args.view or ("scene",)),
                        width=args.size, height=args.size, chunk_steps=args.chunk,
                        fps=args.fps, num_steps=args.steps, overlay=not args.no_overlay)
    if args.checkpoint:
        actor, params = policy_actor(env, loaded.policy), loaded.params
    else:
        controller = {"replay": log_replay, "random": random_actions}[args.policy]
        actor, params = controller_actor(env, controller(env)), None
    frames = video.num_steps or episode_steps(env)
    return Recorder(env, actor, video), params, env_params, frames, step


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.render``: videos, or one PNG frame with
    ``--png``; returns the exit code (2 on bad input)."""
    p = argparse.ArgumentParser(prog="python -m jaxdrive.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", metavar="RUN_DIR", help="a training run directory")
    p.add_argument("--which", default="best", choices=("best", "last"),
                   help="checkpoint of the run to load (default best)")
    p.add_argument("--config", help="run config YAML for the env when no --checkpoint")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set env.scenario.max_agents=16")
    p.add_argument("--scenario", nargs="+", metavar="FILE",
                   help="scene files (WOMD JSON / TFRecord) or a converted shard directory")
    p.add_argument("--policy", default="replay", choices=("replay", "random"),
                   help="who drives without --checkpoint (default: log replay)")
    p.add_argument("--view", action="append", choices=("scene", "ego"),
                   help="view to render; repeat for both (default scene)")
    p.add_argument("--envs", type=int, default=4, help="environments (videos per view)")
    p.add_argument("--steps", type=int, default=0, help="frames per video (0: one episode)")
    p.add_argument("--seed", type=int, default=None, help="procedural scene seed")
    p.add_argument("--size", type=int, default=256, help="frame width and height, pixels")
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--chunk", type=int, default=16, help="frames per device call")
    p.add_argument("--no-overlay", action="store_true", help="no text on the frames")
    p.add_argument("--png", metavar="FILE", help="write one frame as PNG instead of videos")
    p.add_argument("--frame", type=int, default=0, help="frame index for --png")
    p.add_argument("--out", default="renders", help="output directory for videos")
    args = p.parse_args(argv)
    if args.envs < 1:
        p.error("--envs must be at least 1")
    if args.frame < 0:
        p.error("--frame must be >= 0")
    from jaxdrive.render.record import record
    from jaxdrive.render.video import FrameGrabber, VideoSink, write_png

    try:
        if args.png:
            args.steps = max(args.steps, args.frame + 1)
        recorder, params, env_params, frames, step = build(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ids = np.arange(recorder.config.num_envs, dtype=np.int32)
    key = jax.random.key(0)
    if args.png:
        grab = FrameGrabber(recorder, args.frame)
        record(recorder, params, env_params, ids, args.frame + 1, grab, key)
        print(write_png(args.png, grab.image))
        return 0
    from tqdm import tqdm

    c = recorder.config
    print(f"rendering {c.num_envs} env(s) x {len(c.views)} view(s) x {frames} frames "
          f"at {c.width}x{c.height} into {Path(args.out) / PRODUCER}", flush=True)
    with VideoSink(recorder, args.out, PRODUCER, step) as sink, \
            tqdm(total=frames, unit="frame", disable=None) as bar:
        record(recorder, params, env_params, ids, frames, sink, key,
               progress=lambda n: bar.update(n - bar.n))
    for path in sink.paths.values():
        print(path)
    return 0

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

Before any scene is built: the numeric flags are checked (``--frame`` must lie inside
one episode of the env), and the output (``--png FILE`` or ``--out DIR``) must be
writable. The PNG is written atomically; if it cannot be written at the end, it is saved
next to its directory or in the system temp directory and the message says where (exit
code 1). Exit code 2: bad input or an unwritable output path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np
import yaml

from jaxdrive.agents.controllers import log_replay, random_actions
from jaxdrive.command import add_debug_flag
from jaxdrive.config import MAX_SEED, ConfigError, int_arg, local_path_arg, parse_overrides
from jaxdrive.env import Env, episode_steps
from jaxdrive.files import OutputError, check_writable, check_writable_file, write_or_fallback
from jaxdrive.render.record import (
    Recorder,
    VideoConfig,
    controller_actor,
    policy_actor,
    record,
)
from jaxdrive.render.video import FrameGrabber, VideoSink, png_bytes
from jaxdrive.resources import check_fits
from jaxdrive.runs.config import load_run_config
from jaxdrive.runs.load import load_policy, read_run_config
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch

PRODUCER = "render"

# What bad input raises while configs, checkpoints, scenes and output paths are read.
INPUT_ERRORS = (ConfigError, OSError, ValueError, yaml.YAMLError)


def _scenes(args, config):
    """Batched Scenario from --scenario files or procedural."""
    if args.scenario:
        from jaxdrive.data import load_scenarios

        scenes, _ = load_scenarios(list(args.scenario), config.env.scenario)
        return scenes
    seed = config.validation.seed if args.seed is None else args.seed
    return generate_batch(jax.random.key(seed), args.envs, config.procedural,
                          config.env.scenario)


def load(args):
    """(run config, loaded policy or None, step) for the parsed arguments (no scenes yet)."""
    overrides = parse_overrides(args.overrides)
    if args.checkpoint:
        loaded = load_policy(args.checkpoint, which=args.which)
        config = read_run_config(loaded.run_dir, overrides) if overrides else loaded.config
        return config, loaded, loaded.step
    return load_run_config(args.config, overrides), None, 0


def check_frames(args, env: Env) -> None:
    """``--frame`` must show a state of the first episode (ConfigError otherwise)."""
    if not args.png:
        return
    length = episode_steps(env)
    if args.frame >= length:
        raise ConfigError(
            f"--frame {args.frame} is beyond the episode: this env's episode has {length} "
            f"steps, so frames 0 to {length - 1}; pick a smaller --frame (or lengthen the "
            "episode with --set env.episode_length=N).")


def check_outputs(args) -> None:
    """The ``--png`` file or the ``--out`` directory can be written (OutputError naming
    the path otherwise); called before any scene is built."""
    flag, path, check = (("--png", args.png, check_writable_file) if args.png
                         else ("--out", args.out, check_writable))
    try:
        check(path)
    except OutputError as e:
        raise OutputError(f"{flag} {path}: {e}") from None


def build(args, config, loaded):
    """(recorder, params, env_params, num_frames) for the loaded config and policy."""
    scenes = _scenes(args, config)
    # Every object drawn: one row per object slot (packed rows, ``max_controlled``, keep
    # background objects out of the state the renderer draws; per agent they act alike).
    env = Env(config.env.replace(max_controlled=None))
    env_params = env.make_params(make_pool(scenes, config.env.road_index))
    num_envs = min(args.envs, int(scenes.objects.xy.shape[0]))
    steps = max(args.steps, args.frame + 1) if args.png else args.steps
    video = VideoConfig(num_envs=num_envs, views=tuple(args.view or ("scene",)),
                        width=args.size, height=args.size, chunk_steps=args.chunk,
                        fps=args.fps, num_steps=steps, overlay=not args.no_overlay)
    if loaded is not None:
        actor, params = policy_actor(env, loaded.policy), loaded.params
    else:
        controller = {"replay": log_replay, "random": random_actions}[args.policy]
        actor, params = controller_actor(env, controller(env)), None
    frames = video.num_steps or episode_steps(env)
    return Recorder(env, actor, video), params, env_params, frames


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    p.add_argument("--checkpoint", type=local_path_arg, metavar="RUN_DIR",
                   help="a training run directory")
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
    p.add_argument("--envs", type=int_arg(1, 4096), default=4,
                   help="environments (videos per view)")
    p.add_argument("--steps", type=int_arg(0, 1_000_000), default=0,
                   help="frames per video (0: one episode)")
    p.add_argument("--seed", type=int_arg(0, MAX_SEED), default=None,
                   help="procedural scene seed")
    p.add_argument("--size", type=int_arg(2, 8192), default=256,
                   help="frame width and height, pixels")
    p.add_argument("--fps", type=int_arg(1, 240), default=10)
    p.add_argument("--chunk", type=int_arg(1, 100_000), default=16,
                   help="frames per device call")
    p.add_argument("--no-overlay", action="store_true", help="no text on the frames")
    p.add_argument("--png", type=local_path_arg, metavar="FILE",
                   help="write one frame as PNG instead of videos")
    p.add_argument("--frame", type=int, default=0, help="frame index for --png")
    p.add_argument("--out", type=local_path_arg, default="renders",
                   help="output directory for videos")
    return p


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, with every count checked (exit code 2 otherwise)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.frame < 0:
        p.error(f"--frame must be >= 0, got {args.frame}")
    if args.size % 2:
        p.error(f"--size must be even (H.264 video needs even frame sizes), got {args.size}")
    # Frames of one device call, uint8 RGB, plus a float32 RGBA raster per env.
    need = args.envs * args.size**2 * (3 * args.chunk + 16)
    try:
        check_fits(f"--size {args.size} with --envs {args.envs} and --chunk {args.chunk}",
                   need, "lower --size, --chunk or --envs")
    except ConfigError as e:
        p.error(str(e))
    return args


def _write_png(path: str, image: np.ndarray) -> int:
    """Write the PNG (atomically, or to a fallback with an error line); the exit code."""
    try:
        written, problem = write_or_fallback(path, png_bytes(image))
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(written)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


def _videos(args, recorder, params, env_params, frames, step) -> int:
    """Record the mp4s into ``--out``, printing their paths; the exit code."""
    from tqdm import tqdm

    c = recorder.config
    ids = np.arange(c.num_envs, dtype=np.int32)
    print(f"rendering {c.num_envs} env(s) x {len(c.views)} view(s) x {frames} frames "
          f"at {c.width}x{c.height} into {Path(args.out) / PRODUCER}", flush=True)
    with VideoSink(recorder, args.out, PRODUCER, step) as sink, \
            tqdm(total=frames, unit="frame", disable=None) as bar:
        record(recorder, params, env_params, ids, frames, sink, jax.random.key(0),
               progress=lambda n: bar.update(n - bar.n))
    for path in sink.paths.values():
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.render``: videos, or one PNG frame with
    ``--png``; returns the exit code (see the module doc)."""
    args = _parse_args(argv)
    try:
        config, loaded, step = load(args)
        check_frames(args, Env(config.env.replace(max_controlled=None)))
        check_outputs(args)
        recorder, params, env_params, frames = build(args, config, loaded)
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.png:
        return _videos(args, recorder, params, env_params, frames, step)
    ids = np.arange(recorder.config.num_envs, dtype=np.int32)
    grab = FrameGrabber(recorder, args.frame)
    record(recorder, params, env_params, ids, args.frame + 1, grab, jax.random.key(0))
    return _write_png(args.png, grab.image)

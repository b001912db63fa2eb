"""Recorded rollouts and their videos: frame count = step count, chunked streaming with
bounded memory, never-overwriting file names, overlays, trails."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_ENV, SMALL_SCENARIO, straight_road

from jaxdrive.agents.controllers import log_replay
from jaxdrive.config import ConfigError
from jaxdrive.env import Env, EnvConfig, episode_steps
from jaxdrive.render.raster import AGENT_RGB, TRAIL_RGB, AgentColour, RenderConfig, render_frame
from jaxdrive.render.record import FrameInfo, Recorder, VideoConfig, controller_actor, record
from jaxdrive.render.video import (
    VideoSink,
    VideoWriter,
    claim_path,
    count_video_frames,
    draw_overlay,
    overlay_lines,
)
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.types import AgentState, Roadgraph

SIZE = 32
CHUNK = 4
NUM_ENVS = 2


@pytest.fixture(scope="module")
def setup():
    """Env with two straight-road scenes, a log-replay recorder."""
    scenes = [
        # Goals out of reach: episodes run to the time limit.
        straight_road(SMALL_SCENARIO, [(0, -2, 0, 5, *CAR), (-20, 2, 0, 3, *CAR)],
                      goals=[(90, -2), (90, 2)]),
        straight_road(SMALL_SCENARIO, [(10, 2, np.pi, 5, *CAR)], goals=[(-90, 2)]),
    ]
    env = Env(EnvConfig.from_dict(SMALL_ENV))
    # Stacked on the host: no eager stack op to compile per leaf.
    pool = make_pool(jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *scenes),
                     env.config.road_index)
    video = VideoConfig(num_envs=NUM_ENVS, views=("scene", "ego"), width=SIZE, height=SIZE,
                        chunk_steps=CHUNK, trail_steps=3)
    recorder = Recorder(env, controller_actor(env, log_replay(env)), video)
    return env, env.make_params(pool), recorder


class Spy:
    """A sink remembering every chunk it got."""

    def __init__(self):
        self.chunks = []

    def __call__(self, first, frames, info):
        self.chunks.append((first, frames.copy(), jax.tree.map(np.copy, info)))

    def frames(self):
        return np.concatenate([f for _, f, _ in self.chunks])

    def steps(self):
        return np.concatenate([i.step for _, _, i in self.chunks])


def run(setup, num_frames, sink, key=0):
    _, params, recorder = setup
    return record(recorder, None, params, np.arange(NUM_ENVS), num_frames, sink,
                  jax.random.key(key))


def test_long_episode_streams_in_bounded_chunks_with_one_compile(setup):
    env, _, recorder = setup
    spy = Spy()
    n = episode_steps(env)  # one whole episode
    assert n % CHUNK  # a cut last chunk
    assert run(setup, n, spy) == n
    sizes = [f.shape[0] for _, f, _ in spy.chunks]
    # Memory holds one chunk of frames at a time, however long the episode.
    assert max(sizes) == CHUNK and len(sizes) == -(-n // CHUNK) and sum(sizes) == n
    assert [first for first, _, _ in spy.chunks] == list(range(0, n, CHUNK))
    frames = spy.frames()
    assert frames.shape == (n, NUM_ENVS, 2, SIZE, SIZE, 3) and frames.dtype == np.uint8
    # Frame index = step index, in every env.
    np.testing.assert_array_equal(spy.steps(), np.repeat(np.arange(n)[:, None], NUM_ENVS, 1))
    # A second, longer recording reuses the compiled chunk.
    run(setup, 2 * n, Spy())
    assert recorder.chunk._cache_size() == 1 and recorder.start._cache_size() == 1


def test_chunking_does_not_change_the_frames(setup):
    env, params, recorder = setup
    spy = Spy()
    run(setup, 9, spy)
    # The same recording in one chunk (scene view only, to compile less).
    whole = Recorder(env, recorder.actor, VideoConfig(**{
        **recorder.config.to_dict(), "chunk_steps": 9, "views": ["scene"]}))
    one = Spy()
    record(whole, None, params, np.arange(NUM_ENVS), 9, one, jax.random.key(0))
    assert len(one.chunks) == 1
    np.testing.assert_array_equal(spy.frames()[:, :, :1], one.frames())
    # The scene moves: log replay drives the cars, so frames differ over time.
    assert np.any(spy.frames()[0] != spy.frames()[8])


def test_one_video_per_env_and_view_with_one_frame_per_step(setup, tmp_path):
    _, _, recorder = setup
    n = 11
    with VideoSink(recorder, tmp_path, "train", step=1234) as sink:
        run(setup, n, sink)
    assert sink.max_chunk == CHUNK
    assert set(sink.paths) == {(e, v) for e in range(NUM_ENVS) for v in ("scene", "ego")}
    for (env_index, view), path in sink.paths.items():
        assert path == tmp_path / "train" / view / f"step0000001234_env{env_index:03d}.mp4"
        assert count_video_frames(path) == n


def test_two_runs_into_one_directory_write_distinct_files(setup, tmp_path):
    _, _, recorder = setup
    paths = []
    for n in (5, 7):
        with VideoSink(recorder, tmp_path, "render", step=0, env_indices=[3, 4]) as sink:
            run(setup, n, sink)
        paths.append(sink.paths)
    first, second = paths
    assert set(first.values()).isdisjoint(second.values())
    assert second[(3, "scene")].name == "step0000000000_env003-2.mp4"
    # The first run's files were not overwritten.
    assert all(count_video_frames(p) == 5 for p in first.values())
    assert all(count_video_frames(p) == 7 for p in second.values())
    # Claiming is exclusive even for the same stem.
    a, b = (claim_path(tmp_path / "x", "f", ".mp4") for _ in range(2))
    assert a != b and a.exists() and b.exists()


def test_record_rejects_bad_requests(setup):
    with pytest.raises(ConfigError, match="num_frames"):
        run(setup, 0, Spy())
    _, params, recorder = setup
    with pytest.raises(ConfigError, match="scenario_ids"):
        record(recorder, None, params, np.arange(3), 4, Spy(), jax.random.key(0))
    with pytest.raises(ConfigError, match="even"):
        VideoConfig(width=33)
    with pytest.raises(ConfigError, match="views"):
        VideoConfig(views=("scene", "top"))


def test_overlay_text_names_step_trial_and_counts():
    info = FrameInfo(*(np.array([[v]]) for v in (17, 1, 8, 3, 1, 2)))
    assert overlay_lines(info, 0, 0, num_trials=3) == [
        "step 17", "trial 2 / 3", "goal 3/8  coll 1  off 2"]
    assert overlay_lines(info, 0, 0, num_trials=1)[1].startswith("goal")
    frame = np.full((64, 96, 3), 200, np.uint8)
    out = draw_overlay(frame, overlay_lines(info, 0, 0, 3))
    assert out.shape == frame.shape and out.dtype == np.uint8
    # Text sits in the top-left band; the rest of the frame is untouched.
    assert np.any(out[:20, :40] != 200) and np.all(out[48:] == 200)
    assert np.all(frame == 200)  # the input is not modified


def test_trail_points_light_their_pixels_under_the_bodies():
    # 16 x 16 pixels at 1 m per pixel, view centred on the origin (no roads).
    config = RenderConfig(width=16, height=16, metres_per_pixel=1.0)
    rg = Roadgraph(xy=jnp.zeros((2, 2)), dir=jnp.zeros((2, 2)), type=jnp.zeros(2, jnp.int32),
                   id=jnp.full(2, -1, jnp.int32), valid=jnp.zeros(2, bool))
    z = jnp.zeros((1,), jnp.float32)
    agent = AgentState(xy=jnp.array([[0.5, 0.5]]), yaw=z, vel=jnp.zeros((1, 2)), steer=z,
                       accel=z, valid=jnp.ones(1, bool))
    # Past positions at (-4.5, 0.5) and (-6.5, 0.5); the third is hidden; one under the body.
    trail = jnp.array([[[-4.5, 0.5], [-6.5, 0.5], [3.5, 3.5], [0.5, 0.5]]])
    shown = jnp.array([[True, True, False, True]])
    image = np.asarray(jax.jit(render_frame, static_argnums=0)(
        config, rg, agent, jnp.array([2.0]), jnp.array([1.0]), jnp.ones(1, bool),
        jnp.array([AgentColour.EGO]), jnp.zeros((1, 2)), jnp.zeros(1, bool), trail, shown))
    trail_rgb = np.array(TRAIL_RGB[AgentColour.EGO], np.uint8)
    # World (x, y) -> pixel (row, col) = (8 - ceil(y), 8 + floor(x)).
    lit = np.all(image == trail_rgb, axis=-1)
    assert set(zip(*np.nonzero(lit), strict=True)) == {(7, 3), (7, 1)}
    # The body (2 x 1 m at the origin pixel) covers the trail point beneath it.
    assert np.all(image[7, 8] == np.array(AGENT_RGB[AgentColour.EGO], np.uint8))


def test_a_video_stopped_midway_leaves_no_file(tmp_path):
    """Issue 40: a stop (Ctrl-C, SIGTERM, an error) while a video is written leaves the
    path as it was (absent), not a truncated mp4; a finished one is complete."""
    frames = np.zeros((3, 16, 16, 3), np.uint8)
    done = VideoWriter(tmp_path / "done.mp4", 16, 16)
    done.write(frames)
    assert not (tmp_path / "done.mp4").exists()  # nothing at the path until it is done
    done.close()
    assert count_video_frames(tmp_path / "done.mp4") == 3
    stopped = VideoWriter(tmp_path / "stopped.mp4", 16, 16)
    stopped.write(frames)
    stopped.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.mp4"]


def test_a_recording_stopped_midway_leaves_no_video(setup, tmp_path):
    _, _, recorder = setup
    with pytest.raises(KeyboardInterrupt):
        with VideoSink(recorder, tmp_path, "render", step=0) as sink:
            run(setup, 5, sink)
            raise KeyboardInterrupt  # Ctrl-C after some frames were written
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []

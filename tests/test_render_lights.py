"""Traffic lights in the raster: stop lines on hand-computed pixels in their state's colour
at the drawn log step, nothing for invalid lights, and recordings that follow the log
(rewound by a trial restart)."""

from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_ENV, SMALL_SCENARIO, straight_road

from jaxdrive.agents.controllers import log_replay
from jaxdrive.env import Env, EnvConfig
from jaxdrive.render.raster import (
    BACKGROUND_RGB,
    LIGHT_RGB,
    RenderConfig,
    render_frame,
    render_state,
)
from jaxdrive.render.record import Recorder, VideoConfig, controller_actor
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.signals import LightColor, lights_at
from jaxdrive.types import AgentState, Roadgraph, TrafficLights, TrafficLightState, tree_stack

S = TrafficLightState
RED, YELLOW, GREEN, GREY = (np.array(LIGHT_RGB[c], np.uint8) for c in (
    LightColor.RED, LightColor.YELLOW, LightColor.GREEN, LightColor.UNKNOWN))
# 32 x 32 pixels at 0.5 m per pixel, no roads: the view centre is the world origin and
# world (x, y) lies at image (u, v) = (16 + 2 x, 16 - 2 y).
SCENE = RenderConfig(width=32, height=32, view="scene", metres_per_pixel=0.5)

# Light 0 at (-4.1, 0.1) on a lane heading +x: its stop line runs across the lane (along
# y) from v = 15.8 - 4 to 15.8 + 4 in 1-pixel samples (rows 11..19), 3 pixels thick along
# the lane (u = 7.8 - 1, 7.8, 7.8 + 1: columns 6..8).
LINE_0 = {(r, c) for r in range(11, 20) for c in range(6, 9)}
# Light 1 at (4.1, -0.1) on a lane heading +y: its line runs along x, u = 24.2 -+ 4
# (columns 20..28), rows 15..17 (v = 16.2 -+ 1).
LINE_1 = {(r, c) for r in range(15, 18) for c in range(20, 29)}
# Light 2 at (0.1, 6.1) heading +x is never valid; light 3 at (0.1, -6.1) has no lane
# direction (a dot, 3 pixels along u = 16.2 -+ 1, row 28) and is valid with state UNKNOWN.
DOT_3 = {(28, 15), (28, 16), (28, 17)}
STOP_XY = np.array([[-4.1, 0.1], [4.1, -0.1], [0.1, 6.1], [0.1, -6.1]], np.float32)
STOP_DIR = np.array([[1, 0], [0, 1], [1, 0], [0, 0]], np.float32)
# Log steps 0..2: light 0 goes red -> green -> red, light 1 green -> yellow -> invalid.
STATES = np.array([[S.STOP, S.GO, S.ARROW_STOP],
                   [S.GO, S.CAUTION, S.GO],
                   [S.STOP, S.STOP, S.STOP],
                   [S.UNKNOWN, S.UNKNOWN, S.UNKNOWN]], np.int32)
VALID = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 1]], bool)
LIGHTS = TrafficLights(lane_id=jnp.asarray(np.arange(4, dtype=np.int32)),
                       stop_xy=jnp.asarray(STOP_XY),
                       state=jnp.asarray(STATES), valid=jnp.asarray(VALID))
R, A = 4, 1


def _empty_roads():
    return Roadgraph(xy=jnp.zeros((R, 2)), dir=jnp.zeros((R, 2)), type=jnp.zeros(R, jnp.int32),
                     id=jnp.full(R, -1, jnp.int32), valid=jnp.zeros(R, bool))


def _hidden_agent():
    z = jnp.zeros((A,), jnp.float32)
    agents = AgentState(xy=jnp.full((A, 2), 1e5), yaw=z, vel=jnp.zeros((A, 2)), steer=z,
                        accel=z, valid=jnp.zeros(A, bool))
    return dict(agents=agents, length=z, width=z, visible=jnp.zeros(A, bool),
                colour_index=jnp.zeros(A, jnp.int32), goal=jnp.zeros((A, 2)),
                goal_visible=jnp.zeros(A, bool))


@jax.jit
@chex.assert_max_traces(n=1)
def frame_at(t):
    """The hand-built scene's frame at log step ``t`` (one compile for the module)."""
    state, valid = lights_at(LIGHTS, t)
    return render_frame(SCENE, _empty_roads(), **_hidden_agent(), stop_xy=LIGHTS.stop_xy,
                        stop_dir=jnp.asarray(STOP_DIR), light_state=state, light_valid=valid)


def pixels(img, rgb):
    rows, cols = np.nonzero(np.all(np.asarray(img) == rgb, axis=-1))
    return set(zip(rows.tolist(), cols.tolist(), strict=True))


def test_stop_lines_light_the_hand_computed_pixels_in_their_state_colour():
    img = np.asarray(frame_at(jnp.int32(0)))
    assert pixels(img, RED) == LINE_0
    assert pixels(img, GREEN) == LINE_1
    assert pixels(img, GREY) == DOT_3
    # Everything else (the never-valid light 2 included) is background.
    background = pixels(img, np.array(BACKGROUND_RGB, np.uint8))
    assert len(background) == 32 * 32 - len(LINE_0) - len(LINE_1) - len(DOT_3)


def test_colours_follow_the_log_step_and_invalid_lights_vanish():
    step1 = np.asarray(frame_at(jnp.int32(1)))
    assert pixels(step1, GREEN) == LINE_0 and pixels(step1, YELLOW) == LINE_1
    assert not pixels(step1, RED)
    # Step 2: light 0 shows a red arrow; light 1 is invalid and draws nothing.
    step2 = np.asarray(frame_at(jnp.int32(2)))
    assert pixels(step2, RED) == LINE_0
    assert not pixels(step2, GREEN) and not pixels(step2, YELLOW)
    assert all((step2[r, c] == BACKGROUND_RGB).all() for r, c in LINE_1)
    # Past the log the last step holds (lights_at clips).
    np.testing.assert_array_equal(np.asarray(frame_at(jnp.int32(9))), step2)


def test_render_state_draws_the_pool_lights_at_the_given_log_step():
    z = jnp.zeros((A,), jnp.float32)
    state = SimpleNamespace(
        scenario_id=jnp.int32(1),
        agents=AgentState(xy=jnp.full((A, 2), 1e5), yaw=z, vel=jnp.zeros((A, 2)), steer=z,
                          accel=z, valid=jnp.zeros(A, bool)),
        kind=jnp.zeros(A, jnp.int32), role=jnp.zeros(A, jnp.int32),
        removed=jnp.zeros(A, bool), length=z, width=z, goal=jnp.zeros((A, 2)))
    no = jnp.zeros(A, bool)
    timestep = SimpleNamespace(info=SimpleNamespace(
        metrics=SimpleNamespace(collided=no, offroad=no),
        episode_done=jnp.asarray(False), trial_done=jnp.asarray(False)))
    dark = LIGHTS.replace(valid=jnp.zeros_like(LIGHTS.valid))
    pool = SimpleNamespace(
        scenarios=SimpleNamespace(roadgraph=tree_stack([_empty_roads()] * 2),
                                  traffic_lights=tree_stack([dark, LIGHTS])),
        stop_dir=jnp.stack([jnp.zeros((4, 2)), jnp.asarray(STOP_DIR)]))
    params = SimpleNamespace(pool=pool)
    draw = jax.jit(lambda t: render_state(SCENE, params, state, timestep, log_step=t))
    for t in (0, 1):
        np.testing.assert_array_equal(np.asarray(draw(jnp.int32(t))),
                                      np.asarray(frame_at(jnp.int32(t))))
    # Without a log step no light is drawn.
    img = np.asarray(jax.jit(lambda: render_state(SCENE, params, state, timestep))())
    assert (img == np.array(BACKGROUND_RGB, np.uint8)).all()


@pytest.fixture(scope="module")
def recording():
    """A recorder's frame function (ego view, one env) on a straight-road scene whose lane
    carries one hand-injected light, the reset env, and that light's log."""
    # A parked car at (-3, -2) heading +x on lane 2 (y = -2, heading +x); the light's stop
    # point 6.1 m ahead, 0.1 m right of the lane centre.
    scene = straight_road(SMALL_SCENARIO, [(-3, -2, 0, 0, *CAR)], goals=[(90, -2)])
    T, TL = SMALL_SCENARIO.num_steps, SMALL_SCENARIO.max_traffic_lights
    tl = scene.traffic_lights
    tl.lane_id[0], tl.stop_xy[0] = 2, (3.1, -2.1)
    t = np.arange(T)
    tl.state[0] = np.select([t < 4, t < 7, t < 9], [S.STOP, S.GO, S.CAUTION], S.STOP)
    tl.valid[0] = t != 9
    assert TL > 1 and not tl.valid[1:].any()
    env = Env(EnvConfig.from_dict({**SMALL_ENV, "init_step": 2}))
    params = env.make_params(make_pool(tree_stack([jax.tree.map(jnp.asarray, scene)]),
                                       env.config.road_index))
    video = VideoConfig(num_envs=1, views=("ego",), width=32, height=32,
                        ego_metres_per_pixel=0.5, trail_steps=0, overlay=False)
    recorder = Recorder(env, controller_actor(env, log_replay(env)), video)
    state, ts = jax.jit(jax.vmap(env.reset_to, in_axes=(None, 0, 0)))(
        params, jnp.zeros(1, jnp.int32), jax.random.split(jax.random.key(0), 1))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def frame(step, trial_start):
        s = state.replace(step=jnp.full_like(state.step, step),
                          trial_start=jnp.full_like(state.trial_start, trial_start))
        return recorder._frames(params, s, ts, None, None)[0, 0]  # (H, W, 3)

    return frame, tl.state[0], tl.valid[0]


def test_recorded_frames_show_the_light_at_init_step_plus_trial_step(recording):
    frame, state, valid = recording
    # Ego view, car heading up at the image centre: world (x, y) -> (u, v) =
    # (16 - 2 (y + 2), 16 - 2 (x + 3)). The stop line spans columns 12..20 (u = 16.2 -+ 4)
    # and rows 2..4 (v = 3.8 -+ 1); pixel (3, 13) is on it and off the lane centre line.
    rgb = {S.STOP: RED, S.GO: GREEN, S.CAUTION: YELLOW}
    seen = []
    for step, trial_start in [(0, 0), (2, 0), (5, 0), (7, 0), (8, 0), (12, 7), (20, 16)]:
        log = 2 + step - trial_start  # init_step + trial_step: a trial restart rewinds
        want = rgb[int(state[log])] if valid[log] else np.array(BACKGROUND_RGB, np.uint8)
        got = np.asarray(frame(jnp.int32(step), jnp.int32(trial_start)))[3, 13]
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
        seen.append(tuple(got))
    # Red, green, yellow, dark (log step 9), red, then yellow and green in later trials.
    assert seen == [tuple(c) for c in (RED, GREEN, YELLOW, BACKGROUND_RGB, RED, YELLOW,
                                       GREEN)]

"""Top-down rasteriser: hand-computed pixels, hidden agents, ego view, roads, vmap/scan."""

import functools
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.config import ConfigError
from jaxdrive.render.raster import (
    AGENT_RGB,
    BACKGROUND_RGB,
    HEADING_RGB,
    ROAD_RGB,
    AgentColour,
    RenderConfig,
    agent_colours,
    render_frame,
    render_state,
    view_transform,
)
from jaxdrive.types import AgentState, EntityKind, Roadgraph, RoadType, Role

A = 3  # agent slots
R = 64  # road points
FAR = 1.0e5  # where unused slots are parked
# 32 x 32 pixels at 0.5 m per pixel: the view spans 16 m; in the scene view its centre is
# the road extent's centre (the world origin when there are no roads).
SCENE = RenderConfig(width=32, height=32, view="scene", metres_per_pixel=0.5)
EGO = RenderConfig(width=32, height=32, view="ego", metres_per_pixel=0.5, ego_agent=0)


# One compiled function per view for the whole module; a retrace would fail the test.
@jax.jit
@chex.assert_max_traces(n=1)
def render_scene(roadgraph, **kwargs):
    return render_frame(SCENE, roadgraph, **kwargs)


@jax.jit
@chex.assert_max_traces(n=1)
def render_ego(roadgraph, **kwargs):
    return render_frame(EGO, roadgraph, **kwargs)


def roadgraph(polylines=()):
    """Roadgraph of R points from [(points (n, 2), RoadType)], one polyline id each."""
    xy = np.zeros((R, 2), np.float32)
    rtype = np.zeros((R,), np.int32)
    ids = np.full((R,), -1, np.int32)
    valid = np.zeros((R,), bool)
    i = 0
    for pid, (pts, t) in enumerate(polylines):
        n = len(pts)
        xy[i : i + n] = pts
        rtype[i : i + n] = t
        ids[i : i + n] = pid
        valid[i : i + n] = True
        i += n
    return Roadgraph(xy=jnp.asarray(xy), dir=jnp.zeros((R, 2), jnp.float32),
                     type=jnp.asarray(rtype), id=jnp.asarray(ids), valid=jnp.asarray(valid))


def scene(boxes):
    """render_frame's agent arguments from up to A boxes (x, y, yaw, length, width, colour,
    goal or None); the other slots are hidden and parked far away."""
    xy = np.full((A, 2), FAR, np.float32)
    yaw = np.zeros((A,), np.float32)
    length = np.zeros((A,), np.float32)
    width = np.zeros((A,), np.float32)
    visible = np.zeros((A,), bool)
    colour = np.zeros((A,), np.int32)
    goal = np.full((A, 2), FAR, np.float32)
    goal_visible = np.zeros((A,), bool)
    for a, (x, y, h, ln, wd, c, g) in enumerate(boxes):
        xy[a], yaw[a], length[a], width[a], colour[a] = (x, y), h, ln, wd, c
        visible[a] = True
        if g is not None:
            goal[a], goal_visible[a] = g, True
    zeros = jnp.zeros((A,), jnp.float32)
    agents = AgentState(xy=jnp.asarray(xy), yaw=jnp.asarray(yaw), vel=jnp.zeros((A, 2)),
                        steer=zeros, accel=zeros, valid=jnp.asarray(visible))
    return dict(agents=agents, length=jnp.asarray(length), width=jnp.asarray(width),
                visible=jnp.asarray(visible), colour_index=jnp.asarray(colour),
                goal=jnp.asarray(goal), goal_visible=jnp.asarray(goal_visible))


def painted(shape, pixels):
    """(H, W, 3) uint8 background with {colour: [(row, col), ...]} painted on it."""
    img = np.empty(shape + (3,), np.uint8)
    img[:] = BACKGROUND_RGB
    for rgb, cells in pixels.items():
        for r, c in cells:
            img[r, c] = rgb
    return img


def where_colour(img, rgb):
    """Set of (row, col) pixels of exactly this colour."""
    rows, cols = np.nonzero(np.all(np.asarray(img) == np.array(rgb, np.uint8), axis=-1))
    return set(zip(rows.tolist(), cols.tolist(), strict=True))


# Two roads across the scene view: a road edge along y = 2.3 and a lane centre along
# y = -1.2, both from x = -5.3 to 5.1 in 11 points 1.04 m apart.
_XS = np.linspace(-5.3, 5.1, 11)
TWO_ROADS = roadgraph([
    (np.stack([_XS, np.full(11, 2.3)], 1), RoadType.ROAD_EDGE),
    (np.stack([_XS, np.full(11, -1.2)], 1), RoadType.LANE_CENTER),
])


def test_one_box_lights_the_hand_computed_pixels():
    # A 4 m x 2 m ego box heading +x, centred at (0.1, 0.05) m (nudged off the pixel
    # grid so that no pixel centre lies on an edge), no roads: the view centre is the
    # origin. In image coordinates u = 16 + x / 0.5, v = 16 - y / 0.5 its centre is
    # (16.2, 15.9) and it covers u in [12.2, 20.2], v in [13.9, 17.9]: pixel centres
    # (col + 0.5, row + 0.5) inside are cols 12..19, rows 14..17 (32 pixels).
    # Heading mark: lon >= half_len - min(half_len, half_wid) = 4 - 2 = 2 px and
    # |lat| <= half_wid * (half_len - lon) / 2 = 4 - lon. Col 18 has lon = 18.5 - 16.2 =
    # 2.3 (|lat| <= 1.7: rows 14..17 with lat = 1.4, 0.4, -0.6, -1.6); col 19 has
    # lon = 3.3 (|lat| <= 0.7: rows 15, 16).
    frame = render_scene(roadgraph(), **scene([(0.1, 0.05, 0.0, 4.0, 2.0, 0, None)]))
    assert frame.shape == (32, 32, 3) and frame.dtype == jnp.uint8
    heading = {(r, 18) for r in range(14, 18)} | {(15, 19), (16, 19)}
    body = {(r, c) for r in range(14, 18) for c in range(12, 20)} - heading
    expected = painted((32, 32), {AGENT_RGB[AgentColour.EGO]: body, HEADING_RGB: heading})
    # Exact everywhere, which includes: nothing outside a 1-pixel margin of the box changed.
    np.testing.assert_array_equal(np.asarray(frame), expected)
    assert len(body) == 26


def test_big_rotated_boxes_match_a_brute_force_reference():
    # Boxes of 7.2 m x 3.4 m (diagonal 7.96 m, just under max_box_size = 8 m) at random
    # poses, some partly or wholly off the 16 m x 16 m view: the lit pixels must be
    # exactly those whose centre lies inside the box, tested over the whole image in
    # float64, plus the pixel holding the box centre.
    rng = np.random.default_rng(1)
    poses = [(-8.6, 0.3, 0.4), (8.9, 8.7, 2.0), (0.0, -9.5, -1.0)]  # centre off the image
    # Diagonal along x or y: these reach 8 pixels (the patch radius) left, right, down
    # and up of their centre pixel.
    diag = np.arctan2(3.4, 7.2)
    poses += [(0.45, 0.26, diag), (0.05, 0.26, diag), (0.26, -0.45, np.pi / 2 + diag),
              (0.26, -0.05, np.pi / 2 + diag)]
    poses += [tuple(p) for p in rng.uniform([-8.0, -8.0, -np.pi], [8.0, 8.0, np.pi], (9, 3))]
    col, row = np.meshgrid(np.arange(32), np.arange(32))
    px, py = (col + 0.5 - 16.0) * 0.5, (16.0 - row - 0.5) * 0.5  # pixel centres, metres
    for x, y, yaw in poses:
        frame = render_scene(roadgraph(), **scene([(x, y, yaw, 7.2, 3.4, 0, None)]))
        f32 = np.float32  # the renderer's pose, rounded as it sees it
        x, y, yaw = float(f32(x)), float(f32(y)), float(f32(yaw))
        lon = (px - x) * np.cos(yaw) + (py - y) * np.sin(yaw)
        lat = -(px - x) * np.sin(yaw) + (py - y) * np.cos(yaw)
        inside = (np.abs(lon) <= 3.6) & (np.abs(lat) <= 1.7)
        inside |= (col == np.floor(16.0 + x / 0.5)) & (row == np.floor(16.0 - y / 0.5))
        lit = np.any(np.asarray(frame) != np.array(BACKGROUND_RGB, np.uint8), axis=-1)
        np.testing.assert_array_equal(lit, inside, err_msg=f"pose {(x, y, yaw)}")
        assert inside.sum() >= 2  # even the corner one shows a corner


def test_hidden_agent_and_its_goal_are_absent():
    ego = (0.1, 0.05, 0.0, 4.0, 2.0, AgentColour.EGO, None)
    # A collided agent at (-6, -4) m -> image (u, v) = (4, 24), with its goal at (5, 5).
    other = (-6.0, -4.0, 0.3, 4.0, 2.0, AgentColour.COLLIDED, (5.0, 5.0))
    shown = scene([ego, other])
    hidden = dict(shown, visible=shown["visible"].at[1].set(False))
    without = scene([ego])
    f_shown = np.asarray(render_scene(roadgraph(), **shown))
    f_hidden = np.asarray(render_scene(roadgraph(), **hidden))
    f_without = np.asarray(render_scene(roadgraph(), **without))
    np.testing.assert_array_equal(f_hidden, f_without)
    # Shown, its centre pixel and its goal's pixel (u, v) = (26, 6) carry its colour.
    red = AGENT_RGB[AgentColour.COLLIDED]
    assert tuple(f_shown[24, 4]) == red and tuple(f_shown[6, 26]) == red
    assert tuple(f_hidden[24, 4]) == BACKGROUND_RGB and tuple(f_hidden[6, 26]) == BACKGROUND_RGB


def test_goal_is_a_disc_in_the_agent_colour():
    # Goal at (-5.2, 4.1) m -> (u, v) = (16 - 10.4, 16 - 8.2) = (5.6, 7.8): pixel
    # (row 7, col 5). Radius 2: offsets with dr^2 + dc^2 <= 2 * 3 = 6, i.e. the 5 x 5
    # square without its 4 corners (21 pixels). The agent itself is far off-screen.
    frame = render_scene(roadgraph(), **scene([(60.0, 0.0, 0.0, 4.0, 2.0,
                                                AgentColour.CO_PLAYER, (-5.2, 4.1))]))
    disc = {(7 + dr, 5 + dc) for dr in range(-2, 3) for dc in range(-2, 3)
            if dr * dr + dc * dc <= 6}
    assert len(disc) == 21
    expected = painted((32, 32), {AGENT_RGB[AgentColour.CO_PLAYER]: disc})
    np.testing.assert_array_equal(np.asarray(frame), expected)


def _ego_world(yaw):
    """Ego at (10, 5) with heading yaw; another car 6 m ahead turned 0.3 rad left; a road
    edge 3.1 m to the ego's left running along its heading (all rotated with the ego)."""
    c, s = np.cos(yaw), np.sin(yaw)

    def world(lon, lat):
        return np.array([10.0 + lon * c - lat * s, 5.0 + lon * s + lat * c])

    boxes = [
        (*world(0.0, 0.0), yaw, 4.6, 1.8, AgentColour.EGO, None),
        (*world(6.0, 0.0), yaw + 0.3, 4.6, 1.8, AgentColour.EXPERT, None),
    ]
    # 21 points 0.987 m apart (off the pixel grid), lon from -9.87 to 9.87.
    road = np.stack([world(lon, 3.1) for lon in np.linspace(-9.87, 9.87, 21)])
    return roadgraph([(road.astype(np.float32), RoadType.ROAD_EDGE)]), scene(boxes)


def test_ego_view_heads_up_whatever_the_yaw():
    roads, args = _ego_world(0.0)
    f_east = np.asarray(render_ego(roads, **args))
    roads, args = _ego_world(np.pi / 2)
    f_north = np.asarray(render_ego(roads, **args))
    np.testing.assert_array_equal(f_east, f_north)
    # The ego (4.6 x 1.8 m = 9.2 x 3.6 px) sits at (u, v) = (16, 16) heading up: pixel
    # centres with |u - 16| <= 1.8 and |v - 16| <= 4.6 are cols 14..17, rows 11..20,
    # centred on (16, 16). Heading mark: lon = 16 - v >= 4.6 - 1.8 = 2.8 and
    # |lat| <= 4.6 - lon: row 12 (lon 3.5, |u - 16| <= 1.1: cols 15, 16); row 11 has
    # lon 4.5, |u - 16| <= 0.1: none. So the mark lies above the centre.
    box = {(r, c) for r in range(11, 21) for c in range(14, 18)}
    heading = {(12, 15), (12, 16)}
    assert where_colour(f_east, AGENT_RGB[AgentColour.EGO]) == box - heading
    assert {p for p in where_colour(f_east, HEADING_RGB) if p[0] >= 10} == heading
    assert np.mean([r + 0.5 for r, _ in box]) == 16.0
    assert np.mean([c + 0.5 for _, c in box]) == 16.0
    # The car ahead: 12 px up, centre pixel (row 4, col 16). The road 3.1 m to the left:
    # u = 16 - 6.2 = 9.8 (col 9), spanning v from 35.7 to -3.7 (every row).
    assert tuple(f_east[4, 16]) == AGENT_RGB[AgentColour.EXPERT]
    assert where_colour(f_east, ROAD_RGB[RoadType.ROAD_EDGE]) == {(r, 9) for r in range(32)}


def test_roads_land_on_the_expected_rows():
    # Road extent x in [-5.3, 5.1], y in [-1.2, 2.3] -> view centre (-0.1, 0.55).
    # Edge: v = 16 - (2.3 - 0.55) / 0.5 = 12.5 (row 12); lane centre: v = 16 + 1.75 / 0.5
    # = 19.5 (row 19). u from 16 + (-5.3 + 0.1) / 0.5 = 5.6 to 16 + 5.2 / 0.5 = 26.4:
    # cols 5..26, with 8 samples per 2.08 px segment (0.26 px apart) hitting every one.
    frame = render_scene(TWO_ROADS, **scene([]))
    expected = painted((32, 32), {
        ROAD_RGB[RoadType.ROAD_EDGE]: [(12, c) for c in range(5, 27)],
        ROAD_RGB[RoadType.LANE_CENTER]: [(19, c) for c in range(5, 27)],
    })
    np.testing.assert_array_equal(np.asarray(frame), expected)


def test_view_transform_fits_the_scene_and_follows_the_ego():
    fit = RenderConfig(width=64, height=32, margin=5.0)
    xy, yaw = jnp.zeros((A, 2)), jnp.zeros((A,))
    origin, rotation, mpp = view_transform(fit, TWO_ROADS, xy, yaw)
    # Spans with margins: x 10.4 + 10 = 20.4 m over 64 px = 0.31875; y 3.5 + 10 = 13.5 m
    # over 32 px = 0.421875 -> the larger.
    np.testing.assert_allclose(origin, [-0.1, 0.55], atol=1e-6)
    np.testing.assert_array_equal(rotation, np.eye(2))
    assert float(mpp) == pytest.approx(0.421875)
    _, _, floored = view_transform(fit.replace(min_metres_per_pixel=0.5), TWO_ROADS, xy, yaw)
    assert float(floored) == 0.5
    xy = jnp.array([[3.0, -2.0], [0.0, 0.0], [0.0, 0.0]])
    origin, rotation, mpp = view_transform(EGO.replace(metres_per_pixel=None), TWO_ROADS, xy,
                                           jnp.array([0.7, 0.0, 0.0]))
    np.testing.assert_array_equal(origin, [3.0, -2.0])
    np.testing.assert_allclose(rotation @ np.array([np.cos(0.7), np.sin(0.7)]), [0.0, 1.0],
                               atol=1e-6)
    assert float(mpp) == 0.25


def test_vmap_over_envs_and_scan_over_time_match_single_frames():
    T, B = 4, 3
    rng = np.random.default_rng(0)  # NumPy draws: no PRNG kernels to compile

    def uniform(lo, hi, shape):
        return jnp.asarray(rng.uniform(lo, hi, shape), jnp.float32)

    zeros = jnp.zeros((T, B, A), jnp.float32)
    agents = AgentState(xy=uniform(-6.0, 6.0, (T, B, A, 2)), yaw=uniform(-3.0, 3.0, (T, B, A)),
                        vel=jnp.zeros((T, B, A, 2)), steer=zeros, accel=zeros,
                        valid=jnp.ones((T, B, A), bool))
    args = dict(
        agents=agents,
        length=uniform(3.0, 5.0, (T, B, A)),
        width=uniform(1.5, 2.2, (T, B, A)),
        visible=jnp.asarray(rng.uniform(size=(T, B, A)) < 0.8),
        colour_index=jnp.asarray(rng.integers(0, 6, (T, B, A)), jnp.int32),
        goal=uniform(-7.0, 7.0, (T, B, A, 2)),
        goal_visible=jnp.asarray(rng.uniform(size=(T, B, A)) < 0.5),
    )
    # Env b's roads are shifted by b metres (moving its view with them).
    roads = jax.tree.map(lambda *x: jnp.stack(x), *[
        TWO_ROADS.replace(xy=TWO_ROADS.xy + np.float32([b, -b])) for b in range(B)])

    @jax.jit
    def rollout(roads, args):
        def step(_, a):
            return None, jax.vmap(functools.partial(render_frame, SCENE))(roads, **a)
        return jax.lax.scan(step, None, args)[1]

    frames = rollout(roads, args)
    assert frames.shape == (T, B, 32, 32, 3) and frames.dtype == jnp.uint8
    frames = np.asarray(frames)
    args, roads = jax.device_get((args, roads))  # NumPy slicing: no dispatch per leaf
    for t in range(T):
        for b in range(B):
            one = jax.tree.map(lambda x, t=t, b=b: x[t, b], args)
            single = render_scene(jax.tree.map(lambda x, b=b: x[b], roads), **one)
            np.testing.assert_array_equal(frames[t, b], np.asarray(single))
            # Each frame holds the roads and at least one agent body or heading mark.
            assert where_colour(frames[t, b], ROAD_RGB[RoadType.ROAD_EDGE])
            assert any(where_colour(frames[t, b], rgb)
                       for rgb in [*AGENT_RGB.values(), HEADING_RGB])
    assert not np.array_equal(frames[0, 0], frames[1, 0])
    assert not np.array_equal(frames[0, 0], frames[0, 1])


def _env_standins(episode_done=False):
    """Duck-typed EnvState / TimeStep / EnvParams with the fields the renderer reads."""
    K = EntityKind
    # Slots: ego, co-player, expert, static, collided ego, expert off-road and collided,
    # removed ego, invalid padding.
    kind = [K.CONTROLLED, K.CONTROLLED, K.EXPERT, K.STATIC, K.CONTROLLED, K.EXPERT,
            K.CONTROLLED, K.INVALID]
    n = len(kind)
    role = np.full((n,), Role.EGO, np.int32)
    role[1] = Role.CO_PLAYER
    xy = np.stack([np.linspace(-6.0, 6.0, n), np.full(n, -4.0)], 1).astype(np.float32)
    zeros = jnp.zeros((n,), jnp.float32)
    state = SimpleNamespace(
        scenario_id=jnp.int32(1),
        agents=AgentState(xy=jnp.asarray(xy), yaw=zeros, vel=jnp.zeros((n, 2)), steer=zeros,
                          accel=zeros, valid=jnp.asarray([True] * 6 + [True, False])),
        kind=jnp.asarray(kind, jnp.int32), role=jnp.asarray(role),
        removed=jnp.asarray([False] * 6 + [True, False]),
        length=jnp.full((n,), 1.0, jnp.float32), width=jnp.full((n,), 0.8, jnp.float32),
        goal=jnp.asarray(xy + np.array([0.0, 7.0], np.float32)),
    )
    timestep = SimpleNamespace(info=SimpleNamespace(
        metrics=SimpleNamespace(
            collided=jnp.asarray([False] * 4 + [True, True, False, False]),
            offroad=jnp.asarray([False] * 5 + [True, False, False]),
        ),
        episode_done=jnp.asarray(episode_done), trial_done=jnp.asarray(False),
    ))
    pool = jax.tree.map(lambda *x: jnp.stack(x), roadgraph(), TWO_ROADS)
    params = SimpleNamespace(pool=SimpleNamespace(scenarios=SimpleNamespace(roadgraph=pool)))
    return state, timestep, params


def test_agent_colours_and_render_state():
    C = AgentColour
    state, timestep, params = _env_standins()
    visible, colour = agent_colours(state, timestep)
    np.testing.assert_array_equal(visible, [True] * 6 + [False, False])
    np.testing.assert_array_equal(
        colour[:6], [C.EGO, C.CO_PLAYER, C.EXPERT, C.STATIC, C.COLLIDED, C.COLLIDED])
    # On an auto-reset step the metrics belong to the previous episode: roles only.
    _, stale = agent_colours(*_env_standins(episode_done=True)[:2])
    np.testing.assert_array_equal(stale[4:6], [C.EGO, C.EXPERT])
    # Off-road colours controlled agents only: an expert beyond the road edges (a car
    # parked on the kerb in its log) keeps its role colour.
    offroad_all = SimpleNamespace(info=SimpleNamespace(**{**vars(timestep.info),
                                                          "metrics": SimpleNamespace(
        collided=jnp.zeros(8, bool), offroad=jnp.ones(8, bool))}))
    _, off = agent_colours(state, offroad_all)
    np.testing.assert_array_equal(off[:4], [C.OFFROAD, C.OFFROAD, C.EXPERT, C.STATIC])
    # render_state draws scenario 1 (TWO_ROADS) with these colours and the goals of the
    # visible controlled agents (slots 0, 1, 4).
    frame = jax.jit(lambda: render_state(SCENE, params, state, timestep))()
    goal_visible = visible & (state.kind == EntityKind.CONTROLLED)
    np.testing.assert_array_equal(goal_visible, [1, 1, 0, 0, 1, 0, 0, 0])
    expected = jax.jit(functools.partial(render_frame, SCENE))(
        TWO_ROADS, state.agents, state.length, state.width, visible, colour, state.goal,
        goal_visible)
    np.testing.assert_array_equal(np.asarray(frame), np.asarray(expected))
    assert where_colour(frame, ROAD_RGB[RoadType.ROAD_EDGE])


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="'view'.*scene, ego"):
        RenderConfig(view="top")
    with pytest.raises(ConfigError, match="max_box_size"):
        RenderConfig(view="ego", metres_per_pixel=0.01)
    assert RenderConfig().patch_radius == 16  # floor(4 m / 0.25 m + 0.5)
    assert SCENE.patch_radius == 8  # floor(4 m / 0.5 m + 0.5)

"""Jittable top-down rasteriser: roads, agents as oriented boxes and goals -> uint8 RGB.

Pixel convention: ``image[row, col]`` with row 0 at the top. The view frame has +x to
the right and +y up, in pixels, with its origin at the image centre: view point ``q``
lies at continuous image coordinates ``(u, v) = (W / 2 + q_x, H / 2 - q_y)``, and pixel
``(row, col)`` covers ``u in [col, col + 1), v in [row, row + 1)`` with its centre at
``(col + 0.5, row + 0.5)``. In the scene view world +x is right and +y is up; in the ego
view the followed agent sits at the image centre heading up.

Drawing writes labels, not colours, into an int32 label image padded by the agent patch
radius: labels are ordered by drawing priority (roads by type < traffic-light stop lines <
trails < goals < agent bodies < heading marks) and every write keeps the maximum, so
overlaps resolve the same way whatever the order. Roads (``line_samples`` points per road
point), stop lines (a fixed grid of samples each) and goals (a disc of pixels each) go in
by one scatter-max that drops off-image samples; agents follow one at
a time, each over a fixed square window of pixels (``RenderConfig.patch_radius``),
which on CPU costs a fraction of a scatter over the same pixels. A palette lookup on
the cropped label image gives the colours. All shapes are static.

Traffic lights: each light valid at the drawn log step is its stop line, the segment
through its stop point across its lane (``signals.STOP_LINE_HALF_WIDTH`` to either side,
``RenderConfig.stop_line_width`` pixels thick), coloured by ``signals.color`` (red,
yellow, green, grey for a valid light of unknown colour). A light whose lane direction is
unknown (zero ``stop_dir``) is a dot of ``stop_line_width`` pixels at its stop point; an
invalid light draws nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.config import ConfigBase, ConfigError, check_choice, check_int, check_range
from jaxdrive.scenarios import signals
from jaxdrive.types import NUM_ROAD_TYPES, AgentState, EntityKind, Roadgraph, RoadType, Role

if TYPE_CHECKING:
    from jaxdrive.env import EnvParams, EnvState, TimeStep

VIEWS = ("scene", "ego")
EGO_METRES_PER_PIXEL = 0.25  # the ego view's scale when none is configured
_MAX_PATCH_RADIUS = 128  # pixels; beyond this the per-agent patch costs too much


class AgentColour(enum.IntEnum):
    """Palette slot of an agent (``colour_index``): its role, or its state when notable."""

    EGO = 0  # controlled by the policy being trained or evaluated
    CO_PLAYER = 1  # controlled by a frozen partner policy
    EXPERT = 2  # replays its log
    STATIC = 3  # held at its initial pose
    COLLIDED = 4
    OFFROAD = 5


NUM_AGENT_COLOURS = len(AgentColour)

BACKGROUND_RGB = (40, 40, 40)
HEADING_RGB = (255, 255, 255)
AGENT_RGB = {
    AgentColour.EGO: (70, 150, 255),
    AgentColour.CO_PLAYER: (180, 110, 255),
    AgentColour.EXPERT: (60, 190, 160),
    AgentColour.STATIC: (135, 135, 135),
    AgentColour.COLLIDED: (255, 60, 60),
    AgentColour.OFFROAD: (255, 150, 0),
}
# Road types in drawing order (later on top) with their colours.
_ROAD_STYLE = (
    (RoadType.UNKNOWN, (70, 70, 70)),
    (RoadType.LANE_CENTER, (80, 80, 110)),
    (RoadType.DRIVEWAY, (95, 95, 95)),
    (RoadType.CROSSWALK, (90, 150, 190)),
    (RoadType.SPEED_BUMP, (190, 110, 190)),
    (RoadType.ROAD_LINE, (235, 215, 120)),
    (RoadType.ROAD_EDGE, (210, 210, 210)),
    (RoadType.STOP_SIGN, (200, 0, 0)),
)
ROAD_RGB = dict(_ROAD_STYLE)
LIGHT_RGB = {
    signals.LightColor.UNKNOWN: (150, 150, 150),
    signals.LightColor.RED: (255, 30, 30),
    signals.LightColor.YELLOW: (255, 210, 0),
    signals.LightColor.GREEN: (0, 220, 80),
}

# Label image values: 0 is the background, then road types, stop lines, trails, goals,
# bodies, heading marks.
_ROAD_LABEL = np.zeros((NUM_ROAD_TYPES,), np.int32)
for _rank, (_type, _) in enumerate(_ROAD_STYLE):
    _ROAD_LABEL[_type] = 1 + _rank
LABEL_LIGHT = 1 + len(_ROAD_STYLE)
LABEL_TRAIL = LABEL_LIGHT + signals.NUM_LIGHT_COLORS
LABEL_GOAL = LABEL_TRAIL + NUM_AGENT_COLOURS
LABEL_AGENT = LABEL_GOAL + NUM_AGENT_COLOURS
LABEL_HEADING = LABEL_AGENT + NUM_AGENT_COLOURS
_AGENT_PALETTE = [AGENT_RGB[c] for c in AgentColour]
# Trails: the agent colour halfway to the background.
TRAIL_RGB = {c: tuple((a + b) // 2 for a, b in zip(AGENT_RGB[c], BACKGROUND_RGB, strict=True))
             for c in AgentColour}
PALETTE = np.array(
    [BACKGROUND_RGB] + [rgb for _, rgb in _ROAD_STYLE]
    + [LIGHT_RGB[c] for c in signals.LightColor] + [TRAIL_RGB[c] for c in AgentColour]
    + _AGENT_PALETTE + _AGENT_PALETTE + [HEADING_RGB],
    np.uint8,
)


@dataclasses.dataclass(frozen=True)
class RenderConfig(ConfigBase):
    """Static settings of a rendered view.

    Attributes:
      width, height: image size in pixels.
      view: ``scene`` (centred on the bounding box of the valid road points plus
        ``margin``, world +y up; the origin when there are none) or ``ego`` (centred on
        agent slot ``ego_agent``, rotated so that it heads up).
      metres_per_pixel: fixed scale; ``None`` fits the scene extent into the image
        (scene view) or uses 0.25 (ego view).
      min_metres_per_pixel: the scene fit never zooms in further than this (it bounds
        the agent patch, see ``patch_radius``).
      ego_agent: agent slot the ego view follows (even while it is hidden).
      margin: metres kept around the road extent in the scene view.
      line_samples: points splatted per road segment; a segment of length ``s`` gets
        points ``s / line_samples`` apart, which should stay under one pixel.
      max_box_size: metres, bound on an agent box's diagonal; of bigger boxes only the
        part within about ``max_box_size / 2`` of the centre along each image axis is
        drawn. Drawing costs ``(max_box_size / metres_per_pixel)**2`` pixel tests per
        agent, at the smallest scale the view allows (``scale_floor``).
      goal_radius: pixels, radius of the filled goal disc.
      stop_line_width: pixels, thickness of a traffic light's stop line.
    """

    width: int = 256
    height: int = 256
    view: str = "scene"
    metres_per_pixel: float | None = None
    min_metres_per_pixel: float = 0.25
    ego_agent: int = 0
    margin: float = 5.0
    line_samples: int = 8
    max_box_size: float = 8.0
    goal_radius: int = 2
    stop_line_width: int = 3

    def __post_init__(self):
        check_int("width", self.width, 1, 16384)
        check_int("height", self.height, 1, 16384)
        check_choice("view", self.view, VIEWS)
        if self.metres_per_pixel is not None:
            check_range("metres_per_pixel", self.metres_per_pixel, 0.0, None, lo_open=True)
        check_range("min_metres_per_pixel", self.min_metres_per_pixel, 0.0, None, lo_open=True)
        check_int("ego_agent", self.ego_agent, 0)
        check_range("margin", self.margin, 0.0, None)
        check_int("line_samples", self.line_samples, 1, 1024)
        check_range("max_box_size", self.max_box_size, 0.0, None, lo_open=True)
        check_int("goal_radius", self.goal_radius, 0, 64)
        check_int("stop_line_width", self.stop_line_width, 1, 16)
        if self.patch_radius > _MAX_PATCH_RADIUS:
            raise ConfigError(
                f"config key 'max_box_size' = {self.max_box_size} at "
                f"{self.scale_floor} metres per pixel needs an agent patch of radius "
                f"{self.patch_radius} pixels (allowed <= {_MAX_PATCH_RADIUS}); lower "
                "max_box_size or raise metres_per_pixel / min_metres_per_pixel."
            )

    @property
    def scale_floor(self) -> float:
        """Smallest metres per pixel this view can render at (static)."""
        if self.metres_per_pixel is not None:
            return float(self.metres_per_pixel)
        return EGO_METRES_PER_PIXEL if self.view == "ego" else float(self.min_metres_per_pixel)

    @property
    def patch_radius(self) -> int:
        """Pixels each side of an agent's centre pixel that its box test covers."""
        # A pixel centre within r pixels (the half-diagonal) of a box centre that lies
        # in pixel c is at most r + 0.5 pixels from c's centre, so at most
        # floor(r + 0.5) pixels away along each axis.
        return math.floor(0.5 * self.max_box_size / self.scale_floor + 0.5)


def view_transform(
    config: RenderConfig, roadgraph: Roadgraph, agents_xy: jax.Array, agents_yaw: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Where the view looks: view point = ``rotation @ (world - origin) / metres_per_pixel``.

    Args:
      config: static view settings.
      roadgraph: ``Roadgraph`` (R points), for the scene view's extent.
      agents_xy: (A, 2) float32; agents_yaw: (A,) float32, for the ego view.
    Returns:
      origin: (2,) float32, world point at the image centre.
      rotation: (2, 2) float32, world -> view rotation.
      metres_per_pixel: () float32.
    """
    f32 = jnp.float32
    if config.view == "ego":
        origin = agents_xy[config.ego_agent].astype(f32)
        # Rotate the ego's heading onto view +y.
        angle = jnp.pi / 2 - agents_yaw[config.ego_agent].astype(f32)
        c, s = jnp.cos(angle), jnp.sin(angle)
        rotation = jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])
        return origin, rotation, jnp.asarray(config.scale_floor, f32)
    valid = roadgraph.valid[:, None]
    xy = roadgraph.xy.astype(f32)
    lo = jnp.min(jnp.where(valid, xy, jnp.inf), axis=0)
    hi = jnp.max(jnp.where(valid, xy, -jnp.inf), axis=0)
    any_road = jnp.any(roadgraph.valid)
    lo = jnp.where(any_road, lo, 0.0)
    hi = jnp.where(any_road, hi, 0.0)
    origin = 0.5 * (lo + hi)
    if config.metres_per_pixel is None:
        span = hi - lo + 2.0 * config.margin
        fit = jnp.max(span / jnp.array([config.width, config.height], f32))
        mpp = jnp.maximum(fit, jnp.float32(config.min_metres_per_pixel))
    else:
        mpp = jnp.asarray(config.metres_per_pixel, f32)
    return origin, jnp.eye(2, dtype=f32), mpp


def world_to_image(config: RenderConfig, transform, xy: jax.Array) -> jax.Array:
    """(..., 2) world metres -> (..., 2) float32 continuous image coordinates (u, v).

    ``u`` grows along columns, ``v`` along rows (down); see the module doc.
    """
    origin, rotation, mpp = transform
    d = (xy.astype(jnp.float32) - origin) / mpp
    # Written out: a (2, 2) matmul batched by vmap is far slower on CPU than this.
    qx = rotation[0, 0] * d[..., 0] + rotation[0, 1] * d[..., 1]
    qy = rotation[1, 0] * d[..., 0] + rotation[1, 1] * d[..., 1]
    return jnp.stack([0.5 * config.width + qx, 0.5 * config.height - qy], -1)


def _pixel(config: RenderConfig, uv: jax.Array) -> jax.Array:
    """(..., 2) continuous image coordinates -> (..., 2) int32 (col, row), clipped so that
    far-away points stay just outside the image instead of overflowing int32."""
    lim = jnp.array([config.width, config.height], jnp.float32)
    return jnp.floor(jnp.clip(uv, -1.0, lim)).astype(jnp.int32)


def _flat_index(config: RenderConfig, col: jax.Array, row: jax.Array, ok: jax.Array):
    """Index into the padded flat label image, or its size (dropped by the scatter) where
    not ``ok`` or off the image."""
    w, h, k = config.width, config.height, config.patch_radius
    inside = ok & (col >= 0) & (col < w) & (row >= 0) & (row < h)
    padded_w = w + 2 * k
    return jnp.where(inside, (row + k) * padded_w + col + k, padded_w * (h + 2 * k))


def _road_layer(config: RenderConfig, roadgraph: Roadgraph, transform):
    """(R * line_samples,) flat indices and labels of the road samples."""
    n = config.line_samples
    xy = roadgraph.xy.astype(jnp.float32)
    seg = roadgraph.segment_mask()
    end = jnp.where(seg[:, None], jnp.roll(xy, -1, axis=0), xy)
    t = jnp.arange(n, dtype=jnp.float32) / n
    pts = xy[:, None, :] + t[None, :, None] * (end - xy)[:, None, :]  # (R, n, 2)
    # A point that starts no segment (a polyline's last point, a stop sign) is one sample.
    ok = roadgraph.valid[:, None] & (seg[:, None] | (jnp.arange(n) == 0)[None, :])
    px = _pixel(config, world_to_image(config, transform, pts))
    idx = _flat_index(config, px[..., 0], px[..., 1], ok)
    rtype = jnp.clip(roadgraph.type, 0, NUM_ROAD_TYPES - 1)
    label = jnp.broadcast_to(jnp.asarray(_ROAD_LABEL)[rtype][:, None], idx.shape)
    return idx.reshape(-1), label.reshape(-1)


def _goal_layer(config: RenderConfig, transform, goal, show, colour):
    """(A * D,) flat indices and labels of the goal discs (D pixels each)."""
    r = config.goal_radius
    o = np.arange(-r, r + 1)
    dc, dr = (a.ravel() for a in np.meshgrid(o, o))
    disc = dc**2 + dr**2 <= r * (r + 1)  # r * (r + 1) rounds the disc better than r**2
    dc, dr = jnp.asarray(dc[disc], jnp.int32), jnp.asarray(dr[disc], jnp.int32)
    px = _pixel(config, world_to_image(config, transform, goal))  # (A, 2)
    idx = _flat_index(config, px[:, :1] + dc, px[:, 1:] + dr, show[:, None])
    label = jnp.broadcast_to((LABEL_GOAL + colour)[:, None], idx.shape)
    return idx.reshape(-1), label.reshape(-1)


def _light_layer(config: RenderConfig, transform, stop_xy, stop_dir, light_state, light_valid):
    """(TL * N * W,) flat indices and labels of the stop lines: N samples across the lane
    (at most a pixel apart at the finest scale) times W one pixel apart along it."""
    mpp = transform[2]
    n = 2 * math.ceil(signals.STOP_LINE_HALF_WIDTH / config.scale_floor) + 1
    w = config.stop_line_width
    across = jnp.linspace(-signals.STOP_LINE_HALF_WIDTH, signals.STOP_LINE_HALF_WIDTH, n,
                          dtype=jnp.float32)  # metres
    along = (jnp.arange(w, dtype=jnp.float32) - 0.5 * (w - 1)) * mpp  # metres
    u = stop_dir.astype(jnp.float32)  # (TL, 2)
    left = jnp.stack([-u[:, 1], u[:, 0]], -1)
    pts = (stop_xy.astype(jnp.float32)[:, None, None, :]
           + across[None, :, None, None] * left[:, None, None, :]
           + along[None, None, :, None] * u[:, None, None, :])  # (TL, N, W, 2)
    # A light without a lane direction would collapse onto its stop point: a dot, spread
    # over W pixels along world x so that it stays visible.
    no_dir = jnp.sum(u * u, axis=-1) == 0
    dot = stop_xy.astype(jnp.float32)[:, None, None, :] + jnp.stack(
        [jnp.broadcast_to(along[None, :], (n, w)), jnp.zeros((n, w), jnp.float32)], -1)
    pts = jnp.where(no_dir[:, None, None, None], dot, pts)
    px = _pixel(config, world_to_image(config, transform, pts))
    show = jnp.broadcast_to(light_valid[:, None, None], px.shape[:-1])
    idx = _flat_index(config, px[..., 0], px[..., 1], show)
    label = LABEL_LIGHT + signals.color(light_state, light_valid)  # (TL,)
    label = jnp.broadcast_to(label[:, None, None], idx.shape)
    return idx.reshape(-1), label.reshape(-1)


def _trail_layer(config: RenderConfig, transform, trail_xy, trail_visible, colour):
    """(A * K,) flat indices and labels of the trail pixels (one per past position)."""
    px = _pixel(config, world_to_image(config, transform, trail_xy))  # (A, K, 2)
    idx = _flat_index(config, px[..., 0], px[..., 1], trail_visible)
    label = jnp.broadcast_to((LABEL_TRAIL + colour)[:, None], idx.shape)
    return idx.reshape(-1), label.reshape(-1)


def _draw_agents(config: RenderConfig, labels, transform, xy, yaw, length, width, show, colour):
    """Max the agents' labels into the padded (H + 2k, W + 2k) label image, one agent at a
    time over a (P, P) window, P = 2k + 1, k = ``patch_radius``.

    A pixel is in an agent's body when its centre lies inside the rotated box (the pixel
    holding the box centre always is, so tiny agents stay visible); the heading mark is
    the body's part inside a triangle whose apex is the middle of the front edge and
    whose base spans the box ``min(length, width) / 2`` behind it.
    """
    _, rotation, mpp = transform
    k = config.patch_radius
    size = 2 * k + 1
    off = jnp.arange(-k, k + 1, dtype=jnp.int32)
    uv = world_to_image(config, transform, xy)  # (A, 2)
    px = _pixel(config, uv)
    # Window origin in padded coordinates; clamped so that it stays inside the padded
    # image, which moves the window off-centre only for agents that are off the image.
    start = jnp.clip(px, 0, jnp.array([config.width - 1, config.height - 1]))
    cos, sin = jnp.cos(yaw).astype(jnp.float32), jnp.sin(yaw).astype(jnp.float32)
    fwd = jnp.stack([rotation[0, 0] * cos + rotation[0, 1] * sin,
                     rotation[1, 0] * cos + rotation[1, 1] * sin], -1)  # (A, 2) view heading
    half_len = 0.5 * length.astype(jnp.float32) / mpp
    half_wid = 0.5 * width.astype(jnp.float32) / mpp
    per_agent = (uv, px, start, fwd, half_len, half_wid, show, LABEL_AGENT + colour)

    def draw(img, agent):
        uv, px, start, fwd, half_len, half_wid, show, label = agent
        col = start[0] + off  # (P,) image columns of the window
        row = start[1] + off
        dx = (col.astype(jnp.float32) + 0.5 - uv[0])[None, :]  # view pixels, x right
        dy = (uv[1] - row.astype(jnp.float32) - 0.5)[:, None]  # y up
        lon = dx * fwd[0] + dy * fwd[1]
        lat = dy * fwd[0] - dx * fwd[1]
        inside = (jnp.abs(lon) <= half_len) & (jnp.abs(lat) <= half_wid)
        centre = (row == px[1])[:, None] & (col == px[0])[None, :]
        nose = jnp.maximum(jnp.minimum(half_len, half_wid), 1e-6)
        mark = inside & (lon >= half_len - nose) & (jnp.abs(lat) * nose
                                                     <= half_wid * (half_len - lon))
        value = jnp.where(mark, LABEL_HEADING, label)
        value = jnp.where((inside | centre) & show, value, 0)
        window = jax.lax.dynamic_slice(img, (start[1], start[0]), (size, size))
        img = jax.lax.dynamic_update_slice(img, jnp.maximum(window, value), (start[1], start[0]))
        return img, None

    return jax.lax.scan(draw, labels, per_agent)[0]


def render_frame(
    config: RenderConfig,
    roadgraph: Roadgraph,
    agents: AgentState,
    length: jax.Array,
    width: jax.Array,
    visible: jax.Array,
    colour_index: jax.Array,
    goal: jax.Array,
    goal_visible: jax.Array,
    trail_xy: jax.Array | None = None,
    trail_visible: jax.Array | None = None,
    stop_xy: jax.Array | None = None,
    stop_dir: jax.Array | None = None,
    light_state: jax.Array | None = None,
    light_valid: jax.Array | None = None,
) -> jax.Array:
    """One top-down frame (pure; jit with ``config`` static, vmap over envs, scan over time).

    Args:
      config: static view settings.
      roadgraph: ``Roadgraph`` (R points) of the scenario.
      agents: ``AgentState`` (A agents); only ``xy`` and ``yaw`` are read.
      length, width: (A,) float32, box size in metres.
      visible: (A,) bool, agents to draw; the others (removed, invalid) and their goals
        are not drawn at all.
      colour_index: (A,) int32, ``AgentColour``.
      goal: (A, 2) float32, world positions of the goals.
      goal_visible: (A,) bool, goals to draw (as discs in the agent's colour).
      trail_xy: optional (A, K, 2) float32, recent world positions, drawn as one pixel
        each in a dimmed agent colour under goals and bodies.
      trail_visible: (A, K) bool, which of them to draw (only for visible agents).
      stop_xy, stop_dir: optional (TL, 2) float32, the traffic lights' stop points and
        their lanes' unit directions (``signals.stop_directions``; zero = unknown).
      light_state: (TL,) int32 ``TrafficLightState`` and light_valid: (TL,) bool at the
        drawn log step (``signals.lights_at``); all four or none (no lights drawn).
    Returns:
      (H, W, 3) uint8 RGB image, row 0 at the top (see the module doc).
    """
    with jax.named_scope("render_frame"):
        transform = view_transform(config, roadgraph, agents.xy, agents.yaw)
        colour = jnp.clip(colour_index.astype(jnp.int32), 0, NUM_AGENT_COLOURS - 1)
        layers = (
            _road_layer(config, roadgraph, transform),
            _goal_layer(config, transform, goal, goal_visible & visible, colour),
        )
        if trail_xy is not None:
            show = trail_visible & visible[:, None]
            layers += (_trail_layer(config, transform, trail_xy, show, colour),)
        if stop_xy is not None:
            layers += (_light_layer(config, transform, stop_xy, stop_dir, light_state,
                                    light_valid),)
        idx = jnp.concatenate([i for i, _ in layers])
        label = jnp.concatenate([lab for _, lab in layers]).astype(jnp.int32)
        k = config.patch_radius
        h, w = config.height, config.width
        labels = jnp.zeros(((h + 2 * k) * (w + 2 * k),), jnp.int32)
        labels = labels.at[idx].max(label, mode="drop").reshape(h + 2 * k, w + 2 * k)
        labels = _draw_agents(config, labels, transform, agents.xy, agents.yaw, length, width,
                              visible, colour)
        return jnp.asarray(PALETTE)[labels[k : k + h, k : k + w]]


def agent_colours(state: EnvState, timestep: TimeStep) -> tuple[jax.Array, jax.Array]:
    """Which agents to draw and in which colour, from the env's state and time step.

    Collided beats off-road (controlled agents only) beats the role (controlled ego /
    co-player, expert, static).
    The step's metrics describe the state before an auto-reset or trial restart, so on
    such a step they are ignored.

    Args:
      state: ``EnvState`` (A agents), the state being drawn.
      timestep: the ``TimeStep`` returned with ``state``.
    Returns:
      visible: (A,) bool, present and not removed.
      colour_index: (A,) int32, ``AgentColour``.
    """
    kind = state.kind
    visible = state.agents.valid & ~state.removed & (kind != EntityKind.INVALID)
    controlled = kind == EntityKind.CONTROLLED
    colour = jnp.select(
        [controlled & (state.role == Role.CO_PLAYER), controlled, kind == EntityKind.EXPERT],
        [AgentColour.CO_PLAYER, AgentColour.EGO, AgentColour.EXPERT],
        AgentColour.STATIC,
    ).astype(jnp.int32)
    current = ~(timestep.info.episode_done | timestep.info.trial_done)
    # Off-road marks driving mistakes: a logged object parked beyond the road edges keeps
    # its role colour.
    colour = jnp.where(timestep.info.metrics.offroad & current & controlled, AgentColour.OFFROAD,
                       colour)
    colour = jnp.where(timestep.info.metrics.collided & current, AgentColour.COLLIDED, colour)
    return visible, colour


def render_state(
    config: RenderConfig, env_params: EnvParams, state: EnvState, timestep: TimeStep,
    trail_xy: jax.Array | None = None, trail_visible: jax.Array | None = None,
    log_step: jax.Array | None = None,
) -> jax.Array:
    """Frame of ONE environment (vmap over envs, scan over steps).

    Gathers the scenario's road graph from the pool; draws the goals of visible
    controlled agents and, given ``log_step``, the traffic lights' stop lines in their
    state at that log step.

    Args:
      config: static view settings.
      env_params: ``EnvParams`` (the pool's scenarios carry a leading N axis).
      state: unbatched ``EnvState``; timestep: its ``TimeStep``.
      trail_xy, trail_visible: optional (A, K, 2) / (A, K) recent positions to draw.
      log_step: optional () int32, the state's log index (the env's
        ``init_step + state.trial_step``); None draws no lights.
    Returns:
      (H, W, 3) uint8.
    """
    sid = state.scenario_id
    roadgraph = jax.tree.map(lambda x: x[sid], env_params.pool.scenarios.roadgraph)
    visible, colour = agent_colours(state, timestep)
    goal_visible = visible & (state.kind == EntityKind.CONTROLLED)
    lights = {}
    if log_step is not None:
        tl = jax.tree.map(lambda x: x[sid], env_params.pool.scenarios.traffic_lights)
        light_state, light_valid = signals.lights_at(tl, log_step)
        lights = dict(stop_xy=tl.stop_xy, stop_dir=env_params.pool.stop_dir[sid],
                      light_state=light_state, light_valid=light_valid)
    return render_frame(
        config, roadgraph, state.agents, state.length, state.width, visible, colour,
        state.goal, goal_visible, trail_xy, trail_visible, **lights,
    )

"""Ego-frame observations: ego state, nearest partners, road points and traffic lights,
with masks.

Features (all in the observing agent's frame: x forward, y left; normalised). The rows
are named once, in ``jaxdrive.types`` (``EgoFeature``, ``PartnerFeature``,
``RoadFeature``, ``LightFeature``); this module writes every row by name, so a row added
to an enum and not written here is an error, never a silent shift:

- ego (``EGO_FEATURES`` = 8): speed / speed_scale, length / size_scale,
  width / size_scale, goal x / goal_scale, goal y / goal_scale,
  goal distance / goal_scale, steer, accel / speed_scale. With ``goal: hidden`` the
  three goal rows (``GOAL_FEATURES``) are 0 and no other feature reads the goal, so the
  observation does not depend on it (the hidden-destination task, ``docs/adaptation.md``).
- partner (``PARTNER_FEATURES`` = 10 rows of K values): x / partner_radius,
  y / partner_radius, cos and sin of relative yaw, relative velocity x and y /
  speed_scale, length / size_scale, width / size_scale, valid (1/0), ``ObjectType``.
- road (``ROAD_FEATURES`` = 6 rows of M values): x / road_radius, y / road_radius,
  direction x and y (unit vector), valid (1/0), ``RoadType``.
- light (``LIGHT_FEATURES`` = 6 rows of K_l values): stop point x / light_radius,
  y / light_radius, direction x and y of the light's lane at the stop point (unit
  vector, ``ScenarioPool.stop_dir``; 0 for a light without a lane), valid (1/0),
  ``LightColor`` of its state (1 red, 2 yellow, 3 green, 0 unknown).

Partner, road and light arrays are feature-major (see ``jaxdrive.types.Observation``);
masked entries are zero. Road points come from the scenario's grid (``RoadIndex``): the
``num_road`` points of the chunks nearest the agent's cell centre, those within
``road_radius`` unmasked. Lights are the scenario's lights valid at the observed log
step (``signals.lights_at``), the ``num_lights`` nearest stop points within
``light_radius``, nearest first; ``num_lights = 0`` gives no light tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdrive import geometry, selection
from jaxdrive.config import ConfigBase, check_choice, check_int, check_range
from jaxdrive.scenarios import road_index, signals
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.scenarios.road_index import PointRow
from jaxdrive.types import (
    EGO_FEATURES,
    LIGHT_FEATURES,
    PARTNER_FEATURES,
    ROAD_FEATURES,
    AgentState,
    EgoFeature,
    LightFeature,
    Observation,
    PartnerFeature,
    RoadFeature,
    World,
)

__all__ = ["AUX_LATERAL_SCALE", "EGO_FEATURES", "GOAL_FEATURES", "GOAL_VISIBILITY",
           "LIGHT_FEATURES", "PARTNER_FEATURES", "ROAD_FEATURES", "ObservationConfig", "observe"]

GOAL_VISIBILITY = ("visible", "hidden")
# The ego rows computed from the goal: masked to 0 under ``goal: hidden``.
GOAL_FEATURES = (EgoFeature.GOAL_X, EgoFeature.GOAL_Y, EgoFeature.GOAL_DISTANCE)


def _in_schema_order(schema, rows: dict) -> list:
    """``rows`` (feature -> array) as a list in the schema's row order; every feature of
    the schema must be written exactly once."""
    if set(rows) != set(schema):
        missing = sorted(f.name for f in set(schema) - set(rows))
        raise ValueError(f"{schema.__name__} rows not written: {missing}")
    return [rows[f] for f in schema]


def _blocks_in_schema_order(schema, blocks) -> list:
    """``blocks`` ((features, array) pairs, each array holding its features' rows in that
    order) as a list of arrays, after checking that together they write every row of the
    schema once, in its order."""
    written = [f for features, _ in blocks for f in features]
    if written != list(schema):
        raise ValueError(f"{schema.__name__} rows written as {[f.name for f in written]}, "
                         f"not in the schema's order {[f.name for f in schema]}")
    return [array for _, array in blocks]


@dataclasses.dataclass(frozen=True)
class ObservationConfig(ConfigBase):
    """Observation sizes and normalisation.

    Attributes:
      num_partners: K, partner slots (the K nearest; capped at max_agents - 1).
      num_road: M, road-point slots (at most ``road_index.road_per_cell``).
      num_lights: K_l, traffic-light slots (the K_l nearest stop points; 0: no light
        tokens, and policies then have no light parameters).
      partner_radius, road_radius, light_radius: metres; farther entities are masked
        out.
      speed_scale, size_scale, goal_scale: normalisers (m/s, m, m).
      goal: ``visible``, or ``hidden``: the goal rows of the ego features are 0, so
        nothing the policy observes depends on the goal.
    """

    num_partners: int = 63
    num_road: int = 200
    num_lights: int = 4
    partner_radius: float = 50.0
    road_radius: float = 50.0
    light_radius: float = 50.0
    speed_scale: float = 30.0
    size_scale: float = 10.0
    goal_scale: float = 100.0
    goal: str = "visible"

    def __post_init__(self):
        check_choice("goal", self.goal, GOAL_VISIBILITY)
        check_int("num_partners", self.num_partners, 0, 4096)
        check_int("num_road", self.num_road, 1, 100_000)
        check_int("num_lights", self.num_lights, 0, 4096)
        for name in ("partner_radius", "road_radius", "light_radius", "speed_scale",
                     "size_scale", "goal_scale"):
            check_range(name, getattr(self, name), 0.0, None, lo_open=True)


def observe(
    config: ObservationConfig,
    pool: ScenarioPool,
    scenario_id: jax.Array,
    agents: AgentState,
    visible: jax.Array,
    length: jax.Array,
    width: jax.Array,
    obj_type: jax.Array,
    goal: jax.Array,
    log_step: jax.Array,
    trig=None,
    world: World | None = None,
) -> Observation:
    """Observation of every agent slot of one environment.

    Args:
      config: sizes and scales.
      pool: the scenario pool; scenario ``scenario_id`` supplies the road graph and
        traffic lights.
      scenario_id: () int32.
      agents: ``AgentState`` with A agents.
      visible: (A,) bool, agents others can see (present and not removed).
      length, width: (A,) float32; obj_type: (A,) int32; goal: (A, 2) float32.
      log_step: () int32, the log index of this state (lights show their state there).
      trig: optional ``(cos(yaw), sin(yaw))`` (A,) each, materialised (see
        ``geometry.materialize``); computed here when absent.
      world: the scene's objects when the A observers are a subset of them (packed agent
        rows): partners are then drawn from ``world`` (each observer's own object left
        out) instead of from the observers.
    Returns:
      ``Observation`` with leading axis A.
    """
    if trig is None:
        trig = geometry.cos_sin(agents.yaw)
    with jax.named_scope("observe"):
        ego = _ego_features(config, agents, length, width, goal)
        partners = _partner_features(config, agents, visible, length, width, obj_type, trig,
                                     world)
        road = _road_features(config, pool, scenario_id, agents, trig)
        lights = _light_features(config, pool, scenario_id, agents, log_step, trig)
    return Observation(ego=ego, partners=partners, road=road, lights=lights)


def goal_features(config: ObservationConfig, agents: AgentState,
                  goal: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The ego's goal rows as ``goal: visible`` writes them, whatever ``config.goal``
    says (training targets of ``train.aux_goal_coef``): (A,) float32 goal x and y in the
    agent's frame and goal distance, each / ``goal_scale``, in ``GOAL_FEATURES`` order.

    Args:
      agents: ``AgentState`` (A,); goal: (A, 2) float32 world positions.
    """
    goal_local = geometry.to_local(goal, agents.xy, agents.yaw)
    goal_dist = jnp.linalg.norm(goal - agents.xy, axis=-1)
    return (goal_local[:, 0] / config.goal_scale, goal_local[:, 1] / config.goal_scale,
            goal_dist / config.goal_scale)


# m: the lateral scale of ``nearest_vehicle_features`` (about a car's width), so that a
# car a lane to the side gives a target of order 1 rather than ``1 / goal_scale``.
AUX_LATERAL_SCALE = 2.0


def nearest_vehicle_features(config: ObservationConfig, agents: AgentState,
                             visible: jax.Array) -> jax.Array:
    """Where each agent's nearest other visible agent is, whatever ``partner_radius``
    hides (training targets of ``train.aux_target: nearest_vehicle``): (A, 3) float32
    x / ``goal_scale``, y / ``AUX_LATERAL_SCALE`` in the agent's frame and distance /
    ``goal_scale``; zeros where no other agent is visible.

    Args:
      agents: ``AgentState`` (A,); visible: (A,) bool (present and not removed).
    """
    a = agents.xy.shape[0]
    dist = jnp.linalg.norm(agents.xy[None] - agents.xy[:, None], axis=-1)  # (A, A)
    other = visible[None, :] & ~jnp.eye(a, dtype=bool)
    near = jnp.argmin(jnp.where(other, dist, jnp.inf), axis=-1)
    found = jnp.any(other, axis=-1)
    rel = geometry.to_local(agents.xy[near], agents.xy, agents.yaw)
    rows = jnp.stack([rel[:, 0] / config.goal_scale, rel[:, 1] / AUX_LATERAL_SCALE,
                      jnp.take_along_axis(dist, near[:, None], axis=1)[:, 0]
                      / config.goal_scale], axis=-1)
    return jnp.where(found[:, None], rows, 0.0).astype(jnp.float32)


def _ego_features(config, agents, length, width, goal):
    """(A, EGO_FEATURES) float32; the goal rows are 0 under ``goal: hidden``."""
    if config.goal == "hidden":
        # Constants, not the features times 0: nothing computed from the goal (not even
        # a NaN or inf of a far goal) reaches the observation.
        zero = jnp.zeros(agents.xy.shape[:1], jnp.float32)
        goal_rows = dict.fromkeys(GOAL_FEATURES, zero)
    else:
        goal_rows = dict(zip(GOAL_FEATURES, goal_features(config, agents, goal), strict=True))
    rows = {
        EgoFeature.SPEED: agents.speed / config.speed_scale,
        EgoFeature.LENGTH: length / config.size_scale,
        EgoFeature.WIDTH: width / config.size_scale,
        **goal_rows,
        EgoFeature.STEER: agents.steer,
        EgoFeature.ACCEL: agents.accel / config.speed_scale,
    }
    return jnp.stack(_in_schema_order(EgoFeature, rows), axis=-1).astype(jnp.float32)


def _partner_features(config, agents, visible, length, width, obj_type, trig, world=None):
    """(A, PARTNER_FEATURES, K) float32: partners among the observers themselves, or
    among ``world``'s N objects when given."""
    a = agents.xy.shape[0]
    cos, sin = trig
    if world is None:
        others, ids = (agents, visible, length, width, obj_type, trig), jnp.arange(a)
    else:
        others = (world.agents, world.visible, world.length, world.width, world.obj_type,
                  world.trig)
        ids = world.self_index
    o_agents, o_visible, o_length, o_width, o_type, (o_cos, o_sin) = others
    n = o_agents.xy.shape[0]
    k = min(config.num_partners, n - 1)
    if k == 0:
        return jnp.zeros((a, PARTNER_FEATURES, 0), jnp.float32)
    x, y = o_agents.xy[:, 0], o_agents.xy[:, 1]
    vx, vy = o_agents.vel[:, 0], o_agents.vel[:, 1]
    attrs = (x, y, vx, vy, o_cos, o_sin, o_length / config.size_scale,
             o_width / config.size_scale, o_type.astype(jnp.float32), o_visible)
    # Partner j of observer i is object j + (j >= ids[i]): each observer's own column
    # is dropped by a select between two shifted slices (no gather).
    later = jnp.arange(n - 1)[None, :] >= ids[:, None]  # (A, N - 1)
    if k == n - 1:
        # Every other object: rows for all (observer, object) pairs by broadcasting.
        full = _partner_rows(config, agents, visible, cos, sin,
                             *(v[None, :] for v in attrs))  # (A, F, N)
        return jnp.where(later[:, None, :], full[:, :, 1:], full[:, :, :-1])
    # The nearest K (masked partners last), then rows for those K only.
    dx, dy = x[None, :] - agents.xy[:, 0, None], y[None, :] - agents.xy[:, 1, None]
    dist2 = dx * dx + dy * dy
    ok = o_visible[None, :] & visible[:, None] & (dist2 <= config.partner_radius**2)
    key = jnp.where(ok, dist2, jnp.inf)
    key = jnp.where(later, key[:, 1:], key[:, :-1])
    pick = selection.smallest_k(key, k)  # (A, K) positions among the others
    index = pick + (pick >= ids[:, None])  # agent ids
    return _partner_rows(config, agents, visible, cos, sin, *(v[index] for v in attrs))


def _partner_rows(config, agents, visible, cos, sin, px, py, pvx, pvy, pc, ps, plength,
                  pwidth, ptype, pvisible):
    """(A, F, P) partner rows from the partners' attributes ``p*`` ((A, P) or (1, P)):
    position, velocity, cos/sin of yaw, length and width / ``size_scale``, type, visible.
    Masked partners (not visible, or beyond ``partner_radius``) are zero."""
    c, s = cos[:, None], sin[:, None]
    dx = px - agents.xy[:, 0, None]
    dy = py - agents.xy[:, 1, None]
    dvx = pvx - agents.vel[:, 0, None]
    dvy = pvy - agents.vel[:, 1, None]
    ok = pvisible & visible[:, None] & (dx * dx + dy * dy <= config.partner_radius**2)
    # Seven operands, not ten: XLA's CPU backend fuses the operands of a concatenation
    # into it only up to 8 of them; beyond that each row is its own loop and the
    # concatenation one more copy (1.1x on the env step at 64 agents, 63 partners). The
    # rotated rows keep one expression each: written as pairs over a size-2 axis, a
    # fused multiply-add landed differently in the reset's program than in the step's,
    # and trial k's first observation no longer equalled trial 0's bit for bit.
    ones = jnp.ones_like(dx)
    row = lambda r: r[:, None]  # noqa: E731  (A, P) -> a block of one row
    blocks = (
        ((PartnerFeature.X,), row((c * dx + s * dy) / config.partner_radius)),
        ((PartnerFeature.Y,), row((-s * dx + c * dy) / config.partner_radius)),
        ((PartnerFeature.COS_YAW,), row(pc * c + ps * s)),  # cos(partner yaw - ego yaw)
        ((PartnerFeature.SIN_YAW,), row(ps * c - pc * s)),  # sin(partner yaw - ego yaw)
        ((PartnerFeature.VEL_X,), row((c * dvx + s * dvy) / config.speed_scale)),
        ((PartnerFeature.VEL_Y,), row((-s * dvx + c * dvy) / config.speed_scale)),
        ((PartnerFeature.LENGTH, PartnerFeature.WIDTH, PartnerFeature.VALID,
          PartnerFeature.TYPE),
         jnp.stack([ones * plength, ones * pwidth, ones, ones * ptype], axis=1)),
    )
    return jnp.concatenate([jnp.where(ok[:, None, :], block, 0.0)
                            for block in _blocks_in_schema_order(PartnerFeature, blocks)],
                           axis=1).astype(jnp.float32)


def _road_features(config, pool, scenario_id, agents, trig):
    """(A, ROAD_FEATURES, M) float32."""
    m = min(config.num_road, pool.road_index.road_per_cell)
    block = road_index.road_block(pool.road_index, agents.xy, m, scenario_id)  # (A, 5, k, S)
    a = block.shape[0]
    cos, sin = trig
    c, s = cos[:, None, None], sin[:, None, None]
    dx = block[:, PointRow.X] - agents.xy[:, 0, None, None]
    dy = block[:, PointRow.Y] - agents.xy[:, 1, None, None]
    lx = c * dx + s * dy
    ly = -s * dx + c * dy
    dir_x, dir_y = block[:, PointRow.DIR_X], block[:, PointRow.DIR_Y]
    rtype = block[:, PointRow.TYPE]
    ok = (rtype >= 0) & (lx * lx + ly * ly <= config.road_radius**2)
    rows = {
        RoadFeature.X: lx / config.road_radius,
        RoadFeature.Y: ly / config.road_radius,
        RoadFeature.DIR_X: c * dir_x + s * dir_y,
        RoadFeature.DIR_Y: -s * dir_x + c * dir_y,
        RoadFeature.VALID: jnp.ones_like(lx),
        RoadFeature.TYPE: rtype,
    }
    # Each row goes (A, k, S) -> (A, M) before the stack: XLA then writes every row with
    # one vectorised loop over M rather than short loops over S.
    rows = [jnp.where(ok, r, 0.0).reshape(a, -1)[:, :m]
            for r in _in_schema_order(RoadFeature, rows)]
    return jnp.stack(rows, axis=1).astype(jnp.float32)


def _light_features(config, pool, scenario_id, agents, log_step, trig):
    """(A, LIGHT_FEATURES, K_l) float32; K_l = ``num_lights``, zero-padded where the
    scenario has fewer light slots."""
    a, k_l = agents.xy.shape[0], config.num_lights
    if k_l == 0:
        return jnp.zeros((a, LIGHT_FEATURES, 0), jnp.float32)
    state, valid, stop_xy = signals.scenario_lights_at(pool.scenarios.traffic_lights,
                                                       scenario_id, log_step)  # (TL,)
    colour = signals.color(state, valid).astype(jnp.float32)
    stop_dir = pool.stop_dir[scenario_id]  # (TL, 2)
    cos, sin = trig
    c, s = cos[:, None], sin[:, None]
    dx = stop_xy[None, :, 0] - agents.xy[:, 0, None]  # (A, TL)
    dy = stop_xy[None, :, 1] - agents.xy[:, 1, None]
    lx = c * dx + s * dy
    ly = -s * dx + c * dy
    d2 = lx * lx + ly * ly
    ok = valid[None, :] & (d2 <= config.light_radius**2)
    ones = jnp.ones_like(lx)
    rows = {
        LightFeature.X: lx / config.light_radius,
        LightFeature.Y: ly / config.light_radius,
        LightFeature.DIR_X: c * stop_dir[None, :, 0] + s * stop_dir[None, :, 1],
        LightFeature.DIR_Y: -s * stop_dir[None, :, 0] + c * stop_dir[None, :, 1],
        LightFeature.VALID: ones,
        LightFeature.TYPE: ones * colour[None, :],
    }
    feats = jnp.stack([jnp.where(ok, r, 0.0) for r in _in_schema_order(LightFeature, rows)],
                      axis=1).astype(jnp.float32)  # (A, F, TL)
    k = min(k_l, stop_xy.shape[0])
    # Nearest k by distance; masked lights sort last (and are zero already).
    pick = selection.smallest_k(jnp.where(ok, d2, jnp.inf), k)
    feats = jnp.take_along_axis(feats, pick[:, None, :], axis=2)
    if k < k_l:
        feats = jnp.pad(feats, ((0, 0), (0, 0), (0, k_l - k)))
    return feats

"""Ego-frame observations: ego state, nearest partners, nearest road points, with masks.

Features (all in the observing agent's frame: x forward, y left; normalised):

- ego (``EGO_FEATURES`` = 8): speed / speed_scale, length / size_scale,
  width / size_scale, goal x / goal_scale, goal y / goal_scale,
  goal distance / goal_scale, steer, accel / speed_scale.
- partner (``PARTNER_FEATURES`` = 8): x / partner_radius, y / partner_radius,
  cos and sin of relative yaw, relative velocity x and y / speed_scale,
  length / size_scale, width / size_scale. Type in ``partner_type``.
- road (``ROAD_FEATURES`` = 4): x / road_radius, y / road_radius, direction x and y
  (unit vector). Type in ``road_type``.

Masked entries are zero. Road points come from the scenario's grid (``RoadIndex``): the
``num_road`` points of the chunks nearest the agent's cell centre, those within
``road_radius`` unmasked.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdrive.config import ConfigBase, check_int, check_range
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.sim import geometry, road_index
from jaxdrive.types import AgentState, Observation

EGO_FEATURES = 8
PARTNER_FEATURES = 8
ROAD_FEATURES = 4


@dataclasses.dataclass(frozen=True)
class ObservationConfig(ConfigBase):
    """Observation sizes and normalisation.

    Attributes:
      num_partners: K, partner slots (the K nearest; capped at max_agents - 1).
      num_road: M, road-point slots (at most ``road_index.road_per_cell``).
      partner_radius, road_radius: metres; farther entities are masked out.
      speed_scale, size_scale, goal_scale: normalisers (m/s, m, m).
    """

    num_partners: int = 63
    num_road: int = 200
    partner_radius: float = 50.0
    road_radius: float = 50.0
    speed_scale: float = 30.0
    size_scale: float = 10.0
    goal_scale: float = 100.0

    def __post_init__(self):
        check_int("num_partners", self.num_partners, 0, 4096)
        check_int("num_road", self.num_road, 0, 100_000)
        for name in ("partner_radius", "road_radius", "speed_scale", "size_scale", "goal_scale"):
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
) -> Observation:
    """Observation of every agent slot of one environment.

    Args:
      config: sizes and scales.
      pool: the scenario pool; scenario ``scenario_id`` supplies the road graph.
      scenario_id: () int32.
      agents: ``AgentState`` with A agents.
      visible: (A,) bool, agents others can see (present and not removed).
      length, width: (A,) float32; obj_type: (A,) int32; goal: (A, 2) float32.
    Returns:
      ``Observation`` with leading axis A.
    """
    with jax.named_scope("observe"):
        ego = _ego_features(config, agents, length, width, goal)
        partners = _partner_features(config, agents, visible, length, width, obj_type)
        road = _road_features(config, pool, scenario_id, agents)
    return Observation(ego=ego, **partners, **road)


def _ego_features(config, agents, length, width, goal):
    goal_local = geometry.to_local(goal, agents.xy, agents.yaw)
    goal_dist = jnp.linalg.norm(goal - agents.xy, axis=-1)
    return jnp.stack(
        [
            agents.speed / config.speed_scale,
            length / config.size_scale,
            width / config.size_scale,
            goal_local[:, 0] / config.goal_scale,
            goal_local[:, 1] / config.goal_scale,
            goal_dist / config.goal_scale,
            agents.steer,
            agents.accel / config.speed_scale,
        ],
        axis=-1,
    ).astype(jnp.float32)


def _drop_diagonal(x: jax.Array) -> jax.Array:
    """(A, A, ...) -> (A, A-1, ...): row i without column i, by reshapes (no gather)."""
    a = x.shape[0]
    rest = x.shape[2:]
    flat = x.reshape((a * a,) + rest)[1:]
    return flat.reshape((a - 1, a + 1) + rest)[:, :-1].reshape((a, a - 1) + rest)


def _partner_features(config, agents, visible, length, width, obj_type):
    a = agents.xy.shape[0]
    k = min(config.num_partners, a - 1)
    if k == 0:
        z = jnp.zeros((a, 0), jnp.float32)
        return dict(
            partners=jnp.zeros((a, 0, PARTNER_FEATURES), jnp.float32),
            partner_type=z.astype(jnp.int32), partner_mask=z.astype(bool),
        )
    # All pairs by broadcasting (row = observer, column = partner), then the diagonal
    # dropped: cheaper on every backend than gathering partner rows.
    c, s = jnp.cos(agents.yaw)[:, None], jnp.sin(agents.yaw)[:, None]
    dx = agents.xy[None, :, 0] - agents.xy[:, None, 0]
    dy = agents.xy[None, :, 1] - agents.xy[:, None, 1]
    dvx = agents.vel[None, :, 0] - agents.vel[:, None, 0]
    dvy = agents.vel[None, :, 1] - agents.vel[:, None, 1]
    rel_yaw = agents.yaw[None, :] - agents.yaw[:, None]
    ok = visible[None, :] & visible[:, None] & (dx * dx + dy * dy <= config.partner_radius**2)
    ones = jnp.ones((a, 1), jnp.float32)
    feats = jnp.stack(
        [
            (c * dx + s * dy) / config.partner_radius,
            (-s * dx + c * dy) / config.partner_radius,
            jnp.cos(rel_yaw),
            jnp.sin(rel_yaw),
            (c * dvx + s * dvy) / config.speed_scale,
            (-s * dvx + c * dvy) / config.speed_scale,
            ones * (length / config.size_scale)[None, :],
            ones * (width / config.size_scale)[None, :],
        ],
        axis=-1,
    )
    ptype = jnp.broadcast_to(obj_type[None, :], (a, a))
    feats, ok, ptype = _drop_diagonal(feats), _drop_diagonal(ok), _drop_diagonal(ptype)
    if k < a - 1:
        # Nearest K by distance; masked partners sort last.
        dist2 = jnp.sum(jnp.square(feats[..., :2]), axis=-1)
        _, pick = jax.lax.top_k(jnp.where(ok, -dist2, -jnp.inf), k)
        feats = jnp.take_along_axis(feats, pick[..., None], axis=1)
        ok = jnp.take_along_axis(ok, pick, axis=1)
        ptype = jnp.take_along_axis(ptype, pick, axis=1)
    feats = jnp.where(ok[..., None], feats, 0.0).astype(jnp.float32)
    return dict(partners=feats, partner_type=jnp.where(ok, ptype, 0).astype(jnp.int32),
                partner_mask=ok)


def _road_features(config, pool, scenario_id, agents):
    m = min(config.num_road, pool.road_index.road_per_cell)
    block = road_index.road_block(pool.road_index, agents.xy, m, scenario_id)  # (A, M, 5)
    c, s = jnp.cos(agents.yaw)[:, None], jnp.sin(agents.yaw)[:, None]
    dx = block[..., 0] - agents.xy[:, None, 0]
    dy = block[..., 1] - agents.xy[:, None, 1]
    lx = c * dx + s * dy
    ly = -s * dx + c * dy
    rtype = block[..., 4]
    ok = (rtype >= 0) & (lx * lx + ly * ly <= config.road_radius**2)
    feats = jnp.stack(
        [
            lx / config.road_radius,
            ly / config.road_radius,
            c * block[..., 2] + s * block[..., 3],
            -s * block[..., 2] + c * block[..., 3],
        ],
        axis=-1,
    )
    feats = jnp.where(ok[..., None], feats, 0.0).astype(jnp.float32)
    return dict(
        road=feats, road_type=jnp.where(ok, rtype, 0).astype(jnp.int32), road_mask=ok
    )

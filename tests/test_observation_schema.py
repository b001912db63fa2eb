"""The observation schema: rows written by ``observe`` are the ones the enums name."""

import dataclasses
import enum

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scenes import CAR, SMALL_SCENARIO, straight_road

from jaxdrive.env import observation as observation_module
from jaxdrive.env.observation import ObservationConfig, observe
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.road_index import RoadIndexConfig
from jaxdrive.types import (
    EGO_FEATURES,
    PARTNER_FEATURES,
    ROAD_FEATURES,
    AgentState,
    EgoFeature,
    ObjectType,
    PartnerFeature,
    RoadFeature,
    RoadType,
)

A = SMALL_SCENARIO.max_agents
CFG = ObservationConfig(num_partners=2, num_road=128, partner_radius=50.0, road_radius=20.0,
                        speed_scale=30.0, size_scale=10.0, goal_scale=100.0)
INDEX = RoadIndexConfig(grid_size=8, road_per_cell=128, chunk_size=8)
# Agent 0 drives +x in the y = -2 lane at 10 m/s; agent 1 is 12 m ahead at 5 m/s; agent 2
# drives -x in the y = +2 lane at 8 m/s, 30 m behind agent 0. Slot 3 is empty.
AGENTS = [(0.0, -2.0, 0.0, 10.0, *CAR), (12.0, -2.0, 0.0, 5.0, *CAR),
          (-30.0, 2.0, np.pi, 8.0, *CAR)]
GOALS = [(30.0, -2.0), (60.0, -2.0), (-60.0, 2.0), (0.0, 0.0)]
STEER = [0.1, 0.0, 0.0, 0.0]
ACCEL = [1.5, 0.0, 0.0, 0.0]


def _observe_case(config):
    scene = straight_road(SMALL_SCENARIO, AGENTS, goals=GOALS)
    pool = make_pool(jax.tree.map(lambda x: jnp.asarray(x)[None], scene), INDEX)
    obj = scene.objects
    agents = AgentState(
        xy=jnp.asarray(obj.xy[:, 0]), yaw=jnp.asarray(obj.yaw[:, 0]),
        vel=jnp.asarray(obj.vel[:, 0]), steer=jnp.asarray(STEER, jnp.float32),
        accel=jnp.asarray(ACCEL, jnp.float32), valid=jnp.asarray(obj.valid[:, 0]))
    obs = jax.jit(observe, static_argnums=0)(
        config, pool, jnp.int32(0), agents, agents.valid, jnp.asarray(obj.length),
        jnp.asarray(obj.width), jnp.asarray(obj.type), jnp.asarray(obj.goal), jnp.int32(0))
    return scene, agents, jax.device_get(obs)


@pytest.fixture(scope="module")
def case():
    return _observe_case(CFG)


@pytest.fixture(scope="module")
def every_partner_case():
    """K = A - 1: every other slot is a partner, in slot order (the path with no
    nearest-K selection)."""
    return _observe_case(dataclasses.replace(CFG, num_partners=A - 1))


def test_enum_sizes_are_the_written_sizes(case):
    _, _, obs = case
    assert EGO_FEATURES == len(EgoFeature) == obs.ego.shape[-1] == 8
    assert PARTNER_FEATURES == len(PartnerFeature) == obs.partners.shape[-2] == 10
    assert ROAD_FEATURES == len(RoadFeature) == obs.road.shape[-2] == 6
    # The names the observation module always exported still import from it.
    assert observation_module.EGO_FEATURES is EGO_FEATURES
    assert observation_module.PARTNER_FEATURES is PARTNER_FEATURES
    assert observation_module.ROAD_FEATURES is ROAD_FEATURES


def test_ego_rows_by_name(case):
    _, _, obs = case
    ego = obs.ego[0]
    # 10 m/s / 30; 4 x 2 m / 10; goal 30 m straight ahead / 100; steer and accel as set
    # (accel / speed_scale).
    want = {EgoFeature.SPEED: 10 / 30, EgoFeature.LENGTH: 0.4, EgoFeature.WIDTH: 0.2,
            EgoFeature.GOAL_X: 0.3, EgoFeature.GOAL_Y: 0.0, EgoFeature.GOAL_DISTANCE: 0.3,
            EgoFeature.STEER: 0.1, EgoFeature.ACCEL: 1.5 / 30}
    assert set(want) == set(EgoFeature)
    for feature, value in want.items():
        np.testing.assert_allclose(ego[feature], value, atol=1e-6, err_msg=feature.name)
    # Agent 2 heads -x: its goal 30 m behind it in world x is 30 m ahead in its frame.
    np.testing.assert_allclose(obs.ego[2, EgoFeature.GOAL_X], 0.3, atol=1e-6)
    np.testing.assert_allclose(obs.ego[2, EgoFeature.GOAL_Y], 0.0, atol=1e-6)


def test_partner_rows_by_name(case):
    _, _, obs = case
    p = obs.partners[0]  # (F, K): agent 0's two nearest, agent 1 then agent 2
    # Agent 1: 12 m ahead, same heading, closing at 5 - 10 = -5 m/s.
    # Agent 2: 30 m behind and 4 m to the left, opposite heading, (-8 - 10) m/s in x.
    want = {
        PartnerFeature.X: [12 / 50, -30 / 50], PartnerFeature.Y: [0.0, 4 / 50],
        PartnerFeature.COS_YAW: [1.0, -1.0], PartnerFeature.SIN_YAW: [0.0, 0.0],
        PartnerFeature.VEL_X: [-5 / 30, -18 / 30], PartnerFeature.VEL_Y: [0.0, 0.0],
        PartnerFeature.LENGTH: [0.4, 0.4], PartnerFeature.WIDTH: [0.2, 0.2],
        PartnerFeature.VALID: [1.0, 1.0],
        PartnerFeature.TYPE: [ObjectType.VEHICLE, ObjectType.VEHICLE],
    }
    assert set(want) == set(PartnerFeature)
    for feature, value in want.items():
        np.testing.assert_allclose(p[feature], value, atol=1e-5, err_msg=feature.name)
    np.testing.assert_array_equal(obs.partner_mask[0], [True, True])
    np.testing.assert_array_equal(obs.partner_type[0], [ObjectType.VEHICLE] * 2)
    # The empty slot 3 sees nobody, and its rows are all zero.
    assert not obs.partner_mask[3].any() and np.all(obs.partners[3] == 0)


def test_partner_rows_by_name_with_every_other_agent(every_partner_case, case):
    _, _, obs = every_partner_case
    # Observer 2 sees slots 0, 1, 3 in that order. Agent 0 is 30 m behind in its frame
    # (it drives -x) and 4 m to its left, heading opposite, closing at 8 + 10 = 18 m/s
    # along its forward axis; agent 1 is 42 m behind, closing at 13 m/s; slot 3 is empty.
    p = obs.partners[2]  # (F, 3)
    want = {
        PartnerFeature.X: [-30 / 50, -42 / 50, 0.0], PartnerFeature.Y: [4 / 50, 4 / 50, 0.0],
        PartnerFeature.COS_YAW: [-1.0, -1.0, 0.0], PartnerFeature.SIN_YAW: [0.0, 0.0, 0.0],
        PartnerFeature.VEL_X: [-18 / 30, -13 / 30, 0.0],
        PartnerFeature.VEL_Y: [0.0, 0.0, 0.0],
        PartnerFeature.LENGTH: [0.4, 0.4, 0.0], PartnerFeature.WIDTH: [0.2, 0.2, 0.0],
        PartnerFeature.VALID: [1.0, 1.0, 0.0],
        PartnerFeature.TYPE: [ObjectType.VEHICLE, ObjectType.VEHICLE, 0.0],
    }
    for feature, value in want.items():
        np.testing.assert_allclose(p[feature], value, atol=1e-5, err_msg=feature.name)
    # Observer 0's two nearest (the K = 2 case) are its first two of the three.
    _, _, nearest = case
    np.testing.assert_array_equal(obs.partners[0][:, :2], nearest.partners[0])
    assert np.all(obs.partners[3] == 0)


@pytest.mark.parametrize("agent", [0, 2])
def test_road_rows_by_name(case, agent):
    scene, agents, obs = case
    r = obs.road[agent]  # (F, M)
    valid = r[RoadFeature.VALID] > 0.5
    np.testing.assert_array_equal(valid, obs.road_mask[agent])
    assert valid.sum() > 10
    xy0 = np.asarray(agents.xy[agent])
    yaw = float(agents.yaw[agent])
    c, s = np.cos(yaw), np.sin(yaw)
    lx = r[RoadFeature.X, valid] * CFG.road_radius
    ly = r[RoadFeature.Y, valid] * CFG.road_radius
    world = xy0 + np.stack([c * lx - s * ly, s * lx + c * ly], axis=-1)
    # Each observed point is a road-graph point; its rows hold that point's type and
    # direction rotated into the agent's frame.
    rg = scene.roadgraph
    d = np.linalg.norm(world[:, None] - np.asarray(rg.xy)[None], axis=-1)
    d = np.where(np.asarray(rg.valid)[None], d, np.inf)
    match = np.argmin(d, axis=1)
    np.testing.assert_allclose(d[np.arange(len(match)), match], 0.0, atol=1e-3)
    np.testing.assert_array_equal(r[RoadFeature.TYPE, valid], np.asarray(rg.type)[match])
    np.testing.assert_array_equal(obs.road_type[agent][valid], np.asarray(rg.type)[match])
    wd = np.asarray(rg.dir)[match]
    np.testing.assert_allclose(r[RoadFeature.DIR_X, valid], c * wd[:, 0] + s * wd[:, 1],
                               atol=1e-6)
    np.testing.assert_allclose(r[RoadFeature.DIR_Y, valid], -s * wd[:, 0] + c * wd[:, 1],
                               atol=1e-6)
    # The agent's own lane centre (lateral 0) runs forward in its frame, the other lane
    # (4 m to the left) backwards.
    lane = r[RoadFeature.TYPE, valid] == RoadType.LANE_CENTER
    own = lane & (np.abs(ly) < 1e-3)
    other = lane & (np.abs(ly - 4.0) < 1e-3)
    assert own.any() and other.any()
    np.testing.assert_allclose(r[RoadFeature.DIR_X, valid][own], 1.0, atol=1e-6)
    np.testing.assert_allclose(r[RoadFeature.DIR_X, valid][other], -1.0, atol=1e-6)
    assert np.all(r[:, ~valid] == 0)


def test_writer_refuses_a_schema_row_it_does_not_write():
    class Grown(enum.IntEnum):
        X = 0
        Y = 1
        NEW = 2

    with pytest.raises(ValueError, match="NEW"):
        observation_module._in_schema_order(Grown, {Grown.X: 0.0, Grown.Y: 1.0})
    assert observation_module._in_schema_order(
        Grown, {Grown.NEW: 2, Grown.Y: 1, Grown.X: 0}) == [0, 1, 2]
    # Rows written in blocks: all of them, once, in the schema's order.
    for bad in ([((Grown.X, Grown.Y), "xy")], [((Grown.Y, Grown.X), "yx"), ((Grown.NEW,), "n")],
                [((Grown.X, Grown.Y), "xy"), ((Grown.NEW, Grown.NEW), "nn")]):
        with pytest.raises(ValueError, match="schema's order"):
            observation_module._blocks_in_schema_order(Grown, bad)
    assert observation_module._blocks_in_schema_order(
        Grown, [((Grown.X,), "x"), ((Grown.Y, Grown.NEW), "yn")]) == ["x", "yn"]

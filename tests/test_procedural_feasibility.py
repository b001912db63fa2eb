"""Procedural scenes are feasible (issue 20): over 512 scenes of the default
distribution (7,101 vehicles; 1,024 until the CI budget of issue 35, the same properties
on half the sample) no two logged boxes ever overlap, and replaying the logs through each
dynamics model (inverse dynamics, the ``log_replay`` controller) stays on the road in
>= 99.5 % of agent-episodes and never collides."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.agents.controllers import log_replay
from jaxdrive.agents.rollout import first_episode_events
from jaxdrive.env import Env, EnvConfig
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch
from jaxdrive.scenarios.road_index import RoadIndexConfig
from jaxdrive.sim.dynamics import BicycleModel

NUM = 512
MAX_AGENTS = 24  # the default num_agents[1]
SCENARIO = ScenarioConfig(max_agents=MAX_AGENTS)
KEY = jax.random.key(20)
# A coarser road grid than the default builds 3.5x faster; edges_per_cell is raised so
# that nearly every cell still lists all its candidate edges (off-road stays exact).
ROAD_INDEX = {"grid_size": 16, "road_per_cell": 10, "edges_per_cell": 48}


@pytest.fixture(scope="module")
def scenes():
    """The same 512 keys with conflicting vehicles dropped (the default) and kept, and
    the scene pool of the dropped ones."""
    cfg = ProceduralConfig()
    drop = generate_batch(KEY, NUM, cfg, SCENARIO)
    keep = generate_batch(KEY, NUM, cfg.replace(log_conflicts="keep"), SCENARIO)
    pool = make_pool(drop, RoadIndexConfig(**ROAD_INDEX))
    return cfg, pool, jax.device_get(drop.objects), jax.device_get(keep.objects)


def _corners(xy, yaw, length, width):
    """(..., 2), (...,) x3 float64 -> (..., 4, 2) box corners, counter-clockwise."""
    c, s = np.cos(yaw), np.sin(yaw)
    u = np.stack([c, s], -1) * (length / 2)[..., None]
    v = np.stack([-s, c], -1) * (width / 2)[..., None]
    return np.stack([xy + u + v, xy - u + v, xy - u - v, xy + u - v], -2)


def _quads_overlap(ca, cb):
    """Separating-axis test of convex quads (..., 4, 2); touching counts as overlap."""
    hit = np.ones(ca.shape[:-2], bool)
    for quad in (ca, cb):
        for e in range(2):
            edge = quad[..., e + 1, :] - quad[..., e, :]
            axis = np.stack([-edge[..., 1], edge[..., 0]], -1)[..., None, :]
            pa, pb = np.sum(ca * axis, -1), np.sum(cb * axis, -1)
            hit &= (pa.max(-1) >= pb.min(-1)) & (pb.max(-1) >= pa.min(-1))
    return hit


def _overlapping_pairs(ob) -> np.ndarray:
    """(n, 4) (scene, step, a, b) of every pair of valid logged boxes that overlap, in
    float64; pairs whose centres are farther apart than their half diagonals are skipped
    (they cannot touch)."""
    xy, yaw = ob.xy.astype(np.float64), ob.yaw.astype(np.float64)
    length, width = ob.length.astype(np.float64), ob.width.astype(np.float64)
    reach = 0.5 * np.hypot(length, width)  # (B, A)
    a, b = np.triu_indices(xy.shape[1], 1)
    found = []
    for t in range(xy.shape[2]):
        valid = ob.valid[:, a, t] & ob.valid[:, b, t]
        dist = np.linalg.norm(xy[:, a, t] - xy[:, b, t], axis=-1)
        s, p = np.nonzero(valid & (dist <= reach[:, a] + reach[:, b]))
        if len(s) == 0:
            continue
        i, j = a[p], b[p]
        ci = _corners(xy[s, i, t], yaw[s, i, t], length[s, i], width[s, i])
        cj = _corners(xy[s, j, t], yaw[s, j, t], length[s, j], width[s, j])
        hit = _quads_overlap(ci, cj)
        found += [(s_, t, i_, j_) for s_, i_, j_ in zip(s[hit], i[hit], j[hit], strict=True)]
    return np.array(found, np.int64).reshape(-1, 4)


def test_logged_boxes_never_overlap(scenes):
    _, _, drop, keep = scenes
    bad = _overlapping_pairs(drop)
    assert len(bad) == 0, f"overlapping logged boxes (scene, step, a, b): {bad[:10].tolist()}"
    # Not vacuous: with the conflicting vehicles kept, logs do collide in the junctions.
    assert len(_overlapping_pairs(keep)) > 100


def test_dropping_keeps_the_other_vehicles_and_their_logs(scenes):
    cfg, _, drop, keep = scenes
    n_drop, n_keep = drop.valid[:, :, 0].sum(1), keep.valid[:, :, 0].sum(1)
    assert (n_keep >= cfg.num_agents[0]).all() and (n_keep <= cfg.num_agents[1]).all()
    assert (n_drop <= n_keep).all() and (n_drop >= 1).all()
    # A few percent go, not most (measured: about 2 %).
    assert 0 < 1 - n_drop.sum() / n_keep.sum() < 0.05, (n_drop.sum(), n_keep.sum())
    for i in range(NUM):
        kept = drop.valid[i, :, 0]
        assert (kept == (np.arange(MAX_AGENTS) < n_drop[i])).all(), "kept vehicles come first"
        # Each kept vehicle is one of the kept-all vehicles, with its whole log, in order.
        same = np.all(drop.xy[i, :n_drop[i], None] == keep.xy[i, None, :n_keep[i]], axis=(-1, -2))
        match = np.argmax(same, axis=1)
        assert same.any(axis=1).all() and (np.diff(match) > 0).all(), i
        for name in ("yaw", "vel", "length", "width", "goal"):
            np.testing.assert_array_equal(getattr(drop, name)[i, :n_drop[i]],
                                          getattr(keep, name)[i, match], err_msg=name)
        assert match[0] == 0 and drop.is_sdc[i, 0], "the SDC is always kept, in slot 0"


def test_default_corners_are_turnable_by_the_default_bicycle():
    """The inner lane's centre at the tightest corner turns no tighter than the default
    bicycle can turn the longest vehicle (hand check: 7 + 3.2 / 2 = 8.6 >= 8.50 m)."""
    cfg = ProceduralConfig()
    radius = BicycleModel().min_turn_radius(cfg.length[1])
    assert radius == pytest.approx(2.75 / np.sin(np.arctan(0.5 * np.tan(0.6))))
    assert cfg.corner_radius[0] + cfg.lane_width[0] / 2 >= radius


def _replay_outcomes(pool, model: str):
    """One episode per scene, every vehicle driven by ``log_replay``: (NUM, A) bool each
    of controlled, collided, off-road, reached its goal; and whether the log itself
    reaches the goal within the episode."""
    env = Env(EnvConfig.from_dict({
        "scenario": {"max_agents": MAX_AGENTS}, "control_mode": "all",
        "collision_behavior": "ignore", "goal_behavior": "stop",
        "dynamics": {"model": model},
        "observation": {"num_partners": 1, "num_road": 4, "num_lights": 1},
        "road_index": ROAD_INDEX,
    }))
    params = env.make_params(pool)
    events = jax.jit(first_episode_events(env, log_replay(env)))
    out = jax.device_get(events(params, jnp.arange(NUM, dtype=jnp.int32)))
    ob = pool.scenarios.objects
    t0 = env.config.init_step
    dist = jnp.linalg.norm(ob.xy[:, :, t0 + 1:] - ob.goal[:, :, None], axis=-1)
    log_goal = np.asarray(jnp.any(dist <= env.config.goal_radius, axis=-1))
    return (*(np.asarray(out[k]) for k in ("controlled", "collided", "offroad",
                                            "goal_reached")), log_goal)


@pytest.mark.parametrize("model", ["bicycle", "delta_local"])
def test_replay_through_each_model_stays_on_road_and_never_collides(scenes, model):
    _, pool, _, _ = scenes
    controlled, collided, offroad, goal, log_goal = _replay_outcomes(pool, model)
    n = controlled.sum()
    assert n > 5_000, n
    assert not collided[controlled].any(), np.argwhere(collided & controlled)[:10]
    assert offroad[controlled].mean() <= 0.005, offroad[controlled].mean()
    # The replay reaches the goals the log reaches.
    want = controlled & log_goal
    assert goal[want].mean() >= 0.99, goal[want].mean()

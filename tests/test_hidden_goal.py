"""The hidden-destination task (docs/adaptation.md): ``observation.goal: hidden`` and the
procedural ``goal_exit: uniform``, with the env of the ``adaptive_hidden_goal`` preset on
T-junctions and intersections (1-2 lanes, half signalised, 1-2 cars). One batch of 512
scenes, each under two exit keys (one compile), feeds every test.

- Two scenes that differ only in the goal exit (same scene key, two exit keys) share
  every array but ``objects.goal``, and with the goal hidden every observation array of a
  short rollout is bit-identical (with it visible the ego features differ).
- Driving through the wrong exit past the goal's distance pays no goal reward and
  leaves the agent in the trial; the same drive through the right exit pays the goal
  reward, removes the agent and so ends the trial.
- Over many scenes the exit draw covers every exit about equally (T-junctions and
  intersections), another exit key changes no array but the goals, and each goal lies
  on the drawn exit lane at a distance in range.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.agents.controllers import lane_follow, straight_on
from jaxdrive.env import Env
from jaxdrive.env.observation import observe
from jaxdrive.env.rewards import RewardConfig
from jaxdrive.runs.config import load_run_config
from jaxdrive.scenarios import procedural
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_with_info
from jaxdrive.scenarios.procedural import config as procedural_config
from jaxdrive.types import EgoFeature, RoadType

ROLLOUT = 6  # steps compared; the ego starts >= 5 m before the junction, so no goal yet
N = 512
CFG = ProceduralConfig(
    topology=procedural.TopologyWeights(straight=0.0, curve=0.0, t_junction=1.0,
                                        intersection=1.0),
    lanes_per_direction=(1, 2), arm_length=30.0, point_spacing=2.0, goal_distance=(5.0, 10.0),
    num_agents=(1, 2), signals=0.5, goal_exit="uniform",
    corner_radius=(4.0, 8.0))  # the default before issue 20: SCFG's road points fit it
SCFG = ScenarioConfig(max_agents=2, num_steps=71, max_road_points=1308, max_lanes=40,
                      max_lane_successors=3, max_traffic_lights=8)
NM = CFG.lanes_per_direction[1]


def _lane_mouth(rg, lane_id):
    """First point and unit direction of lane polyline ``lane_id`` (its junction end for
    an outgoing lane): (2,), (2,) float64."""
    idx = np.flatnonzero(rg.valid & (rg.id == lane_id) & (rg.type == RoadType.LANE_CENTER))
    p0, p1 = rg.xy[idx[0]].astype(np.float64), rg.xy[idx[1]].astype(np.float64)
    return p0, (p1 - p0) / np.linalg.norm(p1 - p0)


@pytest.fixture(scope="module")
def gen():
    fn = jax.jit(jax.vmap(lambda k, e: generate_with_info(k, CFG, SCFG, exit_key=e)))
    keys = jax.random.split(jax.random.PRNGKey(7), N)
    fold = jax.vmap(lambda k: jax.random.fold_in(k, procedural_config._EXIT_SALT))
    sc, info = jax.device_get(fn(keys, fold(keys)))  # the default exit keys
    sc2, info2 = jax.device_get(fn(keys, jax.random.split(jax.random.PRNGKey(8), N)))
    return sc, info, sc2, info2


@pytest.fixture(scope="module")
def task(gen):
    sc, info, sc2, info2 = gen
    # Scenes 0, 1: one signalised two-car scene under two exit keys that give the ego
    # different exits; scene 2: a one-car scene (the ego alone ends its trial).
    two = (info.agent_exit[:, 0] != info2.agent_exit[:, 0]) & info.signalised & (
        info.agent_lane[:, 1] >= 0)
    i, j = int(np.flatnonzero(two)[0]), int(np.flatnonzero(info.agent_lane[:, 1] < 0)[0])
    pick = lambda tree, i: jax.tree.map(lambda x: x[i], tree)
    scenes = jax.tree.map(lambda *x: jnp.asarray(np.stack(x)),  # stacked on the host
                          pick(sc, i), pick(sc2, i), pick(sc, j))
    run = load_run_config("adaptive_hidden_goal")
    assert run.procedural.goal_exit == "uniform" and run.env.observation.goal == "hidden"
    # Partner and light tokens too, so that they are checked for leaks.
    obs_cfg = run.env.observation.replace(num_partners=1, num_lights=4)
    env_cfg = run.env.replace(scenario=SCFG, observation=obs_cfg)
    pool = make_pool(scenes, env_cfg.road_index)
    return dict(pool=pool, hidden=Env(env_cfg), visible_obs=obs_cfg.replace(goal="visible"),
                exits=(int(info.agent_exit[i, 0]), int(info2.agent_exit[i, 0])),
                solo=dict(exit=int(info.agent_exit[j, 0]), lane=int(info.agent_lane[j, 0]),
                          arms=int(info.num_arms[j])))


@pytest.fixture(scope="module")
def drive(task):
    """``drive(params, sid, move)``: the env's first ``TimeStep`` of scene ``sid`` and
    the ``TimeStep``s and trial indices of ``ROLLOUT`` constant-velocity steps from it;
    ``move = (xy, d)`` first puts the ego at ``xy`` at 5 m/s along unit ``d`` (one
    compile for every call: ``move`` is always given, ``None`` picks a no-op)."""
    env = task["hidden"]
    act = straight_on(env)

    @jax.jit
    def run(params, sid, xy, d, teleport):
        start, first = env.reset_to(params, sid, jax.random.PRNGKey(0))
        agents = start.agents
        moved = agents.replace(
            xy=agents.xy.at[0].set(xy), yaw=agents.yaw.at[0].set(jnp.arctan2(d[1], d[0])),
            vel=agents.vel.at[0].set(5.0 * d))
        agents = jax.tree.map(lambda m, a: jnp.where(teleport, m, a), moved, agents)
        state = start.replace(agents=agents, goal_distance=jnp.linalg.norm(
            start.goal - agents.xy, axis=-1).astype(jnp.float32))

        def body(state, _):
            state, ts = env.step(params, state, act(params, state, None, None))
            return state, (ts, state.trial)

        return start, first, jax.lax.scan(body, state, None, ROLLOUT)[1]

    def call(params, sid, move=None):
        xy, d = move if move is not None else (np.zeros(2), np.ones(2))
        return jax.device_get(run(params, jnp.int32(sid), jnp.asarray(xy, jnp.float32),
                                  jnp.asarray(d, jnp.float32), jnp.asarray(move is not None)))

    return call


def test_hidden_goal_observations_are_bit_identical_across_goal_exits(task, drive):
    env, pool = task["hidden"], task["pool"]
    assert task["exits"][0] != task["exits"][1]
    params = env.make_params(pool)
    (start_a, first_a, (ts_a, _)), (_, first_b, (ts_b, _)) = (drive(params, s) for s in (0, 1))
    assert first_a.obs.partner_mask[0].any() and first_a.obs.light_mask[0].any()
    for x, y in ((first_a.obs, first_b.obs), (ts_a.obs, ts_b.obs)):
        for name in ("ego", "partners", "road", "lights"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name
    goal_rows = [EgoFeature.GOAL_X, EgoFeature.GOAL_Y, EgoFeature.GOAL_DISTANCE]
    assert not np.any(ts_a.obs.ego[..., goal_rows])
    # With the goal visible the same start observations differ, in the goal rows only.
    look = jax.jit(lambda sid, goal: observe(
        task["visible_obs"], pool, sid, start_a.agents, start_a.agents.valid,
        start_a.length, start_a.width, start_a.obj_type, goal, jnp.int32(0)))
    seen = [jax.device_get(look(jnp.int32(s), pool.scenarios.objects.goal[s]))
            for s in (0, 1)]
    assert not np.array_equal(seen[0].ego[0, goal_rows], seen[1].ego[0, goal_rows])
    others = [r for r in range(seen[0].ego.shape[-1]) if r not in goal_rows]
    assert np.array_equal(seen[0].ego[:, others], seen[1].ego[:, others])
    np.testing.assert_allclose(seen[0].ego[:, others], first_a.obs.ego[:, others], atol=1e-6)


def test_only_the_right_exit_pays_the_goal_reward(task, drive):
    env, pool, solo = task["hidden"], task["pool"], task["solo"]
    sid = 2
    # Goal reward only (every other weight 0): the reward is then exactly 1 on the goal
    # step and 0 elsewhere.
    weights = RewardConfig(goal=1.0, collision=0.0, offroad=0.0, progress=0.0).weights()
    params = env.make_params(pool).replace(reward=weights)
    rg = jax.tree.map(lambda x: np.asarray(x[sid]), pool.scenarios.roadgraph)
    goal = np.asarray(pool.scenarios.objects.goal[sid, 0], np.float64)
    k, arm_in = solo["lane"] % NM, solo["lane"] // (2 * NM)
    wrong = next(b for b in range(solo["arms"]) if b not in (solo["exit"], arm_in))
    mouth, _ = _lane_mouth(rg, 2 * solo["exit"] * NM + k)
    dist = float(np.linalg.norm(goal - mouth))
    for right in (True, False):
        # 3 m before the goal's distance on the exit lane; six 0.5 m steps pass it.
        p0, d = _lane_mouth(rg, 2 * (solo["exit"] if right else wrong) * NM + k)
        _, _, (ts, trial) = drive(params, sid, (p0 + (dist - 3.0) * d, d))
        reward, removed, trial_ended = ts.reward[:, 0], ts.removed[:, 0], ts.info.trial_ended[:, 0]
        reached = ts.info.metrics.goal_reached[:, 0]
        if right:
            step = int(np.argmax(reward))
            assert reward[step] == 1.0 and reward.sum() == 1.0
            assert reached[step] and trial_ended[step]
            # Removed, hence (the only controlled agent) the trial ended at once and the
            # next one started afresh.
            assert trial[step] == 1 and not removed[step]
        else:
            assert not reward.any() and not reached.any()
            assert not trial_ended.any() and not removed.any() and not trial.any()


def test_the_exit_draw_covers_every_exit_and_keeps_the_scene(gen):
    sc, info, sc2, info2 = gen
    # Another exit key moves goals only: start poses, logs, lights and map are unchanged.
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(sc), jax.tree.leaves(sc2),
                            strict=True):
        if jax.tree_util.keystr(path) != ".objects.goal":
            assert np.array_equal(x, y), jax.tree_util.keystr(path)
    lane = info.agent_lane[:, 0]
    assert np.all((lane // NM) % 2 == 1)  # the SDC always starts on an incoming lane
    n_arms = info.num_arms
    # Exits counted counter-clockwise from the ego's arm: 0 .. n_arms - 2.
    j = (info.agent_exit[:, 0] - lane // (2 * NM) - 1) % n_arms
    for arms in (3, 4):
        sel = n_arms == arms
        shares = np.bincount(j[sel], minlength=arms - 1) / sel.sum()
        assert sel.sum() > 200 and len(shares) == arms - 1
        # Binomial sd <= 0.035 at 200+ scenes: +-0.11 is over 3 sd.
        np.testing.assert_allclose(shares, 1.0 / (arms - 1), atol=0.11)
    # The two exit keys draw independently: they agree about as often as chance (~0.42).
    agree = np.mean(info.agent_exit[:, 0] == info2.agent_exit[:, 0])
    assert 0.3 < agree < 0.55
    # Every incoming vehicle's goal lies on the outgoing lane k of its exit arm, at a
    # distance past the junction mouth within exit_goal_distance.
    lo, hi = CFG.exit_goal_distance
    for i in range(40):
        rg = jax.tree.map(lambda x, i=i: x[i], sc.roadgraph)
        for a in np.flatnonzero(info.agent_lane[i] >= 0):
            lane_a = info.agent_lane[i, a]
            if (lane_a // NM) % 2 == 0:
                continue
            mouth, d = _lane_mouth(rg, 2 * info.agent_exit[i, a] * NM + lane_a % NM)
            off = sc.objects.goal[i, a].astype(np.float64) - mouth
            along, across = off @ d, off[0] * d[1] - off[1] * d[0]
            assert lo - 1e-3 <= along <= hi + 1e-3 and abs(across) < 1e-3


def test_lane_follow_drives_without_partner_slots(task):
    """The preset observes no partners (``num_partners: 0``); ``lane_follow`` then acts
    as with one empty partner slot (no leader either way) instead of failing."""
    env1 = Env(task["hidden"].config.replace(observation=task["visible_obs"]))
    env0 = Env(env1.config.replace(observation=task["visible_obs"].replace(num_partners=0)))
    actions = []
    for env in (env0, env1):
        params = env.make_params(task["pool"])

        @jax.jit  # one compile per env, not one per eager operation
        def act(params, env=env):
            state, ts = env.reset_to(params, jnp.int32(2), jax.random.PRNGKey(0))  # one car
            return lane_follow(env)(params, state, ts, None)

        actions.append(np.asarray(act(params)))
    assert np.array_equal(actions[0], actions[1])

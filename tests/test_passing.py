"""The narrow-passing family (``procedural.partner_convention``, docs/adaptation.md): the
ego and one oncoming partner that keeps to its right or its left, seen only within
``observation.partner_radius`` (the ``adaptive_passing`` preset).

- The side draw (``either``) covers both sides about equally; another side key changes
  nothing but the partner's lateral position (and its side in the info).
- The statistic that defines each member: the partner keeps to the side its convention
  says, at a constant offset in ``partner_offset``, at a constant speed (it never
  yields), against the ego's heading.
- One rollout (one compile): a scripted ego keeping right passes a partner that keeps
  right and meets one that keeps left head-on; its observations of the two scenes are
  bit-identical until the partner comes within ``partner_radius``; an ego driving off
  the road ends its trial there (``offroad_behavior: collision``), counted as off-road
  and not as a collision. The partner is not a controlled row: it drives its log.
- The oracle preset's env differs from the ego's in one key, and at the first step its
  observation differs from the ego's in the partner tokens only.
- ``nearest_vehicle_features`` (the auxiliary target) against hand-computed numbers.
- The adaptation evaluator per partner member (slow tier): its trial scores and deltas
  equal the host's means over the episode records.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from policy_inputs import random_obs

from jaxdrive.agents.controllers import keep_line
from jaxdrive.config import ConfigError
from jaxdrive.env import Env
from jaxdrive.env.observation import AUX_LATERAL_SCALE, nearest_vehicle_features
from jaxdrive.eval.api import run
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.runs.config import flat_items, load_run_config
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_with_info
from jaxdrive.scenarios.procedural.passing import _SIDE_SALT
from jaxdrive.types import AgentState

N = 64
RUN = load_run_config("adaptive_passing")
CFG, SCFG = RUN.procedural, RUN.env.scenario
ONE_TRIAL = load_run_config("adaptive_passing", {"env.num_trials": 1}).env


@pytest.fixture(scope="module")
def gen():
    fn = jax.jit(jax.vmap(lambda k, s: generate_with_info(k, CFG, SCFG, side_key=s)))
    keys = jax.random.split(jax.random.PRNGKey(3), N)
    default = jax.vmap(lambda k: jax.random.fold_in(k, _SIDE_SALT))(keys)
    other = jax.random.split(jax.random.PRNGKey(4), N)
    return jax.device_get(fn(keys, default)), jax.device_get(fn(keys, other))


def _lateral(xy, origin, yaw):
    """Signed distance (m) of points ``xy`` (..., 2) left of the axis through ``origin``
    with heading ``yaw``."""
    return (-(xy[..., 0] - origin[0]) * np.sin(yaw) + (xy[..., 1] - origin[1]) * np.cos(yaw))


def test_side_draw_is_even_and_changes_only_the_partner(gen):
    (sc, info), (sc2, info2) = gen
    assert set(np.unique(info.partner_side)) == {-1, 1}
    assert 20 <= int(np.sum(info.partner_side == 1)) <= 44  # 64 fair coins, +-3 sd
    flip = info.partner_side != info2.partner_side
    assert flip.any() and (~flip).any()
    for path, a in jax.tree_util.tree_leaves_with_path(sc):
        b = _leaf(sc2, path)
        name = jax.tree_util.keystr(path)
        if name in (".objects.xy", ".objects.goal"):
            np.testing.assert_array_equal(np.delete(a, 1, axis=1), np.delete(b, 1, axis=1))
            assert np.all(np.any(a[:, 1] != b[:, 1], axis=tuple(range(1, a[:, 1].ndim)))
                          == flip)
        elif name == ".objects.vel":  # the same motion, shifted sideways
            np.testing.assert_allclose(a, b, atol=1e-4)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)
    for name in ("agent_speed", "agent_goal_distance", "topology", "lane_width"):
        np.testing.assert_array_equal(getattr(info, name), getattr(info2, name))


def _leaf(tree, path):
    for p in path:
        tree = getattr(tree, p.name)
    return tree


def test_partner_keeps_its_side_at_constant_speed(gen):
    (sc, info), _ = gen
    t0 = RUN.env.init_step
    o = sc.objects
    for i in range(N):
        ego0, yaw0 = o.xy[i, 0, t0], o.yaw[i, 0, t0]
        lat = _lateral(o.xy[i, 1, t0:], ego0, yaw0)
        # keep_right (+1) is the partner's right: the ego's left, seen head-on.
        assert np.all(np.sign(lat) == info.partner_side[i])
        np.testing.assert_allclose(lat, lat[0], atol=1e-3)
        assert CFG.partner_offset[0] - 1e-3 <= abs(lat[0]) <= CFG.partner_offset[1] + 1e-3
        assert np.cos(o.yaw[i, 1, t0] - yaw0) < -0.999  # head-on
        step = np.linalg.norm(np.diff(o.xy[i, 1, t0:], axis=0), axis=-1)
        moving = step > 1e-3
        n = int(moving.sum())
        assert moving[:n].all() and n > 20  # drives, then stands at the road's end
        v = step[:n] / CFG.dt  # never slower until the last step, which ends at the stop
        np.testing.assert_allclose(v[:-1], info.agent_speed[i, 1], rtol=1e-3)
        assert v[-1] <= info.agent_speed[i, 1] * (1 + 1e-3)
        assert o.valid[i, :2].all() and not o.valid[i, 2:].any()
        assert o.is_sdc[i, 0] and not o.is_sdc[i, 1:].any()


def test_config_checks():
    with pytest.raises(ConfigError, match="partner_convention.*straight roads only"):
        ProceduralConfig(partner_convention="either")
    straight = dict(topology=dict(straight=1, curve=0, t_junction=0, intersection=0),
                    partner_convention="either")
    with pytest.raises(ConfigError, match=r"lanes_per_direction \[1, 1\]"):
        ProceduralConfig(**straight)
    with pytest.raises(ConfigError, match="partner_offset.*width"):
        ProceduralConfig(**straight, lanes_per_direction=(1, 1), partner_offset=(1.0, 1.9))
    with pytest.raises(ConfigError, match="partner_offset.*hugging"):
        ProceduralConfig(**straight, lanes_per_direction=(1, 1), partner_offset=(0.5, 1.0))
    with pytest.raises(ConfigError, match="partner_convention"):
        ProceduralConfig(partner_convention="keep_middle")
    with pytest.raises(ConfigError, match="offroad_behavior"):
        load_run_config("adaptive_passing", {"env.offroad_behavior": "remove"})


@pytest.fixture(scope="module")
def rollout(gen):
    """Envs 0 and 1: one scene with the partner keeping right / left (same key); env 2:
    scene 0 driven off the road. The scripted ego keeps 1.75 m right of the centre line
    (env 2: 6 m left of it, past the edge)."""
    (sc, info), (sc2, info2) = gen
    i = int(np.flatnonzero(info.partner_side != info2.partner_side)[0])
    right, left = (sc, sc2) if info.partner_side[i] == 1 else (sc2, sc)
    pick = lambda tree: jax.tree.map(lambda x: jnp.asarray(x[i]), tree)
    scenes = jax.tree.map(lambda *x: jnp.stack(x), pick(right), pick(left), pick(right))
    env = Env(ONE_TRIAL)
    params = env.make_params(make_pool(scenes, ONE_TRIAL.road_index))
    keep_right, off_road = keep_line(env, -1.75), keep_line(env, 6.0)

    def act(p, state, ts, key):
        del key
        return jax.lax.cond(state.scenario_id == 2, off_road, keep_right, p, state, ts, None)

    sids = jnp.arange(3, dtype=jnp.int32)
    state, ts = jax.jit(jax.vmap(env.reset_to, in_axes=(None, 0, 0)))(
        params, sids, jax.random.split(jax.random.key(0), 3))

    def step(carry, _):
        state, ts = carry
        action = jax.vmap(act, in_axes=(None, 0, 0, None))(params, state, ts, None)
        nxt, nts = env.step_batch(params, state, action)
        return (nxt, nts), (ts.obs, state.agents.xy, nts.info.metrics.collided,
                            nts.info.metrics.offroad, nts.info.metrics.goal_reached,
                            nts.info.trial_done, state.scenario_id)

    _, out = jax.jit(lambda s, t: jax.lax.scan(step, (s, t), None,
                                               length=ONE_TRIAL.trial_length))(state, ts)
    return jax.device_get(out)


def test_side_decides_and_fog_hides_it(rollout, gen):
    obs, xy, collided, offroad, reached, trial_done, sid = rollout
    scene_logs = _partner_logs(gen)
    assert np.all(sid[0] == np.arange(3))
    ego, partner = 0, 1
    # Each env's first (and only) trial ends at its first trial_done; later steps belong
    # to the next episode, on another scene.
    end = [int(np.argmax(trial_done[:, e])) for e in range(3)]
    assert all(trial_done[:, e].any() for e in range(3))
    # Against the partner that keeps right the ego keeping right passes and arrives ...
    assert reached[end[0], 0, ego] and not collided[: end[0] + 1, 0, ego].any()
    # ... against the one that keeps left it meets it head-on, which ends its trial.
    hit = end[1]
    assert collided[hit, 1, ego] and not reached[: hit + 1, 1, ego].any()
    # Until the partner is within partner_radius, the ego sees the same in both scenes.
    dist = np.linalg.norm(xy[:, :2, partner] - xy[:, :2, ego], axis=-1)  # (T, 2)
    radius = ONE_TRIAL.observation.partner_radius
    before = np.arange(len(dist)) < hit  # both envs still in their first trial
    hidden = np.all(dist > radius + 0.5, axis=1) & before
    seen = np.all(dist < radius - 0.5, axis=1) & before
    assert hidden[:5].all() and seen.any()
    for leaf in jax.tree.leaves(obs):
        np.testing.assert_array_equal(leaf[hidden, 0, ego], leaf[hidden, 1, ego])
    assert np.any(obs.partners[seen, 0, ego] != obs.partners[seen, 1, ego])
    assert obs.partner_mask[seen, 0, ego].all() and not obs.partner_mask[hidden, 0, ego].any()
    # The partner is no controlled row: whatever the ego does, it drives its log.
    for e in range(2):
        np.testing.assert_array_equal(
            xy[: end[e] + 1, e, partner],
            scene_logs[e][ONE_TRIAL.init_step: ONE_TRIAL.init_step + end[e] + 1])


def _partner_logs(gen):
    """(2, T, 2): the partner's logged positions in the rollout's envs 0 and 1."""
    (sc, info), (sc2, info2) = gen
    i = int(np.flatnonzero(info.partner_side != info2.partner_side)[0])
    right, left = (sc, sc2) if info.partner_side[i] == 1 else (sc2, sc)
    return right.objects.xy[i, 1], left.objects.xy[i, 1]


def test_offroad_ends_the_trial_as_a_collision_does(rollout):
    _, _, collided, offroad, reached, trial_done, _ = rollout
    first = int(np.argmax(offroad[:, 2, 0]))
    assert offroad[:, 2, 0].any() and not collided[: first + 1, 2, 0].any()
    assert trial_done[first, 2] and not trial_done[:first, 2].any()  # ended there
    assert not reached[: first + 1, 2, 0].any()


def test_oracle_differs_in_partner_radius_only(gen):
    oracle = load_run_config("adaptive_passing_oracle")
    a, b = dict(flat_items(RUN.to_dict())), dict(flat_items(oracle.to_dict()))
    # Its env differs in the fog alone (its schedule is shorter: no memory to learn).
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {
        "env.observation.partner_radius", "train.total_steps"}
    (sc, _), _ = gen
    scenes = jax.tree.map(lambda x: jnp.asarray(x[:2]), sc)
    obs = []
    for cfg in (RUN.env, oracle.env):
        env = Env(cfg)
        params = env.make_params(make_pool(scenes, cfg.road_index))
        _, ts = jax.jit(env.reset_batch, static_argnums=2)(params, jax.random.key(0), 2)
        obs.append(jax.device_get(ts.obs))
    ego, orc = obs
    for name in ("ego", "road", "road_mask", "road_type"):
        np.testing.assert_array_equal(getattr(ego, name), getattr(orc, name), err_msg=name)
    assert not ego.partner_mask[:, 0].any() and orc.partner_mask[:, 0].all()


def test_nearest_vehicle_features_by_hand():
    cfg = RUN.env.observation
    agents = AgentState(
        xy=jnp.array([[0.0, 0.0], [10.0, 2.0], [30.0, -5.0]]),
        yaw=jnp.array([0.0, np.pi / 2, 0.0], jnp.float32), vel=jnp.zeros((3, 2)),
        steer=jnp.zeros(3), accel=jnp.zeros(3), valid=jnp.ones(3, bool))
    features = jax.jit(nearest_vehicle_features, static_argnums=0)
    got = np.asarray(features(cfg, agents, jnp.array([True, True, True])))
    d01, d12 = np.hypot(10, 2), np.hypot(20, 7)
    s, lat = cfg.goal_scale, AUX_LATERAL_SCALE
    np.testing.assert_allclose(got[0], [10 / s, 2 / lat, d01 / s], rtol=1e-5)
    # Agent 1 heads +y: agent 0, at (-10, -2) from it, lies 2 m behind and 10 m right.
    np.testing.assert_allclose(got[1], [-2 / s, 10 / lat, d01 / s], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], [-20 / s, 7 / lat, d12 / s], rtol=1e-5)
    alone = np.asarray(features(cfg, agents, jnp.array([True, False, False])))
    np.testing.assert_array_equal(alone[0], 0.0)  # nobody else visible
    np.testing.assert_allclose(alone[1], [-2 / s, 10 / lat, d01 / s], rtol=1e-5, atol=1e-6)


# One more compiled transformer adaptation rollout (about 30 s on 2 cores): the deltas
# are computed by the same code as test_eval's default-tier adaptation test.
@pytest.mark.slow
def test_per_member_deltas_equal_the_episode_records():
    """The adaptation evaluator per partner member (sections of configs/eval/passing.yaml
    on a tiny transformer with random weights and a short trial): each member's trial
    scores and deltas equal the host's mean over its counted episodes' trial records."""
    env_config = load_run_config("adaptive_passing", {
        "env.trial_timeout": 20, "env.goal_radius": 24.0}).env  # short trials, mixed outcomes
    env = Env(env_config)
    policy = Policy.for_env(PolicyConfig(kind="transformer", model_dim=16, token_dim=8,
                                         num_layers=1, heads=2, horizon=40), env)
    o = env_config.observation
    params = policy.init(jax.random.key(1), random_obs(
        jax.random.key(0), (env_config.scenario.max_agents,), o.num_partners, o.num_road,
        num_lights=o.num_lights))
    section = {"type": "adaptation", "num_scenarios": 12, "batch_size": 12, "seed": 5,
               "num_trials": 2, "env.goal_behavior": "trial"}
    sections = {"eval": {m: {**section, "procedural.partner_convention": m}
                         for m in ("keep_right", "keep_left")}}
    result = run(params, sections, policy=policy, env_config=env_config, procedural=CFG,
                 write=False, progress=False, out_dir="unused")
    scored = 0
    for member in ("keep_right", "keep_left"):
        r = result[member]
        assert r.status == "ok", r.error
        assert r.config["procedural"]["partner_convention"] == member
        for prefix, actor in (("", "memory"), ("control/", "no_memory")):
            counted = [t for t in r.trials if t["actor"] == actor and t["start_step"] == 0]
            assert sorted(t["scenario_id"] for t in counted) == list(range(12))
            s = np.array([t["trial_score"] for t in counted])  # (12, 2)
            for k in range(2):
                assert r.metrics[f"{prefix}trial_{k}_score"] == pytest.approx(s[:, k].mean())
            assert r.metrics[f"{prefix}ada_delta_trial_1_minus_0"] == pytest.approx(
                np.mean(s[:, 1] - s[:, 0]))
            scored += int(s.sum())
    assert scored > 0  # some trials reached the goal: the comparison is not 0 = 0

"""Measurement of multi-trial episodes: trial counters, episode records, videos.

One trial-mode evaluation that runs past several episodes is replayed host-side, env by
env, with its recorded actions: every episode record's start and end step, the trial
counters and each episode's trial outcomes equal a brute-force count from the replay's
per-step flags, and the video replays the same states. The training counters equal a
brute-force count from the training rollout's per-row flags; per-env wandb video keys
are distinct.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from policy_inputs import random_obs
from scenes import CAR, straight_road

from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval.evaluator import Evaluator
from jaxdrive.eval.evaluators import MultiScenario, _trial_reduce
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.metrics.trials import TRIAL_COUNTERS
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.render.video import count_video_frames
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural import ProceduralConfig
from jaxdrive.telemetry.writers import WandbWriter, video_keys
from jaxdrive.types import tree_stack

K, TIMEOUT = 2, 5  # episodes of at most 10 steps
STEPS = 23  # two whole episodes and a cut third (more where trials end early)
BATCH, NUM = 2, 3  # two batches, the second padded
ENV = {"scenario": ScenarioConfig(max_agents=4, num_steps=31,
                                  max_road_points=1024).to_dict(),
       "collision_behavior": "remove", "init_step": 0,
       "observation": {"num_partners": 3, "num_road": 20},
       "road_index": {"road_per_cell": 20, "grid_size": 8}}
PROCEDURAL = {"num_agents": [2, 4], "arm_length": 30.0, "lanes_per_direction": [1, 1],
              "topology": {"straight": 1.0, "curve": 1.0, "t_junction": 0.0,
                           "intersection": 0.0}}


class StraightRoads(MultiScenario):
    """Hand-built scenes (no procedural generator to compile): cars on a straight road."""

    def load_scenarios(self, env_config):
        sc = env_config.scenario
        cars = [[(0, -2, 0, 5, *CAR), (-30, 2, np.pi, 4, *CAR)],
                [(-10, -2, 0, 3, *CAR), (10, -2, 0, 6, *CAR), (40, 2, np.pi, 5, *CAR)],
                [(5, 2, np.pi, 2, *CAR), (-20, -2, 0, 7, *CAR), (25, -2, 0, 1, *CAR),
                 (-45, 2, np.pi, 3, *CAR)]]
        return jax.tree.map(jnp.asarray, tree_stack([straight_road(sc, c) for c in cars]))


@pytest.fixture(scope="module")
def evaluated():
    """(evaluator, result) of a trial-mode multi_scenario evaluation whose videos would
    show all its scenarios (their actions are kept; rendered only by the video test)."""
    env_config = EnvConfig.from_dict(ENV)
    procedural = ProceduralConfig.from_dict(PROCEDURAL)
    env = Env(env_config)
    policy = Policy.for_env(PolicyConfig(kind="mlp", model_dim=16, token_dim=8), env)
    section = {"type": "multi_scenario", "num_scenarios": NUM, "batch_size": BATCH,
               "seed": 3, "num_steps": STEPS, "trial_counters": True,
               "env.goal_behavior": "trial", "env.num_trials": K,
               "env.trial_timeout": TIMEOUT,
               "render": {"enabled": True, "num_scenarios": NUM, "steps": STEPS + 1,
                          "width": 32, "height": 32}}
    specs = load_suite_specs({"eval": {"ev": section}}, env_config, procedural)
    ev = StraightRoads(specs["ev"])
    ev._build(policy)
    # init reads only the observation's shapes (one env's agents): drawn on the host, the
    # parameters are those of an env reset's observation, without compiling the reset.
    c = ev._setup["env"].config
    o = c.observation
    obs = random_obs(jax.random.key(0), (c.scenario.max_agents,), o.num_partners, o.num_road,
                     num_lights=o.num_lights)
    params = jax.jit(policy.init)(jax.random.key(0), obs)
    result = ev.run(policy, params, step=7)  # no out_dir: no videos yet
    assert result.status == "ok", result.error
    return ev, result


_REPLAYS: dict = {}


def replay(ev, j):
    """Host-side replay of scenario position ``j``: reset as the rollout's row did
    (batch key -> reset key split -> the row's key), then one ``env.step`` per recorded
    action. Returns the (T + 1) states and the T time steps, as NumPy."""
    if j in _REPLAYS:
        return _REPLAYS[j]
    s = ev._setup
    env, env_params = s["env"], s["env_params"]
    if "fns" not in _REPLAYS:
        _REPLAYS["fns"] = jax.jit(env.reset_to), jax.jit(env.step)
    reset_to, step = _REPLAYS["fns"]
    b, row = divmod(j, BATCH)
    k_reset, _ = jax.random.split(jax.random.fold_in(jax.random.key(ev.spec.seed), b))
    state, ts = reset_to(env_params, jnp.int32(s["ids"][j]),
                                      jax.random.split(k_reset, BATCH)[row])
    actions = s["kept"][j][0]
    states, steps = [jax.device_get(state)], []
    for t in range(STEPS):
        state, ts = step(env_params, state, jnp.asarray(actions[t]))
        states.append(jax.device_get(state))
        steps.append(jax.device_get(ts))
    _REPLAYS[j] = states, steps
    return states, steps


def brute_force(states, steps):
    """Episodes of one replayed env from its per-step flags: [(start, end, scenario,
    finished, [(length, timed_out, goal_reached, ego goals)] per trial)]."""
    out, start, t0, trials = [], 0, 0, []
    hits: set = set()
    for t, ts in enumerate(steps):
        prev_state = states[t]
        hits |= set(np.flatnonzero(ts.info.metrics.goal_reached & prev_state.active).tolist())
        if ts.info.trial_done:
            length = t + 1 - t0
            controlled = set(np.flatnonzero(prev_state.controlled).tolist())
            ego = set(np.flatnonzero(prev_state.ego).tolist())
            timed_out = length >= TIMEOUT
            goal = (not timed_out) and bool(controlled) and controlled <= hits
            trials.append((length, timed_out, goal, len(hits & ego)))
            hits, t0 = set(), t + 1
        if ts.info.episode_done:
            out.append((start, t + 1, int(prev_state.scenario_id), True, trials))
            start, trials = t + 1, []
    if not out:  # the counted episode was cut by the rollout's end
        out.append((0, STEPS, int(states[0].scenario_id), False, []))
    return out


def test_records_counters_and_trial_outcomes_equal_a_host_replay(evaluated):
    ev, result = evaluated
    assert sorted(ev._setup["kept"]) == list(range(NUM))  # every row's actions kept
    counted = []
    later = 0
    for j in range(NUM):
        b, row = divmod(j, BATCH)
        states, steps = replay(ev, j)
        want = brute_force(states, steps)
        got = sorted((e for e in result.episodes if (e["batch"], e["env_index"]) == (b, row)),
                     key=lambda e: e["start_step"])
        assert [(e["start_step"], e["end_step"], e["scenario_id"]) for e in got] == [
            w[:3] for w in want]
        assert got[0]["scenario_id"] == int(ev._setup["ids"][j])
        later += len(want) - 1
        if want[0][3]:
            counted.append(want[0])
        # Trial outcomes of every completed episode, in the results' ``trials``.
        outcomes = sorted((e for e in result.trials if (e["batch"], e["env_index"]) == (b, row)),
                          key=lambda e: e["start_step"])
        done = [w for w in want if w[3]]
        assert [(o["start_step"], o["end_step"]) for o in outcomes] == [w[:2] for w in done]
        for o, w in zip(outcomes, done, strict=True):
            assert o["trial_length"] == [x[0] for x in w[4]]
            assert o["trial_timed_out"] == [x[1] for x in w[4]]
            assert o["trial_goal_reached"] == [x[2] for x in w[4]]
            assert o["trial_score"] == pytest.approx(
                [x[3] / max(o["ego_agents"], 1) for x in w[4]])
    assert later >= NUM  # every env completed episodes after its counted one
    # The counters count the counted (first) episodes, as the other metrics do.
    trials = [x for w in counted for x in w[4]]
    n = len(counted)
    want = {"trial_episodes": n, "trials_completed": len(trials) / n,
            "trials_timed_out": sum(x[1] for x in trials) / n,
            "trials_goal_reached": sum(x[2] for x in trials) / n,
            "trial_mean_length": sum(x[0] for x in trials) / len(trials)}
    for name in ("trial_episodes", *TRIAL_COUNTERS):
        assert result.metrics[name] == pytest.approx(want[name], abs=1e-6), name


@pytest.mark.slow  # the recorder's compile; default-run sibling: the records test above
def test_video_replays_the_recorded_states(evaluated, tmp_path):
    ev, _ = evaluated
    s = ev._setup
    videos = ev._render(None, None, tmp_path, 7)  # what ``run`` does with an out_dir
    assert len(videos) == NUM and all(f"step{7:010d}_env" in v for v in videos)
    assert count_video_frames(videos[0]) == STEPS + 1
    j = 2  # the second batch's row
    states, _ = replay(ev, j)
    rec = s["recorder"]
    order = list(range(NUM))
    actions = jnp.asarray(np.stack([s["kept"][i][0] for i in order]))
    keys = jax.random.wrap_key_data(jnp.asarray(np.stack([s["kept"][i][1] for i in order])))
    carry = rec.start(actions, s["env_params"], jnp.asarray(s["ids"][order]),
                      jax.random.key(0), keys)
    frame = 0
    while frame <= STEPS:
        carry, (_, info) = rec.chunk(actions, s["env_params"], carry)
        info = jax.device_get(info)
        for c in range(info.step.shape[0]):
            if frame + c > STEPS:
                break
            want = states[frame + c]
            assert info.step[c, j] == want.step and info.trial[c, j] == want.trial
            assert info.at_goal[c, j] == int(np.sum(want.reached & want.controlled
                                                    & want.agents.valid & ~want.removed))
        frame += info.step.shape[0]
        if frame <= STEPS:  # the state after the chunk, bit for bit
            got = jax.device_get(jax.tree.map(lambda x: x[j], carry.state.agents))
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(states[frame].agents),
                            strict=True):
                np.testing.assert_array_equal(g, w)


def test_each_env_video_gets_its_own_wandb_key(monkeypatch, tmp_path):
    videos = [f"out/ev/render/scene/step0000000007_env{i:03d}.mp4" for i in (4, 0, 9)]
    logged = []
    run = types.SimpleNamespace(id="r", disabled=False, finish=lambda: None,
                                log=lambda data, step=None: logged.append((data, step)))
    fake = types.ModuleType("wandb")
    fake.Settings = lambda **kw: None
    fake.Video = lambda path: path
    fake.init = lambda **kw: run
    fake.login = lambda prompt=True, verify=True: True
    monkeypatch.setitem(__import__("sys").modules, "wandb", fake)
    writer = WandbWriter({}, str(tmp_path), mode="offline")
    for key, path in video_keys("ev", videos):
        writer.log_video(key, path, 7)
    keys = [k for data, _ in logged for k in data]
    assert keys == [f"video/ev/scene/env_{i}" for i in range(NUM)]
    # Two views: env-major listing, one key per env and view.
    paths = ["o/scene/a.mp4", "o/ego/a.mp4", "o/scene/b.mp4", "o/ego/b.mp4"]
    assert [k for k, _ in video_keys("x", paths)] == [
        "video/x/scene/env_0", "video/x/ego/env_0", "video/x/scene/env_1", "video/x/ego/env_1"]


def test_rendered_scenes_vary_with_a_render_seed():
    def positions(seed, step):
        render = {"enabled": True, "num_scenarios": 3}
        if seed is not None:
            render["seed"] = seed
        specs = load_suite_specs({"eval": {"v": {"type": "multi_scenario",
                                                  "render": render}}},
                                 EnvConfig.from_dict(ENV), ProceduralConfig())
        ev = Evaluator(specs["v"])
        ev._setup = {"ids": np.arange(20, dtype=np.int32)}
        return ev.rendered_positions(step).tolist()

    assert positions(None, 1) == positions(None, 2) == [0, 1, 2]  # today's default
    drawn = [positions(5, step) for step in range(4)]
    assert drawn[0] == positions(5, 0)  # reproducible
    assert len({tuple(d) for d in drawn}) > 1  # other scenes at other evaluations
    assert all(len(set(d)) == 3 and max(d) < 20 for d in drawn)


def test_adaptation_reduction_on_device_matches_numpy():
    # Three scenarios, two trials; the third has no ego agent (not scored).
    memory = (np.array([[0, 1], [1, 2], [0, 0]], np.int32), np.array([2, 2, 0], np.int32))
    control = (np.array([[1, 1], [0, 0], [0, 0]], np.int32), np.array([2, 2, 0], np.int32))
    red = jax.device_get(_trial_reduce(memory, control))
    # memory deltas: 0.5, 0.5 -> mean 0.5, sd 0; control: 0, 0; gain 0.5, 0.5.
    np.testing.assert_allclose(red["scores"][0], [[0, 0.5], [0.5, 1], [0, 0]])
    assert red["delta_n"].tolist() == [2, 2]
    np.testing.assert_allclose(red["delta_mean"][:, 0], [0.5, 0.0])
    np.testing.assert_allclose(red["delta_std"][:, 0], [0.0, 0.0])
    assert float(red["gain_mean"][0]) == 0.5 and float(red["gain_n"]) == 2


TRAIN_TIMEOUT = 4


def ppo_setup(evaluated, trial_counters=True, abstract=False):
    """(config, env, PPO, its initial state, env params) of a tiny trial-mode run on the
    evaluation's scenes; with ``abstract`` the state's shapes only (nothing compiled)."""
    from jaxdrive.runs.config import RunConfig
    from jaxdrive.train.ppo import PPO

    timeout = TRAIN_TIMEOUT
    config = RunConfig.from_dict({
        "env": {**ENV, "collision_behavior": "ignore", "goal_behavior": "trial",
                "num_trials": K, "trial_timeout": timeout},
        "procedural": PROCEDURAL, "policy": {"kind": "mlp", "model_dim": 16, "token_dim": 8},
        "train": {"seed": 1, "num_scenes": 2, "num_envs": 2, "rollout_steps": 19},
        "validation": {"every": 0}})
    env = Env(config.env)
    env_params = env.make_params(evaluated[0]._setup["env_params"].pool)  # the same scenes
    policy = Policy.for_env(config.policy, env)
    ppo = PPO(config, env, policy, trial_counters=trial_counters)
    init = jax.eval_shape if abstract else (lambda f, *args: f(*args))
    return config, env, ppo, init(ppo.init, jax.random.key(0), env_params), env_params


def test_training_step_logs_trial_counters(evaluated):
    # Off by default (the PPO golden pins the default metrics); the training run sets it.
    _, _, ppo, state, env_params = ppo_setup(evaluated, abstract=True)
    logged = jax.eval_shape(ppo.train_step, state, env_params)[1]  # traced, not compiled
    assert {f"train/{n}" for n in ("trial_episodes", *TRIAL_COUNTERS)} <= set(logged)


@pytest.mark.slow  # a rollout compile; default-run siblings: the records test (the same
# TrialTotals counters, from an evaluation) and the test above (the step logs them)
def test_training_counters_equal_a_brute_force_count(evaluated):
    config, env, ppo, state, env_params = ppo_setup(evaluated)
    timeout = TRAIN_TIMEOUT
    _, traj, _, totals = jax.jit(ppo._rollout_totals)(state, env_params)
    term, trunc = np.asarray(traj.terminated), np.asarray(traj.truncated)  # (T, N)
    a = env.config.scenario.max_agents
    episodes = []  # per completed episode: [(length, timed out, goal reached)]
    for b in range(config.train.num_envs):
        rows = slice(b * a, (b + 1) * a)
        trial_end = (term[:, rows] | trunc[:, rows]).any(1)  # controlled agents' flags
        episode_end = term[:, rows].any(1)
        t0, trials = 0, []
        for t in range(term.shape[0]):
            if trial_end[t]:
                length = t + 1 - t0
                # Collisions are ignored: a trial of an env with controlled agents (the
                # rows with flags) ends early only when every one reached its goal.
                trials.append((length, length >= timeout, length < timeout))
                t0 = t + 1
            if episode_end[t]:
                episodes.append(trials)
                trials = []
    got = {k: float(v) for k, v in jax.device_get(totals.counters()).items()}
    flat = [x for e in episodes for x in e]
    n = len(episodes)
    assert n >= 2 and any(x[1] for x in flat)  # not vacuous
    want = {"trial_episodes": n, "trials_completed": len(flat) / n,
            "trials_timed_out": sum(x[1] for x in flat) / n,
            "trials_goal_reached": sum(x[2] for x in flat) / n,
            "trial_mean_length": sum(x[0] for x in flat) / len(flat)}
    assert got == pytest.approx(want, abs=1e-6)

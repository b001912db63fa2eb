"""Evaluators on tiny shapes: every scenario once, records equal a host-side replay,
failures recorded, the results file and CLI, adaptation intervals, 8 devices = 1."""

import json
import os
import subprocess
import sys
import textwrap

import eval_family
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from policy_inputs import random_obs

from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval.api import run
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.rollout import outcome
from jaxdrive.eval.runner import RESULTS_VERSION
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.models.policy import Policy, PolicyConfig, policy_inputs
from jaxdrive.scenarios.procedural import ProceduralConfig

# The family's shared tiny sizes (eval_family): the CLI tests build the same scenes.
ENV = {"scenario": eval_family.SCENARIO, "collision_behavior": "remove",
       "observation": eval_family.OBSERVATION, "road_index": eval_family.ROAD_INDEX,
       "episode_length": 14}
PROCEDURAL = eval_family.PROCEDURAL
NUM_SCENARIOS = eval_family.NUM_SCENES  # 5: not a multiple of the batch
assert NUM_SCENARIOS == 5
BATCH = 2


def suite(**sections):
    base = {"_tiny": {"template": True, "num_scenarios": NUM_SCENARIOS, "batch_size": BATCH,
                      "seed": 7}}
    return {"eval": {**base, **sections}}


def build():
    """(env config, procedural config, tiny MLP policy, its random parameters)."""
    env_config = EnvConfig.from_dict(ENV)
    procedural = ProceduralConfig.from_dict(PROCEDURAL)
    env = Env(env_config)
    policy = Policy.for_env(PolicyConfig(kind="mlp", model_dim=16, token_dim=8), env)
    # init reads only the observation's shapes (one env's agents): drawn on the host, the
    # parameters are those of an env reset's observation, without compiling the reset.
    o = env_config.observation
    obs = random_obs(jax.random.key(0), (env_config.scenario.max_agents,), o.num_partners,
                     o.num_road, num_lights=o.num_lights)
    params = policy.init(jax.random.key(0), obs)
    return env_config, procedural, policy, params


@pytest.fixture(scope="module")
def setup():
    return build()


@pytest.fixture(scope="module")
def multi(setup, tmp_path_factory):
    env_config, procedural, policy, params = setup
    specs = load_suite_specs(suite(val={"type": "multi_scenario", "inherits": "_tiny"}),
                             env_config, procedural)
    (ev,) = make_evaluators(specs.values())
    return ev, ev.run(policy, params)


def test_every_scenario_counted_exactly_once(multi):
    ev, result = multi
    assert result.status == "ok", result.error
    ids = [e["scenario_id"] for e in result.episodes]
    assert sorted(ids) == list(range(NUM_SCENARIOS))  # 3 batches of 2, one row padding
    assert result.per_scenario["scenario_id"] == list(range(NUM_SCENARIOS))
    ego = sum(e["ego_agents"] for e in result.episodes)
    assert result.metrics["agent_episodes"] == ego > 0
    assert result.metrics["goal_rate"] == pytest.approx(
        sum(e["goals"] for e in result.episodes) / ego)
    # One compiled rollout serves all three batches.
    assert list(ev._setup["compiled"]) == ["policy"]


def test_episode_records_match_a_host_side_replay(multi, setup):
    ev, result = multi
    _, _, policy, params = setup
    env, env_params = ev._setup["env"], ev._setup["env_params"]
    reset = jax.jit(env.reset_to)
    step = jax.jit(env.step)
    act = jax.jit(policy.step)
    a = env.config.scenario.max_agents
    key = jax.random.key(ev.spec.seed)
    for rec in result.episodes:
        sid, b, j = rec["scenario_id"], rec["batch"], rec["env_index"]
        # The rollout's keys: batch key -> (reset, run) -> per-env reset key.
        k_reset, _ = jax.random.split(jax.random.fold_in(key, b))
        state, ts = reset(env_params, jnp.int32(sid), jax.random.split(k_reset, BATCH)[j])
        cache = policy.init_cache(a)
        taken = 0
        while taken < ev._setup["steps"]:
            taken += 1
            first, removed = policy_inputs(ts)
            out, cache = act(params, cache, ts.obs, first, removed)
            state, ts = step(env_params, state, policy.distribution(out).mode())
            if bool(ts.info.episode_done):
                break
        ego = np.asarray(ts.info.episode_ego)
        e = jax.device_get(ts.info.episode)
        row = {"ego_agents": int(ego.sum()), "goals": int((e.goal_reached & ego).sum()),
               "collisions": int((e.collided & ego).sum()),
               "offroads": int((e.offroad & ego).sum()), "finished": bool(ts.info.episode_done)}
        assert rec["end_step"] == taken
        assert {k: rec[k] for k in ("ego_agents", "goals", "collisions", "offroads")} == {
            k: row[k] for k in ("ego_agents", "goals", "collisions", "offroads")}
        assert rec["outcome"] == outcome(row)


def test_failing_evaluator_is_recorded_and_the_others_run(setup, tmp_path):
    env_config, procedural, policy, params = setup
    sections = suite(
        broken={"type": "multi_scenario", "inherits": "_tiny",
                "scenarios": [str(tmp_path / "missing.json")]},
        # All NUM_SCENARIOS scenes: the multi fixture's procedural batch, whose generator
        # and road index are compiled already (another count would compile both again);
        # the rollout is the golden eval case's replay program (shared cache).
        replay={"type": "human_replay", "inherits": "_tiny"})
    result = run(params, sections, policy=policy, env_config=env_config,
                 procedural=procedural, out_dir=tmp_path / "out", progress=False)
    assert result.status == "partial"
    assert result["broken"].status == "failed" and "missing.json" in result["broken"].error
    assert result["replay"].status == "ok"
    # human replay controls the SDC only: one ego agent-episode per scenario.
    assert result["replay"].metrics["agent_episodes"] == NUM_SCENARIOS
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["version"] == RESULTS_VERSION and data["status"] == "partial"
    assert set(data["evaluators"]) == {"broken", "replay"}
    assert data["evaluators"]["broken"]["status"] == "failed"
    for ev in data["evaluators"].values():
        assert {"metrics", "episodes", "eval_seconds", "status", "config"} <= set(ev)
    assert data["config"]["replay"]["type"] == "human_replay"


def test_adaptation_reports_deltas_with_confidence_intervals(setup):
    env_config, procedural, policy, params = setup
    # The golden eval case's adaptation section (trial_timeout 7): one compiled program
    # for both modules through the shared compilation cache.
    sections = suite(ada={"type": "adaptation", "inherits": "_tiny",
                          "env.goal_behavior": "trial", "num_trials": 2, "trial_timeout": 7})
    result = run(params, sections, policy=policy, env_config=env_config,
                 procedural=procedural, write=False, progress=False, out_dir="unused")
    r = result["ada"]
    assert r.status == "ok", r.error
    m = r.metrics
    scores = np.array([r.per_scenario["trial_0_score"], r.per_scenario["trial_1_score"]])
    assert m["ada_delta_trial_1_minus_0"] == pytest.approx(np.mean(scores[1] - scores[0]))
    assert m["ada_delta_trial_1_minus_0_ci_low"] <= m["ada_delta_trial_1_minus_0"] \
        <= m["ada_delta_trial_1_minus_0_ci_high"]
    # The MLP has no memory: wiping it at trial boundaries changes nothing.
    assert m["control/trial_1_score"] == m["trial_1_score"]
    assert m["memory_gain_trial_1"] == 0.0
    assert {e["actor"] for e in r.episodes} == {"memory", "no_memory"}


EIGHT_DEVICES = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax
    sys.path.insert(0, {tests!r})
    import test_eval as t
    assert len(jax.local_devices()) == 8
    env_config, procedural, policy, params = t.build()
    specs = t.load_suite_specs(t.suite(val={{"type": "multi_scenario", "inherits": "_tiny",
                                              "batch_size": 8}}), env_config, procedural)
    (ev,) = t.make_evaluators(specs.values())
    r = ev.run(policy, params)
    print(json.dumps({{"metrics": r.metrics, "episodes": r.episodes, "error": r.error}}))
""")


@pytest.mark.slow
def test_eight_devices_give_the_single_device_result(setup, tmp_path):
    env_config, procedural, policy, params = setup
    specs = load_suite_specs(suite(val={"type": "multi_scenario", "inherits": "_tiny",
                                        "batch_size": 8}), env_config, procedural)
    (ev,) = make_evaluators(specs.values())
    single = ev.run(policy, params)
    script = EIGHT_DEVICES.format(tests=os.path.dirname(__file__))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    sharded = json.loads(out.stdout.strip().splitlines()[-1])
    assert sharded["error"] is None
    assert sharded["episodes"] == single.episodes
    assert sharded["metrics"] == single.metrics


def test_planning_evaluator_scores_the_sdc_by_the_documented_formula(setup):
    env_config, procedural, policy, params = setup
    sections = suite(plan={"type": "planning", "inherits": "_tiny"})
    result = run(params, sections, policy=policy, env_config=env_config,
                 procedural=procedural, write=False, progress=False, out_dir="unused")
    r = result["plan"]
    assert r.status == "ok", r.error
    p = {k: np.array(v) for k, v in r.per_scenario.items()}
    one = p["scored_agents"] == 1  # the SDC alone is controlled and scored
    assert one.all()
    expected = (p["no_at_fault_collision"] * p["drivable_area"] * p["driving_direction"]
                * (5 * p["ttc"] + 5 * p["progress"] + 2 * p["comfort"]) / 12)
    np.testing.assert_allclose(p["total"], expected, atol=1e-6)
    assert r.metrics["score"] == pytest.approx(np.mean(p["total"]))
    assert 0.0 <= r.metrics["score"] <= 1.0
    assert r.metrics["agent_episodes"] == NUM_SCENARIOS


SHARED_JSON = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                           "womd_json")


@pytest.mark.skipif(not os.path.isdir(SHARED_JSON), reason="../shared/data not present")
def test_a_policy_evaluates_on_real_scenes_as_on_procedural_ones(setup):
    env_config, procedural, policy, params = setup
    files = sorted(os.path.join(SHARED_JSON, f) for f in os.listdir(SHARED_JSON))
    sections = suite(real={"type": "human_replay", "inherits": "_tiny", "scenarios": files})
    result = run(params, sections, policy=policy, env_config=env_config,
                 procedural=procedural, write=False, progress=False, out_dir="unused")
    r = result["real"]
    assert r.status == "ok", r.error
    # Every real scene played once with its SDC driven by the policy.
    assert sorted(e["scenario_id"] for e in r.episodes) == list(range(len(files)))
    assert r.metrics["agent_episodes"] == len(files)
    assert all(e["end_step"] >= 1 for e in r.episodes)
    # Results name the scenes by their own (WOMD) ids, as the files write them.
    womd = [json.load(open(f))["scenario_id"] for f in files]
    assert r.per_scenario["scenario_name"] == womd
    assert all(e["scenario_name"] == womd[e["scenario_id"]] for e in r.episodes)


def test_behavior_class_plays_the_sampled_scenarios_of_each_class(setup, tmp_path):
    from jaxdrive.data import convert_to_shards
    from jaxdrive.data.subsets import write_subset
    from jaxdrive.data.synth import synth_scenario
    from jaxdrive.data.tfrecord import write_records

    env_config, procedural, policy, params = setup
    synth = dict(num_objects=5, num_lanes=2, lane_points=20, num_edges=2, edge_points=30,
                 num_lines=1, line_points=10, num_lights=1)
    write_records(tmp_path / "s.tfrecord",
                  [synth_scenario(i, **synth).SerializeToString()
                   for i in range(NUM_SCENARIOS)])
    manifest = convert_to_shards([str(tmp_path / "s.tfrecord")], str(tmp_path / "shards"),
                                 env_config.scenario)
    ids = [s["scenario_id"] for s in manifest["scenarios"]]
    write_subset(tmp_path / "shards", "hard", [ids[1], ids[3]])
    # Two scenes per class in a pool of NUM_SCENARIOS: both classes' batches have the
    # shapes of the multi fixture's, so their rollouts reuse its compiled program.
    write_subset(tmp_path / "shards", "easy", [ids[0], ids[4]])
    sections = suite(bc={"type": "behavior_class", "inherits": "_tiny",
                         "scenarios": [str(tmp_path / "shards")], "classes": ["hard", "easy"],
                         "scenarios_per_class": 5})
    result = run(params, sections, policy=policy, env_config=env_config,
                 procedural=procedural, write=False, progress=False, out_dir="unused")
    assert [r.name for r in result.results] == ["bc/hard", "bc/easy"]
    assert [e["scenario_id"] for e in result["bc/hard"].episodes] == [1, 3]
    assert [e["scenario_id"] for e in result["bc/easy"].episodes] == [0, 4]
    assert result["bc/hard"].per_scenario["scenario_name"] == [ids[1], ids[3]]
    assert [e["scenario_name"] for e in result["bc/easy"].episodes] == [ids[0], ids[4]]
    assert all(r.status == "ok" for r in result.results)


def test_rollout_and_stop_hooks(setup):
    """A subclass playing every scenario twice and ending episodes after 3 steps."""
    from jaxdrive.eval.evaluators import MultiScenario

    env_config, procedural, policy, params = setup

    class TwiceShort(MultiScenario):
        def num_rollouts(self):
            return 2

        def should_stop(self, env):
            return lambda state, ts: ts.info.episode_done | (state.step >= 3)

    specs = load_suite_specs(suite(val={"type": "multi_scenario", "inherits": "_tiny"}),
                             env_config, procedural)
    r = TwiceShort(specs["val"]).run(policy, params)
    assert r.status == "ok", r.error
    assert [(e["rollout"], e["scenario_id"]) for e in r.episodes] == [
        (k, s) for k in range(2) for s in range(NUM_SCENARIOS)]
    assert all(e["end_step"] <= 3 for e in r.episodes)
    assert r.per_scenario["scenario_id"] == list(range(NUM_SCENARIOS)) * 2
    # Stopped early, the counts are the running episode's: every ego agent is counted.
    assert r.metrics["agent_episodes"] == sum(e["ego_agents"] for e in r.episodes) > 0

"""The ``realism`` evaluator (jaxdrive.eval.realism): WOSAC scores of rollouts in the
suite machinery, on tiny procedural scenes with a tiny MLP policy."""

from __future__ import annotations

import json

import eval_family
import jax
import numpy as np
import pytest
from policy_inputs import perturb, random_obs

from jaxdrive.config import ConfigError
from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval import realism
from jaxdrive.eval.evaluators import EVALUATORS, make_evaluators
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.scenarios.procedural import ProceduralConfig

# The evaluation family's tiny sizes and scenes (eval_family): the scene generator and
# the road index come from test_eval's compiled programs (the shared compilation cache).
ENV = {"scenario": eval_family.SCENARIO, "observation": eval_family.OBSERVATION,
       "road_index": eval_family.ROAD_INDEX, "init_step": 4}
PROCEDURAL = eval_family.PROCEDURAL
NUM = eval_family.NUM_SCENES  # 5
NAMES = ("meta_metric", "kinematic", "interactive", "map_based", "min_ade",
         *realism.wosac.FEATURE_NAMES)


def _suite(**section):
    base = {"type": "realism", "num_scenarios": NUM, "batch_size": 2, "seed": 3,
            "num_rollouts": 2, "deterministic": False}
    return {"eval": {"real": {**base, **section}}}


@pytest.fixture(scope="module")
def setup():
    env_config = EnvConfig.from_dict(ENV)
    procedural = ProceduralConfig.from_dict(PROCEDURAL)
    env = Env(env_config)
    policy = Policy.for_env(PolicyConfig(kind="mlp", model_dim=16, token_dim=8), env)
    cfg = env_config.observation
    obs = random_obs(jax.random.key(0), (4,), cfg.num_partners, cfg.num_road,
                     num_lights=cfg.num_lights)
    return env_config, procedural, policy, obs


def _evaluator(setup, **section):
    env_config, procedural, _, _ = setup
    specs = load_suite_specs(_suite(**section), env_config, procedural)
    (ev,) = make_evaluators(specs.values())
    return ev


def test_registered_and_config_checked(setup):
    assert "realism" in EVALUATORS
    with pytest.raises(ConfigError):
        _evaluator(setup, simulate="some")
    with pytest.raises(ConfigError):
        _evaluator(setup, actors=["policy", "expert"])


def test_scores_named_in_range_baselines_ordered_no_recompile(setup):
    _, _, policy, obs = setup
    ev = _evaluator(setup, actors=["policy", "log_replay"])
    params = policy.init(jax.random.key(0), obs)
    res = ev.run(policy, params)
    assert res.status == "ok", res.error
    for prefix in ("", "log_replay/"):
        for name in NAMES:
            assert prefix + name in res.metrics, prefix + name
            assert len(res.per_scenario[prefix + name]) == NUM
        for name in NAMES[:4] + realism.wosac.FEATURE_NAMES:
            assert 0.0 <= res.metrics[prefix + name] <= 1.0, (prefix + name)
    assert res.per_scenario["scenario_id"] == list(range(NUM))
    assert res.metrics["scored_scenarios"] == float(NUM)
    # log_replay scores the logged future itself: no displacement, and every group at
    # least as high as the untrained policy's (the log holds each bin's whole mass).
    assert res.metrics["log_replay/ade"] == 0.0 and res.metrics["log_replay/min_ade"] == 0.0
    assert res.metrics["log_replay/meta_metric"] > res.metrics["meta_metric"] + 0.1
    for group in ("kinematic", "interactive", "map_based"):
        assert res.metrics[f"log_replay/{group}"] >= res.metrics[group], group
    traces = realism.TRACES[0]
    # A fresh init may act alike (a small output layer); move every weight (unit
    # Gaussian noise, drawn on the host: no random kernels to compile).
    moved = perturb(params, jax.random.key(5), scale=1.0)
    res2 = ev.run(policy, moved)
    assert res2.status == "ok", res2.error
    assert realism.TRACES[0] == traces and res2.compile_seconds == 0.0
    assert res2.metrics["meta_metric"] != res.metrics["meta_metric"]
    assert res2.metrics["log_replay/meta_metric"] == res.metrics["log_replay/meta_metric"]


def test_controlled_mode_constant_velocity_actor(setup):
    # One actor: each is one more compile of the batch function. The random actor takes
    # the same controller_actor path; random_actions itself drives the golden env cases.
    _, _, policy, obs = setup
    ev = _evaluator(setup, simulate="controlled", actors=["constant_velocity"],
                    **{"env.control_mode": "sdc"})
    res = ev.run(policy, policy.init(jax.random.key(0), obs))
    assert res.status == "ok", res.error
    assert 0.0 <= res.metrics["meta_metric"] <= 1.0
    # Only the SDC is driven and scored.
    assert set(res.per_scenario["evaluated_objects"]) == {1.0}
    # The challenge's constant-velocity agent: the SDC straight on at its logged velocity
    # vector of init_step, whatever the env's dynamics; its displacement from the log,
    # computed here in numpy, is every rollout's (all rollouts are the same).
    s = ev._setup
    objects = jax.device_get(s["env_params"].pool.scenarios.objects)
    init, dt, steps = ENV["init_step"], s["env"].config.dynamics.dt, s["steps"]
    want = []
    for sid in res.per_scenario["scenario_id"]:
        a = int(np.flatnonzero(objects.is_sdc[sid])[0])
        k = np.arange(1, steps + 1, dtype=np.float64)[:, None] * dt
        path = objects.xy[sid, a, init] + objects.vel[sid, a, init] * k
        logged = objects.xy[sid, a, init + 1:init + 1 + steps]
        ok = objects.valid[sid, a, init + 1:init + 1 + steps]
        want.append(np.linalg.norm(path - logged, axis=-1)[ok].mean())
    np.testing.assert_allclose(res.per_scenario["ade"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(res.per_scenario["min_ade"], want, rtol=1e-4, atol=1e-4)
    assert max(want) > 1.0  # some procedural SDCs turn or brake: not a vacuous match


@pytest.mark.slow
def test_cli_default_suite_file(tmp_path):
    """``python -m jaxdrive.eval --config eval/realism --suite realism`` on a tiny
    checkpoint writes the realism metrics and per-scenario lists."""
    from test_train_run import STEPS_PER_IT, _config

    from jaxdrive.eval import cli
    from jaxdrive.train import run

    config = _config(tmp_path)
    config = config.replace(train=config.train.replace(total_steps=STEPS_PER_IT))
    run_dir = run.new_run_dir(config, "tiny")
    run.train(config, run_dir, quiet=True)
    out = tmp_path / "results.json"
    code = cli.main(["--config", "eval/realism", "--checkpoint", str(run_dir),
                     "--suite", "realism", "--out", str(out), "--no-progress",
                     "--output-root", str(tmp_path / "eval_runs")])
    assert code == 0
    ev = json.loads(out.read_text())["evaluators"]["realism"]
    assert ev["status"] == "ok"
    for part in ("meta", "kinematic", "interactive", "map"):
        assert any(part in k for k in ev["metrics"]), part
    assert len(ev["per_scenario"]["meta_metric"]) == 8


def test_realism_preset_selects_the_evaluator():
    from jaxdrive.eval.suite import load_suite_file

    (spec,) = load_suite_file("eval/realism", "realism", EnvConfig())
    assert spec.type == "realism" and spec.config.num_rollouts == 8
    assert spec.deterministic is False and spec.scenarios is None
    assert spec.env.episode_length is None and spec.env.collision_behavior == "ignore"
    (ref,) = load_suite_file("eval/realism", "realism_references", EnvConfig())
    assert ref.config.actors == ("log_replay", "log_follow", "constant_velocity", "random")
    assert ref.enabled is False
    assert [s.name for s in load_suite_file("eval/realism", None, EnvConfig())] == ["realism"]


_DEVICES_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import jax
import test_realism_eval as t
s = t.setup.__wrapped__()
ev = t._evaluator(s, num_scenarios=4, batch_size=4)
res = ev.run(s[2], s[2].init(jax.random.key(0), s[3]))
assert res.status == "ok", res.error
print("RESULT" + json.dumps({{"devices": jax.device_count(), "batch": ev._setup["batch"],
                             "metrics": res.metrics, "per": res.per_scenario}}))
"""


@pytest.mark.slow
def test_eight_fake_devices_give_the_one_device_numbers():
    import os
    import pathlib
    import subprocess
    import sys

    tests = str(pathlib.Path(__file__).resolve().parent)
    out = {}
    for d in (1, 8):
        env = {**os.environ, "JAX_PLATFORMS": "cpu",
               "PYTHONPATH": str(pathlib.Path(tests).parent),
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={d}"}
        proc = subprocess.run([sys.executable, "-c", _DEVICES_SCRIPT.format(tests=tests)],
                              capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
        out[d] = json.loads(line[len("RESULT"):])
    assert out[8]["devices"] == 8 and out[1]["batch"] == out[8]["batch"] == 8
    for k, v in out[1]["metrics"].items():
        assert out[8]["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for k, v in out[1]["per"].items():
        assert out[8]["per"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


@pytest.mark.slow
def test_two_shards_merge_to_the_serial_run(setup):
    from jaxdrive.eval.merge import merge_results
    from jaxdrive.eval.runner import run_evaluators
    from jaxdrive.eval.shards import Shard

    _, _, policy, obs = setup
    ev = _evaluator(setup)
    params = policy.init(jax.random.key(0), obs)
    serial = json.loads(run_evaluators([ev], policy, params, progress=False,
                                       checkpoint="RUN").to_json())
    shards = [json.loads(run_evaluators([ev], policy, params, progress=False,
                                        checkpoint="RUN", shard=Shard(i, 2)).to_json())
              for i in range(2)]
    merged = json.loads(merge_results([(f"f{i}.json", d) for i, d in
                                       enumerate(shards)]).to_json())
    timing = ("eval_seconds", "compile_seconds")
    same = lambda doc: {k: v for k, v in doc["evaluators"]["real"].items()  # noqa: E731
                        if k not in timing}
    assert merged["status"] == "ok" and same(merged) == same(serial)


def test_the_eval_cli_reads_the_preset_named_by_the_suite():
    from jaxdrive.eval.cli import default_config

    assert default_config(None, "realism") == "eval/realism"
    assert default_config(None, None) == "eval/default"
    assert default_config(None, "held_out") == "eval/default"  # a section of the default
    assert default_config("mine.yaml", "realism") == "mine.yaml"  # --config wins

"""The metric registry: one definition and one registration put a metric everywhere.

A metric registered here (``fast``: a present agent moving faster than 4 m/s) must show
up in the env's step metrics and episode statistics, in an evaluator's rates and
per-episode records, and in the trainer's logged EMA metrics; and be gone again once
unregistered."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.metrics import registry
from jaxdrive.metrics.registry import Metric, registered
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.runs.config import RunConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch
from jaxdrive.train.ppo import PPO

SPEED = 4.0
ENV = {"scenario": {"max_agents": 4, "num_steps": 40}, "collision_behavior": "remove",
       "observation": {"num_partners": 3, "num_road": 20},
       "road_index": {"road_per_cell": 20, "grid_size": 8}, "episode_length": 8}
PROCEDURAL = {"num_agents": [2, 4], "topology": {"straight": 1.0, "curve": 0.0,
                                                 "t_junction": 0.0, "intersection": 0.0}}


def _fast(view):
    return view.present & (jnp.linalg.norm(view.agents.vel, axis=-1) > SPEED)


FAST = Metric("fast", _fast, reduce="any", rate="fast_rate", count="fasts")


def _env_and_params(env_config):
    env = Env(env_config)
    scenes = generate_batch(jax.random.key(1), 3, ProceduralConfig.from_dict(PROCEDURAL),
                            env_config.scenario)
    return env, env.make_params(make_pool(scenes, env_config.road_index))


# Slow-marked for the CI budget (a trainer and an evaluator compiled with a test metric);
# the built-in ran_red_light takes the same path and the PPO and eval goldens record it.
@pytest.mark.slow
def test_a_registered_metric_reaches_env_evaluator_and_trainer():
    env_config = EnvConfig.from_dict(ENV)
    with registered(FAST):
        env, env_params = _env_and_params(env_config)
        # The env: per step, and reduced over each agent's episode (any while acting).
        state, ts = env.reset_batch(env_params, jax.random.key(0), 2)
        assert not np.asarray(ts.info.metrics.fast).any()  # a reset reports no event
        step = jax.jit(env.step_batch)
        seen = np.zeros((2, 4), bool)
        for _ in range(6):
            active = np.asarray(ts.active)
            state, ts = step(env_params, state, jnp.full((2, 4), 7, jnp.int32))
            speed = np.linalg.norm(np.asarray(ts.info.terminal.vel), axis=-1)
            present = np.asarray(ts.info.terminal.valid)
            # Hand-computed from the reached state: present and faster than 4 m/s.
            np.testing.assert_array_equal(ts.info.metrics.fast, present & (speed > SPEED))
            seen |= np.asarray(ts.info.metrics.fast) & active
            np.testing.assert_array_equal(state.episode.fast, seen)  # no episode ended yet
        assert seen.any()

        # An evaluator: a rate over ego agent-episodes and a count per episode record.
        policy = Policy.for_env(PolicyConfig(kind="mlp", model_dim=16, token_dim=8), env)
        params = policy.init(jax.random.key(0), jax.tree.map(
            lambda x: x.reshape((-1,) + x.shape[2:]), ts.obs))
        spec = load_suite_specs({"eval": {"m": {"type": "multi_scenario", "num_scenarios": 3,
                                                "batch_size": 2}}},
                                env_config, ProceduralConfig.from_dict(PROCEDURAL))
        (ev,) = make_evaluators(spec.values())
        r = ev.run(policy, params)
        assert r.status == "ok", r.error
        fasts = sum(e["fasts"] for e in r.episodes)
        assert r.metrics["fast_rate"] == pytest.approx(
            fasts / sum(e["ego_agents"] for e in r.episodes))
        assert r.per_scenario["fasts"] == [e["fasts"] for e in r.episodes]

        # The trainer: its per-agent EMA of the new rate is logged as train/fast_rate.
        config = RunConfig.from_dict({
            "env": ENV, "procedural": PROCEDURAL, "validation": {"every": 0},
            "policy": {"kind": "mlp", "model_dim": 16, "token_dim": 8},
            "train": {"num_scenes": 3, "num_envs": 2, "rollout_steps": 10, "epochs": 1,
                      "minibatches": 1}})
        ppo = PPO(config, env, policy)
        state = ppo.init(jax.random.key(0), env_params)
        state, metrics = jax.jit(ppo.train_step)(state, env_params)
        assert "train/fast_rate" in metrics
        # Episodes of 8 steps ended within the 10-step rollout: the rate has data.
        assert 0.0 <= float(metrics["train/fast_rate"]) <= 1.0

    # Unregistered again: a new env no longer computes it.
    assert "fast" not in [m.name for m in Env(env_config).metrics]


def test_registry_refuses_duplicates_and_bad_declarations():
    names = [m.name for m in registry.metrics()]
    assert names[:6] == ["goal_reached", "collided", "offroad", "goal_distance", "progress",
                         "ran_red_light"]
    assert registry.report_names() == ("goal_rate", "collision_rate", "offroad_rate",
                                       "red_light_rate", "episode_return", "episode_length")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Metric("collided", _fast))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Metric("other", _fast, reduce="any", rate="goal_rate", count="x"))
    with pytest.raises(ValueError, match="reserved"):
        registry.register(Metric("x", _fast, reduce="sum", rate="episode_return", count="y"))
    with pytest.raises(ValueError, match="reduce"):
        Metric("x", _fast, reduce="mean", rate="r", count="c")
    with pytest.raises(ValueError, match="rate and a count"):
        Metric("x", _fast, reduce="any")
    with pytest.raises(KeyError):
        registry.unregister("nope")
    assert [m.name for m in registry.metrics()] == names

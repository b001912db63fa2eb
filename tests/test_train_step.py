"""The jitted PPO step's internals on tiny shapes: the training path sees exactly what the
rollout saw (transformer memory across segments), frozen co-players act from their own
policy and are never trained on."""

import jax
import jax.numpy as jnp
import numpy as np
from policy_inputs import random_obs

from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import RunConfig
from jaxdrive.telemetry import ema
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env

BASE = {
    "env": {"scenario": {"max_agents": 4}, "collision_behavior": "remove",
            "goal_behavior": "trial", "num_trials": 2, "trial_timeout": 6,
            "observation": {"num_partners": 3, "num_road": 20},
            "road_index": {"road_per_cell": 20, "grid_size": 8}},
    "procedural": {"num_agents": [3, 4], "topology": {"straight": 1.0, "curve": 1.0,
                                                      "t_junction": 0.0, "intersection": 0.0}},
    "policy": {"kind": "transformer", "model_dim": 16, "token_dim": 8, "horizon": 16},
    "train": {"seed": 5, "num_scenes": 2, "num_envs": 3, "rollout_steps": 7, "epochs": 1,
              "minibatches": 1},
    "validation": {"every": 0},
}


def _ppo(co_player_fraction=0.0, co_players=(), kind="transformer"):
    data = {**BASE, "env": {**BASE["env"], "co_player_fraction": co_player_fraction},
            "policy": {**BASE["policy"], "kind": kind}}
    config = RunConfig.from_dict(data)
    env, env_params = build_env(config, 0, 2)
    policy = Policy.for_env(config.policy, env)
    return PPO(config, env, policy, co_players), env_params


def test_sequence_path_reproduces_rollout_outputs_across_segments():
    ppo, env_params = _ppo()
    state = ppo.init(jax.random.key(0), env_params)
    # No weakly typed leaf: a checkpoint restores strong types, and a weak leaf would
    # make the resumed run retrace and recompile its step.
    weak = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(state)
            if getattr(x, "weak_type", False)]
    assert not weak, weak
    rollout = jax.jit(lambda s: ppo._rollout(s, env_params))

    @jax.jit
    def replay(params, cache, traj):
        rows = lambda x: jnp.swapaxes(x, 0, 1)
        out = ppo.policy.sequence(params, cache, jax.tree.map(rows, traj.obs),
                                  rows(traj.first), rows(traj.removed))
        logp = ppo.policy.distribution(out).log_prob(rows(traj.action))
        return rows(logp), rows(out.value)

    # Three segments of 7 steps over 2 trials of 6 steps: episodes straddle segments,
    # so segments 2 and 3 start with memory in the cache.
    saw_carry_over = False
    for _ in range(3):
        cache0 = state.cache
        saw_carry_over |= bool(jnp.any(cache0.next_pos > 0))
        state, traj, _ = rollout(state)
        logp, value = replay(state.params, cache0, traj)
        valid = np.asarray(traj.valid)
        assert valid.sum() > 10
        np.testing.assert_allclose(np.asarray(logp)[valid], np.asarray(traj.logp)[valid],
                                   atol=2e-5)
        np.testing.assert_allclose(np.asarray(value)[valid], np.asarray(traj.value)[valid],
                                   atol=2e-5)
    assert saw_carry_over
    # Trial mode: per-trial scores are tracked per env (2 trials of 6 steps done).
    scores = ema.emit(state.trial_ema)
    assert set(scores) == {"trial_0_score", "trial_1_score", "slots_with_data"}
    assert scores["slots_with_data"] > 0


def test_frozen_co_players_act_from_their_policy_and_are_never_trained_on():
    learner, env_params = _ppo(co_player_fraction=0.5, kind="mlp")
    frozen_policy = learner.policy
    # init reads only the observation's shapes (one env's agents): drawn on the host, not
    # by an env reset run op by op.
    c = learner.env.config
    o = c.observation
    params = frozen_policy.init(jax.random.key(9), random_obs(
        jax.random.key(0), (c.scenario.max_agents,), o.num_partners, o.num_road,
        num_lights=o.num_lights))
    # A frozen partner that always picks action 7: a huge bias on that logit.
    bias = params["params"]["pi_out"]["bias"]
    params["params"]["pi_out"]["bias"] = bias.at[7].set(1e4)
    ppo, _ = _ppo(co_player_fraction=0.5, co_players=[(frozen_policy, params)], kind="mlp")
    state = ppo.init(jax.random.key(1), env_params)
    _, traj, _ = jax.jit(lambda s: ppo._rollout(s, env_params))(state)
    co = np.asarray(state.env_state.co_player).reshape(-1)  # roles at the first step
    ego = np.asarray(state.env_state.ego).reshape(-1)
    active = np.asarray(state.timestep.active).reshape(-1)
    assert (co & active).any() and (ego & active).any()
    action0 = np.asarray(traj.action[0])
    assert np.all(action0[co & active] == 7)
    assert not np.all(action0[ego & active] == 7)
    valid0 = np.asarray(traj.valid[0])
    assert not valid0[co].any()  # never trained on
    assert np.array_equal(valid0, ego & active)

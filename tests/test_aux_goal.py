"""The auxiliary goal loss (``policy.aux_goal``, ``train.aux_goal_coef``): a training-only
head that predicts the goal rows of the ego features, which ``observation.goal: hidden``
keeps out of the observation.

- ``goal_features`` equal the goal rows a visible-goal observation writes (to rounding),
  and hidden observations still hold zeros there.
- The head with weight 0 changes nothing: one PPO iteration's shared parameters and
  metrics are bit-identical to those of a policy without it (the head's own parameters
  are left alone).
- With a weight, the loss is the PPO loss plus weight x the mean over valid steps of
  the squared prediction error (computed here in NumPy from the policy's outputs), the
  targets are the true goal rows (distance = |(x, y)|) while the observation's rows
  are 0, and a weight of 0 in the config is refused when the head is missing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden_cases import PPO_BASE

from jaxdrive.config import ConfigError, merge
from jaxdrive.env import Env
from jaxdrive.env.observation import GOAL_FEATURES, goal_features
from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import RunConfig
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env


def _config(**overrides) -> RunConfig:
    data = merge(PPO_BASE, {"env": {"co_player_fraction": 0.0,
                                    "observation": {"goal": "hidden"}},
                            "policy": {"kind": "mlp"}})
    return RunConfig.from_dict(merge(data, overrides))


def _ppo(config: RunConfig):
    env, env_params = build_env(config, 0, 2)
    ppo = PPO(config, env, Policy.for_env(config.policy, env))
    return ppo, env_params, ppo.init(jax.random.key(0), env_params)


def test_goal_features_equal_the_visible_rows():
    config = _config()
    env_h, params = build_env(config, 0, 2)
    # The same scenes (env params do not depend on the observation settings).
    env_v = Env(config.env.replace(observation=config.env.observation.replace(
        goal="visible")))
    reset = lambda env, p: env.reset_batch(p, jax.random.key(1), 3)
    state, ts_h = jax.jit(reset, static_argnums=0)(env_h, params)
    _, ts_v = jax.jit(reset, static_argnums=0)(env_v, env_v.make_params(params.pool))
    rows = np.asarray(jax.jit(jax.vmap(lambda a, g: jnp.stack(
        goal_features(config.env.observation, a, g), -1)))(state.agents, state.goal))
    ego_v, ego_h = np.asarray(ts_v.obs.ego), np.asarray(ts_h.obs.ego)
    # Equal up to float32 rounding (XLA fuses the two programs differently); 1e-6 x
    # goal_scale is 0.1 mm.
    np.testing.assert_allclose(rows, ego_v[..., list(GOAL_FEATURES)], rtol=1e-6, atol=1e-6)
    assert np.all(ego_h[..., list(GOAL_FEATURES)] == 0.0)
    assert np.any(rows[..., 2] > 0.0)


@pytest.mark.slow  # two PPO compiles; the PPO goldens already pin the default (no head)
def test_head_with_weight_zero_changes_nothing():
    outs = []
    for head in (False, True):
        ppo, env_params, state = _ppo(_config(policy={"aux_goal": head}))
        state, metrics = jax.jit(ppo.train_step)(state, env_params)
        outs.append((jax.device_get(state.params), jax.device_get(metrics)))
    (p0, m0), (p1, m1) = outs
    assert m0.keys() == m1.keys() and "loss/aux_goal" not in m1
    for k in m0:
        np.testing.assert_array_equal(m0[k], m1[k], err_msg=k)
    inner0, inner1 = p0["params"], p1["params"]
    assert set(inner1) - set(inner0) == {"aux_hidden", "aux_out"}
    jax.tree.map(np.testing.assert_array_equal, inner0, {k: inner1[k] for k in inner0})


def test_aux_loss_is_the_weighted_mean_squared_goal_error():
    config = _config(policy={"aux_goal": True}, train={"aux_goal_coef": 2.0})
    ppo, env_params, state = _ppo(config)
    cache0 = state.cache
    _, traj, _ = jax.jit(ppo._rollout)(state, env_params)
    to_rows = lambda x: np.swapaxes(np.asarray(x), 0, 1)
    valid = to_rows(traj.valid)
    target = to_rows(traj.aux_goal_target)  # (N, T, 3)
    ego = to_rows(traj.obs.ego)
    assert valid.any() and np.all(ego[..., list(GOAL_FEATURES)] == 0.0)
    np.testing.assert_allclose(target[..., 2], np.hypot(target[..., 0], target[..., 1]),
                               rtol=1e-5)
    assert np.all(target[valid][:, 2] > 0.0)
    mb = {"obs": jax.tree.map(to_rows, traj.obs), "first": to_rows(traj.first),
          "removed": to_rows(traj.removed), "action": to_rows(traj.action),
          "logp": to_rows(traj.logp), "value": to_rows(traj.value),
          "advantages": np.zeros_like(valid, np.float32),
          "returns": to_rows(traj.value), "valid": valid, "computed": to_rows(traj.computed),
          "aux_goal_target": target}
    # The loss and the policy's outputs, jitted together (one compile; op by op the
    # sequence dispatches hundreds of small kernels).
    (total, stats), out = jax.jit(lambda p, c, mb: (ppo._loss(p, c, mb), ppo.policy.sequence(
        p, c, mb["obs"], mb["first"], mb["removed"])))(state.params, cache0, mb)
    err = np.sum(np.square(np.asarray(out.aux_goal, np.float64) - target), axis=-1)
    expected = err[valid].mean()
    np.testing.assert_allclose(float(stats.aux_goal), expected, rtol=1e-5)
    ppo_only = float(stats.policy) + 0.5 * float(stats.value) - 0.01 * float(stats.entropy)
    np.testing.assert_allclose(float(total), ppo_only + 2.0 * expected, rtol=1e-5,
                               atol=1e-7)


def test_weight_without_head_is_refused():
    with pytest.raises(ConfigError, match="aux_goal"):
        _config(train={"aux_goal_coef": 1.0})

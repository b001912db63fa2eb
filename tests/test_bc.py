"""Behaviour cloning (issue 38, item 3; ``train.objective: bc``): the loss against
hand-computed values, and the BC rollout drives the learner's agents by the expert
(``log_replay``, inverse dynamics of the logs) and labels exactly the steps whose log has
a next state, against an independent rollout of the controller."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import BASE

from jaxdrive.agents.controllers import log_replay
from jaxdrive.config import ConfigError
from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import RunConfig
from jaxdrive.train.losses import bc_loss
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env


def test_bc_loss_is_the_mean_nll_over_valid_steps():
    logp = jnp.array([[-1.0, -2.0], [-0.5, jnp.nan]])
    entropy = jnp.array([[1.0, 2.0], [3.0, jnp.inf]])
    mask = jnp.array([[True, True], [True, False]])
    total, stats = bc_loss(logp, entropy, mask)
    assert float(total) == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    assert float(stats.entropy) == pytest.approx(2.0) and float(stats.valid_steps) == 3
    # Masked garbage reaches neither the loss nor its gradient; each valid step's
    # gradient is -1 / (valid steps).
    grad = jax.grad(lambda x: bc_loss(x, entropy, mask)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad), [[-1 / 3, -1 / 3], [-1 / 3, 0.0]])
    # A categorical check: the NLL of the expert's action under softmax logits.
    logits = jnp.log(jnp.array([0.5, 0.25, 0.25]))
    nll, _ = bc_loss(jax.nn.log_softmax(logits)[jnp.array([1])], jnp.zeros(1),
                     jnp.ones(1, bool))
    assert float(nll) == pytest.approx(np.log(4.0))


def test_objective_and_regularisation_keys_are_checked():
    with pytest.raises(ConfigError, match="objective"):
        RunConfig.from_dict({"train": {"objective": "bce"}})
    with pytest.raises(ConfigError, match="'bc_kl_coef' = 0.1 needs 'bc_policy'"):
        RunConfig.from_dict({"train": {"bc_kl_coef": 0.1}})
    with pytest.raises(ConfigError, match="with objective: bc set it to 0"):
        RunConfig.from_dict({"train": {"bc_kl_coef": 0.1, "bc_policy": "r",
                                       "objective": "bc"}})
    with pytest.raises(ConfigError, match="bc_kl_coef"):
        RunConfig.from_dict({"train": {"bc_kl_coef": 1.0, "bc_policy": "r"}})


def test_bc_rollout_drives_by_the_expert_and_labels_where_the_log_continues():
    data = {**BASE, "policy": {**BASE["policy"], "kind": "mlp"},
            "env": {**BASE["env"], "goal_behavior": "stop",
                    "dynamics": {"action_space": "continuous"}},
            "train": {**BASE["train"], "objective": "bc"}}
    data["env"] = {k: v for k, v in data["env"].items()
                   if k not in ("num_trials", "trial_timeout")}
    config = RunConfig.from_dict(data)
    env, env_params = build_env(config, 0, 2)
    ppo = PPO(config, env, Policy.for_env(config.policy, env))
    # A gap in one object's log: object 1's logged state at step init_step + 3 is invalid.
    init = env.config.init_step
    obj = env_params.pool.scenarios.objects
    objects = obj.replace(valid=obj.valid.at[:, 1, init + 3].set(False))
    env_params = env_params.replace(pool=env_params.pool.replace(
        scenarios=env_params.pool.scenarios.replace(objects=objects)))
    state = ppo.init(jax.random.key(0), env_params)
    _, traj, _ = jax.jit(ppo._rollout)(state, env_params)

    # Independently: the controller alone drives the same envs from the same state.
    expert = jax.vmap(log_replay(env), in_axes=(None, 0, 0, 0))
    keys = jax.random.split(jax.random.key(1), ppo.num_envs)
    steps = config.train.rollout_steps

    @jax.jit
    def reference(s, ts):
        def body(c, _):
            s, ts = c
            a = expert(env_params, s, ts, keys)
            return env.step_batch(env_params, s, a), (a, s.trial_step, s.scenario_id,
                                                      ts.active & s.ego, s.ego)
        return jax.lax.scan(body, (s, ts), None, length=steps)[1]

    actions, trial_step, sid, acting, ego = jax.device_get(
        reference(state.env_state, state.timestep))
    # The learner's rows act as the expert (other rows hold no vehicle of the learner).
    ego = ego.reshape(steps, -1)
    expert_actions = actions.reshape((steps, -1) + actions.shape[3:])[ego]
    np.testing.assert_array_equal(np.asarray(traj.action)[ego], expert_actions)
    # Not a constant: the expert corrects each step's small drift (a sampled Beta
    # action would be of order 1).
    assert len(np.unique(expert_actions)) > 10 and np.abs(expert_actions).max() < 0.01
    valid = np.asarray(objects.valid)  # (scenes, A, log steps)
    a = env.config.scenario.max_agents
    nxt = init + trial_step[..., None] + 1  # (T, B, 1)
    labelled = valid[sid[..., None], np.arange(a), np.broadcast_to(nxt, acting.shape)]
    expected = acting & labelled
    np.testing.assert_array_equal(np.asarray(traj.valid), expected.reshape(steps, -1))
    gap = acting[:, :, 1] & (trial_step == 2)  # object 1 acting just before its gap
    assert gap.any() and not expected[:, :, 1][gap].any()
    assert expected.sum() > 0.8 * acting.sum()  # the gap is the only unlabelled kind


@pytest.mark.slow  # a training run of its own (one more compiled PPO step)
def test_bc_training_fits_the_expert(tmp_path):
    """12 iterations of ``objective: bc`` on the tiny training config: the NLL of the
    expert's actions falls from about log(91) (the uniform 7 x 13 grid) to near 0."""
    import json

    from test_train_run import TINY

    from jaxdrive.train import run

    data = json.loads(json.dumps(TINY))
    data["train"].update(objective="bc", total_steps=12 * 40, learning_rate=3e-3)
    data["validation"]["every"] = 0
    data["logging"]["output_dir"] = str(tmp_path)
    config = RunConfig.from_dict(data)
    run_dir = run.new_run_dir(config, "bc")
    run.train(config, run_dir, quiet=True)
    nll = [json.loads(line)["loss/policy"] for line in open(run_dir / "metrics.jsonl")]
    assert nll[0] == pytest.approx(np.log(91), abs=0.2)
    assert nll[-1] < 0.1 * nll[0]


def test_kl_of_the_action_distributions_against_independent_values():
    """Categorical: the sum of p log(p / q) by hand; scaled Beta: the closed form against
    a numerical integral of p log(p / q) over the bounds."""
    from jaxdrive.models.distributions import Categorical, ScaledBeta

    p, q = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.25, 0.5])
    kl = Categorical(jnp.log(jnp.asarray(p))).kl(Categorical(jnp.log(jnp.asarray(q))))
    assert float(kl) == pytest.approx(0.5 * np.log(2) + 0.25 * np.log(0.5))
    low, high = jnp.array([-6.0, -0.6]), jnp.array([4.0, 0.6])
    a = ScaledBeta(jnp.array([2.0, 3.5]), jnp.array([5.0, 1.5]), low, high)
    b = ScaledBeta(jnp.array([4.0, 2.0]), jnp.array([2.5, 2.0]), low, high)
    from scipy.special import betaln  # scipy is a dependency of jax

    u = np.linspace(0, 1, 200_001)[1:-1]
    total = 0.0
    for d in range(2):  # per dimension, the scaled densities by their formula in numpy
        x = np.asarray(low[d]) + u * float(high[d] - low[d])

        width = float(high[d] - low[d])
        la, lb = ((float(al) - 1) * np.log(u) + (float(be) - 1) * np.log1p(-u)
                  - betaln(float(al), float(be)) - np.log(width)
                  for al, be in ((a.alpha[d], a.beta[d]), (b.alpha[d], b.beta[d])))
        total += np.trapezoid(np.exp(la) * (la - lb), x)
    assert float(a.kl(b)) == pytest.approx(total, rel=1e-4)
    assert float(a.kl(a)) == pytest.approx(0.0, abs=1e-6)


def test_human_regularised_loss_mixes_ppo_and_the_kl_to_the_reference():
    """(1 - lambda) * the PPO loss + lambda * the mean KL(pi_ref || pi) over valid steps,
    with the KL computed in numpy from both policies' logits."""
    from policy_inputs import random_obs, random_params

    lam = 0.3
    data = {**BASE, "policy": {**BASE["policy"], "kind": "mlp"},
            "env": {k: v for k, v in BASE["env"].items()
                    if k not in ("num_trials", "trial_timeout")},
            "train": {**BASE["train"], "bc_policy": "unused", "bc_kl_coef": lam}}
    config = RunConfig.from_dict(data)
    env, _ = build_env(config, 0, 2)
    policy = Policy.for_env(config.policy, env)
    cfg = env.config.observation
    n, t = 4, 3
    obs = random_obs(jax.random.key(1), (n, t), cfg.num_partners, cfg.num_road,
                     num_lights=cfg.num_lights)
    learner = random_params(policy, obs, jax.random.key(2))
    ref_params = random_params(policy, obs, jax.random.key(3))
    ppo = PPO(config, env, policy, reference=(policy, ref_params))
    plain = PPO(RunConfig.from_dict({**data, "train": BASE["train"]}), env, policy)
    rng = np.random.default_rng(4)
    valid = rng.random((n, t)) < 0.7
    mb = {"obs": obs, "first": np.zeros((n, t), bool), "removed": np.zeros((n, t), bool),
          "action": rng.integers(0, env.num_actions, (n, t)).astype(np.int32),
          "logp": rng.normal(-4, 0.1, (n, t)).astype(np.float32),
          "value": rng.normal(size=(n, t)).astype(np.float32),
          "advantages": rng.normal(size=(n, t)).astype(np.float32),
          "returns": rng.normal(size=(n, t)).astype(np.float32),
          "valid": valid, "computed": valid}
    loss = jax.jit(lambda p: ppo._loss(p, None, mb))
    hr_total, hr_stats = loss(learner)
    ppo_total, _ = jax.jit(lambda p: plain._loss(p, None, mb))(learner)
    logits = lambda params: np.asarray(policy.distribution(policy.sequence(
        params, None, obs, mb["first"], mb["removed"])).logits, np.float64)
    lp, lq = (x - np.log(np.exp(x).sum(-1, keepdims=True))
              for x in (logits(ref_params), logits(learner)))
    kl = (np.exp(lp) * (lp - lq)).sum(-1)[valid].mean()
    assert float(hr_stats.bc_kl) == pytest.approx(kl, rel=1e-4)
    assert float(hr_total) == pytest.approx((1 - lam) * float(ppo_total) + lam * kl,
                                            rel=1e-4)

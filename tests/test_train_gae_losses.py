"""GAE with mixed stops (hand-computed) and masked PPO losses."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.train.gae import bootstrap_stop, gae
from jaxdrive.train.losses import normalize_advantages, ppo_loss


def test_gae_hand_computed_with_termination_truncation_and_removal():
    # gamma = lambda = 0.5, so gamma * lambda = 0.25. Columns are agents.
    # Agent 0: terminated on step 1.          Agent 1: truncated on step 0, removed at
    #                                         step 2, removed again after the last step.
    rewards = jnp.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [1.0, 3.0]])
    values = jnp.array([[1.0, 2.0], [2.0, 1.0], [1.0, 3.0], [0.5, 1.0]])
    bootstrap = jnp.array([4.0, 10.0])
    terminated = jnp.array([[False, False], [True, False], [False, False], [False, False]])
    truncated = jnp.array([[False, True], [False, False], [False, False], [False, False]])
    valid = jnp.array([[True, True], [True, True], [True, False], [True, True]])
    stop = bootstrap_stop(terminated, truncated, valid, jnp.array([True, False]))
    # Agent 0: stop only at t=1. Agent 1: t=0 (truncated), t=1 (step 2 removed),
    # t=3 (after the last step removed).
    np.testing.assert_array_equal(stop, [[False, True], [True, True], [False, False],
                                         [False, True]])
    adv, ret = gae(rewards, values, bootstrap, stop, gamma=0.5, lam=0.5)
    # Agent 0 deltas: 1 + .5*2 - 1 = 1; 0 - 2 = -2 (stop); 2 + .5*.5 - 1 = 1.25;
    #   1 + .5*4 - .5 = 2.5. Advantages backwards: 2.5; 1.25 + .25*2.5 = 1.875; -2;
    #   1 + .25*(-2) = 0.5.
    # Agent 1 deltas: 0 - 2 = -2 (stop); 1 - 1 = 0 (stop); 0 + .5*1 - 3 = -2.5;
    #   3 - 1 = 2 (stop). Advantages: 2; -2.5 + .25*2 = -2; 0; -2.
    np.testing.assert_allclose(adv[:, 0], [0.5, -2.0, 1.875, 2.5])
    np.testing.assert_allclose(adv[:, 1], [-2.0, 0.0, -2.0, 2.0])
    np.testing.assert_allclose(ret, adv + values)


def test_ppo_loss_hand_computed():
    # Ratios 1.5 and 0.5 with advantages +1 and -1, clip 0.2: surrogates
    # min(1.5, 1.2) = 1.2 and min(-0.5, -0.8) = -0.8 -> policy loss -(1.2 - 0.8)/2 = -0.2.
    # approx KL = mean((r - 1) - log r) = ((0.5 - ln 1.5) + (-0.5 - ln 0.5)) / 2.
    # The third step is masked and holds garbage.
    logp = jnp.array([np.log(1.5), np.log(0.5), np.nan])
    zeros = jnp.zeros(3)
    mask = jnp.array([True, True, False])
    total, s = ppo_loss(logp, zeros, jnp.array([1.0, -1.0, jnp.inf]),
                        jnp.array([1.0, 3.0, jnp.nan]), zeros, jnp.array([0.0, 1.0, 5.0]),
                        jnp.array([0.5, 1.5, jnp.inf]), mask, clip_eps=0.2, value_coef=0.5,
                        entropy_coef=0.01)
    np.testing.assert_allclose(s.policy, -0.2, rtol=1e-6)
    np.testing.assert_allclose(s.value, 0.5 * (1.0 + 4.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(s.entropy, 1.0, rtol=1e-6)
    np.testing.assert_allclose(s.approx_kl, ((0.5 - np.log(1.5)) + (-0.5 - np.log(0.5))) / 2,
                               rtol=1e-5)
    np.testing.assert_allclose(s.clip_fraction, 1.0)
    np.testing.assert_allclose(total, -0.2 + 0.5 * 1.25 - 0.01 * 1.0, rtol=1e-6)
    assert float(s.valid_steps) == 2


def test_masked_steps_change_no_loss_and_no_gradient():
    k = jax.random.split(jax.random.key(0), 8)
    shape = (4, 6)
    mask = jax.random.uniform(k[0], shape) < 0.6
    inputs = [jax.random.normal(k[i], shape) for i in range(1, 8)]
    inputs[6] = jnp.abs(inputs[6])  # entropy

    def loss(logp, old_logp, adv, values, old_values, returns, entropy):
        return ppo_loss(logp, old_logp, adv, values, old_values, returns, entropy, mask,
                        value_clip_eps=0.3)[0]

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 3, 6)))
    l1, g1 = grad(*inputs)
    garbage = [jnp.where(mask, x, v) for x, v in
               zip(inputs, [jnp.nan, 7.0, jnp.inf, -jnp.inf, 3.0, jnp.nan, 1e30], strict=True)]
    l2, g2 = grad(*garbage)
    np.testing.assert_array_equal(l1, l2)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_array_equal(a, b)
        assert (np.asarray(a)[~np.asarray(mask)] == 0).all()
        assert np.abs(np.asarray(a)[np.asarray(mask)]).max() > 0


def test_advantage_normalisation_over_valid_steps_only():
    adv = jnp.array([1.0, 2.0, 3.0, 1000.0])
    mask = jnp.array([True, True, True, False])
    out = normalize_advantages(adv, mask)
    np.testing.assert_allclose(out[:3], np.array([-1.0, 0.0, 1.0]) / np.sqrt(2 / 3), rtol=1e-5)
    assert float(out[3]) == 0.0

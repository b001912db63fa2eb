"""Train/rollout parity of the transformer policy: ``sequence`` equals stepping.

One batch holds every segment shape the acceptance asks for (rows below), run once per
horizon H (shorter and longer than the segment), so each path compiles once per H.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from policy_inputs import at, random_obs, random_params

from jaxdrive.models import Policy, PolicyConfig

T = 12
PREFIX = 7  # steps run before the segment, so that rows continue an earlier episode
# Rows: (first steps, removed steps) within the segment.
ROWS = [
    ((), ()),  # the episode began in an earlier segment; no boundary
    ((0,), (3, 4, 5)),  # one episode, a removed stretch inside
    ((0, 5), (2, 7, 8)),  # two episodes
    ((0, 4, 8), (4, 5, 10)),  # three episodes, a removed first step
    ((6,), (0, 1, 2)),  # earlier episode (removed at the start), then a new one
    ((0,), tuple(range(T))),  # removed throughout
]
B = len(ROWS)
_PARAMS = {}  # drawn once per head kind


def masks():
    first = np.zeros((B, T), bool)
    removed = np.zeros((B, T), bool)
    for b, (f, r) in enumerate(ROWS):
        first[b, list(f)] = True
        removed[b, list(r)] = True
    return jnp.asarray(first), jnp.asarray(removed)


def setup(horizon, discrete=True, layers=2):
    cfg = PolicyConfig(horizon=horizon, num_layers=layers, token_dim=16, model_dim=32)
    if discrete:
        policy = Policy(cfg, num_actions=9)
    else:
        policy = Policy(cfg, action_low=[-2.0, -0.5], action_high=[2.0, 0.5])
    obs = random_obs(jax.random.key(horizon), (B, T))
    if (discrete, layers) not in _PARAMS:  # the horizon does not change the parameters
        _PARAMS[discrete, layers] = random_params(policy, at(obs, 0), jax.random.key(2))
    params = _PARAMS[discrete, layers]
    # Context: PREFIX steps of an episode that starts before the segment, with a
    # removed step in it.
    pre = random_obs(jax.random.key(3), (B, PREFIX))
    step = jax.jit(policy.step)
    cache = policy.init_cache(B)
    for t in range(PREFIX):
        cache = step(params, cache, at(pre, t), jnp.full((B,), t == 0),
                     jnp.full((B,), t == 2))[1]
    return policy, params, obs, cache, step


def run_steps(step, params, cache, obs, first, removed):
    outs = []
    for t in range(T):
        out, cache = step(params, cache, at(obs, t), first[:, t], removed[:, t])
        outs.append(out)
    return jax.tree.map(lambda *x: jnp.stack(x, axis=1), *outs), cache


# H shorter and longer than PREFIX + T; both action heads. Slow-marked for the CI budget:
# tests/test_train_step.py checks the sequence path against the rollout in the default run.
@pytest.mark.parametrize("horizon, discrete",
                         [pytest.param(4, True, marks=pytest.mark.slow),
                          pytest.param(32, False, marks=pytest.mark.slow)])
def test_sequence_matches_step_by_step(horizon, discrete):
    policy, params, obs, context, step = setup(horizon, discrete)
    first, removed = masks()
    stepped, _ = run_steps(step, params, context, obs, first, removed)
    seq = jax.jit(policy.sequence)(params, context, obs, first, removed)
    keep = np.asarray(~removed)
    assert keep.sum() > B * T // 2
    d_step, d_seq = np.asarray(stepped.dist), np.asarray(seq.dist)
    assert np.abs(d_step).max() > 0.1  # outputs are not trivially small
    np.testing.assert_allclose(d_seq[keep], d_step[keep], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(seq.value)[keep], np.asarray(stepped.value)[keep],
                               atol=1e-5, rtol=1e-5)
    assert np.isfinite(d_seq).all() and np.isfinite(d_step).all()


@pytest.mark.slow  # ~60 s; CI's 15-minute budget (run with -m slow)
def test_removed_observations_change_nothing_and_get_zero_gradient():
    policy, params, obs, context, step = setup(8)
    first, removed = masks()
    noise = random_obs(jax.random.key(9), (B, T))
    r = removed[..., None]
    swapped = jax.tree.map(
        lambda x, y: jnp.where(r.reshape(r.shape + (1,) * (x.ndim - 3)), y, x), obs, noise)
    keep = np.asarray(~removed)
    seq = jax.jit(policy.sequence)
    a, b = seq(params, context, obs, first, removed), seq(params, context, swapped, first,
                                                           removed)
    np.testing.assert_array_equal(np.asarray(a.dist)[keep], np.asarray(b.dist)[keep])
    np.testing.assert_array_equal(np.asarray(a.value)[keep], np.asarray(b.value)[keep])
    # The step path too: the garbage slots hold different keys, same outputs.
    sa, _ = run_steps(step, params, context, obs, first, removed)
    sb, _ = run_steps(step, params, context, swapped, first, removed)
    np.testing.assert_array_equal(np.asarray(sa.dist)[keep], np.asarray(sb.dist)[keep])

    def loss(o):
        out = policy.sequence(params, context, o, first, removed)
        w = (~removed).astype(jnp.float32)
        return jnp.sum(w[..., None] * out.dist) + jnp.sum(w * out.value)

    grads = jax.jit(jax.grad(loss))(obs)
    for g in jax.tree.leaves(grads):
        g = np.asarray(g)
        assert (g[np.asarray(removed)] == 0).all()
        assert np.abs(g[keep]).max() > 0  # the check is not vacuous


def test_no_nan_under_random_masks_and_fully_removed_prefix():
    # One decoder layer: the masking under test is per layer, and half the compilation.
    policy, params, obs, context, step = setup(5, layers=1)
    seq = jax.jit(policy.sequence)
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)  # NumPy: no random kernel to compile
        first = jnp.asarray(rng.random((B, T)) < 0.2)
        removed = jnp.asarray(rng.random((B, T)) < 0.5)
        out = seq(params, context, obs, first, removed)
        assert np.isfinite(np.asarray(out.dist)).all() and np.isfinite(np.asarray(out.value)).all()
    # Row 5 of ROWS is removed at every step from its episode's start.
    first, removed = masks()
    stepped, _ = run_steps(step, params, context, obs, first, removed)
    assert np.isfinite(np.asarray(stepped.dist[5])).all()

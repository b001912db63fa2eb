"""Policy heads, distributions, the MLP baseline, bfloat16 and config errors."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from policy_inputs import at, random_obs, random_params

from jaxdrive.config import ConfigError
from jaxdrive.models import Policy, PolicyConfig
from jaxdrive.models.distributions import Categorical, ScaledBeta


def test_categorical_hand_computed():
    # logits log([1, 2, 1]) -> p = [0.25, 0.5, 0.25]; entropy = 1.5 ln 2.
    @jax.jit  # one compile, not one per operation
    def stats(logits, key):
        d = Categorical(logits)
        return d.log_prob(jnp.array([1])), d.entropy(), d.mode(), d.sample(key)

    log_prob, entropy, mode, s = stats(np.log(np.array([[1.0, 2.0, 1.0]], np.float32)),
                                       jax.random.key(0))
    np.testing.assert_allclose(log_prob, [np.log(0.5)], rtol=1e-6)
    np.testing.assert_allclose(entropy, [1.5 * np.log(2)], rtol=1e-6)
    assert int(mode[0]) == 1
    assert s.dtype == jnp.int32 and s.shape == (1,)


def test_scaled_beta_against_reference_density():
    import scipy.stats

    low, high = np.array([-2.0, 0.0], np.float32), np.array([2.0, 0.5], np.float32)
    alpha, beta = np.array([[2.0, 3.5]], np.float32), np.array([[5.0, 1.5]], np.float32)
    x = np.array([[0.3, 0.1]], np.float32)

    @jax.jit  # the distribution's side: one compile, not one per operation
    def stats(alpha, beta, low, high, x, key):
        d = ScaledBeta(alpha, beta, low, high)
        return d.log_prob(x), d.entropy(), d.sample(key)

    log_prob, entropy, s = stats(alpha, beta, low, high, x, jax.random.key(1))
    # The references in float64 with SciPy and NumPy (nothing to compile).
    lo, hi = low.astype(np.float64), high.astype(np.float64)
    u = (x - lo) / (hi - lo)
    want = (scipy.stats.beta.logpdf(u, alpha, beta) - np.log(hi - lo)).sum(-1)
    np.testing.assert_allclose(log_prob, want, rtol=1e-5)
    # Entropy against numerical integration of -p log p on a fine grid, per dimension.
    grid = np.linspace(1e-5, 1 - 1e-5, 40_001)
    total = 0.0
    for i in range(2):
        xs = lo[i] + grid * (hi[i] - lo[i])
        pdf = scipy.stats.beta.pdf(grid, alpha[0, i], beta[0, i]) / (hi[i] - lo[i])
        total += np.trapezoid(-pdf * np.log(pdf), xs)
    np.testing.assert_allclose(float(entropy[0]), total, rtol=1e-3)
    s = np.asarray(s)
    assert ((s >= low) & (s <= high)).all()




@functools.cache
def rand_obs():
    """(3, 4) random observations, built on first use (not at import); on the host, so
    that slicing them compiles nothing."""
    return jax.tree.map(np.asarray, random_obs(jax.random.key(0), (3, 4)))



@pytest.mark.parametrize("discrete", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_mlp_baseline_same_interface_no_memory(discrete):
    cfg = PolicyConfig(kind="mlp", token_dim=8, model_dim=16)
    policy = (Policy(cfg, num_actions=6) if discrete
              else Policy(cfg, action_low=[-1.0, -1.0], action_high=[1.0, 1.0]))
    params = random_params(policy, at(rand_obs(), 0), jax.random.key(2))
    cache = policy.init_cache(3)
    no = np.zeros((3,), bool)
    step = jax.jit(policy.step)
    out1, cache = step(params, cache, at(rand_obs(), 1), no, no)
    fresh, _ = step(params, policy.init_cache(3), at(rand_obs(), 1), ~no, no)
    np.testing.assert_allclose(out1.dist, fresh.dist, atol=1e-6)  # memoryless
    seq = jax.jit(policy.sequence)(params, cache, rand_obs(), np.zeros((3, 4), bool),
                                   np.zeros((3, 4), bool))
    np.testing.assert_allclose(seq.dist[:, 1], out1.dist, atol=1e-5)

    @jax.jit  # one compile, not one per operation
    def sample(out, key):
        dist = policy.distribution(out)
        a = dist.sample(key)
        return a, dist.log_prob(a)

    a, log_prob = sample(out1, jax.random.key(3))
    assert a.shape == ((3,) if discrete else (3, 2))
    assert np.isfinite(np.asarray(log_prob)).all()


def test_bfloat16_compute_close_to_float32():
    f32 = Policy(PolicyConfig(token_dim=16, model_dim=32), num_actions=5)
    b16 = Policy(PolicyConfig(token_dim=16, model_dim=32, dtype="bfloat16"), num_actions=5)
    # Initialiser-like parameters drawn on the host (no noise: an init's scale), float32.
    params = random_params(f32, at(rand_obs(), 0), jax.random.key(1), scale=0.0)
    first = np.zeros((3, 4), bool)
    first[:, 0] = True
    no = np.zeros((3, 4), bool)
    a = jax.jit(f32.sequence)(params, f32.init_cache(3), rand_obs(), first, no)
    b = jax.jit(b16.sequence)(params, b16.init_cache(3), rand_obs(), first, no)
    assert b.dist.dtype == jnp.float32 and np.isfinite(np.asarray(b.value)).all()
    np.testing.assert_allclose(b.value, a.value, atol=0.1)
    assert b16.init_cache(2).k.dtype == jnp.bfloat16


def test_two_layer_token_embedding_against_hand_computation():
    # relu(W2 relu(W1 x + b1 + E[type]) + b2) per token, with the module's own parameters.
    from jaxdrive.models.encoder import TokenEmbed
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(3, 5, 4)).astype(np.float32)
    types = rng.integers(0, 3, size=(3, 5)).astype(np.int32)
    embed = TokenEmbed(6, 3, layers=2)
    params = embed.init(jax.random.key(1), feats, types)["params"]
    assert set(params) == {"Dense_0", "Embed_0", "Dense_1"}
    p = jax.tree.map(np.asarray, params)
    h = np.maximum(feats @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]
                   + p["Embed_0"]["embedding"][types], 0)
    want = np.maximum(h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"], 0)
    np.testing.assert_allclose(np.asarray(embed.apply({"params": params}, feats, types)),
                               want, rtol=1e-5, atol=1e-6)
    # One layer: the parameters (and so every saved policy) are as they always were.
    one = TokenEmbed(6, 3).init(jax.random.key(1), feats, types)["params"]
    assert set(one) == {"Dense_0", "Embed_0"}
    with pytest.raises(ConfigError, match="token_layers"):
        PolicyConfig.from_dict({"token_layers": 0})


def test_policy_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="kind"):
        PolicyConfig.from_dict({"kind": "lstm"})
    with pytest.raises(ConfigError, match="heads"):
        PolicyConfig.from_dict({"model_dim": 30, "heads": 4})
    with pytest.raises(ConfigError, match="horizon"):
        PolicyConfig.from_dict({"horizon": 0})
    with pytest.raises(ConfigError, match="dtype"):
        PolicyConfig.from_dict({"dtype": "float16"})
    with pytest.raises(ValueError, match="num_actions"):
        Policy(PolicyConfig())


@pytest.mark.slow
def test_bench_policy_cli_writes_records(tmp_path):
    from jaxdrive.bench import cli as bench

    out = tmp_path / "p.json"
    rc = bench.main(["policy", "--policy", "transformer", "--batch", "8", "--partners", "3",
                     "--road-obs", "20", "--seq-len", "4", "--steps", "2", "--repeats", "1",
                     "--set", "model_dim=32", "--set", "token_dim=8", "--json", str(out)])
    assert rc == 0
    (rec,) = json.loads(out.read_text())["records"]
    for key in ("policy", "batch", "params", "step_agent_steps_per_s",
                "sequence_agent_steps_per_s"):
        assert key in rec
    assert rec["policy"] == "transformer" and rec["batch"] == 8 and rec["params"] > 0
    assert rec["config"]["model_dim"] == 32
    assert bench.main(["policy", "--set", "modle_dim=32"]) == 2  # typo: clear error


def test_batched_heads_layout_equals_the_per_head_one():
    """``attention_heads: batched`` (one contraction with a heads axis, for backends
    where that is faster) computes what the per-head loops compute, with the same
    parameters, in the scene encoder and the temporal decoder."""
    cfg = PolicyConfig(token_dim=8, model_dim=16, scene_heads=2, heads=2, horizon=6)
    per_head = Policy(cfg, num_actions=5)
    batched = Policy(cfg.replace(attention_heads="batched"), num_actions=5)
    obs = rand_obs()
    params = random_params(per_head, at(obs, 0), jax.random.key(2))
    first = np.zeros((3, 4), bool)
    first[:, 0] = first[1, 2] = True
    removed = np.zeros((3, 4), bool)
    removed[2, 1] = True
    a = jax.jit(per_head.sequence)(params, per_head.init_cache(3), obs, first, removed)
    b = jax.jit(batched.sequence)(params, batched.init_cache(3), obs, first, removed)
    assert np.abs(np.asarray(a.dist)).max() > 0.1
    np.testing.assert_allclose(b.dist, a.dist, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(b.value, a.value, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="attention_heads"):
        PolicyConfig(attention_heads="heads")

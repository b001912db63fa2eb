"""The policy's per-agent KV cache: independent resets, positions across trials and
episodes, retracing, jit and vmap."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
from policy_inputs import at, random_obs, random_params
from scenes import straight_road

from jaxdrive.env import Env, EnvConfig
from jaxdrive.models import Policy, PolicyConfig
from jaxdrive.models.policy import policy_inputs
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool

CFG = PolicyConfig(horizon=6, num_layers=1, token_dim=16, model_dim=32)
N = 4
POLICY = Policy(CFG, num_actions=5)


@functools.cache
def rand_obs():
    """(N, 9) random observations; built on first use, not at import (pytest-xdist
    workers import every test module). On the host: slicing them compiles nothing."""
    return jax.tree.map(np.asarray, random_obs(jax.random.key(0), (N, 9)))


@functools.cache
def policy_params():
    return random_params(POLICY, at(rand_obs(), 0), jax.random.key(2))


STEP = jax.jit(chex.assert_max_traces(POLICY.step, n=1))
SEQUENCE = jax.jit(chex.assert_max_traces(POLICY.sequence, n=1))


def warm_cache(steps=8):
    cache = POLICY.init_cache(N)
    for t in range(steps):
        cache = STEP(policy_params(), cache, at(rand_obs(), t), np.full((N,), t == 0),
                     np.arange(N) == t % N)[1]
    return cache


def test_resetting_one_agent_leaves_the_others_unchanged():
    cache = warm_cache()
    none = np.zeros((N,), bool)
    one = none.copy()
    one[1] = True
    out_a, cache_a = STEP(policy_params(), cache, at(rand_obs(), 8), none, none)
    out_b, cache_b = STEP(policy_params(), cache, at(rand_obs(), 8), one, none)
    others = np.array([0, 2, 3])
    np.testing.assert_array_equal(np.asarray(out_a.dist)[others], np.asarray(out_b.dist)[others])
    np.testing.assert_array_equal(np.asarray(out_a.value)[others],
                                  np.asarray(out_b.value)[others])
    assert not np.allclose(np.asarray(out_a.dist)[1], np.asarray(out_b.dist)[1])
    for name in ("pos", "garbage", "next_pos"):
        a, b = np.asarray(getattr(cache_a, name)), np.asarray(getattr(cache_b, name))
        np.testing.assert_array_equal(a[others], b[others])
    np.testing.assert_array_equal(cache_b.next_pos, [9, 1, 9, 9])
    # Agent 1's row holds only its new step: every other slot is empty.
    assert (np.asarray(cache_b.pos[1]) >= 0).sum() == 1


def test_positions_continue_across_trials_and_restart_with_the_episode():
    # Two trials of 3 steps per episode: trial boundaries after env steps 3 and 9, episode
    # ends after steps 6 and 12. Positions must count 0..5 through the trial boundary and
    # restart at 0 only on each episode's first observation.
    sc = ScenarioConfig(max_agents=N, num_steps=31, max_road_points=1024)
    env = Env(EnvConfig.from_dict({
        "scenario": sc.to_dict(), "observation": {"num_partners": 3, "num_road": 7},
        "road_index": {"road_per_cell": 32, "chunk_size": 8, "grid_size": 8},
        "init_step": 0, "goal_behavior": "trial", "num_trials": 2, "trial_timeout": 3,
    }))
    scene = straight_road(sc, [(0, -2, 0, 0, 4.0, 2.0), (-60, 2, 0, 0, 4.0, 2.0)],
                          goals=[(50, -2), (-90, 2)])
    pool = make_pool(jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[None]), scene),
                     env.config.road_index)  # a pool of one scene, stacked on the host
    params = env.make_params(pool)
    state, ts = jax.jit(env.reset_to)(params, jnp.int32(0), jax.random.key(0))
    env_step = jax.jit(env.step)
    cache = POLICY.init_cache(N)
    step = jax.jit(POLICY.step)  # env observations have other sizes than rand_obs()
    seen_pos, trials = [], []
    for _ in range(13):
        first, removed = policy_inputs(ts)
        seen_pos.append(int(cache.reset(first).next_pos[0]))
        trials.append(int(state.trial))
        _, cache = step(policy_params(), cache, ts.obs, first, removed)
        state, ts = env_step(params, state, jnp.zeros((N,), jnp.int32))
    assert trials == [0, 0, 0, 1, 1, 1] * 2 + [0]
    assert seen_pos == [0, 1, 2, 3, 4, 5] * 2 + [0]


def test_jit_vmap_and_single_trace_on_both_paths():
    # vmap over an env axis (E envs x N agents) equals one call on the flattened E*N.
    e = 2
    obs = random_obs(jax.random.key(5), (e, N))
    stack = lambda *c: jax.tree.map(lambda *x: np.stack(x), *c)  # on the host
    caches = stack(warm_cache(3), warm_cache(5))
    first = np.zeros((e, N), bool)
    first[1, 2] = True
    removed = np.zeros((e, N), bool)
    removed[0, 1] = True
    out_v, cache_v = jax.jit(jax.vmap(POLICY.step, in_axes=(None, 0, 0, 0, 0)))(
        policy_params(), caches, obs, first, removed)
    flat = lambda x: np.asarray(x).reshape((e * N,) + x.shape[2:])
    flat_cache = jax.tree.map(lambda x: np.concatenate(list(x), axis=1 if x.ndim == 6 else 0),
                              caches)
    out_f, _ = jax.jit(POLICY.step)(policy_params(), flat_cache, jax.tree.map(flat, obs),
                                    flat(first), flat(removed))  # 2N agents: own compile
    np.testing.assert_allclose(flat(out_v.dist), out_f.dist, atol=1e-6)
    np.testing.assert_allclose(flat(out_v.value), out_f.value, atol=1e-6)
    # Same shapes again: no retrace (assert_max_traces would raise).
    STEP(policy_params(), warm_cache(1), at(rand_obs(), 0), np.ones((N,), bool),
         np.zeros((N,), bool))
    segment = jax.tree.map(lambda x: x[:, :5], rand_obs())
    masks = np.zeros((N, 5), bool)
    starts = masks.copy()
    starts[:, 0] = True
    for _ in range(2):
        out = SEQUENCE(policy_params(), warm_cache(2), segment, starts, masks)
        assert out.dist.shape == (N, 5, 5) and out.value.shape == (N, 5)
    seq_v = jax.jit(jax.vmap(POLICY.sequence, in_axes=(None, 0, 0, 0, 0)))(
        policy_params(), stack(warm_cache(2), warm_cache(2)),
        jax.tree.map(lambda x: np.stack([x, x]), segment), np.stack([masks] * 2),
        np.stack([masks] * 2))
    np.testing.assert_allclose(np.asarray(seq_v.dist)[0], np.asarray(seq_v.dist)[1], atol=1e-5)

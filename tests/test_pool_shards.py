"""``train.pool_shards`` (issue 39, item 2): the envs draw their scenes from their own
shard of the pool, so that a mesh can hold each device's shards only.

On one device: with K shards every env of block k starts and auto-resets only on
scenes of shard k; the setting's checks name the key. That 8 devices with a split pool
train like one device with ``pool_shards: 8`` and hold an eighth of the pool each is
checked on 8 fake devices in test_train_parallel (slow)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden_cases import PPO_BASE

from jaxdrive.config import ConfigError, merge
from jaxdrive.runs.config import RunConfig, TrainConfig
from jaxdrive.train.ppo import _pool_shards

ENVS, SCENES, SHARDS, STEPS = 8, 4, 2, 40


@pytest.fixture(scope="module")
def visited():
    """(STEPS + 1, ENVS) scenario ids of every env from its reset on, episodes of 9
    steps, and (STEPS, ENVS) whether each step ended an episode."""
    from jaxdrive.train.run import build_env

    data = merge(PPO_BASE, {"policy": {"kind": "mlp"}})
    data["env"] = {k: v for k, v in data["env"].items()
                   if k not in ("num_trials", "trial_timeout", "co_player_fraction")}
    data["env"].update(goal_behavior="stop", episode_length=9)
    env, params = build_env(RunConfig.from_dict(data), 0, SCENES)

    @jax.jit
    def run(key):
        state, _ = env.reset_batch(params, key, ENVS, SHARDS)
        action = jnp.zeros((ENVS,) + (env.num_rows,) + env.action_shape, jnp.int32)

        def body(s, _):
            s, ts = env.step_batch(params, s, action, pool_shards=SHARDS)
            return s, (s.scenario_id, ts.info.episode_done)

        _, (ids, ended) = jax.lax.scan(body, state, None, length=STEPS)
        return jnp.concatenate([state.scenario_id[None], ids]), ended

    ids, ended = run(jax.random.key(3))
    return np.asarray(ids), np.asarray(ended)


def test_each_block_of_envs_draws_only_from_its_own_shard(visited):
    ids, ended = visited
    assert ended.sum() >= ENVS * 3  # every env auto-reset several times
    block = np.arange(ENVS) // (ENVS // SHARDS)
    shard = ids // (SCENES // SHARDS)
    np.testing.assert_array_equal(shard, np.broadcast_to(block, ids.shape))
    # Within its shard an env does draw: both scenes of each shard are visited.
    for k in range(SHARDS):
        assert set(ids[:, block == k].ravel()) == set(range(2 * k, 2 * k + 2))


def test_a_new_scene_only_where_an_episode_ended(visited):
    ids, ended = visited
    changed = ids[1:] != ids[:-1]
    assert not (changed & ~ended).any()


def _t(**kw):
    return TrainConfig(**kw)


def test_auto_is_one_shard_per_device_where_pool_and_envs_split():
    mesh = types.SimpleNamespace(size=8)
    pool = (64, "train.num_scenes")
    assert _pool_shards(_t(), pool, 16, None) == 1
    assert _pool_shards(_t(), pool, 16, mesh) == 8
    assert _pool_shards(_t(), (2, "train.num_scenes"), 16, mesh) == 1  # 2 scenes, 8 devices
    assert _pool_shards(_t(), pool, 12, mesh) == 1
    assert _pool_shards(_t(pool_shards=16), pool, 32, mesh) == 16


@pytest.mark.parametrize("value, envs, mesh_size, match", [
    (3, 12, None, r"train.pool_shards' = 3 must divide train.num_scenes = 64"),
    (4, 6, None, r"train.pool_shards' = 4 must divide train.num_envs = 6"),
    (4, 16, 8, r"train.pool_shards' = 4 must be 1 or a multiple of the 8 devices"),
])
def test_a_setting_that_does_not_split_names_the_key(value, envs, mesh_size, match):
    mesh = None if mesh_size is None else types.SimpleNamespace(size=mesh_size)
    with pytest.raises(ConfigError, match=match):
        _pool_shards(_t(pool_shards=value), (64, "train.num_scenes"), envs, mesh)


@pytest.mark.parametrize("value", [0, -2, "all", True, 1.5])
def test_a_value_that_is_not_a_positive_integer_or_auto_is_refused(value):
    with pytest.raises(ConfigError, match="pool_shards"):
        TrainConfig(pool_shards=value)


def test_process_blocks_are_recognised_only_in_process_order(monkeypatch):
    from jaxdrive.train import placement

    mesh = lambda owners: types.SimpleNamespace(devices=np.array(  # noqa: E731
        [types.SimpleNamespace(process_index=p) for p in owners]))
    monkeypatch.setattr(placement.jax, "process_count", lambda: 2)
    assert placement._devices_in_process_order(mesh([0, 0, 1, 1]))
    assert not placement._devices_in_process_order(mesh([0, 1, 0, 1]))
    assert not placement._devices_in_process_order(mesh([1, 1, 0, 0]))
    assert not placement._devices_in_process_order(mesh([0, 0, 0, 0]))

"""``train.shuffle_groups`` (issue 39, item 1): how each epoch's minibatches are drawn.

One group is the one shuffle of all rows that PPO always did (bit for bit); G groups are
shuffled apart and every minibatch takes an equal share of each; gathering a minibatch
group by group equals gathering its global rows; bad settings name the key. That a mesh
keeps each group on its device, and memory per device stays flat, is checked on 8 fake
devices in test_train_parallel (slow)."""

import types

import jax
import numpy as np
import pytest

from jaxdrive.config import ConfigError
from jaxdrive.runs.config import TrainConfig
from jaxdrive.train.ppo import _groups, _shuffle_groups, _take_in_groups, epoch_rows

ROWS, MINIBATCHES = 24, 3


def test_one_group_is_the_single_permutation_ppo_always_drew():
    key = jax.random.key(7)
    want = np.asarray(jax.random.permutation(key, ROWS)).reshape(MINIBATCHES, -1)
    np.testing.assert_array_equal(np.asarray(epoch_rows(key, ROWS, 1, MINIBATCHES)), want)


@pytest.mark.parametrize("groups", [2, 4])
def test_groups_are_shuffled_apart_and_each_minibatch_takes_an_equal_share(groups):
    key = jax.random.key(3)
    rows = np.asarray(epoch_rows(key, ROWS, groups, MINIBATCHES))
    local = np.asarray(epoch_rows(key, ROWS, groups, MINIBATCHES, within_groups=True))
    size = ROWS // groups
    assert rows.shape == (MINIBATCHES, ROWS // MINIBATCHES)
    assert local.shape == (MINIBATCHES, groups, size // MINIBATCHES)
    assert sorted(rows.ravel().tolist()) == list(range(ROWS))  # every row once an epoch
    for mb in range(MINIBATCHES):
        group_of = rows[mb] // size
        assert np.bincount(group_of, minlength=groups).tolist() == \
            [size // MINIBATCHES] * groups
        np.testing.assert_array_equal(rows[mb], (local[mb] + size * np.arange(groups)[:, None])
                                      .ravel())
    # Group g's rows in epoch order: a permutation drawn from its own key.
    keys = jax.random.split(key, groups)
    for g in range(groups):
        np.testing.assert_array_equal(local[:, g].ravel(),
                                      np.asarray(jax.random.permutation(keys[g], size)))


def test_gathering_by_group_equals_gathering_the_global_rows():
    rng = np.random.default_rng(0)
    groups = 4
    rows = np.asarray(epoch_rows(jax.random.key(1), ROWS, groups, MINIBATCHES))
    local = np.asarray(epoch_rows(jax.random.key(1), ROWS, groups, MINIBATCHES,
                                  within_groups=True))
    take = jax.jit(lambda x, i, axis: _take_in_groups(_groups(x, groups, axis), i, axis),
                   static_argnums=2)
    for shape, axis in (((ROWS, 5, 2), 0), ((3, ROWS, 2), 1), ((ROWS, 5, 0), 0)):
        x = rng.standard_normal(shape).astype(np.float32)
        for mb in range(MINIBATCHES):
            got = np.asarray(take(x, local[mb], axis))
            np.testing.assert_array_equal(got, np.take(x, rows[mb], axis=axis))


def test_bad_settings_name_the_key_and_the_fix():
    for bad in ("some", 0, True, 1.5):
        with pytest.raises(ConfigError, match="shuffle_groups"):
            TrainConfig(shuffle_groups=bad)
    t = TrainConfig(minibatches=3)
    assert _shuffle_groups(t, ROWS, None) == 1  # auto on one device
    assert _shuffle_groups(t, ROWS, types.SimpleNamespace(size=4)) == 4
    with pytest.raises(ConfigError, match=r"train.shuffle_groups' = auto \(6 groups\).*"
                                          r"train.minibatches = 3"):
        _shuffle_groups(t, ROWS, types.SimpleNamespace(size=6))  # 4 rows a group
    with pytest.raises(ConfigError, match=r"1 or a multiple of the 4 devices.*auto \(= 4\)"):
        _shuffle_groups(TrainConfig(minibatches=3, shuffle_groups=2), ROWS,
                        types.SimpleNamespace(size=4))
    assert _shuffle_groups(TrainConfig(minibatches=3, shuffle_groups=1), ROWS,
                           types.SimpleNamespace(size=4)) == 1

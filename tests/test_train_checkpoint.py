"""Checkpointer: bit-exact round trips (typed keys included), last-K and best retention,
saves in a background thread."""

import logging
import os
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from jaxdrive.files import OutputError
from jaxdrive.runs.checkpoint import (
    BackgroundSaver,
    Checkpointer,
    find_checkpoints,
    host_snapshot,
)


@jax.jit  # one program for every seed (op by op: dozens of tiny compiles)
def _train_state(seed: int) -> dict:
    """Dense(3 -> 4) params after one adam step, its optimiser state, a typed key, a step."""
    params = nn.Dense(4).init(jax.random.key(seed), jnp.ones((1, 3), jnp.float32))
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.25 + seed), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
            "key": jax.random.key(3 + seed), "step": jnp.asarray(seed, jnp.int32),
            "empty": jnp.zeros((0, 2, 3), jnp.bfloat16)}  # e.g. a memoryless policy's cache


def _assert_trees_equal(restored, expected):
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    for r, e in zip(jax.tree.leaves(restored), jax.tree.leaves(expected), strict=True):
        if jax.dtypes.issubdtype(e.dtype, jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(r.dtype, jax.dtypes.prng_key)
            assert jax.random.key_impl(r) == jax.random.key_impl(e)
            r, e = jax.random.key_data(r), jax.random.key_data(e)
        assert r.dtype == e.dtype and r.shape == e.shape
        np.testing.assert_array_equal(np.asarray(r), np.asarray(e))


def test_round_trip_is_bit_exact_with_typed_key(tmp_path):
    state = _train_state(0)
    metadata = {"config": {"lr": 0.01, "layers": [4]}, "env_steps": 1234, "return": 0.5}
    ckpt = Checkpointer(tmp_path / "checkpoints")
    assert ckpt.save(10, state, metadata) is False  # no best_metric -> never "best"
    assert ckpt.all_steps() == [10] and ckpt.latest_step() == 10

    # A fresh state with other values but the same structure serves as the target.
    restored, meta = Checkpointer(tmp_path / "checkpoints").restore(_train_state(1))
    assert meta == metadata
    _assert_trees_equal(restored, state)
    # One adam step from zero moments: count 1, mu = 0.1 * g = 0.025, nu = 0.001 * g^2.
    adam = restored["opt_state"][0]
    assert adam.count.dtype == jnp.int32 and int(adam.count) == 1
    np.testing.assert_array_equal(adam.mu["params"]["bias"], np.full(4, 0.025, np.float32))
    assert restored["step"].dtype == jnp.int32 and int(restored["step"]) == 0
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]),
                                  jax.random.key_data(jax.random.key(3)))
    # The restored key is a typed key that behaves exactly like the original.
    np.testing.assert_array_equal(jax.random.key_data(jax.random.split(restored["key"])),
                                  jax.random.key_data(jax.random.split(jax.random.key(3))))
    ckpt.close()


def test_keep_last_keeps_the_newest_saves(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        ckpt.save(step, _train_state(0), {"step": step})
    assert ckpt.all_steps() == [3, 4]
    assert sorted(p.name for p in (tmp_path / "last").iterdir()) == ["3", "4"]
    assert ckpt.restore_metadata() == {"step": 4}
    assert ckpt.restore_metadata(step=3) == {"step": 3}
    assert ckpt.all_steps("best") == [] and ckpt.latest_step("best") is None
    ckpt.close()


def test_best_survives_when_older_than_last_k(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=2, best_metric="score")
    became_best = [ckpt.save(step, _train_state(step), {"score": score})
                   for step, score in zip((1, 2, 3, 4), (0.5, 0.9, 0.1, 0.2), strict=True)]
    assert became_best == [True, True, False, False]
    assert ckpt.all_steps() == [3, 4]
    assert ckpt.all_steps("best") == [2] and ckpt.latest_step("best") == 2
    assert ckpt.best_value == 0.9
    state, meta = ckpt.restore(_train_state(0), which="best")
    assert meta == {"score": 0.9}
    _assert_trees_equal(state, _train_state(2))
    ckpt.close()


def test_reopened_directory_keeps_its_best(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=2, best_metric="metrics.return")
    assert ckpt.save(1, _train_state(1), {"metrics": {"return": 3.0}}) is True
    assert ckpt.save(2, _train_state(2), {"metrics": {"return": 1.0}}) is False
    ckpt.close()

    resumed = Checkpointer(tmp_path, keep_last=2, best_metric="metrics.return")
    reader = Checkpointer(tmp_path)  # e.g. an evaluator watching the run
    assert resumed.best_value == 3.0
    assert resumed.save(3, _train_state(3), {"metrics": {"return": 2.0}}) is False
    assert resumed.all_steps("best") == [1]
    assert resumed.save(4, _train_state(4), {"metrics": {"return": 4.0}}) is True
    assert resumed.all_steps("best") == [4] and resumed.all_steps() == [3, 4]
    assert resumed.restore_metadata(which="best") == {"metrics": {"return": 4.0}}
    # Another instance sees the saves made after it was opened.
    assert reader.all_steps() == [3, 4] and reader.latest_step("best") == 4
    assert reader.restore_metadata() == {"metrics": {"return": 4.0}}
    resumed.close()
    reader.close()


def test_best_mode_min_and_non_finite_metrics(tmp_path):
    ckpt = Checkpointer(tmp_path, best_metric="loss", best_mode="min")
    state = _train_state(0)
    results = [ckpt.save(step, state, {"loss": loss})
               for step, loss in zip((1, 2, 3, 4, 5), (2.0, 3.0, float("nan"), 1.5, 1.7),
                                     strict=True)]
    assert results == [True, False, False, True, False]
    assert ckpt.all_steps("best") == [4] and ckpt.best_value == 1.5
    assert ckpt.all_steps() == [3, 4, 5]
    # NaN round-trips through the JSON metadata.
    assert np.isnan(ckpt.restore_metadata(step=3)["loss"])
    ckpt.close()


def test_empty_directory_gives_helpful_errors(tmp_path):
    ckpt = Checkpointer(tmp_path / "nothing")
    assert ckpt.latest_step() is None and ckpt.all_steps() == []
    with pytest.raises(FileNotFoundError, match=r"no checkpoints under .*nothing.last.*"
                                                r"pass a run directory that contains checkpoints/"):
        ckpt.restore(_train_state(0))
    with pytest.raises(FileNotFoundError, match="best_metric"):
        ckpt.restore_metadata(which="best")
    # Restoring from a wrong path creates nothing.
    assert not (tmp_path / "nothing").exists()
    saved = Checkpointer(tmp_path)
    saved.save(1, {"x": jnp.zeros(2, jnp.float32)}, {})
    with pytest.raises(FileNotFoundError, match=r"step 7 .* available steps: \[1\]"):
        saved.restore_raw(step=7)
    saved.close()
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no checkpoints found in .*empty_run: expected "
                                                r"a run directory that contains checkpoints/"):
        find_checkpoints(tmp_path / "empty_run")


def test_restore_raw_and_metadata_without_target(tmp_path):
    state = _train_state(0)
    state["counts"] = np.arange(3, dtype=np.int64)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(5, state, {"config": {"model": {"width": 4}}, "mean_return": np.float32(0.25)})

    fresh = Checkpointer(tmp_path)
    assert fresh.restore_metadata() == {"config": {"model": {"width": 4}}, "mean_return": 0.25}
    raw, meta = fresh.restore_raw(step=5)
    assert meta["config"] == {"model": {"width": 4}}
    assert sorted(raw) == ["counts", "empty", "key", "opt_state", "params", "step"]
    assert raw["empty"].shape == (1,)  # zero-size arrays come back as placeholders
    kernel = raw["params"]["params"]["kernel"]
    assert kernel.shape == (3, 4) and kernel.dtype == np.float32
    np.testing.assert_array_equal(kernel, state["params"]["params"]["kernel"])
    # Typed keys come back as their raw key data.
    assert raw["key"].dtype == np.uint32
    np.testing.assert_array_equal(raw["key"], jax.random.key_data(jax.random.key(3)))
    np.testing.assert_array_equal(raw["counts"], [0, 1, 2])
    assert int(raw["step"]) == 0
    ckpt.close()
    fresh.close()


def test_step_order_and_argument_validation(tmp_path):
    ckpt = Checkpointer(tmp_path, keep_last=3)
    tree = {"x": jnp.arange(3, dtype=jnp.float32)}
    ckpt.save(5, tree, {"v": 1})
    # The same step again (e.g. a final save right after a periodic one) is skipped.
    assert ckpt.save(5, {"x": jnp.zeros(3, jnp.float32)}, {"v": 2}) is False
    assert ckpt.restore_metadata() == {"v": 1}
    with pytest.raises(ValueError, match="older than the latest checkpoint 5"):
        ckpt.save(4, tree, {})
    with pytest.raises(ValueError, match="best_mode"):
        Checkpointer(tmp_path, best_mode="maximum")
    with pytest.raises(ValueError, match="keep_last"):
        Checkpointer(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="which"):
        ckpt.all_steps("first")
    ckpt.close()


def test_restore_refuses_a_target_of_another_shape_or_dtype(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(0, {"w": jnp.ones((2, 3), jnp.float32), "key": jax.random.key(0)}, {})
    with pytest.raises(ValueError, match=r"w: saved float32\[2, 3\], target int32\[2, 3\]"):
        ckpt.restore({"w": jnp.ones((2, 3), jnp.int32), "key": jax.random.key(0)})
    with pytest.raises(ValueError, match=r"w: saved float32\[2, 3\], target float32\[3, 2\]"):
        ckpt.restore({"w": jnp.ones((3, 2), jnp.float32), "key": jax.random.key(0)})
    # An rbg key has 4 words of key data, the default threefry key 2.
    with pytest.raises(ValueError, match=r"key: saved uint32\[2\], target uint32\[4\]"):
        ckpt.restore({"w": jnp.ones((2, 3), jnp.float32), "key": jax.random.key(0, impl="rbg")})
    with pytest.raises(ValueError, match="tree structures do not match"):
        ckpt.restore({"w": jnp.ones((2, 3), jnp.float32)})
    ckpt.close()


def test_find_checkpoints_accepts_run_dir_or_checkpoints_dir(tmp_path):
    ckpt = Checkpointer(tmp_path / "run" / "checkpoints")
    ckpt.save(0, {"x": jnp.ones(1, jnp.float32)}, {})
    ckpt.close()
    expected = tmp_path / "run" / "checkpoints"
    assert find_checkpoints(tmp_path / "run") == expected
    assert find_checkpoints(expected) == expected
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_checkpoints(tmp_path / "missing")


def test_orbax_info_is_dropped_but_its_warnings_pass():
    absl_logger = logging.getLogger("absl")
    orbax_file = os.path.join(os.path.dirname(ocp.__file__), "checkpoint_manager.py")

    def passes(level: int, pathname: str) -> bool:
        record = logging.LogRecord("absl", level, pathname, 1, "msg", None, None)
        return bool(absl_logger.filter(record))

    assert passes(logging.INFO, orbax_file) is False
    assert passes(logging.WARNING, orbax_file) is True
    assert passes(logging.ERROR, orbax_file) is True
    assert passes(logging.INFO, __file__) is True


def test_background_saves_of_host_snapshots_round_trip_and_run_while_the_caller_goes_on(
        tmp_path):
    state = _train_state(0)
    snapshot = host_snapshot(state)  # NumPy only: the device arrays may be donated now
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(snapshot))
    ckpt = Checkpointer(tmp_path / "checkpoints", best_metric="score")
    release, started = threading.Event(), threading.Event()
    save = ckpt.save

    def held_save(*args):  # the write blocks until the caller has moved on
        started.set()
        assert release.wait(timeout=60)
        return save(*args)

    ckpt.save = held_save
    saver = BackgroundSaver(ckpt)
    saver.submit(5, snapshot, {"score": 1.0})
    assert started.wait(timeout=60)
    saver.check()  # not finished: returns at once, raises nothing
    assert ckpt.all_steps() == []  # submit returned before the files were written
    release.set()
    saver.submit(6, host_snapshot(_train_state(2)), {"score": 0.5})  # waits for step 5
    assert 5 in ckpt.all_steps()
    saver.close()
    assert ckpt.all_steps() == [5, 6] and ckpt.latest_step("best") == 5
    restored, meta = Checkpointer(tmp_path / "checkpoints").restore(_train_state(1), step=5)
    assert meta == {"score": 1.0}
    _assert_trees_equal(restored, state)  # typed key and empty leaf included


def test_asynchronous_saves_take_device_state_and_finish_in_the_background(tmp_path,
                                                                          monkeypatch):
    """Issue 39, item 6: how a multi-process job saves in the background (its arrays span
    processes, so no host snapshot): ``submit`` starts orbax's asynchronous save where it
    is called and returns once the arrays are on the host (the device buffers may then be
    donated: here deleted), and the worker finishes it (files, checksum record, pruning,
    best). Its barriers are the coordination service's, a no-op on one process."""
    from jaxdrive.runs import integrity

    ckpt = Checkpointer(tmp_path / "checkpoints", keep_last=1, best_metric="score",
                        asynchronous=True)
    release, started = threading.Event(), threading.Event()
    write_record = integrity.write_record

    def held_record(path):  # the finish blocks until the caller has moved on
        started.set()
        assert release.wait(timeout=60)
        return write_record(path)

    monkeypatch.setattr(integrity, "write_record", held_record)
    saver = BackgroundSaver(ckpt)
    state = _train_state(0)
    saver.submit(5, state, {"score": 1.0})
    for leaf in jax.tree.leaves(state):
        leaf.delete()  # as a donating step would: the save holds its own host copy
    assert started.wait(timeout=60)
    saver.check()  # not finished: returns at once, raises nothing
    assert not (tmp_path / "checkpoints" / "last" / "5" / "checksums.json").exists()
    release.set()
    saver.submit(6, _train_state(2), {"score": 0.5})  # waits for step 5's finish
    saver.close()
    assert ckpt.all_steps() == [6] and ckpt.all_steps("best") == [5]  # keep_last 1
    reader = Checkpointer(tmp_path / "checkpoints")
    restored, meta = reader.restore(_train_state(1), which="best")  # checksums verified
    assert meta == {"score": 1.0}
    _assert_trees_equal(restored, _train_state(0))  # the same program: the same values
    restored, _ = reader.restore(_train_state(1), step=6)
    _assert_trees_equal(restored, _train_state(2))


def test_a_failed_background_save_is_raised_by_the_next_call(tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints")

    def full_disk(*args):
        raise OutputError("could not save the checkpoint: No space left on device")

    ckpt.save = full_disk
    saver = BackgroundSaver(ckpt)
    saver.submit(1, host_snapshot(_train_state(0)), {})
    with pytest.raises(OutputError, match="No space left"):
        saver.wait()
    saver.wait()  # reported once
    saver.submit(2, host_snapshot(_train_state(0)), {})
    saver.close(raise_errors=False)  # another error is being reported: this one is dropped


def test_resume_converts_a_slot_major_kv_cache_and_refuses_other_mismatches(tmp_path):
    """Checkpoints written before the head-major cache (k, v (L, N, S, heads, hd)) restore
    into today's (L, N, heads, S, hd) transposed; any other shape still fails."""
    from flax import struct

    from jaxdrive.models.kv_cache import KVCache
    from jaxdrive.train.run import restore_train_state

    @struct.dataclass
    class State:
        cache: KVCache
        co_caches: tuple
        params: jax.Array

    def cache(shape, seed):
        # Drawn on the host: jax.random.normal would compile a program per shape.
        k = np.random.default_rng(seed).standard_normal(shape, np.float32)
        return KVCache(k=jnp.asarray(k), v=jnp.asarray(2.0 * k),
                       pos=jnp.zeros((2, 5), jnp.int32),
                       garbage=jnp.zeros((2, 5), bool), next_pos=jnp.zeros((2,), jnp.int32))

    old_layout = (1, 2, 5, 3, 4)  # (L, N, S, heads, hd)
    saved = State(cache=cache(old_layout, 0), co_caches=(cache(old_layout, 1),),
                  params=jnp.arange(3.0))
    ckpt = Checkpointer(tmp_path / "checkpoints")
    ckpt.save(1, saved, {"iteration": 1})
    new_layout = (1, 2, 3, 5, 4)
    target = State(cache=cache(new_layout, 2), co_caches=(cache(new_layout, 3),),
                   params=jnp.zeros(3))
    logged = []
    state, meta = restore_train_state(ckpt, target, 1, logged.append)
    assert meta == {"iteration": 1} and len(logged) == 1 and "d61cecb" in logged[0]
    for got, want in ((state.cache, saved.cache), (state.co_caches[0], saved.co_caches[0])):
        np.testing.assert_array_equal(np.asarray(got.k), np.swapaxes(np.asarray(want.k), 2, 3))
        np.testing.assert_array_equal(np.asarray(got.v), np.swapaxes(np.asarray(want.v), 2, 3))
    np.testing.assert_array_equal(np.asarray(state.params), np.arange(3.0))
    # Today's layout restores as it is, without a word.
    ckpt.save(2, state, {"iteration": 2})
    again, _ = restore_train_state(ckpt, target, 2, logged.append)
    assert len(logged) == 1
    np.testing.assert_array_equal(np.asarray(again.cache.k), np.asarray(state.cache.k))
    # Another mismatch (params of another size) is the usual error.
    with pytest.raises(ValueError, match="params"):
        restore_train_state(ckpt, target.replace(params=jnp.zeros(4)), 2, logged.append)

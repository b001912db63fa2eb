"""Checkpoints you can trust (issue 15): every damaged file is caught on restore, restore
falls back to the newest intact step, stale temporary directories and damaged steps are
cleaned by the writer, ``best/`` survives a kill at any point, a full disk is one clear
error; the run lock. Tiny pytrees only: the whole module runs in seconds."""

import builtins
import errno
import json
import logging
import os
import shutil
import socket
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.files import OutputError
from jaxdrive.runs import integrity
from jaxdrive.runs.checkpoint import Checkpointer, CheckpointError
from jaxdrive.runs.lock import LOCK_FILE, RunLock, RunLockedError


def _state(seed: int) -> dict:
    """A small train-state-like pytree (floats, ints, a typed key)."""
    return {"params": {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + seed,
                       "b": jnp.full((4,), 0.5 * seed, jnp.float32)},
            "count": jnp.asarray(seed, jnp.int32), "key": jax.random.key(seed)}


def _assert_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file())


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":  # one bit of one byte, in the middle of the file
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoints directory with intact steps 1 and 2 (step 2 newest)."""
    directory = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    with Checkpointer(directory, keep_last=3) as ckpt:
        ckpt.save(1, _state(1), {"step": 1})
        ckpt.save(2, _state(2), {"step": 2})
    return directory


def test_any_damaged_file_of_a_checkpoint_is_detected_and_restore_falls_back(saved, caplog):
    step_dir = saved / "last" / "2"
    files = _files(step_dir)
    assert len(files) > 10 and step_dir / integrity.RECORD in files
    cases = 0
    for path in files:
        for how in ("flip", "truncate", "delete"):
            original = path.read_bytes()
            _damage(path, how)
            try:
                ckpt = Checkpointer(saved)
                with pytest.raises(CheckpointError) as err:
                    ckpt.restore(_state(0), step=2)
                assert str(step_dir) in str(err.value), (path, how)
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="jaxdrive.runs.checkpoint"):
                    state, meta = ckpt.restore(_state(0))  # newest intact: step 1
                assert meta == {"step": 1}, (path, how)
                _assert_equal(state, _state(1))
                assert len(ckpt.skipped) == 1 and str(step_dir) in ckpt.skipped[0]
                assert str(step_dir) in caplog.text
                cases += 1
            finally:
                path.write_bytes(original)
    assert cases == 3 * len(files)
    # The reasons name the file and what happened to it.
    state_file = max(_files(step_dir / "state"), key=lambda p: p.stat().st_size)
    rel = state_file.relative_to(step_dir).as_posix()
    for how, reason in (("flip", f"{rel} does not match its checksum"),
                        ("truncate", f"{rel} has \\d+ bytes, \\d+ were saved"),
                        ("delete", f"{rel} is missing")):
        original = state_file.read_bytes()
        _damage(state_file, how)
        try:
            with pytest.raises(CheckpointError, match=reason):
                Checkpointer(saved).restore_raw(step=2)
        finally:
            state_file.write_bytes(original)
    _assert_equal(Checkpointer(saved).restore(_state(0))[0], _state(2))  # all restored


def test_an_unexpected_file_and_a_damaged_record_are_detected(saved):
    step_dir = saved / "last" / "2"
    extra = step_dir / "state" / "stray"
    extra.write_text("x")
    try:
        with pytest.raises(CheckpointError, match="state/stray was not part of the save"):
            Checkpointer(saved).restore_metadata(step=2)
    finally:
        extra.unlink()
    record = step_dir / integrity.RECORD
    original = record.read_bytes()
    record.write_text("{not json")
    try:
        with pytest.raises(CheckpointError, match="checksum record checksums.json is "
                                                  "unreadable"):
            Checkpointer(saved).restore_metadata(step=2)
    finally:
        record.write_bytes(original)


def test_no_intact_checkpoint_is_one_error_listing_each_and_why(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, _state(1), {})
        ckpt.save(2, _state(2), {})
    (tmp_path / "last" / "1" / integrity.RECORD).unlink()  # as if killed before the record
    _damage(max(_files(tmp_path / "last" / "2" / "state"), key=lambda p: p.stat().st_size),
            "flip")
    with pytest.raises(CheckpointError) as err:
        Checkpointer(tmp_path).restore(_state(0))
    message = str(err.value)
    assert message.startswith(f"no intact checkpoint under {tmp_path / 'last'}")
    assert f"{tmp_path / 'last' / '2'}: " in message and "does not match" in message
    assert f"{tmp_path / 'last' / '1'}: it has no checksum record" in message
    assert "save did not finish" in message
    assert isinstance(err.value, FileNotFoundError)  # CLIs report it as an input error


def test_a_kill_during_the_first_save_leaves_nothing_restorable_and_the_writer_cleans_it(
        tmp_path, caplog):
    # Killed before orbax committed: only its temporary directory is left.
    stale = tmp_path / "last" / "1.orbax-checkpoint-tmp"
    (stale / "state").mkdir(parents=True)
    (stale / "state" / "junk").write_bytes(b"\0" * 10)
    with pytest.raises(FileNotFoundError, match="no checkpoints under"):
        Checkpointer(tmp_path).restore(_state(0))
    assert stale.exists()  # readers change nothing
    writer = Checkpointer(tmp_path)
    notes = writer.recover()
    assert notes == [f"removed {stale}: a save or deletion that did not finish"]
    assert not stale.exists()
    writer.save(1, _state(1), {"step": 1})
    _assert_equal(writer.restore(_state(0))[0], _state(1))
    # Killed after orbax committed, before the checksum record: moved aside by the writer.
    (tmp_path / "last" / "1" / integrity.RECORD).unlink()
    writer = Checkpointer(tmp_path)
    [note] = writer.recover()
    assert note.startswith(f"{tmp_path / 'last' / '1'} cannot be used (it has no checksum")
    assert writer.all_steps() == [] and len(list((tmp_path / "damaged").iterdir())) == 1
    writer.save(1, _state(3), {"step": 1})  # the step can be saved again
    _assert_equal(writer.restore(_state(0))[0], _state(3))
    writer.close()


def _legacy_copy(saved: Path, dest: Path) -> Path:
    """A copy of ``saved`` as an older jaxdrive left it: no marker, no checksum records."""
    shutil.copytree(saved, dest)
    (dest / "integrity.json").unlink()
    for record in dest.glob(f"*/*/{integrity.RECORD}"):
        record.unlink()
    return dest


def test_directories_saved_before_checksums_still_load_and_get_records(saved, tmp_path,
                                                                        caplog):
    legacy = _legacy_copy(saved, tmp_path / "ckpt")
    with caplog.at_level(logging.WARNING, logger="jaxdrive.runs.checkpoint"):
        _assert_equal(Checkpointer(legacy).restore(_state(0))[0], _state(2))
    assert "no checksums" in caplog.text
    assert not (legacy / "integrity.json").exists()  # readers change nothing
    writer = Checkpointer(legacy)
    assert writer.recover() == [
        f"{legacy / 'last' / str(s)}: saved without checksums (older jaxdrive); read back "
        "intact, recorded them now" for s in (1, 2)]
    assert writer.problems(1) == [] and writer.problems(2) == []
    assert json.loads((legacy / "integrity.json").read_text()) == {
        "checksums": integrity.RECORD, "algorithm": "sha256"}
    # From now on the records guard those bytes like any save's.
    _damage(legacy / "last" / "2" / "metadata" / "metadata", "flip")
    assert writer.problems(2) and writer.problems(1) == []


def test_a_damaged_step_saved_before_checksums_gets_no_checksums(saved, tmp_path, caplog):
    """Issue 40, item 3: resuming a run saved before checksums recorded checksums over a
    damaged step's bytes (which then passed verification) and died in a JSONDecodeError
    traceback. A checksum is written only for bytes read back intact."""
    legacy = _legacy_copy(saved, tmp_path / "ckpt")
    damaged_file = legacy / "last" / "2" / "state" / "_METADATA"
    _damage(damaged_file, "flip")
    # Readers: the newest readable step, the unreadable one named, nothing written.
    with caplog.at_level(logging.WARNING, logger="jaxdrive.runs.checkpoint"):
        state, meta = Checkpointer(legacy).restore(_state(0))
    _assert_equal(state, _state(1))
    assert meta == {"step": 1}
    assert f"{legacy / 'last' / '2'}: saved without checksums by an older jaxdrive, and " \
           "its files cannot be read" in caplog.text
    with pytest.raises(CheckpointError, match=r"last/2: saved without checksums .* cannot "
                                              r"be read: .*restore another step"):
        Checkpointer(legacy).restore_raw(step=2)
    assert not list(legacy.glob(f"*/*/{integrity.RECORD}"))
    # The writer reads each step back: step 1 gets checksums, step 2 goes to damaged/.
    writer = Checkpointer(legacy)
    notes = writer.recover()
    assert notes[0] == (f"{legacy / 'last' / '1'}: saved without checksums (older "
                        "jaxdrive); read back intact, recorded them now")
    assert notes[1].startswith(f"{legacy / 'last' / '2'} cannot be used (saved without "
                               "checksums by an older jaxdrive, and its files cannot be "
                               "read: ")
    assert len(notes) == 2 and writer.all_steps() == [1]
    [moved] = (legacy / "damaged").iterdir()
    assert not (moved / integrity.RECORD).exists()  # no checksum over the damaged bytes
    assert writer.restore_metadata() == {"step": 1}
    writer.save(2, _state(5), {"step": 2})  # the step can be saved again
    _assert_equal(Checkpointer(legacy).restore(_state(0))[0], _state(5))
    assert Checkpointer(legacy).recover() == []


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (except finally blocks)."""


def _kill_at(monkeypatch, n: int) -> list[int]:
    """Makes the ``n``-th file-system change of the main thread raise _Killed; returns a
    counter of the changes seen."""
    seen = [0]
    main = threading.main_thread()
    for module, name in ((os, "rename"), (os, "replace"), (os, "unlink"), (os, "mkdir"),
                         (os, "fsync"), (shutil, "copy2"), (shutil, "rmtree")):
        original = getattr(module, name)

        def wrapped(*args, _original=original, **kwargs):
            if threading.current_thread() is main:
                seen[0] += 1
                if seen[0] == n:
                    raise _Killed
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)
    return seen


def test_best_survives_a_kill_at_any_point_of_a_new_best_save(tmp_path, monkeypatch):
    template = tmp_path / "template"
    with Checkpointer(template, best_metric="score") as ckpt:
        ckpt.save(1, _state(1), {"score": 0.5})
    with monkeypatch.context() as m:  # count the file-system changes of one best save
        seen = _kill_at(m, 0)
        with Checkpointer(tmp_path / "count", best_metric="score") as ckpt:
            shutil.copytree(template, tmp_path / "count", dirs_exist_ok=True)
            seen[0] = 0
            assert ckpt.save(2, _state(2), {"score": 0.9}) is True
        total = seen[0]
    assert total > 5, total
    print("kill points", total)
    outcomes = set()
    for n in range(1, total + 1):
        directory = tmp_path / f"kill{n}"
        shutil.copytree(template, directory)
        with monkeypatch.context() as m:
            _kill_at(m, n)
            with pytest.raises(_Killed):
                Checkpointer(directory, best_metric="score").save(2, _state(2),
                                                                   {"score": 0.9})
        reader = Checkpointer(directory, best_metric="score")
        assert reader.best_value in (0.5, 0.9), n  # an intact best, old or new
        state, meta = reader.restore(_state(0), which="best")
        assert meta["score"] == reader.best_value
        _assert_equal(state, _state(1 if meta["score"] == 0.5 else 2))
        writer = Checkpointer(directory, best_metric="score")
        writer.recover()
        # After recovery the best is the new one exactly when its last/ save completed.
        expected = 0.9 if writer.problems(2) == [] and 2 in writer.all_steps() else 0.5
        assert writer.best_value == expected, n
        assert writer.all_steps("best") == [1 if expected == 0.5 else 2], n
        assert not [p for w in ("last", "best") for p in (directory / w).iterdir()
                    if ".orbax-checkpoint-tmp" in p.name], n
        outcomes.add(expected)
        shutil.rmtree(directory)
    assert outcomes == {0.5, 0.9}


def test_a_full_disk_during_a_save_is_one_error_and_the_last_checkpoint_stays(
        tmp_path, monkeypatch, caplog):
    ckpt = Checkpointer(tmp_path, keep_last=1)
    ckpt.save(1, _state(1), {"step": 1})
    real_open = builtins.open
    full = os.path.exists("/dev/full")

    target = str(tmp_path / "last" / "2")  # step 2 and its temporary directories

    def open_on_full_disk(file, mode="r", *args, **kwargs):
        # The OS boundary: writes of step 2 go to a device that answers ENOSPC.
        if (isinstance(file, str | os.PathLike) and str(file).startswith(target)
                and any(c in mode for c in "wax")):
            if not full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_on_full_disk)
    with caplog.at_level(logging.ERROR):
        with pytest.raises(OutputError) as err:
            ckpt.save(2, _state(2), {"step": 2})
    monkeypatch.undo()
    message = str(err.value)
    assert message.startswith(f"could not save the checkpoint {tmp_path / 'last' / '2'}: No "
                              "space left on device")
    assert f"{tmp_path / 'last' / '1'}, is intact" in message and "free disk space" in message
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []  # no orbax dumps
    assert sorted(p.name for p in (tmp_path / "last").iterdir()) == ["1"]  # nothing left
    _assert_equal(Checkpointer(tmp_path).restore(_state(0))[0], _state(1))
    ckpt.save(2, _state(2), {"step": 2})  # space freed: saving works again
    _assert_equal(Checkpointer(tmp_path).restore(_state(0))[0], _state(2))
    ckpt.close()


def test_run_lock_refuses_a_second_holder_and_takes_over_stale_or_forced_locks(tmp_path):
    with RunLock(tmp_path) as held:
        assert held.note is None
        assert str(os.getpid()) in (tmp_path / LOCK_FILE).read_text()
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on host .*"
                                                 r"--force-unlock"):
            RunLock(tmp_path).acquire()
        forced = RunLock(tmp_path, force=True).acquire()
        assert forced.note.startswith("--force-unlock: took over the lock of pid")
        forced.release()
    assert not (tmp_path / LOCK_FILE).exists()  # released on exit
    # A lock file left by a killed process holds no flock: taken over with a note.
    stale = {"pid": 999999999, "host": socket.gethostname(), "since": "then"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stale))
    with RunLock(tmp_path) as lock:
        assert lock.note.startswith("took over the lock left by pid 999999999")

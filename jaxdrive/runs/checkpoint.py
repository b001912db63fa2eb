"""Checkpoints of one training run: the last K saves plus the best one (orbax).

Layout under the checkpoints directory of a run::

    checkpoints/
      last/<step>/{state, metadata}   the last ``keep_last`` saves
      best/<step>/{state, metadata}   the single best save by ``metadata[best_metric]``

``state`` is any pytree of arrays (flax params, optax states, counters, typed PRNG keys),
written by orbax's ``StandardSave``; ``metadata`` is a JSON dict (resolved config, step
counters, metrics) written by ``JsonSave``, so a checkpoint directory alone is enough to
rebuild its policy. The best save lives in its own orbax manager, so it survives when it
is older than the last K.

Host-side only: never call these inside jit. ``save`` returns once the files are written,
so a trainer may exit right after it (e.g. on Ctrl-C). ``BackgroundSaver`` finishes saves
in a worker thread (host snapshots, or in a multi-process job orbax's asynchronous
saves), so a trainer's device goes on with the next iterations while the files are
written.

Integrity (``jaxdrive.runs.integrity``): after orbax commits ``last/<step>``, the size and
SHA-256 of each of its files go to ``last/<step>/checksums.json``; every restore checks
them first. A damaged or unfinished step raises ``CheckpointError`` naming the path and
the reason; ``step=None`` takes the newest intact step and logs the ones it skipped.
``best/<step>`` is a verified copy of ``last/<step>``, renamed into place before the old
best is removed, so a kill at any point leaves an intact best. The first ``save`` of a
``Checkpointer`` (or ``recover``, which the trainer calls at start) removes stale
temporary directories, moves damaged or unfinished steps to ``damaged/`` and re-copies a
best that a kill interrupted. Only one writer may use a directory at a time (the trainer
holds the run lock, ``jaxdrive.runs.lock``); readers never change anything.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxdrive.distributed import barrier, host_barrier, is_main_process
from jaxdrive.files import OutputError, atomic_write_text
from jaxdrive.runs import integrity

_log = logging.getLogger(__name__)

_WHICH = ("last", "best")
_STATE = "state"
_META = "metadata"
_TMP = ".orbax-checkpoint-tmp"  # orbax's suffix of uncommitted directories
_MARKER = "integrity.json"  # "steps here carry checksum records": a missing one is damage
_DAMAGED = "damaged"
# How long a save's finish waits for the other processes at a barrier (their writes of a
# large state on slow storage included); a lost peer ends the job sooner (its watch).
_BARRIER_TIMEOUT_S = 3600.0


class CheckpointError(FileNotFoundError):
    """A checkpoint is damaged or unfinished, or no intact checkpoint is left.

    The message names each path and why it cannot be used. A subclass of
    FileNotFoundError, so callers that already report a missing checkpoint as an input
    error report an unusable one the same way.
    """


class _DropOrbaxInfo(logging.Filter):
    """Drops orbax's INFO/DEBUG chatter (dozens of lines per save) from the absl logger.

    orbax logs through absl, whose records go to the ``absl`` std logger; they reach the
    console as soon as an application configures logging at INFO. Warnings and errors pass,
    and so do INFO records of any other absl user.
    """

    saving = 0  # > 0 while Checkpointer.save runs: its errors are re-raised, once

    def filter(self, record: logging.LogRecord) -> bool:
        from_orbax = f"{os.sep}orbax{os.sep}" in record.pathname
        if from_orbax and self.saving and record.levelno >= logging.ERROR:
            return False  # each orbax thread logs the same failure with a traceback
        if record.levelno >= logging.WARNING:
            return True
        return not from_orbax


def _quiet_orbax() -> _DropOrbaxInfo:
    absl_logger = logging.getLogger("absl")
    for f in absl_logger.filters:
        if isinstance(f, _DropOrbaxInfo):
            return f
    f = _DropOrbaxInfo()
    absl_logger.addFilter(f)
    return f


_ORBAX_FILTER = _quiet_orbax()


class _DropStorageFailureFutures(logging.Filter):
    """Drops asyncio's "exception was never retrieved" records of orbax writes that failed
    for lack of space or permission: one per array written, printed long after the save
    has raised its one clear error."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("exception" in message and "orbax" in message
                    and any(text in message for text in _OS_MESSAGES))


def _quiet_asyncio() -> None:
    asyncio_logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _DropStorageFailureFutures) for f in asyncio_logger.filters):
        asyncio_logger.addFilter(_DropStorageFailureFutures())


@contextlib.contextmanager
def _saving() -> Iterator[None]:
    """Within: orbax's own error logs are dropped (the save re-raises the error once)."""
    _ORBAX_FILTER.saving += 1
    try:
        yield
    finally:
        _ORBAX_FILTER.saving -= 1


# Storage failures that C++ writers (tensorstore) report in the text of a non-OSError.
_OS_MESSAGES = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
                "Permission denied": errno.EACCES, "Read-only file system": errno.EROFS}


_quiet_asyncio()


def _os_error(e: BaseException | None) -> OSError | None:
    """The first OSError in ``e``, its causes, contexts and exception groups (or one made
    from a storage failure named in the text of one of them)."""
    seen, chain = set(), []
    todo = [e]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        chain.append(e)
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    for e in chain:
        for text, code in _OS_MESSAGES.items():
            if text in str(e):
                return OSError(code, text)
    return None


def _remove_dir(path: Path) -> None:
    """Removes a directory: first renamed to a temporary name (so a kill halfway leaves a
    stale temporary directory, cleaned later, never half a step), then deleted."""
    if not path.exists():
        return
    doomed = path.with_name(f"{path.name}{_TMP}-deleting")
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def find_checkpoints(run_dir: str | os.PathLike) -> Path:
    """The checkpoints directory of a run.

    Args:
      run_dir: a run directory that contains ``checkpoints/``, or that checkpoints
        directory itself (recognised by its ``last/`` or ``best/`` subdirectory).

    Returns:
      The checkpoints directory.

    Raises:
      FileNotFoundError: neither form is found.
    """
    path = Path(run_dir).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist (or is not a directory); "
                                f"pass a run directory that contains checkpoints/")
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if any((path / which).is_dir() for which in _WHICH):
        return path
    raise FileNotFoundError(
        f"no checkpoints found in {path}: expected a run directory that contains checkpoints/ "
        f"or a checkpoints directory that contains last/ or best/; was the run saved?")


def _is_typed_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _is_empty(x: Any) -> bool:
    return getattr(x, "size", 1) == 0 and hasattr(x, "dtype") and not _is_typed_key(x)


def _to_storable(tree: Any) -> Any:
    """Typed PRNG keys -> their raw uint32 key data (orbax cannot store key dtypes), and
    zero-size arrays (e.g. the key/value buffers of a memoryless policy's cache, which
    orbax refuses) -> a one-element placeholder of the same dtype."""
    def store(x):
        if _is_typed_key(x):
            return jax.random.key_data(x)
        if _is_empty(x):
            return np.zeros((1,), np.dtype(x.dtype))
        return x

    return jax.tree.map(store, tree)


def _from_storable(restored: Any, target: Any) -> Any:
    """Re-wraps key data as typed keys wherever ``target`` holds one, keeping its impl,
    and puts ``target``'s zero-size arrays back in place of their placeholders."""
    def load(t, r):
        if _is_typed_key(t):
            return jax.random.wrap_key_data(r, impl=jax.random.key_impl(t))
        return t if _is_empty(t) else r

    return jax.tree.map(load, target, restored)


def host_snapshot(state: Any) -> Any:
    """A host (NumPy) copy of ``state`` in the form ``Checkpointer.save`` stores (typed
    PRNG keys as key data): once it returns, ``state``'s device buffers may be donated to
    the next step while the copy is written. Single-process only (a multi-process job's
    arrays span processes: save those directly)."""
    return jax.device_get(_to_storable(state))


class BackgroundSaver:
    """Checkpoint saves finished in one worker thread, one save at a time.

    ``submit`` waits for the previous save, then starts the next and returns at once;
    a failed save's error (e.g. ``OutputError`` on a full disk) is raised by the next
    ``check``, ``submit``, ``wait`` or ``close``, so a trainer learns of it within one
    iteration. With a synchronous ``Checkpointer`` the thread writes what ``submit`` is
    given: host snapshots (``host_snapshot``), never device arrays that the next step
    donates. With an ``asynchronous`` one (a multi-process job, whose arrays span
    processes and cannot be snapshot on one host) ``submit`` takes the device state and
    starts the save where it is called, on every process at the same iteration (it
    returns once the arrays are on the host), and the thread waits for the files, the
    checksum record and the other processes.
    """

    def __init__(self, checkpointer: Checkpointer):
        self.checkpointer = checkpointer
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="jaxdrive-checkpoint")
        self._pending: Future | None = None

    def submit(self, step: int, state: Any, metadata: dict) -> None:
        """Starts saving ``state`` at ``step`` (a host snapshot, or with an asynchronous
        checkpointer the state itself)."""
        self.wait()
        if self.checkpointer.asynchronous:
            self._pending = self._pool.submit(
                self.checkpointer.start_save(step, state, metadata))
        else:
            self._pending = self._pool.submit(self.checkpointer.save, step, state, metadata)

    def check(self) -> None:
        """Raises the error of a save that has finished and failed; never blocks."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        """Blocks until the running save (if any) is written; raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, raise_errors: bool = True) -> None:
        """Waits for the running save and stops the thread; with ``raise_errors=False``
        a failed save's error is dropped (another error is already being reported)."""
        try:
            self.wait()
        except Exception:
            if raise_errors:
                raise
        finally:
            self._pool.shutdown(wait=True)


def _jsonable(x: Any) -> Any:
    """NumPy / JAX scalars and arrays -> Python numbers and lists, recursively."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.generic, np.ndarray, jax.Array)):
        return np.asarray(x).tolist()
    return x


def _lookup(metadata: Mapping[str, Any], key: str) -> Any:
    """``metadata[key]``, else the dotted path ``a.b.c`` into nested dicts; None if absent."""
    if key in metadata:
        return metadata[key]
    node: Any = metadata
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


class _TargetMismatch(ValueError):
    """The restore target differs from the saved state (the caller's error, not damage)."""


def _unreadable(e: BaseException) -> str:
    """Why a step saved without checksums cannot be used, in one line."""
    text = " ".join(str(e).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return (f"saved without checksums by an older jaxdrive, and its files cannot be read: "
            f"{type(e).__name__}: {text}")


def _check_like_saved(saved: Any, target: Any, where: Path) -> None:
    """Raises if ``target`` arrays differ in shape or dtype from the saved ones.

    orbax would silently cast a dtype mismatch (e.g. float32 -> int32), which breaks the
    bit-exact promise, and names no path in its shape error. Structure mismatches are left
    to orbax, whose message lists the differing keys.
    """
    saved_flat = ocp.tree.to_flat_dict(saved)
    target_flat = ocp.tree.to_flat_dict(ocp.tree.serialize_tree(target, keep_empty_nodes=True))
    problems = []
    for path, leaf in target_flat.items():
        meta = saved_flat.get(path)
        if meta is None or not hasattr(leaf, "dtype") or not hasattr(meta, "dtype"):
            continue
        if np.dtype(leaf.dtype) != np.dtype(meta.dtype) or tuple(leaf.shape) != tuple(meta.shape):
            problems.append(f"{'/'.join(path)}: saved {np.dtype(meta.dtype).name}"
                            f"{list(meta.shape)}, target {np.dtype(leaf.dtype).name}"
                            f"{list(leaf.shape)}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise _TargetMismatch(f"restore target does not match the checkpoint {where}: "
                         f"{'; '.join(problems[:5])}{more}")


def is_step_name(name: str) -> bool:
    """Whether a directory name under ``last/`` or ``best/`` is a step: ASCII digits
    only (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return name.isascii() and name.isdigit()


class Checkpointer:
    """Checkpoints of one run under `directory`: the last `keep_last` saves plus the best one.

    Args:
      directory: the checkpoints directory of a run (typically ``<run_dir>/checkpoints``).
        Nothing is created until the first save, so opening a wrong path to restore
        fails with FileNotFoundError instead of leaving empty directories behind.
      keep_last: how many of the most recent saves ``last/`` keeps (>= 1).
      best_metric: metadata key (or dotted path into nested dicts, e.g.
        ``"metrics.eval_return"``) that ranks saves for ``best/``; None keeps no best.
      best_mode: ``"max"`` or ``"min"``: whether a larger or smaller metric is better.
      asynchronous: ``start_save`` returns once the state is copied to host memory and
        its finish waits for the files (orbax's asynchronous checkpointing: how a
        multi-process job saves in the background, its arrays spanning processes);
        False: ``start_save`` writes the files itself.

    Reopening an existing directory (resume) recovers the best value so far from the
    metadata saved in ``best/``, so a later, worse save does not replace it.
    """

    def __init__(self, directory: str | os.PathLike, keep_last: int = 3,
                 best_metric: str | None = None, best_mode: str = "max",
                 asynchronous: bool = False):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        if best_metric is not None and (not isinstance(best_metric, str) or not best_metric):
            raise ValueError(f"best_metric must be a non-empty string or None, got "
                             f"{best_metric!r}")
        self.directory = Path(os.path.abspath(Path(directory).expanduser()))
        self.keep_last = keep_last
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.asynchronous = bool(asynchronous)
        self._managers: dict[str, ocp.CheckpointManager] = {}
        self._recovered = False
        self.skipped: list[str] = []  # what the last restore skipped, one line each
        self.best_value: float | None = None
        if best_metric is not None:
            self.best_value = self._recover_best_value()

    # ------------------------------------------------------------------ managers

    def _check_which(self, which: str) -> None:
        if which not in _WHICH:
            raise ValueError(f"which must be one of {_WHICH}, got {which!r}")

    def _manager(self, which: str, create: bool = False) -> ocp.CheckpointManager | None:
        """The orbax manager of ``directory/which``; None if it does not exist and not create."""
        self._check_which(which)
        if which in self._managers:
            return self._managers[which]
        path = self.directory / which
        if not create and not path.is_dir():
            return None
        options = ocp.CheckpointManagerOptions(
            # Retention is ours (``_prune``): a step goes only once a newer one is recorded.
            max_to_keep=None,
            # Asynchronous: save() returns once the arrays are on the host, and
            # wait_until_finished() once the files are committed (``start_save``).
            enable_async_checkpointing=self.asynchronous,
            create=True,
        )
        manager = ocp.CheckpointManager(
            path, options=options,
            item_handlers={_STATE: ocp.StandardCheckpointHandler(),
                           _META: ocp.JsonCheckpointHandler()})
        self._managers[which] = manager
        return manager

    def _fresh_manager(self, which: str) -> ocp.CheckpointManager | None:
        """The manager of ``which`` with its step list re-read from disk.

        orbax caches the steps it knows; re-reading lets a reader (an evaluator watching
        a training run) see saves made by another process. It costs a directory listing.
        """
        manager = self._manager(which)
        if manager is not None:
            manager.reload()
        return manager

    # ------------------------------------------------------------------ integrity

    def _steps(self, which: str) -> list[int]:
        """Committed steps of ``which`` (directories named by their step), ascending."""
        self._check_which(which)
        path = self.directory / which
        if not path.is_dir():
            return []
        return sorted(int(p.name) for p in path.iterdir()
                      if is_step_name(p.name) and p.is_dir())

    def _marker(self) -> dict | None:
        """The directory's integrity marker; None if it has none ({} if unreadable)."""
        path = self.directory / _MARKER
        if not path.exists():
            return None
        try:
            marker = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return {}
        return marker if isinstance(marker, dict) else {}

    def _unverified(self) -> set[tuple[str, int]]:
        """(which, step) of the steps saved before checksums existed and not yet checked.

        A directory with neither a marker nor any record was saved by an older jaxdrive:
        all its steps. Otherwise the steps the marker lists as such (recover() wrote them)
        that still have no record. Nothing else may lack a record: that is an unfinished
        save.
        """
        marker = self._marker()
        if marker is None:
            steps = {(w, s) for w in _WHICH for s in self._steps(w)}
            if any(integrity.has_record(self.directory / w / str(s)) for w, s in steps):
                return set()
            return steps
        listed = marker.get("unverified", [])
        out = set()
        for entry in listed if isinstance(listed, list) else []:
            which, _, step = str(entry).partition("/")
            if which in _WHICH and is_step_name(step) and (self.directory / entry).is_dir() \
                    and not integrity.has_record(self.directory / entry):
                out.add((which, int(step)))
        return out

    def problems(self, step: int, which: str = "last") -> list[str]:
        """Why ``which/step`` cannot be restored (damaged or unfinished); empty if intact
        (or saved before checksums existed and not checked yet)."""
        step = int(step)
        return integrity.problems(self.directory / which / str(step),
                                  (which, step) in self._unverified())

    def _resolve_step(self, step: int | None, which: str,
                      unreadable: Mapping[int, str] | None = None) -> int:
        """An intact step of ``which``: ``step``, or the newest intact one.

        ``unreadable``: step -> why it could not be read (steps saved before checksums
        existed, found unreadable by a restore); those steps are skipped.

        Raises:
          FileNotFoundError: no checkpoint (or not that step).
          CheckpointError: ``step`` is damaged, or (``step`` None) no step is intact.
        """
        steps = self._steps(which)
        where = self.directory / which
        if not steps:
            hint = (" (best/ is only written when the Checkpointer has a best_metric)"
                    if which == "best" else "")
            raise FileNotFoundError(
                f"no checkpoints under {where}; was the run saved? pass a run "
                f"directory that contains checkpoints/{hint}")
        if step is not None and int(step) not in steps:
            raise FileNotFoundError(
                f"no checkpoint for step {step} under {where}; available steps: {steps}")
        unverified = {st for w, st in self._unverified() if w == which}
        candidates = [int(step)] if step is not None else steps[::-1]
        skipped = []
        for s in candidates:
            if unreadable and s in unreadable:
                skipped.append(unreadable[s])
                continue
            found = integrity.problems(where / str(s), s in unverified)
            if not found:
                break
            skipped.append(f"{where / str(s)}: {integrity.describe(found)}")
        else:
            if step is not None:
                raise CheckpointError(f"checkpoint {skipped[0]}; restore another step "
                                      f"(available: {steps}) or step=None for the newest "
                                      "intact one")
            raise CheckpointError(
                f"no intact checkpoint under {where}: " + "; ".join(skipped) +
                ". Each was damaged after it was saved or its save did not finish; start a "
                "new run (e.g. --config RUN_DIR/config.yaml) or restore a copy")
        if s in unverified:
            _log.warning("checkpoint %s has no checksums (saved by an older jaxdrive): "
                         "restored without verification", where / str(s))
        for line in skipped:
            _log.warning("skipped checkpoint %s", line)
        self.skipped = skipped
        return s

    # ------------------------------------------------------------------ recovery

    def recover(self) -> list[str]:
        """Makes the directory ready for saving; returns one note per change.

        Removes stale temporary directories (a save or deletion that was killed), records
        checksums of a directory saved before they existed, moves damaged or unfinished
        steps to ``damaged/`` (they would block re-saving their step) and copies to
        ``best/`` an intact ``last/`` step whose best save was interrupted. Only the one
        writer of the directory may call it (the trainer holds the run lock); ``save``
        calls it once, first. In a multi-process job every process calls it, process 0
        does the work and the others wait for it (and return no notes).
        """
        self._recovered = True
        main = is_main_process()
        notes = self._recover_files() if main else []
        barrier("jaxdrive-checkpoint-recover")
        notes += self._check_unverified()
        if main:
            notes += self._recover_best()
            self._prune("last", self.keep_last)  # a kill may have come before the pruning
            self._prune("best", 1)
        barrier("jaxdrive-checkpoint-recovered")
        for manager in self._managers.values():
            manager.reload()
        return notes

    def _check_unverified(self) -> list[str]:
        """Reads every step saved before checksums existed: the ones that restore get
        their checksums recorded (bytes just read back), the others go to ``damaged/``.
        A checksum is never written over bytes nobody read. Every process reads (an orbax
        restore is collective); process 0 records and moves."""
        main, notes = is_main_process(), []
        for which, step in sorted(self._unverified()):
            path = self.directory / which / str(step)
            try:
                self._restore_raw_step(step, which)
            except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
                if main:
                    notes.append(f"{path} cannot be used ({_unreadable(e)}); moved to "
                                 f"{self._quarantine(path, which)}")
            else:
                if main:
                    integrity.write_record(path)
                    notes.append(f"{path}: saved without checksums (older jaxdrive); read "
                                 "back intact, recorded them now")
            barrier(f"jaxdrive-checkpoint-checked-{which}-{step}")
        if notes and main:
            self._write_marker()
        for manager in self._managers.values():
            manager.reload()
        return notes

    def _recover_files(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        notes = self._clean_tmp()
        unverified = self._unverified()
        self._write_marker(unverified)
        for which in _WHICH:
            for s in self._steps(which):
                path = self.directory / which / str(s)
                if (which, s) in unverified:
                    continue  # read back by _check_unverified
                found = integrity.problems(path, legacy=False)
                if found:
                    notes.append(f"{path} cannot be used ({integrity.describe(found)}); "
                                 f"moved to {self._quarantine(path, which)}")
        return notes

    def _clean_tmp(self) -> list[str]:
        notes = []
        for which in _WHICH:
            path = self.directory / which
            if not path.is_dir():
                continue
            for p in sorted(path.iterdir()):
                if _TMP in p.name:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
                    notes.append(f"removed {p}: a save or deletion that did not finish")
        return notes

    def _quarantine(self, path: Path, which: str) -> Path:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        dest = self.directory / _DAMAGED / f"{which}-{path.name}-{stamp}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, dest)
        return dest

    def _write_marker(self, unverified: set[tuple[str, int]] | None = None) -> None:
        """Writes the marker ("steps here carry checksum records") listing the steps saved
        before checksums existed that are not checked yet; rewritten only on a change."""
        unverified = self._unverified() if unverified is None else unverified
        marker = {"checksums": integrity.RECORD, "algorithm": "sha256"}
        if unverified:
            marker["unverified"] = [f"{w}/{s}" for w, s in sorted(unverified)]
        if self._marker() != marker:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.directory / _MARKER, json.dumps(marker) + "\n")

    def _recover_best(self) -> list[str]:
        """Copies to ``best/`` the best ``last/`` step newer than the best one, if it beats
        it (its own best save was interrupted)."""
        if self.best_metric is None:
            return []
        self.best_value = self._recover_best_value()
        best_steps = self._steps("best")
        newest_best = best_steps[-1] if best_steps else -1
        chosen, value = None, self.best_value
        for s in self._steps("last"):
            if s <= newest_best:
                continue
            v = self._metric(self.restore_metadata(s, "last"))
            if v is not None and (value is None or self._beats(v, value)):
                chosen, value = s, v
        if chosen is None:
            return []
        self._copy_to_best(chosen)
        self.best_value = value
        return [f"best/: copied step {chosen} ({self.best_metric} {value:g}) from last/, "
                "its best save had not finished"]

    def _recover_best_value(self) -> float | None:
        if not self._steps("best"):
            return None
        try:
            metadata = self.restore_metadata(which="best")
        except CheckpointError as e:
            _log.warning("%s; the next save with %r becomes the best", e, self.best_metric)
            return None
        value = self._metric(metadata)
        if value is None:
            _log.warning("best checkpoint under %s has no finite %r in its metadata; the "
                         "next save with that metric replaces it", self.directory / "best",
                         self.best_metric)
        return value

    def _metric(self, metadata: Mapping[str, Any]) -> float | None:
        """The finite best-metric value of ``metadata``, or None if absent or not finite."""
        value = _lookup(metadata, self.best_metric)
        if value is None:
            return None
        value = _jsonable(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metadata[{self.best_metric!r}] must be a real number to rank "
                            f"checkpoints, got {value!r}")
        value = float(value)
        return value if math.isfinite(value) else None

    def _beats(self, value: float, other: float) -> bool:
        return value > other if self.best_mode == "max" else value < other

    def _is_better(self, value: float) -> bool:
        return self.best_value is None or self._beats(value, self.best_value)

    # ------------------------------------------------------------------ writing

    def _save_failed(self, e: BaseException, step: int, partial: list[Path]) -> None:
        """Removes what a failed save of ``step`` left behind, then raises: OutputError
        (naming the path, the OS reason and the intact checkpoint left) when the cause
        is an OSError (disk full, permissions), else the original error."""
        for p in partial:
            with contextlib.suppress(OSError):
                _remove_dir(p) if is_step_name(p.name) else shutil.rmtree(p)
        for manager in self._managers.values():
            with contextlib.suppress(Exception):
                manager.reload()
        cause = _os_error(e)
        if cause is None:
            raise e
        intact = [s for s in self._steps("last") if s != step]
        kept = (f"the checkpoint saved before, {self.directory / 'last' / str(intact[-1])}, "
                "is intact" if intact else "no earlier checkpoint exists")
        reason = cause.strerror or str(cause)
        fix = ("free disk space" if cause.errno in (errno.ENOSPC, errno.EDQUOT)
               else "make it writable")
        raise OutputError(f"could not save the checkpoint "
                          f"{self.directory / 'last' / str(step)}: {reason}; {kept}; "
                          f"{fix}") from e

    def _tmp_dirs(self, which: str, step: int) -> list[Path]:
        path = self.directory / which
        return [p for p in path.glob(f"{step}{_TMP}*")] if path.is_dir() else []

    def _start_last(self, step: int, args: ocp.args.Composite) -> Callable[[], None]:
        """Starts the orbax save of ``last/step``; returns its finish: wait for the files,
        then the checksum record; cleans up on failure.

        With ``asynchronous`` the start returns once every array is copied to host memory
        (the caller's device buffers may then be donated) and the files are written while
        the finish waits; else the start writes them. Multi-process: every process writes
        its part (orbax); once all have, process 0 writes the checksum record and prunes,
        and the others wait for that. The finish synchronises through the coordination
        service, never through a device collective, so it may run in a worker thread
        while the next training steps run their own collectives."""
        last = self._manager("last", create=True)
        last.reload()
        main = is_main_process()

        def failed(e: BaseException) -> None:
            self._save_failed(e, step, (self._tmp_dirs("last", step)
                                        + [self.directory / "last" / str(step)]) if main
                              else [])

        try:
            with _saving():
                last.save(step, args=args, force=True)
        except Exception as e:
            failed(e)

        def finish() -> None:
            try:
                with _saving():
                    last.wait_until_finished()
                host_barrier(f"jaxdrive-checkpoint-saved-{step}", _BARRIER_TIMEOUT_S)
                if main:
                    integrity.write_record(self.directory / "last" / str(step))
            except Exception as e:
                failed(e)
            if main:
                self._prune("last", self.keep_last)
            host_barrier(f"jaxdrive-checkpoint-recorded-{step}", _BARRIER_TIMEOUT_S)
            last.reload()

        return finish

    def _copy_to_best(self, step: int) -> None:
        """``best/step`` := a verified copy of ``last/step``; the old best goes after."""
        best = self.directory / "best"
        tmp = best / f"{step}{_TMP}-copy"
        try:
            best.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            shutil.copytree(self.directory / "last" / str(step), tmp)
            found = integrity.problems(tmp)
            if found:
                raise CheckpointError(f"the copy of {self.directory / 'last' / str(step)} to "
                                      f"best/ differs from it: {integrity.describe(found)}")
            if (best / str(step)).exists():
                _remove_dir(best / str(step))
            os.rename(tmp, best / str(step))
        except OSError as e:
            if isinstance(e, CheckpointError):
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self._save_failed(e, step, [tmp])
        self._prune("best", 1)

    def _prune(self, which: str, keep: int) -> None:
        """Removes all but the newest ``keep`` steps of ``which``."""
        for s in self._steps(which)[:-keep]:
            _remove_dir(self.directory / which / str(s))
        manager = self._managers.get(which)
        if manager is not None:
            manager.reload()

    # ------------------------------------------------------------------ public

    def save(self, step: int, state: Any, metadata: dict) -> bool:
        """Saves ``state`` and ``metadata`` at ``step``; waits until the files are written.
        Arguments, result and errors: ``start_save`` and its finish."""
        return self.start_save(step, state, metadata)()

    def start_save(self, step: int, state: Any, metadata: dict) -> Callable[[], bool]:
        """Starts saving ``state`` and ``metadata`` at ``step``; the returned finish
        (no arguments) waits until the files are written, records their checksums, prunes
        ``last/`` and updates ``best/``. Call it once, before the next save starts; it
        synchronises processes only through the coordination service, so a worker thread
        may run it (``BackgroundSaver``). With ``asynchronous`` the start returns once
        ``state`` is copied to host memory; else it writes the files itself.

        Args:
          step: training step (>= 0). Steps must increase: a step older than the latest in
            ``last/`` is refused (ValueError); saving the latest step again is skipped with a
            warning (e.g. a final save on Ctrl-C right after a periodic one).
          state: pytree of arrays (jax/numpy arrays, Python scalars, typed PRNG keys).
          metadata: JSON-able dict (NumPy/JAX scalars are converted to Python numbers).

        Returns:
          The finish; it returns True if this save became the best one (and was copied
          to ``best/``).

        Raises:
          OutputError (from the start or the finish): the files could not be written
            (disk full, permissions); what the failed save wrote is removed and the
            earlier checkpoints are intact.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        metadata = _jsonable(metadata)
        value = self._metric(metadata) if self.best_metric is not None else None
        if not self._recovered:
            for note in self.recover():
                _log.warning("%s", note)
            if is_main_process():
                self._write_marker()
        steps = self._steps("last")
        latest = steps[-1] if steps else None
        if latest is not None and step < latest:
            raise ValueError(
                f"step {step} is older than the latest checkpoint {latest} under "
                f"{self.directory / 'last'}; resume from the latest step or use a new run "
                f"directory")
        if latest is not None and step == latest:
            _log.warning("step %d is already saved under %s; skipping this save", step,
                         self.directory / "last")
            return lambda: False
        finish_last = self._start_last(step, ocp.args.Composite(**{
            _STATE: ocp.args.StandardSave(_to_storable(state)),
            _META: ocp.args.JsonSave(metadata)}))

        def finish() -> bool:
            finish_last()
            if value is None or not self._is_better(value):
                return False
            if is_main_process():  # in a multi-process job, only process 0 has the metric
                self._copy_to_best(step)
            self.best_value = value
            return True

        return finish

    def latest_step(self, which: str = "last") -> int | None:
        """The newest saved step in ``which`` ("last" or "best"), None if there is none.
        Not verified: ``restore`` checks a step's files."""
        steps = self._steps(which)
        return steps[-1] if steps else None

    def all_steps(self, which: str = "last") -> list[int]:
        """Saved steps in ``which`` ("last" or "best"), ascending (not verified)."""
        return self._steps(which)

    def _read(self, step: int | None, which: str, read: Callable[[int], Any]) -> Any:
        """``read(s)`` for ``s`` = ``step`` or (None) the newest intact step.

        A step saved before checksums existed is verified by reading it: if ``read``
        fails there, it is named in a CheckpointError (``step`` given) or skipped like a
        damaged one. Errors reading a checksummed step, and a ValueError of a target
        that does not match the save, are raised as they are."""
        unreadable: dict[int, str] = {}
        while True:
            s = self._resolve_step(step, which, unreadable)
            if (which, s) not in self._unverified():
                return read(s)
            try:
                return read(s)
            except _TargetMismatch:
                raise
            except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
                unreadable[s] = f"{self.directory / which / str(s)}: {_unreadable(e)}"
                _log.warning("skipped checkpoint %s", unreadable[s])
                if step is not None:
                    raise CheckpointError(f"checkpoint {unreadable[s]}; restore another "
                                          f"step (available: {self._steps(which)})") from e

    def restore(self, target: Any, step: int | None = None,
                which: str = "last") -> tuple[Any, dict]:
        """Restores a saved state into the structure of ``target``, bit-exactly.

        Args:
          target: pytree with the structure, shapes and dtypes of the saved state (e.g. a
            freshly initialised train state, typed keys included); arrays come back with
            its types and shardings.
          step: step to restore; None restores the newest intact one (the damaged or
            unfinished steps it skips are logged and listed in ``self.skipped``).
          which: "last" or "best".

        Returns:
          (state, metadata).

        Raises:
          FileNotFoundError: no checkpoint (or not that step) under ``directory/which``.
          CheckpointError: that step, or (step None) every step, is damaged or unfinished;
            the message names each path and the reason.
          ValueError: ``target`` differs from the saved state in structure, shape or dtype.
        """
        storable = _to_storable(target)

        def read(s: int) -> tuple[Any, dict]:
            manager = self._fresh_manager(which)
            _check_like_saved(manager.item_metadata(s)[_STATE].tree, storable,
                              self.directory / which / str(s))
            restored = manager.restore(s, args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardRestore(storable),
                _META: ocp.args.JsonRestore()}))
            return _from_storable(restored[_STATE], target), restored[_META]

        return self._read(step, which, read)

    def restore_metadata(self, step: int | None = None, which: str = "last") -> dict:
        """Only the metadata of a save (its files are verified, no arrays are read)."""
        # Read as the JSON file it is (verified first), not through orbax: an orbax
        # restore is a collective in a multi-process job, and only process 0 may get here.
        def read(s: int) -> dict:
            meta = json.loads((self.directory / which / str(s) / _META / _META).read_text(
                encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError(f"its metadata is a JSON {type(meta).__name__}, not an "
                                 "object")
            return meta

        return self._read(step, which, read)

    def restore_raw(self, step: int | None = None, which: str = "last") -> tuple[Any, dict]:
        """Restores without a target: (state as saved, metadata).

        Custom pytree nodes (flax structs, optax states) come back as nested dicts / lists
        of arrays, typed keys as their raw uint32 key data, and zero-size arrays as
        one-element placeholders. Steps are chosen and verified as in ``restore``.
        """
        return self._read(step, which, lambda s: self._restore_raw_step(s, which))

    def _restore_raw_step(self, step: int, which: str) -> tuple[Any, dict]:
        manager = self._fresh_manager(which)
        # Onto this process's first device, whatever mesh saved it (a run trained on 8
        # devices is evaluated on one): orbax needs the target layout spelled out.
        saved = manager.item_metadata(step)[_STATE]
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device)
            if hasattr(m, "shape") and hasattr(m, "dtype") else m,
            getattr(saved, "tree", saved))
        restored = manager.restore(step, args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardRestore(target), _META: ocp.args.JsonRestore()}))
        return restored[_STATE], restored[_META]

    def close(self) -> None:
        """Waits for pending work and releases the orbax managers."""
        for manager in self._managers.values():
            with _saving():  # a failed save already raised its error
                manager.close()
        self._managers.clear()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

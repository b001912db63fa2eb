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

Host-side only: never call these inside jit. Saves are synchronous, so a trainer may exit
right after ``save`` returns (e.g. on Ctrl-C).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

_log = logging.getLogger(__name__)

_WHICH = ("last", "best")
_STATE = "state"
_META = "metadata"


class _DropOrbaxInfo(logging.Filter):
    """Drops orbax's INFO/DEBUG chatter (dozens of lines per save) from the absl logger.

    orbax logs through absl, whose records go to the ``absl`` std logger; they reach the
    console as soon as an application configures logging at INFO. Warnings and errors pass,
    and so do INFO records of any other absl user.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return f"{os.sep}orbax{os.sep}" not in record.pathname


def _quiet_orbax() -> None:
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _DropOrbaxInfo) for f in absl_logger.filters):
        absl_logger.addFilter(_DropOrbaxInfo())


_quiet_orbax()


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
        raise ValueError(f"restore target does not match the checkpoint {where}: "
                         f"{'; '.join(problems[:5])}{more}")


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

    Reopening an existing directory (resume) recovers the best value so far from the
    metadata saved in ``best/``, so a later, worse save does not replace it.
    """

    def __init__(self, directory: str | os.PathLike, keep_last: int = 3,
                 best_metric: str | None = None, best_mode: str = "max"):
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
        self._managers: dict[str, ocp.CheckpointManager] = {}
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
        keep = self.keep_last if which == "last" else 1
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.LatestN(n=keep),
            # Synchronous: save() returns once the files are committed.
            enable_async_checkpointing=False,
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

    def _resolve_step(self, step: int | None, which: str) -> tuple[ocp.CheckpointManager, int]:
        manager = self._fresh_manager(which)
        steps = list(manager.all_steps()) if manager is not None else []
        if not steps:
            hint = (" (best/ is only written when the Checkpointer has a best_metric)"
                    if which == "best" else "")
            raise FileNotFoundError(
                f"no checkpoints under {self.directory / which}; was the run saved? pass a run "
                f"directory that contains checkpoints/{hint}")
        if step is None:
            return manager, max(steps)
        if int(step) not in steps:
            raise FileNotFoundError(
                f"no checkpoint for step {step} under {self.directory / which}; "
                f"available steps: {sorted(steps)}")
        return manager, int(step)

    def _recover_best_value(self) -> float | None:
        manager = self._manager("best")
        if manager is None or manager.latest_step() is None:
            return None
        value = self._metric(self.restore_metadata(which="best"))
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

    def _is_better(self, value: float) -> bool:
        if self.best_value is None:
            return True
        return value > self.best_value if self.best_mode == "max" else value < self.best_value

    # ------------------------------------------------------------------ public

    def save(self, step: int, state: Any, metadata: dict) -> bool:
        """Saves ``state`` and ``metadata`` at ``step``; waits until the files are written.

        Args:
          step: training step (>= 0). Steps must increase: a step older than the latest in
            ``last/`` is refused (ValueError); saving the latest step again is skipped with a
            warning (e.g. a final save on Ctrl-C right after a periodic one).
          state: pytree of arrays (jax/numpy arrays, Python scalars, typed PRNG keys).
          metadata: JSON-able dict (NumPy/JAX scalars are converted to Python numbers).

        Returns:
          True if this save became the best one (and was written to ``best/``).
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        metadata = _jsonable(metadata)
        value = self._metric(metadata) if self.best_metric is not None else None

        last = self._manager("last", create=True)
        latest = last.latest_step()
        if latest is not None and step < latest:
            raise ValueError(
                f"step {step} is older than the latest checkpoint {latest} under "
                f"{self.directory / 'last'}; resume from the latest step or use a new run "
                f"directory")
        if latest is not None and step == latest:
            _log.warning("step %d is already saved under %s; skipping this save", step,
                         self.directory / "last")
            return False

        def args() -> ocp.args.Composite:
            # Fresh args per manager: orbax may consume them.
            return ocp.args.Composite(**{_STATE: ocp.args.StandardSave(_to_storable(state)),
                                         _META: ocp.args.JsonSave(metadata)})

        last.save(step, args=args(), force=True)
        last.wait_until_finished()
        if value is None or not self._is_better(value):
            return False
        best = self._manager("best", create=True)
        best.save(step, args=args(), force=True)
        best.wait_until_finished()
        self.best_value = value
        return True

    def latest_step(self, which: str = "last") -> int | None:
        """The newest saved step in ``which`` ("last" or "best"), None if there is none."""
        manager = self._fresh_manager(which)
        return None if manager is None else manager.latest_step()

    def all_steps(self, which: str = "last") -> list[int]:
        """Saved steps in ``which`` ("last" or "best"), ascending."""
        manager = self._fresh_manager(which)
        return [] if manager is None else sorted(int(s) for s in manager.all_steps())

    def restore(self, target: Any, step: int | None = None,
                which: str = "last") -> tuple[Any, dict]:
        """Restores a saved state into the structure of ``target``, bit-exactly.

        Args:
          target: pytree with the structure, shapes and dtypes of the saved state (e.g. a
            freshly initialised train state, typed keys included); arrays come back with
            its types and shardings.
          step: step to restore; None restores the latest.
          which: "last" or "best".

        Returns:
          (state, metadata).

        Raises:
          FileNotFoundError: no checkpoint (or not that step) under ``directory/which``.
          ValueError: ``target`` differs from the saved state in structure, shape or dtype.
        """
        manager, step = self._resolve_step(step, which)
        storable = _to_storable(target)
        _check_like_saved(manager.item_metadata(step)[_STATE].tree, storable,
                          self.directory / which / str(step))
        restored = manager.restore(step, args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardRestore(storable),
            _META: ocp.args.JsonRestore()}))
        return _from_storable(restored[_STATE], target), restored[_META]

    def restore_metadata(self, step: int | None = None, which: str = "last") -> dict:
        """Only the metadata of a save (no arrays are read)."""
        manager, step = self._resolve_step(step, which)
        return manager.restore(step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))[
            _META]

    def restore_raw(self, step: int | None = None, which: str = "last") -> tuple[Any, dict]:
        """Restores without a target: (state as saved, metadata).

        Custom pytree nodes (flax structs, optax states) come back as nested dicts / lists
        of arrays, typed keys as their raw uint32 key data, and zero-size arrays as
        one-element placeholders.
        """
        manager, step = self._resolve_step(step, which)
        restored = manager.restore(step, args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardRestore(), _META: ocp.args.JsonRestore()}))
        return restored[_STATE], restored[_META]

    def close(self) -> None:
        """Waits for pending work and releases the orbax managers."""
        for manager in self._managers.values():
            manager.close()
        self._managers.clear()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

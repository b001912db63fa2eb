"""Host-side metric writers for the trainer: JSONL file, console progress, wandb.

Writers take ``(step, metrics)`` with ``step`` the total agent-steps so far and plain
host values (python, NumPy or 0-d JAX scalars, after one ``device_get`` per chunk).
They never run inside jit. ``Writers`` fans one call out to several of them;
``video_keys`` names evaluation videos for wandb, one key per env and view.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxdrive.files import OutputError, atomic_write_text

__all__ = ["ConsoleProgress", "JsonlWriter", "WandbWriter", "Writers", "format_metric"]


def _to_python(value: Any, finite: bool = True) -> Any:
    """Python scalar (or list) for a python / NumPy / JAX value; with ``finite``, NaN and
    inf become None."""
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, np.generic | np.ndarray) or hasattr(value, "__array__"):
        arr = np.asarray(value)
        value = arr.item() if arr.ndim == 0 else arr.tolist()
    if isinstance(value, list | tuple):
        return [_to_python(v, finite) for v in value]
    if finite and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def format_metric(value: Any) -> str:
    """Compact console text: ints with thousands separators, floats with 4 significant
    digits (thousands and above as separated integers), None as ``-``."""
    value = _to_python(value, finite=False)
    if value is None:
        return "-"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if 1e3 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


def video_keys(producer: str, paths: Sequence[str]) -> list[tuple[str, str]]:
    """``(wandb key, path)`` for one producer's videos listed env by env (each env's views
    together, as an evaluator lists them): ``video/PRODUCER/VIEW/env_{i}``, ``i`` the
    env's place among that view's videos, so that every env's video has its own key
    (one key per view would keep only the last env's) and an env keeps its key from one
    evaluation to the next. ``VIEW`` is the video's directory name."""
    seen: dict[str, int] = {}
    out = []
    for path in paths:
        view = Path(path).parent.name
        i = seen.get(view, 0)
        seen[view] = i + 1
        out.append((f"video/{producer}/{view}/env_{i}", path))
    return out


def _format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _warn(text: str) -> None:
    print(f"WARNING: {text}", file=sys.stderr, flush=True)


def _reason(e: BaseException) -> str:
    """One-line ``Type: message`` (wandb errors span several lines)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300] + '...' if len(text) > 300 else text}"


def _has_wandb_credentials(wandb) -> bool:
    """Whether wandb finds an API key (env, settings, .netrc) without asking for one.

    Without a key, ``wandb.init`` prompts on a terminal and waits for input (or raises
    KeyboardInterrupt when stdin is closed), which must not stall a training run.
    """
    try:
        return bool(wandb.login(prompt=False, verify=False))
    except TypeError:
        return True  # a wandb without `prompt=`: leave the check to init


class JsonlWriter:
    """One strict-JSON object per line, ``{"step": step, **metrics}``, flushed per line."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None):
        """Opens ``path`` for appending, creating parent directories.

        Args:
          resume_step: when resuming from a checkpoint at this step, lines logged after it
            (by the interrupted run) are dropped first so steps are not duplicated.
        """
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is not None and self.path.exists():
                self._truncate_after(int(resume_step))
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise self._error(e) from e

    def _error(self, e: OSError) -> OutputError:
        return OutputError(f"cannot write the metrics file {self.path}: {e.strerror or e}; "
                           "free disk space (or make it writable)")

    def _truncate_after(self, resume_step: int) -> None:
        kept = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step")
                except (ValueError, AttributeError):
                    continue  # e.g. a line cut short by the crash
                if isinstance(step, int | float) and step <= resume_step:
                    kept.append(line if line.endswith("\n") else line + "\n")
        atomic_write_text(self.path, "".join(kept))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append ``{"step": step, **metrics}`` as one line and flush; NaN / inf are written
        as null."""
        record = {"step": int(step)}
        record.update((k, _to_python(v)) for k, v in metrics.items() if k != "step")
        try:
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()
        except OSError as e:  # e.g. disk full: one clear error, not a traceback per writer
            raise self._error(e) from e

    def close(self) -> None:
        """Close the file (safe to call twice)."""
        if not self._file.closed:
            try:
                self._file.close()
            except OSError as e:  # the buffered tail could not be written
                raise self._error(e) from e


class ConsoleProgress:
    """Progress over agent-steps: a tqdm bar on a terminal, plain lines otherwise.

    The bar shows steps done / total, steps/s, ETA and the chosen metric ``keys`` as a
    postfix. On a non-TTY ``file`` (log files, CI) each ``write`` prints one line instead,
    since ``\\r`` updates would pile up there.
    """

    def __init__(self, total_steps: int, start_step: int = 0, keys: Sequence[str] = (),
                 file=None, desc: str = "train"):
        self.total_steps = int(total_steps)
        self.start_step = int(start_step)
        self.keys = tuple(keys)
        self.file = sys.stderr if file is None else file
        self.desc = desc
        self._t0 = time.monotonic()
        self._bar = None
        try:
            tty = bool(self.file.isatty())
        except (AttributeError, ValueError):
            tty = False
        if tty:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self.total_steps, initial=self.start_step, desc=desc,
                                 unit="step", unit_scale=True, file=self.file,
                                 dynamic_ncols=True)

    def _postfix(self, metrics: Mapping[str, Any], sep: str) -> list[str]:
        return [f"{k}{sep}{format_metric(metrics[k])}" for k in self.keys
                if k in metrics and metrics[k] is not None]

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Args: step: total agent-steps so far; metrics may hold ``sps``."""
        step = int(step)
        if self._bar is not None:
            self._bar.set_postfix_str(", ".join(self._postfix(metrics, "=")), refresh=False)
            self._bar.update(step - self._bar.n)
            self._bar.refresh()
            return
        sps = _to_python(metrics.get("sps"))
        if not isinstance(sps, int | float) or isinstance(sps, bool):
            elapsed = time.monotonic() - self._t0
            sps = (step - self.start_step) / elapsed if elapsed > 0 else None
        eta = (self.total_steps - step) / sps if sps else None
        pct = 100.0 * step / self.total_steps if self.total_steps else 100.0
        parts = [self.desc, f"step {step:,}/{self.total_steps:,} ({pct:.1f}%)",
                 f"sps {format_metric(sps)}", f"eta {_format_duration(eta)}"]
        print("  ".join(parts + self._postfix(metrics, " ")), file=self.file, flush=True)

    def message(self, text: str) -> None:
        """Print a line without breaking the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.file)
        else:
            print(text, file=self.file, flush=True)

    def close(self) -> None:
        """Close the tqdm bar, if any (safe to call twice)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class WandbWriter:
    """Weights & Biases logging that never stops training.

    wandb is optional (``pip install 'jaxdrive[wandb]'``). If it is missing, or ``init`` or
    ``log`` fails (no API key, no network), one warning goes to stderr and the writer
    becomes a no-op; ``active`` says whether a run is live.
    """

    def __init__(self, config: Mapping, run_dir: str, project: str = "jaxdrive",
                 mode: str | None = None, name: str | None = None, entity: str | None = None,
                 resume_id: str | None = None):
        """Args:
          config: resolved run config, stored with the wandb run.
          run_dir: wandb writes its files under ``run_dir/wandb``.
          mode: "online", "offline" or "disabled"; None reads ``WANDB_MODE`` (default online).
          resume_id: id of the run to continue (``run_id`` of an earlier writer).
        """
        self._wandb = None
        self._run = None
        self.mode = mode or os.environ.get("WANDB_MODE") or "online"
        if self.mode == "disabled":
            return
        try:
            import wandb
        except ImportError as e:
            _warn(f"wandb logging off: wandb is not installed ({e}). "
                  "Fix: pip install 'jaxdrive[wandb]' (or pip install wandb).")
            return
        try:
            if self.mode in ("online", "shared") and not _has_wandb_credentials(wandb):
                _warn("wandb logging off: no W&B API key configured. Fix: run `wandb login` "
                      "(or set WANDB_API_KEY), or set WANDB_MODE=offline to log locally and "
                      "`wandb sync` later; WANDB_MODE=disabled silences this.")
                return
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                project=project, entity=entity, name=name, config=dict(config),
                dir=str(run_dir), mode=self.mode, id=resume_id,
                resume="allow" if resume_id else None,
                # Bounded wait for the wandb service instead of the default 90 s.
                settings=wandb.Settings(init_timeout=30))
        except Exception as e:
            _warn(f"wandb logging off: wandb.init failed ({_reason(e)}). "
                  "Fix: run `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline "
                  "to log locally and `wandb sync` later; WANDB_MODE=disabled silences this.")
            return
        if run is None or getattr(run, "disabled", False):
            return
        self._wandb, self._run = wandb, run

    @property
    def active(self) -> bool:
        """() bool: a wandb run is live (not disabled, not failed)."""
        return self._run is not None

    @property
    def run_id(self) -> str | None:
        """The live run's id (pass it as ``resume_id`` to continue), else None."""
        return getattr(self._run, "id", None) if self._run is not None else None

    def _log(self, data: Mapping[str, Any], step: int) -> None:
        try:
            self._run.log(dict(data), step=int(step))
        except Exception as e:
            _warn(f"wandb logging off: log failed ({_reason(e)}).")
            self._finish(quiet=True)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """``run.log(metrics, step=step)`` without None / NaN / inf values."""
        if self._run is None:
            return
        clean = {k: v for k, v in ((k, _to_python(v)) for k, v in metrics.items())
                 if v is not None}
        self._log(clean, step)

    def log_video(self, key: str, path: str, step: int) -> None:
        """Log the video file at ``path`` (mp4 / gif / webm) under ``key``."""
        if self._run is None:
            return
        try:
            video = self._wandb.Video(str(path))
        except Exception as e:
            _warn(f"wandb could not read video {path} ({_reason(e)}).")
            return
        self._log({key: video}, step)

    def _finish(self, quiet: bool = False) -> None:
        run, self._run = self._run, None
        if run is not None:
            try:
                run.finish()
            except Exception as e:
                if not quiet:
                    _warn(f"wandb finish failed ({_reason(e)}).")

    def close(self) -> None:
        """Finish the wandb run, if live (a failure only warns)."""
        self._finish()


class Writers:
    """Fan-out to several writers; each write/close goes to all of them (None skipped)."""

    def __init__(self, *writers):
        self.writers = tuple(w for w in writers if w is not None)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """``write(step, metrics)`` on every writer, in order."""
        for w in self.writers:
            w.write(step, metrics)

    def close(self) -> None:
        """Close all writers, even if one fails; then re-raise the first error."""
        error = None
        for w in self.writers:
            try:
                w.close()
            except Exception as e:
                error = error or e
        if error is not None:
            raise error

"""One writer per run directory: ``RUN_DIR/run.lock``, held with ``flock`` while a run trains.

The lock file names its holder (pid, host, start time) for the error message. ``flock``
is released by the kernel when the holder exits, killed or not, so a lock file left by a
dead process on the same host is simply taken over (with a note). ``force=True``
(``--force-unlock``) replaces a lock that is still held, e.g. by a machine that died
while it held the lock on a shared filesystem: the old holder keeps its lock on the
replaced file, so only use it when that process is surely gone.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
from pathlib import Path

LOCK_FILE = "run.lock"


class RunLockedError(RuntimeError):
    """Another process holds the run directory's lock."""


def _holder(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """The lock of one run directory; a context manager (``acquire`` / ``release``).

    Args:
      run_dir: the run directory (must exist).
      force: take the lock even if another process holds it (``--force-unlock``).

    After ``acquire``, ``note`` says whether a stale or forced lock was taken over
    (None otherwise).
    """

    def __init__(self, run_dir: str | os.PathLike, force: bool = False):
        self.path = Path(run_dir) / LOCK_FILE
        self.force = force
        self.note: str | None = None
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Takes the lock, or raises RunLockedError naming the holder and the way out."""
        for _ in range(10):  # the holder may remove the file between our open and lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                self._held_elsewhere()
                continue  # forced: the file was replaced, lock the new one
            if self._same_file(fd):
                self._fd = fd
                self._write_holder()
                return self
            os.close(fd)
        raise RunLockedError(f"could not lock {self.path}: it keeps changing")

    def _same_file(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def _held_elsewhere(self) -> None:
        """Raises RunLockedError; with ``force``, replaces the lock file instead."""
        holder = _holder(self.path)
        who = (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since "
               f"{holder.get('since', '?')}")
        if not self.force:
            raise RunLockedError(
                f"run directory {self.path.parent} is in use by {who} (lock file "
                f"{self.path}); wait for that run to finish or stop it. If no process uses "
                "the directory any more (e.g. its machine died), pass --force-unlock")
        self.note = f"--force-unlock: took over the lock of {who}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _write_holder(self) -> None:
        old = _holder(self.path)
        if old and self.note is None and old.get("pid") != os.getpid():
            state = ("not running" if old.get("host") == socket.gethostname()
                     and not _pid_alive(old.get("pid")) else "no longer holding it")
            self.note = (f"took over the lock left by pid {old.get('pid', '?')} on host "
                         f"{old.get('host', '?')} ({state})")
        data = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(data) + "\n").encode(), 0)

    def release(self) -> None:
        """Removes the lock file and releases the lock (safe to call twice)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if self._same_file(self._fd):
                os.unlink(self.path)
        os.close(self._fd)  # closing releases the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

"""Safe file output: atomic writes, writability checks before work, names kept inside a root.

The lowest layer: standard library only, so every other layer can use it.

- ``atomic_write_text`` / ``atomic_write_bytes`` / ``atomic_open``: write a temporary file
  in the destination's directory, flush and fsync it, then ``os.replace`` it over the
  destination. A reader sees the old file or the new one, never half of one; a failed
  write leaves the old file in place and no temporary behind.
- ``check_writable(directory)``: raises ``OutputError`` naming the path before any long
  work starts (a command that would write its results at the end calls it first).
- ``safe_name(name, what)``: a name used as one path component (evaluator section, run
  name, view name) must not climb out of its root (no separators, ``..``, absolute paths,
  NUL, or empty names); ``confined(root, *parts)`` joins and checks the result stays
  under ``root``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

_BAD_CHARS = ("/", "\\", "\x00")


class OutputError(OSError):
    """An output path cannot be written (permissions, missing parent, not a directory,
    disk full). The message names the path and what to do."""


class UnsafeNameError(ValueError):
    """A name meant as one path component would leave its root directory."""


# Longest safe name, in UTF-8 bytes: file systems allow 255 per path component, and some
# names get a suffix (a run name its timestamp, "-YYYYmmdd-HHMMSS").
MAX_NAME_BYTES = 200


def safe_name(name: object, what: str) -> str:
    """``name`` if it is safe as one path component under some root, else UnsafeNameError.

    Args:
      name: the name (e.g. an evaluator section, a run name, a view name).
      what: what the name is, for the message (e.g. ``"logging.run_name"``).
    """
    if not isinstance(name, str):
        raise UnsafeNameError(f"{what} must be a string, got {type(name).__name__} {name!r}")
    if not name or name.strip() != name:
        raise UnsafeNameError(f"{what} {name!r} must be a non-empty name without leading or "
                              "trailing spaces")
    if name in (".", "..") or any(c in name for c in _BAD_CHARS) or os.path.isabs(name):
        raise UnsafeNameError(
            f"{what} {name!r} is used as a file or directory name and must stay inside its "
            "output directory: no '/', '\\', '..' or absolute paths (use letters, digits, "
            "'-', '_', '.')")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise UnsafeNameError(
            f"{what} {name[:40]!r}... is {len(name.encode('utf-8', 'surrogatepass'))} bytes "
            f"long; as a file or directory name (with the suffixes added to it) it must stay "
            f"within {MAX_NAME_BYTES} bytes: shorten it")
    return name


def confined(root: str | os.PathLike, *parts: str) -> Path:
    """``root / parts...``, refusing a result outside ``root`` (UnsafeNameError).

    Symlinks are resolved on both sides, so a link inside ``root`` that points out is
    refused too.
    """
    base = Path(root).resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise UnsafeNameError(f"{os.path.join(*parts) if parts else ''!r} leads to {path}, "
                              f"outside {base}")
    return base.joinpath(*parts)


def check_writable(directory: str | os.PathLike, create: bool = True) -> Path:
    """Checks that files can be written in ``directory`` before any work starts.

    Args:
      directory: the output directory.
      create: create it (and its parents) if missing; otherwise a missing directory is
        an error.

    Returns:
      The directory as a Path.

    Raises:
      OutputError: it exists and is not a directory, cannot be created, or a probe file
        cannot be created in it. The message names the path.
    """
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputError(f"output path {path} exists and is not a directory; choose another "
                          "path")
    if not path.exists():
        if not create:
            raise OutputError(f"output directory {path} does not exist")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create the output directory {path}: "
                              f"{e.strerror or e}; choose a writable path") from e
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"cannot write in the output directory {path}: {e.strerror or e}; "
                          "choose a writable path") from e
    return path


def check_writable_file(path: str | os.PathLike) -> Path:
    """``check_writable`` for the directory that will hold the file ``path`` (created if
    missing); also refuses a ``path`` that is an existing directory."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise OutputError(f"output file {file} is a directory; give a file path")
    check_writable(file.parent if str(file.parent) else Path("."))
    return file


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w",
                encoding: str | None = "utf-8") -> Iterator[IO]:
    """Opens a temporary file next to ``path``; on a clean exit it replaces ``path``.

    On an exception inside the block the temporary file is removed and ``path`` is left
    as it was. ``mode`` is ``"w"`` or ``"wb"``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise OutputError(f"cannot write {target}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    with atomic_open(path, "w") as f:
        f.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Writes ``data`` to ``path`` atomically; returns the path."""
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def _fallback_dirs(path: Path) -> list[Path]:
    """Where a file goes when ``path`` cannot be written: next to its directory, then the
    system temp directory."""
    return [path.parent.parent, Path(tempfile.gettempdir())]


def _write_new_file(directory: Path, prefix: str, suffix: str, data: str | bytes) -> Path:
    """A new file with a unique name in ``directory`` holding ``data``, synced."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return Path(name)


def write_or_fallback(path: str | os.PathLike, data: str | bytes) -> tuple[Path, str | None]:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` so that the work that made it is
    never lost.

    First atomically to ``path`` (parents created; a reader never sees half a file). If
    that fails (unwritable, disk full, directory removed and not re-creatable), to a new
    file ``DIRNAME-STEM-XXXX.SUFFIX`` next to ``path``'s directory, else in the system
    temp directory.

    Returns:
      (the path written, None) or (the fallback path, a message naming ``path``, the
      reason and the fallback) for the caller to show.

    Raises:
      OutputError: no place at all could take the file; the message names them.
    """
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            atomic_write_text(path, data)
        else:
            atomic_write_bytes(path, data)
        return path, None
    except OSError as e:
        reason = e.strerror or str(e)
    tried = []
    for directory in _fallback_dirs(path):
        try:
            saved = _write_new_file(directory, f"{path.parent.name or 'out'}-{path.stem}-",
                                    path.suffix, data)
        except OSError as e:
            tried.append(f"{directory} ({e.strerror or e})")
            continue
        return saved, (f"could not write {path} ({reason}); saved it to {saved} instead. "
                       "Move it where it belongs, and free space or fix the path for the "
                       "next run.")
    raise OutputError(f"could not write {path} ({reason}) nor a copy in "
                      f"{' or '.join(tried)}; free space or choose a writable path.")

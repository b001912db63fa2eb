"""Publish a converted cache into its output directory without a window of damage.

``convert_to_shards`` writes shards and manifest into a fresh staging directory next to
the output directory (``.NAME.converting-XXXX``, same file system), and only when the
conversion has finished moves the result into place (``staged_cache``):

- output directory missing or empty: one ``rename`` of the staging directory;
- otherwise the two directories swap places (two renames), the files that are not the
  earlier cache's (anything but ``manifest.json`` and the shards it lists) move back into
  the new one, and the earlier cache is deleted;
- where the staging directory cannot be next to the output (parent not writable) or the
  swap fails (a mount point), the staging directory is inside the output directory and
  the files are moved in one by one, the new ``manifest.json`` last.

An interrupted or failed conversion removes its staging directory and leaves the output
directory as it was. Only names the earlier manifest lists (plain file names, checked by
``shards.previous_shard_files``) and ``manifest.json`` are ever deleted, and only inside
the output directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from jaxdrive.config import ConfigError
from jaxdrive.data import shards as shards_lib


def check_output_dir(out_dir: str | os.PathLike) -> list[str]:
    """Check ``out_dir`` can take a cache before any work; returns the shard files of the
    cache already there (to be replaced).

    Raises:
      ConfigError: ``out_dir`` exists and is not a directory, or its manifest lists shard
        names outside it.
    """
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out '{out_dir}' exists and is not a directory; choose another "
                          "output directory.")
    return shards_lib.previous_shard_files(out_dir) if os.path.isdir(out_dir) else []


def _make_staging(out_dir: str) -> tuple[str, bool]:
    """A fresh staging directory: next to ``out_dir`` if possible (True), else inside it."""
    parent, name = os.path.split(os.path.abspath(out_dir))
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{name}.converting-", dir=parent)
        os.chmod(staging, 0o777 & ~umask)  # the mode os.makedirs gives (mkdtemp: 0o700)
        return staging, True
    except OSError:
        pass
    try:
        os.makedirs(out_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=".converting-", dir=out_dir), False
    except OSError as e:
        raise ConfigError(f"cannot write the output directory '{out_dir}' "
                          f"({e.strerror or e}); choose a writable --out.") from None


@contextlib.contextmanager
def staged_cache(out_dir: str | os.PathLike) -> Iterator[str]:
    """Yields a fresh staging directory to write a cache into; on a clean exit the cache
    replaces the one in ``out_dir`` (see the module docstring), on an exception (Ctrl-C
    included) the staging directory is removed and ``out_dir`` is untouched.

    Raises:
      ConfigError: ``out_dir`` is not usable (``check_output_dir``).
    """
    out_dir = os.path.realpath(os.fspath(out_dir))  # a symlinked output stays a symlink
    check_output_dir(out_dir)
    staging, beside = _make_staging(out_dir)
    try:
        yield staging
        old = check_output_dir(out_dir)  # re-read: the directory may have changed
        if not (beside and _swap_in(staging, out_dir, old)):
            _move_in(staging, out_dir, old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: str, out_dir: str, old: list[str]) -> bool:
    """Put ``staging`` in the place of ``out_dir`` by renames; False if that is impossible
    here (then nothing changed)."""
    with contextlib.suppress(OSError):
        os.rename(staging, out_dir)  # out_dir missing or empty: atomic
        return True
    parent, name = os.path.split(out_dir)
    with contextlib.suppress(OSError):
        shutil.copymode(out_dir, staging)  # the output directory keeps its mode
    previous = None
    try:
        previous = tempfile.mkdtemp(prefix=f".{name}.previous-", dir=parent)
        os.rename(out_dir, previous)  # replaces the empty placeholder
    except OSError:
        if previous is not None:
            with contextlib.suppress(OSError):
                os.rmdir(previous)
        return False
    os.rename(staging, out_dir)
    _remove_cache(previous, old)
    for entry in sorted(os.listdir(previous)):  # the user's other files come along
        if not os.path.lexists(os.path.join(out_dir, entry)):
            os.rename(os.path.join(previous, entry), os.path.join(out_dir, entry))
    shutil.rmtree(previous, ignore_errors=True)  # what is left: replaced by the new cache
    return True


def _move_in(staging: str, out_dir: str, old: list[str]) -> None:
    """Move the staged cache into ``out_dir`` file by file; the old manifest goes first and
    the new one last, so ``out_dir`` is never a cache with a mix of shards."""
    os.makedirs(out_dir, exist_ok=True)
    _remove_cache(out_dir, old)
    files = sorted(os.listdir(staging))
    for name in [f for f in files if f != shards_lib.MANIFEST] + [shards_lib.MANIFEST]:
        shutil.move(os.path.join(staging, name), os.path.join(out_dir, name))


def _remove_cache(directory: str, shard_files: list[str]) -> None:
    """Delete ``manifest.json`` then the listed shard files (plain names) in
    ``directory``."""
    for name in [shards_lib.MANIFEST] + shard_files:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(os.path.join(directory, name))

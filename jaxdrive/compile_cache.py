"""The persistent compilation cache that every ``python -m jaxdrive.X`` command uses.

A restarted or requeued job compiles the same programs again: minutes at the GPU
presets, tens of seconds on a CPU. With JAX's persistent compilation cache on, a program
compiled once on this machine is loaded from disk instead (results are the same; only
compile time changes). ``run_command`` turns it on by default for every command but the
benchmarks (``bench``, ``autotune``), which measure compile time.

Where it lives, first match wins:

- ``JAX_COMPILATION_CACHE_DIR`` (JAX's own variable) or a cache directory already set in
  ``jax.config`` (a notebook, a test run): kept as it is.
- ``JAXDRIVE_CACHE_DIR``: this directory.
- ``$XDG_CACHE_HOME/jaxdrive/xla``, else ``~/.cache/jaxdrive/xla``.

``JAXDRIVE_COMPILATION_CACHE=off`` (or ``0``, ``false``, ``no``) turns it off. At each
start, a default cache directory holding more than ``DEFAULT_MAX_BYTES`` loses its least
recently used entries down to three quarters of that (JAX's own size limit needs the
``filelock`` package). Only programs that took at least JAX's
``jax_persistent_cache_min_compile_time_secs`` (1 s) to compile are stored.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax

__all__ = ["DEFAULT_MAX_BYTES", "OFF_VALUES", "default_dir", "enable", "prune"]

DEFAULT_MAX_BYTES = 4 * 2**30
OFF_VALUES = ("0", "off", "false", "no")


def default_dir(environ: dict | None = None) -> Path:
    """The cache directory when nothing else names one (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("JAXDRIVE_CACHE_DIR"):
        return Path(env["JAXDRIVE_CACHE_DIR"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxdrive" / "xla"


def enable(environ: dict | None = None) -> str | None:
    """Turns the persistent compilation cache on (see the module docstring); returns its
    directory, or None where it is off. A directory that cannot be created is reported
    in one ``note:`` line on stderr and the command runs without the cache."""
    env = os.environ if environ is None else environ
    if env.get("JAXDRIVE_COMPILATION_CACHE", "").strip().lower() in OFF_VALUES:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return current
    path = default_dir(env)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"note: no compilation cache ({path}: {e.strerror or e}); programs are "
              "compiled at every start. Set JAXDRIVE_CACHE_DIR to a writable directory, "
              "or JAXDRIVE_COMPILATION_CACHE=off to silence this.", file=sys.stderr)
        return None
    prune(path, DEFAULT_MAX_BYTES)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return str(path)


def prune(path: Path, max_bytes: int) -> int:
    """Deletes the least recently used files of ``path`` (by access, else modification
    time) while it holds more than ``max_bytes``, down to three quarters of it; returns
    the bytes freed. Files another process removes meanwhile are skipped."""
    entries = []
    for f in path.iterdir():
        try:
            st = f.stat()
        except OSError:
            continue
        if f.is_file():
            entries.append((max(st.st_atime, st.st_mtime), st.st_size, f))
    total = sum(size for _, size, _ in entries)
    if total <= max_bytes:
        return 0
    freed = 0
    for _, size, f in sorted(entries):
        if total - freed <= 0.75 * max_bytes:
            break
        try:
            f.unlink()
            freed += size
        except OSError:
            continue
    return freed

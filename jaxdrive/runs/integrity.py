"""Checksums of saved checkpoints: every file of a step directory, recorded after the save.

orbax commits a step by renaming its temporary directory, but it never checks the bytes it
reads back: a flipped bit in an array file restores silently. After orbax has committed
``<which>/<step>/``, the checkpointer records the size and SHA-256 of every file under it in
``<which>/<step>/checksums.json`` (written atomically, last). A step is intact when its
files match the record exactly: nothing missing, nothing truncated or changed, nothing
added. A step without a record is a save that did not finish (killed or failed between
orbax's commit and the record).

Directories written before checksums existed have no record anywhere; they are accepted as
``legacy`` (not verified) so that old runs still load.

Host-side, standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from jaxdrive.files import atomic_write_text

RECORD = "checksums.json"
_FORMAT = 1
_CHUNK = 1 << 20


def _files(step_dir: Path) -> list[str]:
    """Relative paths (``/``-separated, sorted) of the files under ``step_dir``, record
    excluded."""
    out = []
    for root, dirs, files in os.walk(step_dir):
        dirs.sort()
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), step_dir).replace(os.sep, "/")
            if rel != RECORD:
                out.append(rel)
    return sorted(out)


def _digest(path: Path) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex digest) of one file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def write_record(step_dir: str | os.PathLike) -> Path:
    """Records size and SHA-256 of every file under ``step_dir`` in its ``checksums.json``.

    Call it once the step is committed (no file changes after). Returns the record's path.
    """
    step_dir = Path(step_dir)
    files = {}
    for rel in _files(step_dir):
        size, sha = _digest(step_dir / rel)
        files[rel] = {"size": size, "sha256": sha}
    record = {"format": _FORMAT, "algorithm": "sha256", "files": files}
    return atomic_write_text(step_dir / RECORD, json.dumps(record, indent=1, sort_keys=True))


def has_record(step_dir: str | os.PathLike) -> bool:
    """Whether ``step_dir`` holds a checksum record (intact or not)."""
    return (Path(step_dir) / RECORD).exists()


def _read_record(step_dir: Path) -> dict[str, dict]:
    """The ``files`` table of the record; ValueError with the reason if it is damaged."""
    try:
        record = json.loads((step_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"its checksum record {RECORD} is unreadable ({e})") from e
    files = record.get("files") if isinstance(record, dict) else None
    ok = (isinstance(files, dict) and record.get("format") == _FORMAT and all(
        isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"),
                                                                               str)
        for v in files.values()))
    if not ok:
        raise ValueError(f"its checksum record {RECORD} is damaged (not a format-{_FORMAT} "
                         "record of file sizes and SHA-256 sums)")
    return files


def problems(step_dir: str | os.PathLike, legacy: bool = False) -> list[str]:
    """What is wrong with the step directory ``step_dir``; empty if it is intact.

    Args:
      step_dir: ``<checkpoints>/<which>/<step>``.
      legacy: accept a step without a record (a directory saved before checksums
        existed); otherwise a missing record means an unfinished save.

    Returns:
      One reason per damaged file (missing, truncated or grown, changed bytes,
      unexpected), or the one reason the record itself is missing or damaged.
    """
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return ["it is not a directory"]
    if not has_record(step_dir):
        if legacy:
            return []
        return [f"it has no checksum record {RECORD}: the save did not finish (the process "
                "was killed or the save failed)"]
    try:
        files = _read_record(step_dir)
    except ValueError as e:
        return [str(e)]
    found = []
    for rel, want in sorted(files.items()):
        path = step_dir / rel
        if not path.is_file():
            found.append(f"{rel} is missing")
            continue
        try:
            size, sha = _digest(path)
        except OSError as e:
            found.append(f"{rel} cannot be read ({e.strerror or e})")
            continue
        if size != want["size"]:
            found.append(f"{rel} has {size} bytes, {want['size']} were saved (truncated or "
                         "overwritten)")
        elif sha != want["sha256"]:
            found.append(f"{rel} does not match its checksum (its bytes changed after the "
                         "save)")
    found += [f"{rel} was not part of the save" for rel in _files(step_dir) if rel not in files]
    return found


def describe(found: list[str], limit: int = 3) -> str:
    """The first ``limit`` problems in one line, with a count of the rest."""
    more = f" (and {len(found) - limit} more)" if len(found) > limit else ""
    return "; ".join(found[:limit]) + more

"""Input discovery: files and directories -> JSON scenes and WOMD TFRecord records.

Every unusable input becomes a skip entry ``{"source", "reason"}``, never an exception
deep inside the conversion.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator

from jaxdrive.config import ConfigError
from jaxdrive.data.json_scene import GZIP_MAGIC, read_json_scene
from jaxdrive.data.raw import RawScene, SceneError
from jaxdrive.data.tfrecord import (
    EMPTY_TFRECORD,
    TFRecordError,
    check_record,
    looks_like_tfrecord,
    scan_records,
)
from jaxdrive.data.womd import parse_scenario

JSON = "json"
TFRECORD = "tfrecord"


JSON_SUFFIXES = (".json", ".json.gz")


def is_json_name(name: str) -> bool:
    """Whether a file name is a JSON scene's (``.json`` or ``.json.gz``; not a manifest)."""
    low = name.lower()
    return low.endswith(JSON_SUFFIXES) and low != "manifest.json"


def file_kind(path: str) -> str | None:
    """``"json"``, ``"tfrecord"`` or ``None`` for a file (by suffix, then by content;
    gzip-compressed JSON counts as JSON)."""
    name = os.path.basename(path).lower()
    if name.endswith(JSON_SUFFIXES):
        return JSON
    if looks_like_tfrecord(path):
        return TFRECORD
    if "tfrecord" in name:  # named like one but the first header fails: report as such
        return TFRECORD
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        if head.startswith(GZIP_MAGIC):
            with gzip.open(path, "rb") as f:
                head = f.read(64)
    except (OSError, EOFError, zlib.error):
        return None
    return JSON if head.lstrip().startswith(b"{") else None


def expand_inputs(paths: list[str]) -> list[tuple[str, str | None]]:
    """[(file, kind)] for files and directories (searched recursively, sorted).

    Raises:
      ConfigError: an input path does not exist.
    """
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    if is_json_name(name) or "tfrecord" in name.lower():
                        found.append(os.path.join(root, name))
            out.extend((f, file_kind(f)) for f in found)
        elif os.path.isfile(p):
            out.append((p, file_kind(p)))
        else:
            raise ConfigError(f"input '{p}' does not exist; pass JSON scene files, WOMD "
                              "TFRecord files or directories holding them.")
    return out


def iter_items(files: list[tuple[str, str | None]], defer_crc: bool = False
               ) -> Iterator[tuple]:
    """Work items: ``("json", path)``, ``("proto", bytes, source, crc)`` or ``("skip",
    entry)``. With ``defer_crc`` the payload CRC is checked by ``read_item`` (in a worker
    process) instead of here; ``crc`` is then the stored value, else ``None``."""
    for path, kind in files:
        if kind == JSON:
            yield (JSON, path)
        elif kind == TFRECORD:
            yield from _tfrecord_items(path, defer_crc)
        else:
            yield ("skip", {"source": path, "reason": "not a JSON scene or a TFRecord file"})


def _tfrecord_items(path: str, defer_crc: bool) -> Iterator[tuple]:
    """Work items of one TFRecord file; an empty or unreadable file is one skip entry."""
    count = 0
    try:
        for rec in scan_records(path, defer_data_crc=defer_crc):
            count += 1
            source = f"{path}#{rec.index}"
            if rec.error:
                yield ("skip", {"source": source, "reason": rec.error})
            else:
                yield ("proto", rec.data, source, rec.data_crc)
    except OSError as e:
        yield ("skip", {"source": path, "reason": f"cannot read the file ({e.strerror or e})"})
        return
    if count == 0:
        yield ("skip", {"source": path, "reason": EMPTY_TFRECORD})


def read_item(item: tuple) -> RawScene:
    """Read one work item into a ``RawScene``; ``SceneError`` if it is unusable."""
    if item[0] == JSON:
        return read_json_scene(item[1])
    if item[0] == "proto":
        if item[3] is not None:
            try:
                check_record(item[1], item[3], item[2])
            except TFRecordError as e:
                raise SceneError(str(e)) from None
        return parse_scenario(item[1], item[2])
    raise SceneError(item[1]["reason"])


def item_source(item: tuple) -> str:
    """Where a work item came from: the file path (``path#index`` for a TFRecord record)."""
    return {JSON: lambda: item[1], "proto": lambda: item[2],
            "skip": lambda: item[1]["source"]}[item[0]]()

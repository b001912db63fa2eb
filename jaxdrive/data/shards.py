"""Converted-scenario cache: ``.npz`` shards plus ``manifest.json``.

A cache directory holds ``shard-00000.npz, shard-00001.npz, ...`` and ``manifest.json``.
Each shard stores every ``Scenario`` leaf under its dotted path (``objects.xy`` ...) with
a leading scenario axis, plus ``meta.scenario_id`` (n,) str and ``meta.origin`` (n, 2)
float64 (the world position of each scene's coordinate origin).

``manifest.json`` (``MANIFEST_VERSION``): ``num_scenarios``, ``num_shards``, ``shards``
[{file, num_scenarios, bytes}], ``total_bytes``, ``source_files``, ``skipped``
[{source, reason}], ``truncated_agents``, ``truncated_road_points`` and ``totals`` (every
per-scene count summed), ``scenarios`` (one record per scene: id, source, shard, index,
origin, kept sizes and counts), ``scenario_config``, ``convert_config``, ``classes``
(behaviour-class subsets, see ``subsets.py``), ``version``, ``created``.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

from jaxdrive.config import ConfigError
from jaxdrive.data.convert import REPORT_COUNTS, ConvertConfig
from jaxdrive.scenarios.base import ScenarioConfig

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
FORMAT = "jaxdrive-scenario-shards"
# Per-scene record fields copied from the converter's info into the manifest.
_RECORD_FIELDS = ("scenario_id", "source", "origin", "num_agents", "num_objects_in",
                  "num_road_points", "num_road_points_in", "road_stride") + REPORT_COUNTS
# Index fills for padding to larger sizes (everything else pads with 0 / False).
_MINUS_ONE = ("roadgraph.id", "lanes.successors", "traffic_lights.lane_id")


def _publish(tmp: str, path: str) -> None:
    """Move a finished temp file into place with the usual permissions (mkstemp's are
    owner-only)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def _write_npz(f, arrays: dict[str, np.ndarray], compress: bool) -> None:
    """An ``.npz`` (readable by ``np.load``); deflate level 1 when compressing: padded
    scenario arrays shrink about 4x at level 1 already, at a third of level 6's time."""
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(f, "w", compression=mode, compresslevel=1 if compress else None,
                         allowZip64=True) as z:
        for key, value in arrays.items():
            with z.open(f"{key}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asarray(value), allow_pickle=False)


def shard_name(i: int) -> str:
    """File name of shard ``i``: ``shard-00000.npz``."""
    return f"shard-{i:05d}.npz"


class ShardWriter:
    """Buffers converted scenes and writes them ``shard_size`` at a time.

    Use ``add(arrays, info)`` per scene, ``skip(source, reason)`` per rejected input and
    ``close()`` to flush and write the manifest (returned).
    """

    def __init__(self, directory: str | os.PathLike, scenario_config: ScenarioConfig,
                 convert_config: ConvertConfig, shard_size: int = 128, compress: bool = True):
        if shard_size < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard_size}.")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        _remove_previous(self.directory)
        self.scenario_config = scenario_config
        self.convert_config = convert_config
        self.shard_size = shard_size
        self.compress = compress
        self._buffer: list[tuple[dict, dict]] = []
        self.shards: list[dict] = []
        self.records: list[dict] = []
        self.skipped: list[dict] = []
        self.source_files: list[str] = []

    def add_source(self, path: str) -> None:
        """Record ``path`` among the manifest's ``source_files``."""
        self.source_files.append(os.fspath(path))

    def add(self, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        """Buffer one converted scene (``arrays``: its padded scenario arrays, no batch axis;
        ``info``: its record fields, ``scenario_id`` and ``origin`` required); writes a shard
        once ``shard_size`` scenes are buffered."""
        self._buffer.append((arrays, info))
        if len(self._buffer) >= self.shard_size:
            self._flush()

    def skip(self, source: str, reason: str) -> None:
        """Record an input that could not be converted, with the reason (manifest
        ``skipped``)."""
        self.skipped.append({"source": source, "reason": reason})

    def _flush(self) -> None:
        if not self._buffer:
            return
        index = len(self.shards)
        name = shard_name(index)
        arrays = {key: np.stack([a[key] for a, _ in self._buffer])
                  for key in self._buffer[0][0]}
        arrays["meta.scenario_id"] = np.array([i["scenario_id"] for _, i in self._buffer],
                                              dtype=np.str_)
        arrays["meta.origin"] = np.array([i["origin"] for _, i in self._buffer], np.float64)
        path = os.path.join(self.directory, name)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            _write_npz(f, arrays, self.compress)
        _publish(tmp, path)
        for row, (_, info) in enumerate(self._buffer):
            rec = {k: info[k] for k in _RECORD_FIELDS if k in info}
            rec.update(shard=index, index=row)
            if info.get("notes"):
                rec["notes"] = info["notes"]
            self.records.append(rec)
        self.shards.append({"file": name, "num_scenarios": len(self._buffer),
                            "bytes": os.path.getsize(path)})
        self._buffer = []

    def close(self) -> dict[str, Any]:
        """Flush the last shard, write ``manifest.json`` and return the manifest."""
        self._flush()
        totals = {k: int(sum(r.get(k, 0) for r in self.records)) for k in REPORT_COUNTS}
        manifest = {
            "format": FORMAT, "version": MANIFEST_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "num_scenarios": len(self.records), "num_shards": len(self.shards),
            "num_skipped": len(self.skipped),
            "truncated_agents": totals["truncated_agents"],
            "truncated_road_points": totals["truncated_road_points"],
            "totals": totals,
            "total_bytes": int(sum(s["bytes"] for s in self.shards)),
            "scenario_config": self.scenario_config.to_dict(),
            "convert_config": self.convert_config.to_dict(),
            "source_files": self.source_files, "shards": self.shards,
            "skipped": self.skipped, "scenarios": self.records, "classes": {},
        }
        write_manifest(self.directory, manifest)
        return manifest


def _remove_previous(directory: str) -> None:
    """Delete the shards a previous conversion into ``directory`` listed (no stale data)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return
    try:
        old = read_manifest(directory)
    except ConfigError:
        return
    for shard in old.get("shards", []):
        try:
            os.remove(os.path.join(directory, shard["file"]))
        except OSError:
            pass
    os.remove(path)


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically."""
    directory = os.fspath(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".json.tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
    _publish(tmp, os.path.join(directory, MANIFEST))


def is_shard_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a converted-data manifest."""
    return os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST))


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a cache directory; ``ConfigError`` if missing or unreadable."""
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"'{directory}' has no {MANIFEST}; convert data into it with "
                          "python -m jaxdrive.data convert INPUT... --out DIR.") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"'{path}' is not valid JSON ({e}); reconvert the data.") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise ConfigError(
            f"'{path}' is format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}; this jaxdrive reads {FORMAT!r} version "
            f"{MANIFEST_VERSION}. Reconvert the data with python -m jaxdrive.data convert.")
    return manifest


def manifest_scenario_config(manifest: dict[str, Any]) -> ScenarioConfig:
    """The ``ScenarioConfig`` (padded sizes) the manifest's shards were written with."""
    return ScenarioConfig.from_dict(manifest["scenario_config"])


def read_shard(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All arrays of one shard file (leading axis = scenes in the shard)."""
    try:
        with np.load(os.fspath(path), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read shard '{path}' ({e}); reconvert the data.") from None


def adapt_arrays(arrays: dict[str, np.ndarray], stored: ScenarioConfig,
                 wanted: ScenarioConfig, batch_dims: int = 1) -> dict[str, np.ndarray]:
    """Pad stored scenario arrays to ``wanted`` sizes (never shrink).

    Non-lane polyline ids (``>= max_lanes``) move with ``max_lanes`` so that lane ids stay
    ``[0, L)``. Raises ``ConfigError`` if any wanted size is smaller than the stored one
    (fewer agents or road points need a reconversion, which reselects what to keep).
    """
    if stored == wanted:
        return arrays
    smaller = [k for k, v in wanted.to_dict().items() if v < getattr(stored, k)]
    if smaller:
        pairs = ", ".join(f"{k}: stored {getattr(stored, k)} > wanted {getattr(wanted, k)}"
                          for k in smaller)
        raise ConfigError(
            f"converted scenarios are larger than the requested ScenarioConfig ({pairs}). "
            "Reconvert with the smaller sizes (python -m jaxdrive.data convert ... "
            "--max-agents/--max-road-points/...) or raise the config's sizes.")
    shapes = wanted.shapes()
    out = {}
    for key, arr in arrays.items():
        if key.startswith("meta."):
            out[key] = arr
            continue
        if key == "roadgraph.id":
            arr = np.where(arr >= stored.max_lanes,
                           arr + (wanted.max_lanes - stored.max_lanes), arr)
        target = shapes[key]
        pad = [(0, 0)] * batch_dims + [(0, w - g) for g, w in zip(arr.shape[batch_dims:],
                                                                    target, strict=True)]
        fill = -1 if key in _MINUS_ONE else 0
        out[key] = np.pad(arr, pad, constant_values=fill).astype(arr.dtype)
    return out

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
(behaviour-class subsets, see ``subsets.py``), ``version``, ``created``; ``split`` and
``augment`` (``{mirror, id_suffix, mirrored_scenes}``) when converted with ``--split`` /
``--mirror``.
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
from jaxdrive.files import UnsafeNameError, safe_name
from jaxdrive.scenarios.base import ScenarioConfig

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
FORMAT = "jaxdrive-scenario-shards"
# Per-scene record fields copied from the converter's info into the manifest.
_RECORD_FIELDS = ("scenario_id", "source", "origin", "num_agents", "num_objects_in",
                  "num_road_points", "num_road_points_in", "road_tolerance",
                  "sdc_inferred", "mirror_of") + REPORT_COUNTS
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
    ``close()`` to flush and write the manifest (returned). Write into a fresh directory
    (``convert_to_shards`` writes into a staging directory and publishes it with
    ``staging.staged_cache``): shards of an earlier cache there are not removed.
    """

    def __init__(self, directory: str | os.PathLike, scenario_config: ScenarioConfig,
                 convert_config: ConvertConfig, shard_size: int = 128, compress: bool = True):
        if shard_size < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard_size}.")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.scenario_config = scenario_config
        self.convert_config = convert_config
        self.shard_size = shard_size
        self.compress = compress
        self._buffer: list[tuple[dict, dict]] = []
        self.shards: list[dict] = []
        self.records: list[dict] = []
        self.skipped: list[dict] = []
        self.source_files: list[str] = []
        self.extra: dict[str, Any] = {}  # more manifest fields (e.g. ``split``)

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
            **self.extra,
        }
        write_manifest(self.directory, manifest)
        return manifest


def previous_shard_files(directory: str | os.PathLike) -> list[str]:
    """File names of the shards an earlier conversion into ``directory`` listed (to be
    replaced); empty if there is no manifest or it is not a readable one of ours.

    Raises:
      ConfigError: the manifest lists a shard name that is not a plain file name in
        ``directory`` (absolute path, ``..``, separators): nothing is deleted then.
    """
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path, "rb") as f:
            old = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(old, dict) or old.get("format") != FORMAT:
        return []  # not ours: nothing it lists is deleted
    shards = old.get("shards")
    if not isinstance(shards, list):
        return []
    return [_shard_file(shard, j, path) for j, shard in enumerate(shards)]


def _shard_file(shard: Any, j: int, manifest_path: str) -> str:
    """The ``file`` of manifest entry ``shards[j]``, refused unless a plain file name."""
    name = shard.get("file") if isinstance(shard, dict) else None
    try:
        return safe_name(name, f"shards[{j}].file")
    except UnsafeNameError as e:
        raise ConfigError(f"'{manifest_path}': {e}. A shard must be a file of the manifest's "
                          "own directory; nothing was read or deleted. Reconvert the data "
                          "(remove this manifest.json first).") from None


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
    """The manifest of a cache directory, checked (``check_manifest``).

    Raises:
      ConfigError: missing, unreadable, another format, or malformed (naming the entry).
    """
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise ConfigError(f"'{directory}' has no {MANIFEST}; convert data into it with "
                          "python -m jaxdrive.data convert INPUT... --out DIR.") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"'{path}' is not valid JSON ({e}); reconvert the data.") from None
    except OSError as e:
        raise ConfigError(f"cannot read '{path}' ({e.strerror or e}).") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"'{path}' is not a manifest (a JSON object); reconvert the data.")
    if manifest.get("format") != FORMAT or manifest.get("version") != MANIFEST_VERSION:
        raise ConfigError(
            f"'{path}' is format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}; this jaxdrive reads {FORMAT!r} version "
            f"{MANIFEST_VERSION}. Reconvert the data with python -m jaxdrive.data convert.")
    check_manifest(manifest, path)
    return manifest


def _index(value: Any, upper: int) -> bool:
    """Whether ``value`` is an int (not bool) in ``[0, upper)``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < upper


def check_manifest(manifest: dict[str, Any], path: str) -> None:
    """Raise ``ConfigError`` naming ``path`` and the entry unless every field the readers
    use is well formed: ``shards`` [{file: a plain file name, num_scenarios}],
    ``scenarios`` [{scenario_id, shard, index}] pointing into them, ``skipped`` a list,
    ``scenario_config`` / ``convert_config`` objects, ``classes`` an object."""
    def fail(what: str):
        raise ConfigError(f"'{path}': {what}; the manifest is damaged or incomplete. "
                          "Reconvert the data.")

    for key, kind in (("shards", list), ("scenarios", list), ("skipped", list),
                      ("scenario_config", dict), ("convert_config", dict)):
        if not isinstance(manifest.get(key), kind):
            fail(f"'{key}' is missing or not a {kind.__name__}")
    if not isinstance(manifest.get("classes", {}), dict):
        fail("'classes' is not an object")
    sizes = []
    for j, shard in enumerate(manifest["shards"]):
        _shard_file(shard, j, path)
        if not _index(shard.get("num_scenarios"), 1 << 62):
            fail(f"shards[{j}].num_scenarios is not a count")
        sizes.append(shard["num_scenarios"])
    if len(manifest["scenarios"]) != sum(sizes):
        fail(f"{len(manifest['scenarios'])} scenario records for {sum(sizes)} stored scenarios")
    for i, rec in enumerate(manifest["scenarios"]):
        if not isinstance(rec, dict) or not isinstance(rec.get("scenario_id"), str):
            fail(f"scenarios[{i}] has no 'scenario_id' string")
        if not _index(rec.get("shard"), len(sizes)):
            fail(f"scenarios[{i}].shard {rec.get('shard')!r} is not one of the "
                 f"{len(sizes)} shards")
        if not _index(rec.get("index"), sizes[rec["shard"]]):
            fail(f"scenarios[{i}].index {rec.get('index')!r} is not a row of shard "
                 f"{rec['shard']} ({sizes[rec['shard']]} rows)")


def manifest_scenario_config(manifest: dict[str, Any]) -> ScenarioConfig:
    """The ``ScenarioConfig`` (padded sizes) the manifest's shards were written with."""
    return ScenarioConfig.from_dict(manifest["scenario_config"], "manifest.scenario_config")


def shard_path(directory: str | os.PathLike, manifest: dict[str, Any], shard: int) -> str:
    """Path of shard ``shard`` of a manifest read from ``directory`` (its name checked to
    be a plain file name in ``directory``)."""
    name = _shard_file(manifest["shards"][shard], shard,
                       os.path.join(os.fspath(directory), MANIFEST))
    return os.path.join(os.fspath(directory), name)


# dtype of every stored scenario array (as ``convert_scene`` writes them).
_FLOAT_KEYS = ("roadgraph.xy", "roadgraph.dir", "traffic_lights.stop_xy", "objects.xy",
               "objects.yaw", "objects.vel", "objects.length", "objects.width",
               "objects.goal")
_BOOL_KEYS = ("roadgraph.valid", "lanes.valid", "traffic_lights.valid", "objects.valid",
              "objects.is_sdc", "objects.of_interest", "objects.to_predict")


def shard_dtype(key: str) -> np.dtype:
    """The dtype a shard stores scenario array ``key`` in (float32, bool or int32)."""
    if key in _FLOAT_KEYS:
        return np.dtype(np.float32)
    return np.dtype(bool) if key in _BOOL_KEYS else np.dtype(np.int32)


def read_shard(path: str | os.PathLike, config: ScenarioConfig | None = None,
               num_scenarios: int | None = None) -> dict[str, np.ndarray]:
    """All arrays of one shard file (leading axis = scenes in the shard).

    With ``config`` (the sizes it was written with) the arrays are checked
    (``check_shard``). Raises ``ConfigError`` naming the shard if it cannot be read
    (missing, not a zip, truncated, damaged member) or fails the check.
    """
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - zip, zlib, npy-format and I/O errors alike
        raise ConfigError(f"cannot read shard '{path}' ({type(e).__name__}: {e}); the file "
                          "is damaged or incomplete: reconvert the data.") from None
    if config is not None:
        check_shard(arrays, path, config, num_scenarios)
    return arrays


def check_shard(arrays: dict[str, np.ndarray], path: str, config: ScenarioConfig,
                num_scenarios: int | None = None) -> None:
    """Raise ``ConfigError`` naming ``path`` unless the shard holds every scenario array
    with shape (n,) + ``config.shapes()[key]`` and its dtype, ``meta.scenario_id`` (n,) str
    and ``meta.origin`` (n, 2), all floats finite, n = ``num_scenarios`` if given."""
    def fail(what: str):
        raise ConfigError(f"shard '{path}': {what}; the file is damaged or not from this "
                          "manifest: reconvert the data.")

    expected = {k: (shard_dtype(k), shape) for k, shape in config.shapes().items()}
    missing = sorted(set(expected) - set(arrays))
    if missing or "meta.scenario_id" not in arrays or "meta.origin" not in arrays:
        fail(f"missing arrays {missing or ['meta.scenario_id / meta.origin']}")
    n = arrays["objects.xy"].shape[0] if arrays["objects.xy"].ndim else -1
    if num_scenarios is not None and n != num_scenarios:
        fail(f"holds {n} scenarios, the manifest lists {num_scenarios}")
    expected["meta.origin"] = (np.dtype(np.float64), (2,))
    for key, (dtype, shape) in expected.items():
        arr = arrays[key]
        if arr.shape != (n,) + shape or arr.dtype != dtype:
            fail(f"'{key}' is {arr.dtype} {arr.shape}, expected {dtype} {(n,) + shape}")
        if dtype.kind == "f" and not np.isfinite(arr).all():
            fail(f"'{key}' holds non-finite values")
    ids = arrays["meta.scenario_id"]
    if ids.shape != (n,) or ids.dtype.kind != "U":
        fail(f"'meta.scenario_id' is {ids.dtype} {ids.shape}, expected str ({n},)")


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
            "Raise the config's sizes to the stored ones ("
            + " ".join(f"--set env.scenario.{k}={getattr(stored, k)}" for k in smaller)
            + ") or reconvert with the smaller sizes (python -m jaxdrive.data convert ... "
            "--max-agents/--max-road-points/...).")
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

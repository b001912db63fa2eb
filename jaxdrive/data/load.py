"""Host-side entry points: convert inputs into a shard cache, load scenarios in memory."""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxdrive.config import ConfigError
from jaxdrive.data import shards as shards_lib
from jaxdrive.data.augment import MIRROR_SUFFIX, mirror_info, mirror_scenario
from jaxdrive.data.convert import (
    REPORT_COUNTS,
    ConvertConfig,
    arrays_to_scenario,
    convert_scene,
    scenario_to_arrays,
)
from jaxdrive.data.raw import SceneError
from jaxdrive.data.sources import expand_inputs, item_source, iter_items, read_item
from jaxdrive.data.split import (
    DEFAULT_VALIDATION_FRACTION,
    RULE,
    SPLITS,
    check_fraction,
    split_of,
)
from jaxdrive.data.staging import staged_cache
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.types import RoadType, Scenario

UNEXPECTED = "unexpected error while reading"
MIRROR_VALIDATION = ("--mirror cannot be combined with --split validation: mirrored copies "
                     "are training augmentation, the held-out split is never augmented.")


def _convert_item(args) -> tuple:
    """Worker: one work item -> ("ok", arrays, info) or ("skip", entry).

    The per-scene boundary: whatever goes wrong with one input (a ``SceneError`` from the
    readers and the converter, or anything they did not foresee) becomes a skip entry
    naming the input, never an exception that ends the conversion.
    """
    item, config, convert = args
    if item[0] == "skip":
        return ("skip", item[1])
    source = item_source(item)
    try:
        raw = read_item(item)
        arrays, info = convert_scene(raw, config, convert)
    except SceneError as e:
        return ("skip", {"source": source, "reason": str(e)})
    except Exception as e:  # noqa: BLE001 - one bad input must not end the conversion
        return ("skip", {"source": source,
                         "reason": f"{source}: {UNEXPECTED} ({type(e).__name__}: {e})"[:2000]})
    return ("ok", arrays, info)


def iter_converted(
    paths: list[str], config: ScenarioConfig, convert: ConvertConfig | None = None,
    workers: int = 1,
) -> Iterator[tuple]:
    """Converted scenes of ``paths`` in input order: ``("ok", arrays, info)`` or
    ``("skip", {"source", "reason"})``. ``workers > 1`` parses and converts in that many
    processes (file reading and CRC checks stay in this one)."""
    convert = convert or ConvertConfig()
    files = expand_inputs(paths)
    jobs = ((item, config, convert) for item in iter_items(files, defer_crc=workers > 1))
    if workers <= 1:
        for job in jobs:
            yield _convert_item(job)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork after JAX started threads
    # Workers ignore Ctrl-C (the terminal sends it to them too): the parent decides.
    with ctx.Pool(workers, initializer=signal.signal,
                  initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
        # A bounded number in flight, in order: Pool.imap would read a whole multi-GB
        # input ahead into memory.
        pending = collections.deque()
        for job in jobs:
            pending.append(pool.apply_async(_convert_item, (job,)))
            if len(pending) >= 8 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _unusable(arrays: dict[str, np.ndarray], info: dict, seen: dict[str, str]) -> str | None:
    """Why a converted scene cannot be used (None if it can): no road edges (off-road
    detection needs them), or a scenario id already in ``seen`` (id -> first source:
    the same scene given twice). The caller records the scenes it keeps in ``seen``."""
    sid = str(info["scenario_id"])
    if sid in seen:
        return (f"{info['source']}: scenario {sid} is already in the set (from "
                f"{seen[sid]}); the same scene twice is kept once")
    edges = arrays["roadgraph.valid"] & (arrays["roadgraph.type"] == RoadType.ROAD_EDGE)
    if not edges.any():
        return (f"{info['source']}: scenario {sid} has no road-edge points (off-road "
                "detection needs them)")
    return None


def _keep(info: dict, seen: dict[str, str]) -> None:
    """Records a kept scene's id in ``seen`` (see ``_unusable``)."""
    seen[str(info["scenario_id"])] = str(info.get("source", ""))


class ConversionStopped(Exception):
    """``convert_to_shards`` stopped before publishing, as ``should_stop`` asked; the
    output directory is as it was."""


def convert_to_shards(
    paths: list[str], out_dir: str | os.PathLike, config: ScenarioConfig,
    convert: ConvertConfig | None = None, shard_size: int = 128, compress: bool = True,
    workers: int = 1, should_stop: Callable[[], bool] | None = None,
    split: str | None = None, validation_fraction: float = DEFAULT_VALIDATION_FRACTION,
    mirror: bool = False,
) -> dict[str, Any]:
    """Convert JSON scenes / TFRecord files into shards in ``out_dir``; returns the manifest.

    ``mirror`` also writes each kept scene's mirrored copy (``augment.mirror_scenario``)
    right after it, with id ``<id>~mirror`` (record ``mirror_of``: the original id); the
    manifest's ``augment`` field says so. Refused with ``split="validation"``: the
    held-out split is never augmented.

    ``split`` (``"train"`` or ``"validation"``) keeps only the scenes of that split
    (``jaxdrive.data.split``: by a hash of the scenario id, ``validation_fraction`` of
    them for validation); the manifest's ``split`` field records the rule and how many
    scenes the other split took.

    The cache is written into a staging directory and replaces the one in ``out_dir``
    only once complete (``staging.staged_cache``): an interrupted or failed conversion
    leaves ``out_dir`` as it was. Unusable inputs are skipped with their reasons
    (manifest ``skipped``).

    ``should_stop()`` is asked before each scene and before publishing: True stops the
    conversion (``ConversionStopped``; nothing staged is left behind).

    Raises:
      ConfigError: an input is missing, ``out_dir`` is not a directory or holds a
        manifest listing files outside it, ``shard_size`` < 1, or ``mirror`` with the
        validation split.
      ConversionStopped: ``should_stop()`` said so.
    """
    convert = convert or ConvertConfig()
    stop = should_stop or (lambda: False)
    if split is not None and split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if mirror and split == "validation":
        raise ConfigError(MIRROR_VALIDATION)
    check_fraction(validation_fraction)
    files = expand_inputs(paths)
    other = 0  # usable scenes of the other split
    mirrored = 0
    with staged_cache(out_dir) as staging:
        writer = shards_lib.ShardWriter(staging, config, convert, shard_size, compress)
        for path, _ in files:
            writer.add_source(path)
        seen: dict[str, str] = {}
        for result in iter_converted(paths, config, convert, workers):
            if stop():
                raise ConversionStopped
            why = _unusable(result[1], result[2], seen) if result[0] == "ok" else None
            if result[0] == "ok" and why is None:
                _keep(result[2], seen)
                if split is None or split_of(str(result[2]["scenario_id"]),
                                             validation_fraction) == split:
                    writer.add(result[1], result[2])
                    if mirror:
                        info = mirror_info(result[2])
                        if str(info["scenario_id"]) in seen:
                            writer.skip(info["source"], f"{info['source']}: mirrored copy "
                                        f"{info['scenario_id']} is already in the set")
                        else:
                            _keep(info, seen)  # a later input with the copy's id is skipped
                            writer.add(scenario_to_arrays(mirror_scenario(
                                arrays_to_scenario(result[1]))), info)
                            mirrored += 1
                else:
                    other += 1
            elif why is not None:
                writer.skip(result[2]["source"], why)
            else:
                writer.skip(result[1]["source"], result[1]["reason"])
        if split is not None:
            writer.extra["split"] = {"name": split, "validation_fraction":
                                     validation_fraction, "rule": RULE,
                                     "scenes_of_the_other_split": other}
        if mirror:
            writer.extra["augment"] = {"mirror": True, "id_suffix": MIRROR_SUFFIX,
                                       "mirrored_scenes": mirrored}
        manifest = writer.close()
        if stop():  # the last moment the output directory can stay as it was
            raise ConversionStopped
    return manifest


def load_scenarios(
    paths: list[str], scenario_config: ScenarioConfig, convert: ConvertConfig | None = None,
) -> tuple[Scenario, dict[str, Any]]:
    """Load scenarios from JSON scene files, WOMD TFRecord files or shard directories.

    Args:
      paths: files or directories; a directory with ``manifest.json`` is read as a
        converted cache (padded up to ``scenario_config`` if it was converted smaller),
        any other directory is searched for JSON and TFRecord files.
      scenario_config: padded sizes of the result.
      convert: conversion choices for raw inputs (default ``ConvertConfig()``).
    Returns:
      (scenarios, report): a ``Scenario`` of NumPy arrays with leading axis N (every leaf
      shaped ``(N,) + scenario_config.shapes()[path]``) and a dict with ``num_scenarios``,
      ``scenario_ids``, ``origins`` (N, 2) world-frame origins, ``sources``, ``skipped``
      [{source, reason}], ``truncated_agents``, ``truncated_road_points``, ``totals`` and
      ``scenarios`` (per-scene records).
    Raises:
      ConfigError: an input is missing, or nothing usable was found (the message lists
        the skip reasons).
    """
    convert = convert or ConvertConfig()
    parts: list[dict[str, np.ndarray]] = []
    records: list[dict] = []
    skipped: list[dict] = []
    raw_paths = []
    for p in paths:
        if shards_lib.is_shard_dir(p):
            manifest = shards_lib.read_manifest(p)
            stored = shards_lib.manifest_scenario_config(manifest)
            for j, shard in enumerate(manifest["shards"]):
                arrays = shards_lib.read_shard(shards_lib.shard_path(p, manifest, j), stored,
                                               shard["num_scenarios"])
                parts.append(shards_lib.adapt_arrays(arrays, stored, scenario_config))
            records.extend(manifest["scenarios"])
            skipped.extend(manifest["skipped"])
        else:
            raw_paths.append(p)
    if raw_paths:
        batch, infos = [], []
        seen = {str(r["scenario_id"]): r.get("source", "") for r in records}
        for result in iter_converted(raw_paths, scenario_config, convert):
            why = _unusable(result[1], result[2], seen) if result[0] == "ok" else None
            if result[0] == "ok" and why is None:
                _keep(result[2], seen)
                batch.append(result[1])
                infos.append(result[2])
            elif why is not None:
                skipped.append({"source": result[2]["source"], "reason": why})
            else:
                skipped.append(result[1])
        if batch:
            stacked = {k: np.stack([b[k] for b in batch]) for k in batch[0]}
            stacked["meta.origin"] = np.array([i["origin"] for i in infos], np.float64)
            stacked["meta.scenario_id"] = np.array([i["scenario_id"] for i in infos], np.str_)
            parts.append(stacked)
            records.extend(dict(i) for i in infos)
    if not parts:
        reasons = "; ".join(f"{s['source']}: {s['reason']}" for s in skipped[:5]) or "none"
        raise ConfigError(f"no usable scenarios in {list(paths)} (skipped {len(skipped)}: "
                          f"{reasons}).")
    arrays = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    totals = {k: int(sum(r.get(k, 0) for r in records)) for k in REPORT_COUNTS}
    report = {
        "num_scenarios": int(arrays["objects.xy"].shape[0]),
        "scenario_ids": [str(s) for s in arrays.pop("meta.scenario_id")],
        "origins": arrays.pop("meta.origin"),
        "sources": [r.get("source", "") for r in records],
        "skipped": skipped,
        "truncated_agents": totals["truncated_agents"],
        "truncated_road_points": totals["truncated_road_points"],
        "totals": totals,
        "scenarios": records,
    }
    return arrays_to_scenario(arrays), report


def convert_one(path: str, config: ScenarioConfig, convert: ConvertConfig | None = None,
                index: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Convert the ``index``-th scene of one input (for ``inspect``); raises ``ConfigError``
    with the skip reason if it is unusable."""
    seen = 0
    for result in iter_converted([path], config, convert):
        if seen == index:
            if result[0] == "skip":
                source, reason = result[1]["source"], result[1]["reason"]
                raise ConfigError(reason if reason.startswith(source) else
                                  f"{source}: {reason}")
            return result[1], result[2]
        seen += 1
    raise ConfigError(f"'{path}' holds {seen} scenes; index {index} is out of range.")

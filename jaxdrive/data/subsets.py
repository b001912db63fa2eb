"""Scenario subsets by behaviour class (lane change, hard stop, unprotected turn, ...).

A subset is a named list of scenario ids of one cache directory, stored twice: in the
manifest's ``classes`` field (``{name: [ids]}``) and as ``DIR/subsets/NAME.json``
(``{"name", "scenario_ids", "rule"}``), so that a class can also be dropped in as a file.
``subset_ids`` reads either (the file wins). ``subset_from_scores`` builds one from a CSV
of per-scenario scores (columns ``scenario_id`` and a score column) and a threshold.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from typing import Any

from jaxdrive.config import ConfigError
from jaxdrive.data import shards as shards_lib
from jaxdrive.files import atomic_write_text

SUBSET_DIR = "subsets"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise ConfigError(f"subset name {name!r} may only use letters, digits, '_', '.', '-'.")


def subset_ids(directory: str | os.PathLike, name: str,
               manifest: dict[str, Any] | None = None) -> list[str]:
    """Scenario ids of subset ``name`` (from ``subsets/NAME.json`` or the manifest)."""
    _check_name(name)
    path = os.path.join(os.fspath(directory), SUBSET_DIR, f"{name}.json")
    if os.path.exists(path):
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"cannot read subset file '{path}' ({e}).") from None
        ids = data.get("scenario_ids") if isinstance(data, dict) else data
        if not isinstance(ids, list):
            raise ConfigError(f"subset file '{path}' must hold a list of scenario ids (or "
                              "{\"scenario_ids\": [...]}).")
        return [str(i) for i in ids]
    manifest = manifest or shards_lib.read_manifest(directory)
    classes = manifest.get("classes", {})
    if name not in classes:
        known = sorted(set(classes) | set(list_subset_files(directory)))
        raise ConfigError(f"no subset {name!r} in '{directory}'; known: "
                          f"{', '.join(known) or 'none'}. Build one with python -m "
                          "jaxdrive.data subset DIR --scores FILE.csv --threshold X --name NAME.")
    return [str(i) for i in classes[name]]


def list_subset_files(directory: str | os.PathLike) -> list[str]:
    """Names of the subsets stored as ``subsets/NAME.json`` in ``directory``, sorted
    (empty if none)."""
    d = os.path.join(os.fspath(directory), SUBSET_DIR)
    if not os.path.isdir(d):
        return []
    return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json"))


def read_scores(path: str | os.PathLike, column: str | None = None) -> dict[str, float]:
    """``{scenario_id: score}`` from a CSV with a ``scenario_id`` column and a score column
    (``column``, or the only other column; ``score`` if there are several)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return _read_scores(csv.DictReader(f), path, column)
    except UnicodeDecodeError as e:
        raise ConfigError(f"scores file '{path}' is not UTF-8 text ({e.reason} at byte "
                          f"{e.start}); save it as UTF-8 CSV.") from None


def _read_scores(reader: csv.DictReader, path, column: str | None) -> dict[str, float]:
    """The scores of an open CSV (``read_scores``)."""
    fields = reader.fieldnames or []
    if "scenario_id" not in fields:
        raise ConfigError(f"scores file '{path}' needs a 'scenario_id' column; has "
                          f"{fields}.")
    others = [c for c in fields if c != "scenario_id"]
    if column is None:
        column = others[0] if len(others) == 1 else "score"
    if column not in fields:
        raise ConfigError(f"scores file '{path}' has no column {column!r}; has {fields}. "
                          "Pick one with --column.")
    out = {}
    for line, row in enumerate(reader, start=2):
        try:
            value = float(row[column])
        except (TypeError, ValueError):
            raise ConfigError(f"scores file '{path}' line {line}: {column} = "
                              f"{row.get(column)!r} is not a number.") from None
        if not math.isfinite(value):  # NaN would silently match no threshold
            raise ConfigError(f"scores file '{path}' line {line}: {column} = "
                              f"{row.get(column)!r} is not a finite number; leave the "
                              "scene out of the file instead.")
        out[row["scenario_id"].strip()] = value
    return out


def subset_from_scores(scores: dict[str, float], threshold: float, above: bool = True,
                       known_ids: list[str] | None = None) -> list[str]:
    """Ids whose score is ``>= threshold`` (``<= threshold`` with ``above=False``), in
    ``known_ids`` order when given (ids not in the cache are left out)."""
    pick = {k for k, v in scores.items() if (v >= threshold if above else v <= threshold)}
    if known_ids is None:
        return sorted(pick)
    return [i for i in known_ids if i in pick]


def write_subset(directory: str | os.PathLike, name: str, ids: list[str],
                 rule: str = "") -> dict[str, Any]:
    """Store subset ``name`` in the manifest's ``classes`` and ``subsets/NAME.json``."""
    _check_name(name)
    directory = os.fspath(directory)
    manifest = shards_lib.read_manifest(directory)
    manifest.setdefault("classes", {})[name] = list(ids)
    shards_lib.write_manifest(directory, manifest)
    os.makedirs(os.path.join(directory, SUBSET_DIR), exist_ok=True)
    record = {"name": name, "scenario_ids": list(ids), "rule": rule}
    atomic_write_text(os.path.join(directory, SUBSET_DIR, f"{name}.json"),
                      json.dumps(record, indent=1))
    return record


def build_subset_from_csv(directory: str | os.PathLike, csv_path: str, threshold: float,
                          name: str, above: bool = True, column: str | None = None
                          ) -> dict[str, Any]:
    """Read scores, select by threshold among the cache's scenarios, store the subset.

    Returns the stored record plus ``num_scored``, ``num_unknown`` (scored ids not in the
    cache) and ``num_missing`` (cache scenarios without a score).
    """
    manifest = shards_lib.read_manifest(directory)
    known = [r["scenario_id"] for r in manifest["scenarios"]]
    scores = read_scores(csv_path, column)
    ids = subset_from_scores(scores, threshold, above, known)
    op = ">=" if above else "<="
    record = write_subset(directory, name, ids,
                          rule=f"{os.path.basename(csv_path)}: score {op} {threshold}")
    known_set = set(known)
    record.update(num_scored=len(scores),
                  num_unknown=sum(1 for k in scores if k not in known_set),
                  num_missing=sum(1 for k in known if k not in scores))
    return record

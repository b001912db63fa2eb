"""Merging shard results files into the serial run's results (``merge_results``,
``merge_files``; the shard format is described in ``jaxdrive.eval.shards``).

Above the evaluators, the suite loader and the runner: it rebuilds each evaluator from
its stored config and runs the evaluator's own reduction on the batches in serial order.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxdrive.env import Env
from jaxdrive.eval.evaluator import EvalResult
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.runner import SuiteResult
from jaxdrive.eval.shards import (
    SHARD_FORMAT,
    ShardError,
    decode_tree,
)
from jaxdrive.eval.suite import load_suite_specs


def _load(path: str | os.PathLike) -> dict:
    try:
        doc = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as e:
        raise ShardError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("shard"), dict):
        raise ShardError(f"{path} is not a shard results file (no 'shard' record); make "
                         "shards with python -m jaxdrive.eval ... --shard-id I --num-shards N.")
    return doc


def _diff(a: Any, b: Any, at: str = "") -> list[str]:
    """Dotted paths where ``a`` and ``b`` differ, with both values (mappings descended)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in dict.fromkeys([*a, *b])
                for d in _diff(a.get(k), b.get(k), f"{at}.{k}" if at else str(k))]
    return [] if a == b else [f"{at or 'value'}: {a!r} vs {b!r}"]


def _check_same(docs: list[tuple[str, dict]], what: str, get) -> None:
    first_path, first = docs[0]
    for path, doc in docs[1:]:
        if get(doc) != get(first):
            diffs = _diff(get(doc), get(first))
            shown = "; ".join(diffs[:5]) + (f"; ... ({len(diffs)} in all)"
                                           if len(diffs) > 5 else "")
            raise ShardError(f"shards differ in {what}: {path} vs {first_path}: {shown}; "
                             "merge only the shards of one evaluation.")


def _check_ids(docs: list[tuple[str, dict]]) -> None:
    _check_same(docs, "num_shards", lambda d: d["shard"].get("num_shards"))
    num = docs[0][1]["shard"]["num_shards"]
    seen: dict[int, str] = {}
    for path, doc in docs:
        i = doc["shard"].get("id")
        if i in seen:
            raise ShardError(f"shard id {i} given twice: {seen[i]} and {path}.")
        seen[i] = path
    missing = sorted(set(range(num)) - set(seen))
    if missing:
        raise ShardError(f"missing shard id(s) {missing} of --num-shards {num} (have "
                         f"{', '.join(f'{i}: {p}' for i, p in sorted(seen.items()))}).")


def _rebuild(name: str, resolved: Mapping[str, Any]):
    """The evaluator ``name`` built from its stored resolved section."""
    section = name.split("/")[0]
    specs = load_suite_specs({"eval": {section: dict(resolved)}})
    for ev in make_evaluators(specs.values()):
        if ev.name == name:
            if json.loads(json.dumps(ev.spec.resolved)) != resolved:
                raise ShardError(f"evaluator '{name}': its stored config does not rebuild "
                                 "to the same evaluator; cannot merge it.")
            return ev
    raise ShardError(f"evaluator '{name}': its stored config gives no evaluator of that name.")


def _merge_evaluator(name: str, docs: list[tuple[str, dict]], resolved, given=None):
    recs = [(path, doc["evaluators"][name]) for path, doc in docs]
    first = recs[0][1]
    result = EvalResult(name=name, type=first["type"], config=resolved,
                        eval_seconds=sum(r.get("eval_seconds") or 0.0 for _, r in recs),
                        compile_seconds=sum(r.get("compile_seconds") or 0.0 for _, r in recs))
    for _, r in recs:
        result.videos.extend(r.get("videos") or [])
    failed = [f"shard {d['shard']['id']} ({p}): {d['evaluators'][name].get('error')}"
              for p, d in docs if d["evaluators"][name].get("status") != "ok"]
    if failed:
        result.status = "failed"
        result.error = "\n".join(failed)
        return result
    for key in ("ids", "batch", "rollouts", "num_batches"):
        _check_same(recs, f"evaluator '{name}' {key}",
                    lambda r, key=key: r["shard"][key])
    total = first["shard"]["num_batches"]
    batches: dict[str, dict[int, tuple]] = {}
    for path, r in recs:
        for actor, items in r["shard"]["actors"].items():
            got = batches.setdefault(actor, {})
            for item in items:
                i = item["index"]
                if i in got:
                    raise ShardError(f"evaluator '{name}': batch {i} of actor '{actor}' is "
                                     f"in more than one shard (again in {path}).")
                got[i] = (decode_tree(item["rows"]), decode_tree(item["extra"]))
    for actor, got in batches.items():
        if sorted(got) != list(range(total)):
            missing = sorted(set(range(total)) - set(got))
            raise ShardError(f"evaluator '{name}': actor '{actor}' lacks batches {missing} "
                             f"of {total}; the shards do not cover the run.")
    ev = given if given is not None else _rebuild(name, resolved)
    ev._setup = {"env": Env(ev.env_config()), "ids": np.asarray(first["shard"]["ids"], np.int32),
                 "batch": first["shard"]["batch"], "pool_names": first["shard"].get("names")}
    ev.finish(result, {a: [got[i] for i in range(total)] for a, got in batches.items()},
              rollouts=first["shard"]["rollouts"])
    return result


def merge_results(docs: Iterable[tuple[str, dict]], evaluators=None):
    """The ``SuiteResult`` of the serial run from every shard's results document
    (``[(path or label, document)]``, any order).

    Each evaluator's reduction is that of its ``type`` in the registry, rebuilt from the
    stored config; ``evaluators`` (``Evaluator`` s, matched by name) gives the instances
    to use instead (a subclass with its own ``aggregate``, from the Python API).

    Raises:
      ShardError: a document that is no shard; shards of different ``num_shards``,
        configs, evaluators, parameters or steps; a missing or duplicated shard id; batches
        missing or given twice. The message names the files.
    """
    docs = list(docs)
    if not docs:
        raise ShardError("no shard files to merge.")
    for path, doc in docs:
        if not isinstance(doc, dict) or not isinstance(doc.get("shard"), dict):
            raise ShardError(f"{path} is not a shard results file (no 'shard' record).")
    _check_same(docs, "format", lambda d: d["shard"].get("format"))
    if docs[0][1]["shard"].get("format") != SHARD_FORMAT:
        raise ShardError(f"{docs[0][0]}: unknown shard format "
                         f"{docs[0][1]['shard'].get('format')!r} (this version reads "
                         f"{SHARD_FORMAT}).")
    _check_same(docs, "split", lambda d: d["shard"].get("split"))
    _check_ids(docs)
    docs.sort(key=lambda x: x[1]["shard"]["id"])
    _check_same(docs, "results version", lambda d: d.get("version"))
    _check_same(docs, "evaluators", lambda d: list(d.get("evaluators", {})))
    _check_same(docs, "config", lambda d: d.get("config"))
    _check_same(docs, "parameters (params_sha256)", lambda d: d["shard"].get("params_sha256"))
    _check_same(docs, "step", lambda d: d.get("step"))
    given = {ev.name: ev for ev in evaluators or ()}
    results = [_merge_evaluator(name, docs, docs[0][1]["config"][name], given.get(name))
               for name in docs[0][1]["evaluators"]]
    head = docs[0][1]
    return SuiteResult(results=results,
                       wall_seconds=sum(d.get("wall_seconds") or 0.0 for _, d in docs),
                       out_dir=head.get("out_dir"), step=head.get("step", 0),
                       checkpoint=head.get("checkpoint"),
                       created=datetime.datetime.now().isoformat(timespec="seconds"))


def merge_files(paths: Iterable[str | os.PathLike]):
    """``merge_results`` of the shard results files ``paths``."""
    return merge_results([(str(p), _load(p)) for p in paths])

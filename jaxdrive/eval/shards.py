"""Evaluation in independent shards, merged into the serial run's results.

``python -m jaxdrive.eval ... --shard-id I --num-shards N`` plays, of every evaluator,
the batches ``I, I + N, I + 2N, ...`` (round-robin over the batch indices of the serial
run, rollouts included). A batch is the serial run's own: the same scenario ids, the
same padding, the same key (``fold_in(seed key, batch index)``) and the same compiled
function, so each episode is played exactly as in the serial run, and the shards'
episodes are disjoint and together the serial run's. A shard with no batch (more shards
than batches) is valid and empty.

A shard's results file is an ordinary results file plus:

- top level ``shard``: ``{"id", "num_shards", "split": "batch round-robin",
  "format", "params_sha256", "devices"}`` (``devices``: of every process of the job);
- each evaluator's ``shard``: ``ids`` (the scenario ids of the whole run), ``batch``,
  ``rollouts``, ``num_batches`` (over rollouts), ``indices`` (this shard's batches) and
  ``actors``: per actor, per batch, the fetched rows (padding and ``valid`` included) and
  the step-hook reduction, as exact arrays (dtype, shape, base64 of the bytes);
- each evaluator's ``episodes``: its episode records, numbered (``env_index``,
  ``batch``, ``rollout``) as in the serial run; ``metrics`` and ``per_scenario`` empty.

``merge_results`` puts every evaluator's batches back in serial order and runs the
evaluator's own reduction (``Evaluator.finish``: episode records, ``aggregate``,
per-scenario lists) on them, so every metric, medians and confidence intervals included,
is the serial run's, bit for bit. It refuses shards of different configs, parameters
(``params_sha256``) or steps, different ``num_shards``, a missing or duplicated shard id,
and a file that is no shard. The merging lives in ``jaxdrive.eval.merge`` (above the
evaluators); this module holds what a shard run needs: ``Shard``, its header and the
exact array encoding.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

SHARD_FORMAT = 1
SPLIT = "batch round-robin"


class ShardError(ValueError):
    """Shards that cannot be merged, or a bad shard selection; the message names the
    files or flags."""


@dataclass(frozen=True)
class Shard:
    """Shard ``id`` of ``num`` (``0 <= id < num``)."""

    id: int
    num: int

    def __post_init__(self):
        for flag, v in (("--shard-id", self.id), ("--num-shards", self.num)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise ShardError(f"{flag} must be an integer, got {v!r}.")
        if self.num < 1:
            raise ShardError(f"--num-shards must be at least 1, got {self.num}.")
        if not 0 <= self.id < self.num:
            raise ShardError(f"--shard-id must be in [0, {self.num - 1}] for "
                             f"--num-shards {self.num}, got {self.id}.")

    def batches(self, total: int) -> range:
        """This shard's batch indices among ``total``: ``id, id + num, ...``."""
        return range(self.id, total, self.num)


def params_digest(params) -> str:
    """SHA-256 over the parameters' leaves (dtype, shape and bytes), to tell whether two
    shards evaluated the same weights wherever their checkpoint paths lie."""
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def shard_header(shard: Shard, params) -> dict:
    """The top-level ``shard`` record of a shard's results file."""
    import jax

    return {"id": shard.id, "num_shards": shard.num, "split": SPLIT, "format": SHARD_FORMAT,
            "params_sha256": params_digest(params), "devices": jax.device_count()}


# ------------------------------------------------------------------ exact arrays in JSON
def encode_tree(tree: Any) -> Any:
    """None, or nested mappings of arrays, as JSON data that decodes to the same bits."""
    if tree is None:
        return None
    if isinstance(tree, Mapping):
        return {"tree": {str(k): encode_tree(v) for k, v in tree.items()}}
    a = np.ascontiguousarray(np.asarray(tree))
    if a.dtype.hasobject:
        raise TypeError(f"cannot store an array of dtype {a.dtype} in a shard file.")
    return {"dtype": a.dtype.str, "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_tree(data: Any) -> Any:
    """The inverse of ``encode_tree``."""
    if data is None:
        return None
    if "tree" in data:
        return {k: decode_tree(v) for k, v in data["tree"].items()}
    raw = base64.b64decode(data["data"])
    return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy()


# ------------------------------------------------------------------ merge

"""Stream converted shards to the device ahead of time: seeded shuffle, host split, prefetch.

``ScenarioDataset`` reads a cache directory (``shards.py``) and yields batches of
``batch_size`` scenarios as ``Scenario`` pytrees already on device (or whatever
``transform`` makes of them, e.g. a ``ScenarioPool`` with its road index), produced by a
background thread ``prefetch`` batches ahead so that a training loop swapping pools never
waits on disk or decompression.

Determinism: which scenarios a host owns depends only on the manifest order and
``(process_index, process_count)``: host ``h`` owns the ``h``-th of every
``process_count`` scenarios (truncated to equal counts with ``equal_split``, so that
every host yields the same number of batches). The order within an epoch depends only on
``(seed, epoch, process_index)``: shards are permuted, then the rows of
``shuffle_window`` consecutive shards are permuted together.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxdrive.config import ConfigError
from jaxdrive.data import shards as shards_lib
from jaxdrive.data.convert import arrays_to_scenario
from jaxdrive.scenarios.base import ScenarioConfig

_DONE = object()


class ScenarioDataset:
    """Batches of scenarios from a shard directory, prefetched by a background thread.

    Args:
      directory: a cache written by ``python -m jaxdrive.data convert``.
      batch_size: scenarios per batch (e.g. the env pool size).
      seed: shuffle seed.
      shuffle: permute shards and rows each epoch (else manifest order).
      repeat: cycle through epochs forever (else stop after one).
      drop_remainder: drop a last batch smaller than ``batch_size``.
      batch_key: the name errors give ``batch_size`` (a config key, e.g.
        ``data.pool_size``).
      process_index, process_count: this host and the number of hosts (default
        ``jax.process_index()`` / ``jax.process_count()``).
      equal_split: give every host the same number of scenarios (drops fewer than
        ``process_count`` of them; see ``num_dropped_for_balance``).
      scenario_config: pad to these sizes (default the cache's own).
      subset: name of a behaviour-class subset (``subsets.py``) to restrict to.
      prefetch: batches produced ahead (0 = synchronous, no thread).
      shuffle_window: shards whose rows are mixed together.
      device_put: move batches to device (``True``, or a ``jax.sharding.Sharding``).
      transform: called on each device batch in the background thread (e.g.
        ``lambda s: make_pool(s, env.config.road_index)``).
      skip_batches: start the stream this many batches in (resuming a run: the same
        batches follow as in an uninterrupted stream).
    """

    def __init__(
        self, directory: str | os.PathLike, batch_size: int, *, seed: int = 0,
        shuffle: bool = True, repeat: bool = True, drop_remainder: bool = True,
        process_index: int | None = None, process_count: int | None = None,
        equal_split: bool = True, scenario_config: ScenarioConfig | None = None,
        subset: str | None = None, prefetch: int = 2, shuffle_window: int = 4,
        device_put: bool | Any = True, transform: Callable[[Any], Any] | None = None,
        skip_batches: int = 0, batch_key: str = "batch_size",
    ):
        self.directory = os.fspath(directory)
        self.manifest = shards_lib.read_manifest(self.directory)
        self.stored_config = shards_lib.manifest_scenario_config(self.manifest)
        self.scenario_config = scenario_config or self.stored_config
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
        self.batch_size = batch_size
        self.seed, self.shuffle, self.repeat = seed, shuffle, repeat
        self.drop_remainder = drop_remainder
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        if not 0 <= self.process_index < self.process_count:
            raise ConfigError(f"process_index {self.process_index} must be in "
                              f"[0, {self.process_count}).")
        self.prefetch = prefetch
        self.shuffle_window = max(1, shuffle_window)
        self.device_put = device_put
        self.transform = transform
        if skip_batches < 0:
            raise ConfigError(f"skip_batches must be >= 0, got {skip_batches}.")
        self.skip_batches = skip_batches

        records = self.manifest["scenarios"]
        owned = np.arange(len(records))
        if subset is not None:
            from jaxdrive.data.subsets import subset_ids

            wanted = set(subset_ids(self.directory, subset, self.manifest))
            owned = np.array([i for i in owned if records[i]["scenario_id"] in wanted], np.int64)
        mine = owned[self.process_index::self.process_count]
        self.num_dropped_for_balance = 0
        if equal_split:
            per_host = len(owned) // self.process_count
            self.num_dropped_for_balance = len(mine) - per_host
            mine = mine[:per_host]
        if len(mine) == 0 or (drop_remainder and len(mine) < batch_size):
            raise ConfigError(
                f"host {self.process_index}/{self.process_count} owns {len(mine)} scenarios "
                f"of '{self.directory}'{f' subset {subset!r}' if subset else ''}, fewer "
                f"than {batch_key} {batch_size}; lower {batch_key} (at most {len(mine)}) or "
                "add data.")
        shard_of = np.array([r["shard"] for r in records], np.int64)
        row_of = np.array([r["index"] for r in records], np.int64)
        self._rows: dict[int, np.ndarray] = {}
        for g in mine:
            self._rows.setdefault(int(shard_of[g]), []).append(int(row_of[g]))
        self._rows = {s: np.array(r, np.int64) for s, r in self._rows.items()}
        self.num_scenarios = int(len(mine))
        self.wait_seconds = 0.0  # time the consumer spent blocked on the prefetch queue
        self.batches_served = 0
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()

    # ----------------------------------------------------------------- host side
    def _load(self, shard: int) -> dict[str, np.ndarray]:
        arrays = shards_lib.read_shard(
            shards_lib.shard_path(self.directory, self.manifest, shard), self.stored_config,
            self.manifest["shards"][shard]["num_scenarios"])
        rows = self._rows[shard]
        arrays = {k: v[rows] for k, v in arrays.items()}
        return shards_lib.adapt_arrays(arrays, self.stored_config, self.scenario_config)

    def epoch_windows(self, epoch: int) -> Iterator[dict[str, np.ndarray]]:
        """This host's rows of one epoch, one shuffle window (dict of arrays) at a time."""
        shards = np.array(sorted(self._rows), np.int64)
        rng = np.random.default_rng([self.seed, epoch, self.process_index])
        if self.shuffle:
            shards = shards[rng.permutation(len(shards))]
        for start in range(0, len(shards), self.shuffle_window):
            parts = [self._load(int(s)) for s in shards[start:start + self.shuffle_window]]
            window = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            if self.shuffle:
                perm = rng.permutation(window["objects.xy"].shape[0])
                window = {k: v[perm] for k, v in window.items()}
            yield window

    def host_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """NumPy batches (dict of arrays, ``meta.*`` included) in order, no prefetch."""
        epoch, carry = 0, None
        while True:
            for window in self.epoch_windows(epoch):
                if carry is not None:
                    window = {k: np.concatenate([carry[k], window[k]]) for k in window}
                n = window["objects.xy"].shape[0]
                full = n - n % self.batch_size
                for i in range(0, full, self.batch_size):
                    yield {k: v[i:i + self.batch_size] for k, v in window.items()}
                carry = {k: v[full:] for k, v in window.items()} if full < n else None
            epoch += 1
            if not self.repeat:
                break
        if carry is not None and not self.drop_remainder:
            yield carry

    def _to_device(self, batch: dict[str, np.ndarray]):
        arrays = {k: v for k, v in batch.items() if not k.startswith("meta.")}
        scenario = arrays_to_scenario(arrays)
        if self.device_put is True:
            scenario = jax.device_put(scenario)
        elif self.device_put:
            scenario = jax.device_put(scenario, self.device_put)
        return self.transform(scenario) if self.transform else scenario

    # ----------------------------------------------------------------- iteration
    def _put(self, item) -> bool:
        """Queue ``item`` unless stopped; False once ``close`` was called."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        return itertools.islice(self.host_batches(), self.skip_batches, None)

    def _produce(self) -> None:
        try:
            for batch in self._batches():
                if not self._put(self._to_device(batch)):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)

    def __iter__(self) -> Iterator[Any]:
        if self.prefetch <= 0:
            for batch in self._batches():
                self.batches_served += 1
                yield self._to_device(batch)
            return
        self.close()
        self._stop.clear()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._produce, name="jaxdrive-data",
                                        daemon=True)
        self._thread.start()
        try:
            while True:
                t = time.perf_counter()
                item = self._queue.get()
                self.wait_seconds += time.perf_counter() - t
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.batches_served += 1
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the background thread (safe to call twice)."""
        if self._thread is not None:
            self._stop.set()
            if self._queue is not None:
                try:  # unblock a producer waiting on a full queue
                    while True:
                        self._queue.get_nowait()
                except queue.Empty:
                    pass
            self._thread.join(timeout=10.0)
            self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

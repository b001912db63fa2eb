"""Data-layer benchmark: conversion speed and dataset feed rate.

    python experiments/bench_data.py [--scenes 1000] [--json-scenes 200] [--out FILE.json]

1. Synthesises ``--scenes`` WOMD-sized scenes (``jaxdrive.data.synth``: 64 tracks x 91
   steps, ~8,200 road points, 4 signal lanes, ~550 KB per proto) into 10 TFRecord files
   (not timed), then times ``convert_to_shards`` (CRC checks, proto parsing, conversion to
   the default ``ScenarioConfig`` (64 agents, 4,096 road points), compressed ``.npz``
   shards) with 1 and 2 worker processes.
2. The same for ``--json-scenes`` JSON scenes written from the same content (the JSON
   path is bounded by Python's ``json`` parser).
3. Dataset feed: ``ScenarioDataset`` over the converted cache, batches of 128 scenes
   (the quickstart's env count), prefetch 2, device_put. Reports the producer's rate
   with an idle consumer, then runs a consumer that busies the CPU for the training
   benchmark's iteration time (0.83 s: 32,768 agent-steps at 39,321 agent-steps/s, MLP,
   ``docs/benchmarks.md``) per batch, i.e. a brand-new 128-scene pool every iteration
   (worst case), and reports how long it waited for data.

Prints a table and writes JSON (``--out``, default ``docs/bench/data_cpu.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp

from jaxdrive.data import ScenarioDataset, convert_to_shards
from jaxdrive.data.synth import raw_to_json, synth_scenario
from jaxdrive.data.tfrecord import write_records
from jaxdrive.data.womd import parse_scenario
from jaxdrive.scenarios.base import ScenarioConfig

TRAIN_ITERATION_S = 32_768 / 39_321  # quickstart MLP iteration on the 2-core CPU
POOL = 128


def synthesise(root: str, scenes: int, json_scenes: int) -> tuple[list[str], list[str], int]:
    tf_dir = os.path.join(root, "tfrecord")
    js_dir = os.path.join(root, "json")
    os.makedirs(tf_dir)
    os.makedirs(js_dir)
    per_file = max(1, scenes // 10)
    files, nbytes = [], 0
    for f in range(0, scenes, per_file):
        blobs = [synth_scenario(i).SerializeToString()
                 for i in range(f, min(scenes, f + per_file))]
        nbytes += sum(len(b) for b in blobs)
        path = os.path.join(tf_dir, f"synth.tfrecord-{f // per_file:05d}")
        write_records(path, blobs)
        files.append(path)
    jfiles = []
    for i in range(json_scenes):
        raw = parse_scenario(synth_scenario(i).SerializeToString())
        path = os.path.join(js_dir, f"scene{i:05d}.json")
        with open(path, "w") as fh:
            json.dump(raw_to_json(raw), fh)
        jfiles.append(path)
    return files, jfiles, nbytes


def time_convert(inputs, out, workers):
    t = time.perf_counter()
    m = convert_to_shards(inputs, out, ScenarioConfig(), workers=workers)
    dt = time.perf_counter() - t
    return {"workers": workers, "scenes": m["num_scenarios"], "seconds": round(dt, 2),
            "scenes_per_s": round(m["num_scenarios"] / dt, 1),
            "cache_mb": round(m["total_bytes"] / 1e6, 1), "skipped": len(m["skipped"])}


def busy(seconds: float):
    """A jitted CPU load of about ``seconds`` (matmuls), standing in for a train step."""
    x = jnp.ones((512, 512), jnp.float32)
    f = jax.jit(lambda x: jnp.tanh(x @ x * 1e-3))
    f(x).block_until_ready()
    t = time.perf_counter()
    n = 0
    while time.perf_counter() - t < 0.3:
        x = f(x)
        n += 1
    x.block_until_ready()
    per = (time.perf_counter() - t) / n
    reps = max(1, int(seconds / per))

    def run():
        y = x
        for _ in range(reps):
            y = f(y)
        y.block_until_ready()

    return run


def feed(cache: str, batches: int):
    ds = ScenarioDataset(cache, POOL, seed=0, process_index=0, process_count=1, prefetch=2)
    it = iter(ds)
    next(it)  # thread started, first batch ready
    t = time.perf_counter()
    for _ in range(batches):
        jax.block_until_ready(next(it))
    idle_rate = batches * POOL / (time.perf_counter() - t)
    ds.close()

    work = busy(TRAIN_ITERATION_S)
    ds = ScenarioDataset(cache, POOL, seed=1, process_index=0, process_count=1, prefetch=2)
    it = iter(ds)
    next(it)
    work()
    ds.wait_seconds = 0.0
    t = time.perf_counter()
    for _ in range(batches):
        jax.block_until_ready(next(it))
        work()
    wall = time.perf_counter() - t
    waited = ds.wait_seconds
    ds.close()
    return {
        "batch_scenes": POOL, "batches": batches,
        "idle_consumer_scenes_per_s": round(idle_rate, 1),
        "train_iteration_s": round(TRAIN_ITERATION_S, 3),
        "busy_consumer_wall_s": round(wall, 2),
        "busy_consumer_waited_s": round(waited, 3),
        "waited_fraction": round(waited / wall, 4),
        "needed_scenes_per_s": round(POOL / TRAIN_ITERATION_S, 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenes", type=int, default=1000)
    ap.add_argument("--json-scenes", type=int, default=200)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--out", default="docs/bench/data_cpu.json")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="jaxdrive-bench-data-")
    try:
        t = time.perf_counter()
        tf_files, js_files, nbytes = synthesise(root, args.scenes, args.json_scenes)
        synth_s = time.perf_counter() - t
        rows = []
        for workers in (1, 2):
            r = time_convert(tf_files, os.path.join(root, f"cache_tf{workers}"), workers)
            rows.append({"input": "tfrecord", **r})
        if js_files:
            for workers in (1, 2):
                r = time_convert(js_files, os.path.join(root, f"cache_js{workers}"), workers)
                rows.append({"input": "json", **r})
        fed = feed(os.path.join(root, "cache_tf2"), args.batches)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"synthesised {args.scenes} protos ({nbytes / 1e6:.0f} MB) + {args.json_scenes} "
          f"JSON scenes in {synth_s:.0f} s (not timed below)")
    print(f"{'input':9} {'workers':>7} {'scenes':>7} {'seconds':>8} {'scenes/s':>9} "
          f"{'cache MB':>9}")
    for r in rows:
        print(f"{r['input']:9} {r['workers']:>7} {r['scenes']:>7} {r['seconds']:>8} "
              f"{r['scenes_per_s']:>9} {r['cache_mb']:>9}")
    print(f"dataset feed: {fed['idle_consumer_scenes_per_s']} scenes/s to device (idle "
          f"consumer); with a {fed['train_iteration_s']} s training iteration per "
          f"{POOL}-scene batch (needs {fed['needed_scenes_per_s']} scenes/s) the consumer "
          f"waited {fed['busy_consumer_waited_s']} s of {fed['busy_consumer_wall_s']} s "
          f"({100 * fed['waited_fraction']:.2f}%)")
    record = {
        "benchmark": "data", "platform": platform.platform(), "cpus": os.cpu_count(),
        "jax": jax.__version__, "device": str(jax.devices()[0]),
        "scenes": args.scenes, "json_scenes": args.json_scenes,
        "proto_mb": round(nbytes / 1e6, 1), "convert": rows, "feed": fed,
    }
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Training on converted real-format scenes: the pool is replaced every iteration by the
background stream, and a run resumed across a swap equals the uninterrupted run."""

import json

import jax
import numpy as np
import pytest
from test_train_run import STEPS_PER_IT, TINY, _lines

from jaxdrive.data import convert_to_shards
from jaxdrive.data.synth import synth_scenario
from jaxdrive.data.tfrecord import write_records
from jaxdrive.runs.config import RunConfig
from jaxdrive.train import run

SYNTH = dict(num_objects=6, num_lanes=3, lane_points=30, num_edges=2, edge_points=40,
             num_lines=1, line_points=20, num_lights=1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_records(d / "scenes.tfrecord",
                  [synth_scenario(i, **SYNTH).SerializeToString() for i in range(5)])
    config = RunConfig.from_dict(TINY).env.scenario
    manifest = convert_to_shards([str(d / "scenes.tfrecord")], str(d / "shards"), config)
    assert manifest["num_scenarios"] == 5
    return d / "shards"


def _config(tmp_path, shards, iterations):
    data = json.loads(json.dumps(TINY))
    data["train"]["total_steps"] = iterations * STEPS_PER_IT
    data["logging"]["output_dir"] = str(tmp_path)
    data["data"] = {"path": str(shards), "pool_size": 2, "refresh_every": 1, "seed": 4,
                    "validation_path": str(shards)}
    return RunConfig.from_dict(data)


@pytest.fixture(scope="module")
def full(tmp_path_factory, shards):
    tmp = tmp_path_factory.mktemp("runs")
    run_dir = run.new_run_dir(_config(tmp, shards, 3), "data")
    run.train(_config(tmp, shards, 3), run_dir, quiet=True)
    return run_dir


def test_data_pools_are_replaced_every_refresh(full):
    rows = _lines(full / "metrics.jsonl")
    assert [r["data/pool_index"] for r in rows] == [0, 1, 2]
    assert all(0.0 <= r["val/goal_rate"] <= 1.0 for r in rows if "val/goal_rate" in r)
    assert all(r["time/data_wait_s"] >= 0.0 for r in rows)


@pytest.mark.slow
def test_resume_across_a_pool_swap_is_exact(tmp_path, shards, full):
    rows = _lines(full / "metrics.jsonl")
    part = run.new_run_dir(_config(tmp_path, shards, 2), "data")
    run.train(_config(tmp_path, shards, 2), part, quiet=True)
    run.train(_config(tmp_path, shards, 3), part, resume=True, quiet=True)
    drop = lambda rs: [{k: v for k, v in r.items() if not k.startswith(("sps", "time/"))}
                       for r in rs]
    assert drop(_lines(part / "metrics.jsonl")) == drop(rows)
    a = run.load_policy(part, which="last")
    b = run.load_policy(full, which="last")
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

"""Data-parallel training over 8 fake CPU devices equals the single-device run.

Two child processes (``tests/parallel_case.py``) train the same global configuration for
three iterations (8 shuffle groups, 8 pool shards): one on a single device (the plain
program), one on a ``data`` mesh of 8 devices, the scene pool split over them
(``--xla_force_host_platform_device_count=8``). Their metrics and parameters
must agree up to the order of floating-point sums across devices; the compiled programs
must hold no collective inside the rollout loop and one gradient reduction per update.

The checks on the two child processes are marked ``slow`` (about two minutes of both
cores: over the CI budget); run them with ``python -m pytest -m slow
tests/test_train_parallel.py``. The data-parallel evaluation (``test_eval_distributed``)
and the mesh checks stay in the default run.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from jaxdrive.parallel import check_divisible, data_mesh

CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parallel_case.py")
RTOL = 1e-5
# Metrics below this magnitude are differences of nearly equal numbers (the policy loss,
# the approximate KL): compared with this absolute floor instead of relatively.
METRIC_FLOOR = 0.1
COUNTS = ("rollout/valid_steps", "rollout/agent_episodes", "train/agents_with_episodes")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cases = {1: ["1"], 8: ["8"], "8dense": ["8", "0.5"]}  # the last: train.dense_rows 0.5
    procs = {n: subprocess.Popen([sys.executable, CASE, args[0], str(tmp / f"d{n}.npz"),
                                  *args[1:]],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for n, args in cases.items()}
    out = {}
    for n, p in procs.items():
        log, _ = p.communicate(timeout=900)
        assert p.returncode == 0, log[-3000:]
        with open(tmp / f"d{n}.json") as f:
            out[n] = (dict(np.load(tmp / f"d{n}.npz")), json.load(f))
    return out


def _largest_relative_difference(one: dict, other: dict) -> tuple[str, float]:
    """(key, difference) of the metric or parameter where ``other`` is furthest from
    ``one``: parameters relative to the largest |weight|, metrics to their own magnitude
    (at least METRIC_FLOOR); counts must be equal and NaNs in the same places."""
    worst = {}
    # Parameters: relative to their magnitude (the largest |weight|); a tensor of tiny
    # values (a bias near 0) moves by Adam steps whose rounding is not relative to it.
    weight_scale = max(float(np.max(np.abs(one[k]))) for k in one if k.startswith("params"))
    for k in one:
        a, b = one[k].astype(np.float64), other[k].astype(np.float64)
        if k.startswith("params"):
            scale = weight_scale
        elif k.endswith(COUNTS):
            np.testing.assert_array_equal(a, b, err_msg=k)  # integers: no rounding
            continue
        else:
            scale = max(float(np.max(np.abs(a))), METRIC_FLOOR)
        diff = float(np.nanmax(np.abs(a - b))) if a.size else 0.0
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=k)
        worst[k] = diff / scale if diff > 0 else 0.0
    key = max(worst, key=worst.get)
    return key, worst[key]


@pytest.mark.slow
def test_eight_devices_train_like_one(runs):
    one, _ = runs[1]
    eight, report = runs[8]
    assert report["devices"] == 8 and runs[1][1]["devices"] == 1
    assert one.keys() == eight.keys()
    key, worst = _largest_relative_difference(one, eight)
    print(f"largest relative difference: {worst:.2e} ({key})")
    assert worst <= RTOL, (key, worst)


@pytest.mark.slow
def test_dense_rollout_rows_on_eight_devices_train_like_one(runs):
    """Issue 39, item 6: dense rows on a mesh. With ``train.dense_rows`` 0.5 on 8
    devices each device packs its own live rows into its share of the buffers: in the
    rollout 2 of its 4 rows (a 16-row buffer), in the update 1 of its 2 minibatch rows
    and 7 of its 14 steps (buffers of (8, 56) and (16, 56) rows and steps). The run
    equals the padded single-device run up to float rounding; in the rollout loop only
    the buffer choice (a scalar) crosses devices, and no step gathers rows from another
    device."""
    one, _ = runs[1]
    dense, report = runs["8dense"]
    assert report["devices"] == 8 and report["dense_groups"] == 8
    assert report["rollout_capacities"] == [16]
    extra = {k.split("/", 1)[1] for k in dense.keys() - one.keys()}
    assert extra == {"loss/dense_overflow_minibatches", "rollout/dense_overflow_steps"}
    assert report["update_buffers"] == [[8, 56], [16, 56]]
    assert one.keys() <= dense.keys()
    key, worst = _largest_relative_difference(one, dense)
    print(f"largest relative difference: {worst:.2e} ({key})")
    assert worst <= RTOL, (key, worst)
    rollout = report["rollout_collectives"]
    assert not [c for c in rollout if c["op"] != "all-reduce"], rollout
    in_loop = [c for c in rollout if c["loop_depth"] > 0]
    assert in_loop and all(all(s.endswith("[]") for s in c["shapes"]) for c in in_loop)
    step = report["step_collectives"]
    assert not [c for c in step if c["op"] != "all-reduce"], step


@pytest.mark.slow
def test_rollout_holds_no_collective_in_its_loop(runs):
    _, report = runs[8]
    in_loop = [c for c in report["rollout_collectives"] if c["loop_depth"] > 0]
    assert in_loop == []
    # Only the episode count is summed across devices, once, after the loop.
    assert [c["op"] for c in report["rollout_collectives"]] == ["all-reduce"]


@pytest.mark.slow
def test_gradients_reduced_once_per_update(runs):
    _, report = runs[8]
    step = report["step_collectives"]
    depth = max(c["loop_depth"] for c in step)
    assert depth == 2  # epochs -> minibatches
    per_update = [c for c in step if c["loop_depth"] == depth]
    grads = [c for c in per_update if not all(s.endswith("[]") for s in c["shapes"])]
    assert len(grads) == 1 and grads[0]["op"] == "all-reduce"
    # It carries every gradient: its non-scalar operands hold as many numbers as the
    # parameters (XLA may lay a kernel's gradient out transposed, so count, not shapes).
    size = lambda s: math.prod(int(d) for d in re.findall(r"\d+", s.split("[", 1)[1]))
    assert sum(size(s) for s in grads[0]["shapes"] if not s.endswith("[]")) == \
        report["param_count"]
    others = [c for c in per_update if c is not grads[0]]
    # Besides the gradients, only scalar loss statistics (valid counts, advantage
    # moments) are summed per update; no data moves inside the update loop.
    assert all(c["op"] == "all-reduce" and all(s.endswith("[]") for s in c["shapes"])
               for c in others), others
    # Each device keeps its own rows: the batch is never gathered (issue 39, item 1).
    assert not [c for c in step if c["op"] == "all-gather"]
    print(f"per update: 1 gradient all-reduce ({len(grads[0]['shapes'])} tensors), "
          f"{len(others)} scalar all-reduces")


@pytest.mark.slow
def test_parameters_replicated_envs_split(runs):
    _, report = runs[8]
    assert report["params_replicated"] and report["opt_state_replicated"]
    assert len(report["env_state_split"]) == report["env_state_leaves"]
    assert set(report["env_state_split"]) == {8}


@pytest.mark.slow
def test_each_device_holds_an_eighth_of_the_scene_pool(runs):
    """Issue 39, item 2: ``train.pool_shards`` 8 on 8 devices (the default there)."""
    one, eight = runs[1][1], runs[8][1]
    assert one["pool_bytes"] == eight["pool_bytes"] == one["pool_bytes_per_device"]
    assert eight["pool_bytes_per_device"] * 8 == eight["pool_bytes"]


MEMORY_CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_case.py")


@pytest.mark.slow
@pytest.mark.parametrize("groups", ["auto", "1"])
def test_memory_per_device_follows_the_envs_per_device(tmp_path, groups):
    """Issue 39, item 1: at 4 envs per device, the compiled step's memory per device
    (``memory_analysis``) from 1 to 8 devices stays within 10 % with ``shuffle_groups:
    auto``, and nothing is all-gathered; with one group (the whole batch on every
    device) it grows with the job."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, MEMORY_CASE, str(out), "4", groups], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    per_device = {int(n): r["temp_bytes"] + r["argument_bytes"] + r["output_bytes"]
                  for n, r in report.items()}
    print(groups, per_device)
    if groups == "auto":
        assert max(per_device.values()) <= 1.1 * per_device[1]
        assert all(r["all_gathers"] == 0 for r in report.values())
        assert [r["shuffle_groups"] for r in report.values()] == [1, 2, 4, 8]
    else:
        assert per_device[8] > 1.5 * per_device[1]


def test_num_envs_must_divide_over_the_devices():
    mesh = types.SimpleNamespace(size=8)
    check_divisible(16, "train.num_envs", mesh)
    with pytest.raises(ValueError, match=r"train.num_envs=12 .* 8 devices.*"
                                         r"train.num_envs=8 .*train.num_envs=16"):
        check_divisible(12, "train.num_envs", mesh)


def test_the_default_mesh_spans_every_device_ordered_by_topology_with_automatic_sharding():
    """Issue 39, item 6: ``jax.make_mesh`` orders the devices; its default (explicit
    sharding) would change how the training step is partitioned, so it is asked for
    automatic sharding (GSPMD), as the training step is written for."""
    import jax
    from jax.sharding import AxisType

    mesh = data_mesh()
    assert mesh.axis_names == ("data",) and mesh.axis_types == (AxisType.Auto,)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())
    assert data_mesh(jax.devices()[:1]).axis_types == (AxisType.Auto,)

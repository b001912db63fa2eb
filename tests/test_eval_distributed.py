"""Evaluation over many devices and processes: 8 fake devices in one process, and 2
processes of 2 devices joined with ``jax.distributed`` (localhost, CPU, gloo), each
running ``python -m jaxdrive.eval``, give the single-device run's results (episode
records, counts and metrics exactly); process 1 writes nothing. The split of a batch
over the processes and the job flags are checked fast."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from argparse import Namespace

import numpy as np
import pytest
import yaml

from jaxdrive.distributed import DistributedError
from jaxdrive.eval import cli
from jaxdrive.eval.evaluator import process_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
# 10 scenarios in batches of 8 (the second padded): the batch is a multiple of 1, 4 and 8
# devices, so every layout plays the same batches as one device.
SUITE = {"eval": {
    "_t": {"template": True, "num_scenarios": 10, "batch_size": 8, "seed": 7},
    "val": {"type": "multi_scenario", "inherits": "_t"},
    "plan": {"type": "planning", "inherits": "_t"},  # a step hook: reductions gathered too
}}
JOB = ("JAXDRIVE_COORDINATOR_ADDRESS", "JAXDRIVE_NUM_PROCESSES", "JAXDRIVE_PROCESS_ID")


# ------------------------------------------------------------------ fast: the split
def test_each_process_holds_its_devices_rows():
    # 2 processes of 2 devices, batch 8: process 0 rows 0-3, process 1 rows 4-7.
    devices = [0, 0, 1, 1]
    assert process_rows(8, devices, 0) == [(0, 4)]
    assert process_rows(8, devices, 1) == [(4, 8)]
    # Interleaved devices: ranges per device, adjacent ones joined.
    assert process_rows(8, [0, 1, 1, 0], 1) == [(2, 6)]
    assert process_rows(8, [0, 1, 0, 1], 0) == [(0, 2), (4, 6)]
    # Disjoint, and together the whole batch.
    for layout in ([0] * 8, [0, 0, 1, 1, 2, 2, 3, 3], [0, 1, 2, 3, 0, 1, 2, 3]):
        rows = sorted(r for p in set(layout) for lo, hi in process_rows(16, layout, p)
                      for r in range(lo, hi))
        assert rows == list(range(16))
    with pytest.raises(ValueError, match="does not split over 4 devices"):
        process_rows(6, devices, 0)


def _args(**kw):
    base = dict(coordinator_address=None, num_processes=None, process_id=None)
    return Namespace(**{**base, **kw})


def test_job_flags(monkeypatch, capsys):
    for k in JOB:
        monkeypatch.delenv(k, raising=False)
    assert cli._process_group(_args()) is None  # one process
    group = cli._process_group(_args(coordinator_address="h:1", num_processes=2, process_id=1))
    assert (group.coordinator_address, group.num_processes, group.process_id) == ("h:1", 2, 1)
    monkeypatch.setenv("JAXDRIVE_COORDINATOR_ADDRESS", "h:1")
    monkeypatch.setenv("JAXDRIVE_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAXDRIVE_PROCESS_ID", "0")
    assert cli._process_group(_args()).source == "environment"
    # --num-processes 1 alone: one process whatever the environment says (the manager's
    # children).
    assert cli._process_group(_args(num_processes=1)) is None
    with pytest.raises(DistributedError, match="missing --process-id"):
        cli._process_group(_args(coordinator_address="h:1", num_processes=2))
    # Refused before any work (the checkpoint does not exist), exit code 2.
    assert cli.main(["--config", "eval/default", "--checkpoint", "/nonexistent",
                     "--num-processes", "2", "--process-id", "0"]) == 2
    assert "missing --coordinator-address" in capsys.readouterr().err


# ------------------------------------------------------------------ slow: equality
def _run_dir(path):
    """A run directory (config.yaml + a checkpoint) of the tiny test policy."""
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, {tests!r})
        from pathlib import Path
        import test_eval as t
        from jaxdrive.runs.checkpoint import Checkpointer
        from jaxdrive.runs.config import RunConfig
        from jaxdrive.runs.load import save_config
        _, _, _, params = t.build()
        config = RunConfig.from_dict({{"env": t.ENV, "procedural": t.PROCEDURAL,
            "policy": {{"kind": "mlp", "model_dim": 16, "token_dim": 8}}}})
        rd = Path({path!r})
        rd.mkdir(parents=True)
        save_config(config, rd / "config.yaml")
        with Checkpointer(rd / "checkpoints") as ckpt:
            ckpt.save(40, {{"params": params}}, {{"step": 40, "iteration": 1}})
    """).format(tests=TESTS, path=str(path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=_env(1), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return path


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in JOB}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return env


def _eval(run_dir, suite, out, devices=1, extra=()):
    return subprocess.Popen(
        [sys.executable, "-m", "jaxdrive.eval", "--config", str(suite), "--checkpoint",
         str(run_dir), "--which", "last", "--out", str(out), "--output-root",
         str(out.parent / "root"), "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(devices),
        cwd=ROOT)


def _finish(proc, timeout=900):
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
    return proc.returncode, text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


INTEGER_LISTS = ("scenario_id", "ego_agents", "goals", "collisions", "offroads",
                 "scored_agents")


def _same(a: dict, b: dict, exact, what):
    assert set(a) == set(b), what
    for key, value in b.items():
        if exact(key):
            assert a[key] == value, (what, key)
        else:
            # The planning score's float features may differ in the last bits: XLA
            # compiles the per-device program for 2 or 1 rows of the batch, not 8.
            np.testing.assert_allclose(a[key], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{what} {key}")


def _check_equal(serial, other, what):
    assert other["status"] == "ok" == serial["status"], (what, other)
    assert other["config"] == serial["config"] and other["step"] == serial["step"]
    counted = set(serial["evaluators"]["val"]["metrics"])  # rates of counts, returns
    for name, s in serial["evaluators"].items():
        o = other["evaluators"][name]
        # Every episode record (ids, batch / env index, counts, outcome, return): exactly.
        assert o["episodes"] == s["episodes"], (what, name)
        plain = name == "val"
        _same(o["metrics"], s["metrics"], lambda k, p=plain: p or k in counted,
              f"{what} {name} metrics")
        _same(o["per_scenario"], s["per_scenario"],
              lambda k, p=plain: p or k in INTEGER_LISTS, f"{what} {name} per_scenario")


@pytest.mark.slow  # 4 evaluation runs of 2 evaluators on CPU: several minutes on 2 cores
def test_eight_devices_and_two_processes_equal_one_device(tmp_path):
    run_dir = _run_dir(tmp_path / "run")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    rc, text = _finish(_eval(run_dir, suite, tmp_path / "serial" / "results.json"))
    assert rc == 0, text[-3000:]
    serial = json.loads((tmp_path / "serial" / "results.json").read_text())
    assert sorted(e["scenario_id"] for e in serial["evaluators"]["val"]["episodes"]) == \
        list(range(10))

    rc, text = _finish(_eval(run_dir, suite, tmp_path / "eight" / "results.json", devices=8))
    assert rc == 0, text[-3000:]
    _check_equal(serial, json.loads((tmp_path / "eight" / "results.json").read_text()),
                 "8 devices")

    # 2 processes of 2 devices, one job: process 0 writes, process 1 writes nothing.
    address = f"127.0.0.1:{_free_port()}"
    procs = [_eval(run_dir, suite, tmp_path / f"p{i}" / "results.json", devices=2,
                   extra=("--coordinator-address", address, "--num-processes", "2",
                          "--process-id", str(i)))
             for i in range(2)]
    done = [_finish(p) for p in procs]
    for i, (rc, text) in enumerate(done):
        assert rc == 0, (i, text[-3000:])
    assert "written by process 0 (this is process 1 of 2)" in done[1][1]
    assert not (tmp_path / "p1").exists()
    _check_equal(serial, json.loads((tmp_path / "p0" / "results.json").read_text()),
                 "2 processes x 2 devices")

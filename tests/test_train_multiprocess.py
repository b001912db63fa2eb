"""Multi-process training: two real processes on localhost (``jax.distributed``, CPU).

The slow test trains 2 iterations in a 2-process job, saves, resumes the job for a third
and compares with one process running the same global configuration. The fast tests
cover how a job is recognised (flags, environment, SLURM, TPU) and the bounded waits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from test_train_run import TINY as TRAIN_TINY

from jaxdrive.config import merge
from jaxdrive.distributed import DistributedError, ProcessGroup, detect

# Two shuffle groups on both sides (what 2 devices do by default), so that the single
# process draws the same minibatches as the 2-process job.
TINY = merge(TRAIN_TINY, {
    "train": {"num_scenes": 4, "num_envs": 4, "total_steps": 2 * 80, "shuffle_groups": 2},
    "validation": {"every": 1}, "logging": {"run_name": "mp"}})
STEPS_PER_IT = 4 * 4 * 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {k: v for k, v in os.environ.items()
            if k != "XLA_FLAGS" and not k.startswith(("JAXDRIVE_", "SLURM_", "TPU_"))}


def _train(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jaxdrive.train", *args], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _job(args: list[str], timeout: float = 900) -> list[str]:
    """Runs ``args`` as a 2-process job; returns each process's output."""
    port = _free_port()
    procs = [_train([*args, "--coordinator-address", f"localhost:{port}",
                     "--num-processes", "2", "--process-id", str(i),
                     "--distributed-timeout", "60"]) for i in range(2)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    return logs


def _params(run_dir):
    from jaxdrive.runs.checkpoint import Checkpointer

    raw, meta = Checkpointer(os.path.join(run_dir, "checkpoints")).restore_raw()
    import jax

    return meta["iteration"], [np.asarray(x) for x in jax.tree.leaves(raw["params"])]


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _run_dir(log: str) -> str:
    return next(line.split(": ", 1)[1].strip() for line in log.splitlines()
                if line.startswith("run directory: "))


@pytest.mark.slow
def test_two_processes_train_save_resume_like_one(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = ["--set", f"logging.output_dir={tmp_path / 'job'}"]
    logs = _job(["--config", str(config), *out])
    run_dir = _run_dir(logs[0])
    assert "run directory" not in logs[1] and "finished" not in logs[1]  # process 1 quiet
    more = ["--set", f"train.total_steps={3 * STEPS_PER_IT}"]
    _job(["--resume", run_dir, *more])
    single = _train(["--config", str(config), *more,
                     "--set", f"logging.output_dir={tmp_path / 'single'}"])
    log = single.communicate(timeout=900)[0]
    assert single.returncode == 0, log[-3000:]
    single_dir = _run_dir(log)

    rows, ref = _rows(run_dir), _rows(single_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3]  # written once, by process 0
    assert {(r["devices"], r["processes"]) for r in rows} == {(2, 2)}
    assert {(r["devices"], r["processes"]) for r in ref} == {(1, 1)}
    worst = 0.0
    for r, s in zip(rows, ref, strict=True):
        for k, v in s.items():
            if k.startswith(("sps", "time/", "devices", "processes")) or v is None:
                continue
            assert r[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k  # abs: near-zero losses
            if v:
                worst = max(worst, abs(r[k] - v) / abs(v))
    it, params = _params(run_dir)
    it_ref, params_ref = _params(single_dir)
    assert it == it_ref == 3
    # Relative to the parameters' magnitude (the largest |weight|): a tensor of tiny
    # values (a bias near 0) moves by Adam steps whose rounding is not relative to it.
    scale = max(float(np.max(np.abs(b))) for b in params_ref)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(params, params_ref, strict=True))
    assert diff <= 1e-5 * scale
    print(f"largest relative metric difference {worst:.2e}; parameters: largest "
          f"difference {diff:.2e} = {diff / scale:.2e} of the largest |weight|")


def test_unreachable_coordinator_is_a_clear_error_in_bounded_time(tmp_path):
    port = _free_port()  # nothing listens there
    t0 = time.monotonic()
    p = _train(["--config", "quickstart", "--coordinator-address", f"localhost:{port}",
                "--num-processes", "2", "--process-id", "1", "--distributed-timeout", "1",
                "--set", f"logging.output_dir={tmp_path}"])
    log = p.communicate(timeout=120)[0]
    assert p.returncode == 2
    assert f"the coordinator localhost:{port} did not answer within 1 s" in log
    assert time.monotonic() - t0 < 60
    assert not any(tmp_path.iterdir())  # nothing created


def test_job_detected_from_flags_environment_and_cluster():
    assert detect(environ={}) is None
    assert detect("h:1", 1, 0, environ={}) is None  # one process: nothing to join
    assert detect("h:1234", 4, 3, environ={}) == ProcessGroup("flags", "h:1234", 4, 3)
    env = {"JAXDRIVE_COORDINATOR_ADDRESS": "h:9", "JAXDRIVE_NUM_PROCESSES": "2",
           "JAXDRIVE_PROCESS_ID": "1"}
    assert detect(environ=env) == ProcessGroup("environment", "h:9", 2, 1)
    assert detect("x:1", 2, 0, environ=env).source == "flags"  # flags win
    assert detect(environ={"SLURM_NTASKS": "8", "SLURM_PROCID": "3"}) == \
        ProcessGroup("slurm")
    assert detect(environ={"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    assert detect(environ={"TPU_WORKER_HOSTNAMES": "a,b,c,d"}) == ProcessGroup("tpu")
    assert detect(environ={"TPU_WORKER_HOSTNAMES": "a"}) is None


@pytest.mark.parametrize("args, message", [
    (("h:1", 2, None), "missing --process-id"),
    (("h", 2, 0), "needs a port"),
    (("h:1", 2, 2), r"process id 2 is not in 0..1"),
])
def test_bad_job_settings_name_the_fix(args, message):
    with pytest.raises(DistributedError, match=message):
        detect(*args, environ={})


def test_bad_environment_value_names_the_variable():
    with pytest.raises(DistributedError, match="JAXDRIVE_NUM_PROCESSES='two'"):
        detect(environ={"JAXDRIVE_COORDINATOR_ADDRESS": "h:1",
                        "JAXDRIVE_NUM_PROCESSES": "two", "JAXDRIVE_PROCESS_ID": "0"})


@pytest.mark.slow
def test_a_killed_process_stops_the_others_within_the_timeout(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    port = _free_port()
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "jaxdrive.train", "--config", str(config),
         "--set", f"logging.output_dir={tmp_path / 'job'}",
         "--set", f"train.total_steps={10_000 * STEPS_PER_IT}",
         "--coordinator-address", f"localhost:{port}", "--num-processes", "2",
         "--process-id", str(i), "--distributed-timeout", "10"],
        env=_env(), stdout=open(log, "w"), stderr=subprocess.STDOUT) for i, log in
        enumerate(logs)]
    try:
        deadline = time.monotonic() + 600
        while "train  step" not in logs[0].read_text() and time.monotonic() < deadline:
            assert procs[0].poll() is None, logs[0].read_text()[-3000:]
            time.sleep(1)
        procs[1].kill()
        killed = time.monotonic()
        code = procs[0].wait(timeout=120)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            p.kill()
    assert code != 0
    assert "heartbeat timeout" in logs[0].read_text()
    assert waited < 60, waited  # 10 s heartbeat, plus the coordination service's polling
    print(f"process 0 stopped {waited:.1f} s after process 1 was killed (exit {code})")

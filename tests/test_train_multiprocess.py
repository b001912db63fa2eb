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
from jaxdrive.distributed import (
    EXIT_PEER_LOST,
    DistributedError,
    ProcessGroup,
    _PeerWatch,
    check_coordinator_port_free,
    detect,
)

# Two shuffle groups and pool shards on both sides (what 2 devices do by default), so
# that the single process draws the same minibatches and scenes as the 2-process job.
TINY = merge(TRAIN_TINY, {
    "train": {"num_scenes": 4, "num_envs": 4, "total_steps": 2 * 80, "shuffle_groups": 2,
              "pool_shards": 2},
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
    # Each process placed its own share of the pool on its device (issue 39, item 2).
    assert "the scene pool in 2 shards (2 of its 4 scenes per device" in logs[0]
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


def test_stop_agreement_every_k_iterations_and_overlap_between(monkeypatch):
    """Issue 39, item 6: in a multi-process job the processes agree on a stop after
    every ``train.stop_check_every`` iterations and after the last (one collective
    each), never in between; a request that arrives in between is agreed on at the next
    agreement, or when every process leaves the loop (``force``); between agreements
    the next iteration may be dispatched before the metrics are read."""
    import types

    import jax

    from jaxdrive.runs.config import RunConfig
    from jaxdrive.signals import StopRequest
    from jaxdrive.train import run as run_mod

    calls = []
    peer_asks = {9}  # another process was signalled before iteration 9's agreement

    def fake_any_process(flag):
        it = fake.current
        calls.append(it)
        return bool(flag) or it in peer_asks

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(run_mod, "any_process", fake_any_process)
    config = RunConfig.from_dict({"train": {"stop_check_every": 3}})
    fake = types.SimpleNamespace(config=config, n_it=10, current=0)
    for name in ("_stop_check_due", "_stop_agreed"):
        setattr(fake, name, types.MethodType(getattr(run_mod._Run, name), fake))
    assert [it for it in range(1, 11) if fake._stop_check_due(it)] == [3, 6, 9, 10]

    stop = StopRequest()
    answers = {}
    for it in range(1, 11):
        fake.current = it
        if it == 4:
            stop.requested = True  # this process's signal, between two agreements
        answers[it] = fake._stop_agreed(stop, it)
        assert fake._stop_agreed(stop, it) == answers[it]  # asked twice: one collective
    assert calls == [3, 6, 9, 10]
    assert [it for it, a in answers.items() if a] == [6, 9, 10]

    # Forced when every process leaves the loop between two agreements: one collective.
    calls.clear()
    stop = StopRequest()
    fake.current, fake._agreed = 7, (None, False)
    assert fake._stop_agreed(stop, 7) is False and calls == []
    stop.requested = True
    assert fake._stop_agreed(stop, 7, force=True) is True and calls == [7]
    # A peer's request reaches a process that was not signalled, at the agreement.
    calls.clear()
    stop = StopRequest()
    fake.current = 9
    assert fake._stop_agreed(stop, 9) is True and stop.requested and calls == [9]
    # One process: no collective, its own request at once.
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    calls.clear()
    stop = StopRequest()
    stop.requested = True
    fake.current = 4
    assert fake._stop_agreed(stop, 4) is True and calls == []


def test_run_dir_is_judged_by_process_0_alone(tmp_path, monkeypatch):
    """A 2-process ``--run-dir`` job whose process 1 started later stopped at once (seen
    in the slow SIGTERM test): process 1 looked at the directory itself while process 0
    was writing its config there, and refused a stranger's file
    (``.config.yaml.XXXX.tmp``). Every process now takes process 0's verdict."""
    from jaxdrive.config import ConfigError
    from jaxdrive.train import cli

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    (run_dir / ".config.yaml.bn86l37r.tmp").write_text("")  # process 0 at work
    args = cli._parser().parse_args(["--config", str(config), "--run-dir", str(run_dir)])
    with pytest.raises(ConfigError, match="other files"):  # as process 0 would judge it
        cli._setup(args)
    told = []

    def from_process_0(text, max_bytes=4096):  # process 0 saw an empty directory
        told.append(text)
        return "fresh"

    monkeypatch.setattr(cli, "is_main_process", lambda: False)
    monkeypatch.setattr(cli, "broadcast_text", from_process_0)
    _, got_dir, resume = cli._setup(args)
    assert told == [None] and got_dir == run_dir and resume is False


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
         "--process-id", str(i), "--heartbeat-timeout", "10"],
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
    assert code == EXIT_PEER_LOST
    log = logs[0].read_text()
    # One line naming the silent process, before JAX's own abort (no stack dump).
    assert "error: process 0: process 1 of 2 has not answered for" in log
    assert "Rerun the same command" in log and "Traceback" not in log
    assert "failed unexpectedly" not in log  # the failed collective is not called a bug
    assert "heartbeat timeout" not in log and "Check failure" not in log
    assert waited < 40, waited  # the 10 s heartbeat, its polling, and the abort
    print(f"process 0 stopped {waited:.1f} s after process 1 was killed (exit {code})")


def test_a_second_process_0_is_told_that_the_coordinator_port_is_taken():
    """Issue 39, item 5: two processes given --process-id 0 aborted after 53 s with C++
    stack dumps. The second one now stops before joining, naming the duplicate."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(DistributedError, match=rf"port {port} of localhost:{port} is "
                                                   r"taken .*another process running with "
                                                   r"--process-id 0"):
            check_coordinator_port_free(f"localhost:{port}")
    check_coordinator_port_free(f"localhost:{port}")  # free again: no error


class _Store:
    """The coordination service's key-value store as _PeerWatch uses it; ``frozen``
    processes stop writing, ``down`` makes every call fail (a coordinator gone)."""

    def __init__(self):
        self.values, self.frozen, self.down = {}, set(), False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE")
        if int(key.rsplit("/", 1)[-1]) not in self.frozen:
            self.values[key] = value

    def key_value_dir_get(self, prefix):
        if self.down:
            raise RuntimeError("UNAVAILABLE")
        return list(self.values.items())


def _watch(store, pid, stop_peer=None, down=False):
    """Runs the watches of processes 0-2 on ``store`` until one reports; returns what
    process ``pid`` reported."""
    import threading

    reports, watches = {}, []
    for p in range(3):
        w = _PeerWatch(store, p, 3, timeout_s=2.0, interval_s=0.02,
                       exit_fn=lambda what, p=p: reports.setdefault(p, what))
        watches.append(w)
        threading.Thread(target=w.run, daemon=True).start()
    time.sleep(0.3)  # everyone alive for a while: nothing is reported
    assert reports == {}
    if stop_peer is not None:
        store.frozen.add(stop_peer)
    store.down = down
    deadline = time.monotonic() + 30
    while pid not in reports and time.monotonic() < deadline:
        time.sleep(0.02)
    for w in watches:
        w.stop.set()
    return reports.get(pid)


def test_a_silent_process_is_named_by_the_others():
    assert _watch(_Store(), 0, stop_peer=2).startswith(
        "process 0: process 2 of 3 has not answered for")


def test_a_coordinator_that_stops_answering_is_named():
    assert _watch(_Store(), 1, down=True).startswith(
        "process 1: the coordinator (process 0) has not answered for")


def test_a_process_that_never_joins_is_one_line_and_exit_2_before_jax_aborts():
    """Issue 39, item 5: process 0 waiting for a process that never starts was ended by
    JAX's own abort (exit 134, a C++ stack dump) at the join timeout."""
    script = ("from jaxdrive.distributed import ProcessGroup, initialize\n"
              f"initialize(ProcessGroup('flags', 'localhost:{_free_port()}', 2, 0), "
              "timeout_s=2)\n")
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: process 0: the job did not assemble within 2 s: "
                                "not every one of the 2 processes joined"), proc.stderr
    assert "Check failure" not in proc.stderr and "Traceback" not in proc.stderr


def _start_job_until_training(tmp_path, train: dict):
    """Starts a 2-process ``--run-dir`` job of TINY (no validation, ``train`` overrides)
    logging to ``tmp_path/p{i}.log``; returns (command without ``--process-id``, run
    directory, logs, processes) once process 0 has logged its first training line."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(merge(TINY, {"validation": {"every": 0},
                                                  "train": train})))
    run_dir = tmp_path / "job"
    command = [sys.executable, "-m", "jaxdrive.train", "--config", str(config),
               "--run-dir", str(run_dir), "--coordinator-address",
               f"localhost:{_free_port()}", "--num-processes", "2",
               "--distributed-timeout", "60"]
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    procs = [subprocess.Popen([*command, "--process-id", str(i)], env=_env(),
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
             for i, log in enumerate(logs)]
    deadline = time.monotonic() + 600
    try:
        while "train  step" not in logs[0].read_text() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), logs[0].read_text()[-3000:]
            time.sleep(0.5)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return command, run_dir, logs, procs


@pytest.mark.slow
def test_sigterm_to_a_job_saves_on_both_and_the_same_command_resumes(tmp_path):
    """Issue 39, item 4: a scheduler's SIGTERM to every process of a 2-process job: both
    finish the same iteration, save and exit 0; rerunning the identical command line
    (``--run-dir``) resumes and finishes the run."""
    import signal

    command, run_dir, logs, procs = _start_job_until_training(
        tmp_path, {"total_steps": 60 * STEPS_PER_IT})
    try:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        codes = [p.wait(timeout=120) for p in procs]
        waited = time.monotonic() - sent
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    first = logs[0].read_text()
    assert "stopped at iteration" in first and "checkpoint saved in" in first
    assert "data-parallel over 2 device(s)" in first and "2 shuffle group(s)" in first
    assert "train.dense_rows" not in first  # no longer off (and noted) on a mesh
    stopped_at, _ = _params(run_dir)
    assert 1 <= stopped_at < 60
    print(f"both processes exited 0 {waited:.1f} s after SIGTERM, at iteration {stopped_at}")
    assert waited < 30, waited

    # The same command line again (as a requeued job runs it): it resumes and finishes.
    port = _free_port()
    command[command.index("--coordinator-address") + 1] = f"localhost:{port}"
    procs = [subprocess.Popen([*command, "--process-id", str(i)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outs]
    assert f"note: {run_dir} holds a run: resuming it" in outs[0]
    assert _params(run_dir)[0] == 60
    assert [r["iteration"] for r in _rows(run_dir)] == list(range(1, 61))


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_the_next_agreement(tmp_path):
    """Issue 39, item 6: a signal to one process of a 2-process job (a node's own
    preemption) is agreed on at the next ``train.stop_check_every`` iteration: both
    processes stop after that same iteration, save once and exit 0."""
    import signal

    k = 4
    _, run_dir, logs, procs = _start_job_until_training(
        tmp_path, {"total_steps": 200 * STEPS_PER_IT, "stop_check_every": k})
    try:
        procs[1].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    stopped_at, _ = _params(run_dir)
    assert 1 <= stopped_at < 200 and stopped_at % k == 0, stopped_at
    assert f"stopped at iteration {stopped_at}" in logs[0].read_text()
    assert [r["iteration"] for r in _rows(run_dir)][-1] == stopped_at

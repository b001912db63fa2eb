"""Multi-process jobs: when to call ``jax.distributed.initialize`` and with what.

A job is multi-process when it is told so explicitly (command-line flags, or the
``JAXDRIVE_COORDINATOR_ADDRESS`` / ``JAXDRIVE_NUM_PROCESSES`` / ``JAXDRIVE_PROCESS_ID``
environment variables) or when the cluster runtime that started it says so: a SLURM job
step with more than one task (``SLURM_NTASKS``), or a Cloud TPU slice with more than one
host (``TPU_WORKER_HOSTNAMES``). JAX, SLURM or the TPU runtime starts one process per
host; jaxdrive never launches processes itself. A single process needs nothing.

``initialize`` bounds every wait: a coordinator that cannot be reached, or a process
that never joins, is a ``DistributedError`` after ``timeout_s`` seconds (not a hang); a
process that dies later is noticed by the others through the coordination service's
heartbeats within ``heartbeat_s`` seconds.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import jax

ENV_ADDRESS = "JAXDRIVE_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAXDRIVE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXDRIVE_PROCESS_ID"
DEFAULT_TIMEOUT_S = 120
DEFAULT_HEARTBEAT_S = 60
# Exit code of a process whose job lost another process (or its coordinator): the job
# cannot go on, but rerunning the same command (``--resume`` / ``--run-dir``) can
# (sysexits' EX_TEMPFAIL).
EXIT_PEER_LOST = 75


class DistributedError(RuntimeError):
    """The multi-process job could not be set up (bad settings, or a coordinator or
    process that did not answer in time)."""


@dataclass(frozen=True)
class ProcessGroup:
    """How this process joins the job.

    Attributes:
      source: where the settings came from (``flags``, ``environment``, ``slurm``,
        ``tpu``): shown in messages.
      coordinator_address: ``HOST:PORT`` of process 0's coordination service, or None
        to let JAX read it from the cluster runtime.
      num_processes, process_id: None likewise.
    """

    source: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def _int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name}={value!r} is not an integer") from None


def detect(coordinator_address: str | None = None, num_processes: int | None = None,
           process_id: int | None = None, environ=None) -> ProcessGroup | None:
    """The job's process group, or None for a single process.

    Explicit arguments (the command-line flags) win over the ``JAXDRIVE_*`` environment
    variables, which win over SLURM and Cloud TPU detection.

    Raises:
      DistributedError: incomplete or inconsistent explicit settings.
    """
    env = os.environ if environ is None else environ
    explicit = (coordinator_address, num_processes, process_id)
    source = "flags"
    if all(x is None for x in explicit):
        source = "environment"
        explicit = (env.get(ENV_ADDRESS) or None,
                    _int(env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES),
                    _int(env.get(ENV_PROCESS_ID), ENV_PROCESS_ID))
    address, n, pid = explicit
    if any(x is not None for x in explicit):
        names = (("--coordinator-address", "--num-processes", "--process-id")
                 if source == "flags" else (ENV_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID))
        missing = [name for name, x in zip(names, explicit, strict=True) if x is None]
        if missing:
            raise DistributedError(
                f"a multi-process job needs all of {', '.join(names)} (from {source}); "
                f"missing {', '.join(missing)}")
        if ":" not in address:
            raise DistributedError(f"coordinator address {address!r} needs a port, e.g. "
                                   f"{address}:12355")
        if n < 1 or not 0 <= pid < n:
            raise DistributedError(f"process id {pid} is not in 0..{n - 1} "
                                   f"(number of processes {n})")
        return None if n == 1 else ProcessGroup(source, address, n, pid)
    if (_int(env.get("SLURM_NTASKS"), "SLURM_NTASKS") or 1) > 1 and "SLURM_PROCID" in env:
        return ProcessGroup("slurm")
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1:
        return ProcessGroup("tpu")
    return None


def initialize(group: ProcessGroup | None, timeout_s: int = DEFAULT_TIMEOUT_S,
               heartbeat_s: int = DEFAULT_HEARTBEAT_S) -> None:
    """Joins the job described by ``group`` (``jax.distributed.initialize``); nothing
    for None. Call before anything touches a device.

    Raises:
      DistributedError: the coordinator did not answer, or not every process joined,
        within ``timeout_s`` seconds; or JAX's backend was already started.
    """
    if group is None:
        return
    if jax.distributed.is_initialized():
        return
    if group.process_id and group.coordinator_address:
        _wait_for_coordinator(group.coordinator_address, timeout_s)
    if group.process_id == 0 and group.coordinator_address:
        check_coordinator_port_free(group.coordinator_address)
    joined = threading.Event()
    threading.Thread(target=_join_deadline, args=(group, timeout_s, joined), daemon=True,
                     name="jaxdrive-join-deadline").start()
    try:
        # JAX's own join and heartbeat checks abort the process with a C++ stack dump;
        # jaxdrive's (``_join_deadline`` after ``timeout_s``, ``watch_peers`` after
        # ``heartbeat_s``) end it first with one line.
        jax.distributed.initialize(
            coordinator_address=group.coordinator_address,
            num_processes=group.num_processes, process_id=group.process_id,
            initialization_timeout=int(timeout_s) + 10,
            heartbeat_timeout_seconds=int(2 * heartbeat_s + 10))
    except Exception as e:  # JAX raises RuntimeError / XlaRuntimeError with a long trace
        where = group.coordinator_address or f"the address {group.source} provides"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DistributedError(
            f"could not join the {group.num_processes or ''}-process job as process "
            f"{group.process_id if group.process_id is not None else '?'} (settings from "
            f"{group.source}; coordinator {where}) within {timeout_s} s: {first}. Check "
            "that every process was started with the same coordinator address and number "
            "of processes, that process 0 is running, and that the port is reachable") from e
    finally:
        joined.set()


def _join_deadline(group: ProcessGroup, timeout_s: float, joined: threading.Event) -> None:
    """Ends the process with one line and exit code 2 unless ``joined`` is set within
    ``timeout_s`` (JAX waits inside a call that cannot be interrupted, then aborts)."""
    if joined.wait(timeout_s):
        return
    who = "?" if group.process_id is None else group.process_id
    n = group.num_processes or "all"
    print(f"error: process {who}: the job did not assemble within {timeout_s:g} s: not "
          f"every one of the {n} processes joined (settings from {group.source}). Start "
          "every process with the same coordinator address and --num-processes, each with "
          "its own --process-id 0..N-1, or raise --distributed-timeout.", file=sys.stderr,
          flush=True)
    os._exit(2)


def check_coordinator_port_free(address: str) -> None:
    """Raises DistributedError if process 0's coordinator port is taken on this host,
    e.g. by a second process started with ``--process-id 0`` (JAX would abort both with
    a stack dump after its join timeout)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", int(port)))
    except OSError as e:
        raise DistributedError(
            f"process 0 cannot start the coordinator: port {port} of {address} is taken "
            f"({e.strerror or e}). Is another process running with --process-id 0 (each "
            "process needs its own id, 0..N-1), or an earlier job still holding the port? "
            "Stop it or choose another port") from None


class _PeerWatch:
    """Each process writes a counter into the coordination service's key-value store
    every ``interval_s``, and reads everyone's; a process whose counter stands still for
    ``timeout_s`` (killed, out of memory, its host gone), or a coordinator that stops
    answering for as long, ends this process with one line and ``EXIT_PEER_LOST``."""

    PREFIX = "jaxdrive/alive/"

    def __init__(self, client, process_id: int, num_processes: int, timeout_s: float,
                 interval_s: float, exit_fn):
        self.client, self.pid, self.n = client, process_id, num_processes
        self.timeout_s, self.interval_s, self.exit_fn = timeout_s, interval_s, exit_fn
        self.stop = threading.Event()

    def run(self) -> None:
        tick, seen = 0, {}
        started = answered = time.monotonic()
        while not self.stop.wait(self.interval_s):
            now = time.monotonic()
            tick += 1
            try:
                self.client.key_value_set(f"{self.PREFIX}{self.pid}", str(tick),
                                          allow_overwrite=True)
                values = dict(self.client.key_value_dir_get(self.PREFIX))
                answered = now
            except Exception as e:  # noqa: BLE001 - any failure: the coordinator is gone
                if now - answered > self.timeout_s:
                    self.exit_fn(f"process {self.pid}: the coordinator (process 0) has not "
                                 f"answered for {now - answered:.0f} s ({type(e).__name__})")
                    return
                continue
            for key, value in values.items():
                peer = int(key.rsplit("/", 1)[-1])
                if seen.get(peer, (None,))[0] != value:
                    seen[peer] = (value, now)
            for peer in range(self.n):
                since = seen.get(peer, (None, started))[1]
                if peer != self.pid and now - since > self.timeout_s:
                    self.exit_fn(f"process {self.pid}: process {peer} of {self.n} has not "
                                 f"answered for {now - since:.0f} s (killed, out of memory, "
                                 "or its host lost)")
                    return


_WATCHES: list = []  # the running peer watch of this process (``watch_peers``)


def await_peer_verdict() -> None:
    """Called with an error in flight in a watched multi-process job: a lost peer often
    shows first as a failed collective in this process (e.g. Gloo's "Connection closed
    by peer"). Waits up to the watch's timeout for it to name the silent process (it then
    ends this process with ``EXIT_PEER_LOST``); returns if it does not, so the caller
    reports its own error. Nothing without a running watch."""
    for watch in _WATCHES:
        if not watch.stop.is_set():
            watch.stop.wait(watch.timeout_s + 10 * watch.interval_s)


def _exit_peer_lost(what: str) -> None:
    print(f"error: {what}; the job cannot go on. Rerun the same command on every process "
          "to continue from the last checkpoint (--resume RUN_DIR or --run-dir DIR); exit "
          f"code {EXIT_PEER_LOST}.", file=sys.stderr, flush=True)
    os._exit(EXIT_PEER_LOST)  # the main thread may sit in a collective that never returns


def watch_peers(heartbeat_s: float = DEFAULT_HEARTBEAT_S, exit_fn=_exit_peer_lost):
    """Starts the peer watch of a multi-process job (``_PeerWatch``; nothing on one
    process); returns it (``.stop.set()`` ends it) or None."""
    if jax.process_count() == 1:
        return None
    from jax._src import distributed as jax_distributed

    watch = _PeerWatch(jax_distributed.global_state.client, jax.process_index(),
                       jax.process_count(), heartbeat_s, max(0.5, heartbeat_s / 10),
                       exit_fn)
    threading.Thread(target=watch.run, name="jaxdrive-peer-watch", daemon=True).start()
    # Stops before JAX's own exit handler (registered earlier, so run later) shuts the
    # job down: a process waiting there for process 0's last evaluations, or whose
    # client is already closed, is not a lost peer.
    atexit.register(watch.stop.set)
    _WATCHES[:] = [watch]
    return watch


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Raises DistributedError unless ``HOST:PORT`` accepts a TCP connection within
    ``timeout_s`` (JAX itself would abort the process with a terse fatal error)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                return
        except OSError as e:
            last = e
            time.sleep(0.5)
    raise DistributedError(
        f"the coordinator {address} did not answer within {timeout_s:g} s ({last}): start "
        "process 0 (it runs the coordinator) with the same --coordinator-address, check the "
        "host name and that the port is open, or raise --distributed-timeout")


def is_main_process() -> bool:
    """Whether this process writes the job's shared outputs (process 0)."""
    return jax.process_index() == 0


def describe() -> str:
    """``N devices (KIND) in P process(es)``, for announcements."""
    devices = jax.devices()
    return (f"{len(devices)} device(s) ({devices[0].device_kind}) in "
            f"{jax.process_count()} process(es)")


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier ``name`` (nothing on one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def host_barrier(name: str, timeout_s: float) -> None:
    """Waits until every process reaches the barrier ``name`` (unique per use) through
    the coordination service, at most ``timeout_s`` seconds: unlike ``barrier`` (a device
    collective), safe in a worker thread while the main thread runs compiled steps.
    Nothing on one process."""
    if jax.process_count() > 1:
        from orbax.checkpoint import multihost

        multihost.get_barrier_sync_fn()(key=name, timeout_ms=int(timeout_s * 1000))


def broadcast_text(text: str | None, max_bytes: int = 4096) -> str:
    """Process 0's ``text`` on every process (e.g. the run directory it created);
    ``text`` itself on one process."""
    if jax.process_count() == 1:
        return text
    import numpy as np
    from jax.experimental import multihost_utils

    buf = np.zeros(max_bytes + 4, np.uint8)
    if is_main_process():
        data = text.encode("utf-8")
        if len(data) > max_bytes:
            raise DistributedError(f"text too long to broadcast ({len(data)} bytes)")
        buf[:4] = np.frombuffer(np.uint32(len(data)).tobytes(), np.uint8)
        buf[4:4 + len(data)] = np.frombuffer(data, np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    n = int(np.frombuffer(got[:4].tobytes(), np.uint32)[0])
    return got[4:4 + n].tobytes().decode("utf-8")


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is true on any process (one small host collective; ``flag`` on
    one process). Used so that every process stops at the same iteration."""
    if jax.process_count() == 1:
        return bool(flag)
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray([flag], np.int32))))

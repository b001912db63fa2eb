"""Data-parallel scaling for ``python -m jaxdrive.bench train --devices 1,2,4,8``.

The number of (fake CPU) devices is fixed when jax starts, so each configuration --
policy kind x device count x mesh or not -- lives in its own worker process
(``python -m jaxdrive.bench.scale SPEC``), started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``. The workers are started one
after another (each builds its scenes and compiles alone, so compile times are not
disturbed), then stay idle until told to time one iteration. The parent interleaves the
timed iterations round robin (ABCD ABCD ...), one worker running at a time, so the
machine's drifting speed hits every configuration alike; it reports the medians and each
configuration's ratio to the 1-device one of the same policy.

On a CPU the fake devices share the same cores: the numbers show the cost of
partitioning the program and of its collectives, not a speed-up. On a machine with N
accelerators the flag changes nothing and the worker needs ``jax.device_count() == N``.

A worker prints its protocol lines on stdout, prefixed with ``TAG``; everything else it
prints (and its stderr) is passed through to the parent's stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

TAG = "@@jaxdrive-bench-scale "
_FLAG = "--xla_force_host_platform_device_count"


def _worker_env(devices: int) -> dict:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_FLAG)]
    env["XLA_FLAGS"] = " ".join(flags + [f"{_FLAG}={devices}"])
    return env


def worker_main(spec: dict) -> int:
    """One configuration: build, compile, report ``ready``; then on each stdin line
    ``time`` time one iteration (reply ``time``), ``record`` reply the record, ``quit``
    (or end of input) exit. Exit code 2 on a bad configuration."""
    import jax

    from jaxdrive.bench.train import TrainBench
    from jaxdrive.config import ConfigError, parse_overrides
    from jaxdrive.runs.config import load_run_config
    from jaxdrive.train.placement import default_mesh

    # Protocol lines only on the real stdout; anything else printed goes to stderr.
    out, sys.stdout = sys.stdout, sys.stderr

    def send(kind, **payload):
        out.write(TAG + json.dumps({"kind": kind, **payload}) + "\n")
        out.flush()

    devices = spec["devices"]
    if jax.device_count() != devices:
        send("error", message=f"asked for {devices} device(s), jax has "
                              f"{jax.device_count()} ({jax.default_backend()})")
        return 2
    try:
        config = load_run_config(spec["config"], parse_overrides(spec["overrides"]))
        mesh = default_mesh(force=spec["mesh"])
        bench = TrainBench(config, mesh)
    except (ConfigError, ValueError) as err:
        send("error", message=str(err))
        return 2
    send("ready", compile_s=bench.compile_s)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "time":
            send("time", s=bench.time_once())
        elif cmd == "record":
            rec = bench.record()
            rec.update(backend=jax.default_backend(), device=jax.devices()[0].device_kind,
                       config=spec["config"])
            send("record", record=rec)
        elif cmd == "quit":
            break
    return 0


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jaxdrive.bench.scale", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True,
            env=_worker_env(spec["devices"]))

    def receive(self, kind: str) -> dict:
        """The next protocol line (other stdout lines go to stderr); raises RuntimeError
        with the worker's message if it failed or exited."""
        for line in self.proc.stdout:
            if not line.startswith(TAG):
                sys.stderr.write(line)
                continue
            msg = json.loads(line[len(TAG):])
            if msg["kind"] == "error":
                raise RuntimeError(msg["message"])
            if msg["kind"] != kind:
                raise RuntimeError(f"worker protocol: expected {kind!r}, got {msg['kind']!r}")
            return msg
        raise RuntimeError(f"worker exited (code {self.proc.wait()}) before {kind!r}")

    def ask(self, cmd: str, kind: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.receive(kind)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def configurations(policies, device_counts, mesh: str) -> list[dict]:
    """(policy, devices, mesh) in run order, for ``mesh`` "off" (the mesh only on more
    than one device: the plain program on one), "on" (the mesh on every count) or "both"
    (one device plain and with the mesh; more devices always use the mesh)."""
    out = []
    for kind in policies:
        for n in device_counts:
            modes = {"off": [n > 1], "on": [True], "both": [False, True] if n == 1 else [True]}
            for m in modes[mesh]:
                out.append({"policy": kind, "devices": n, "mesh": m})
    return out


def run_scale(config_path: str | None, overrides: list[str], configs: list[dict],
              rounds: int, log=print) -> list[dict]:
    """Start one worker per configuration, time ``rounds`` interleaved rounds, return
    the records (``iteration_s_all`` in round order; ``ratio_to_1_device``: steps/s over
    that of the same policy's first 1-device configuration, plain before mesh, from the
    medians; ``paired_ratio_to_1_device``: the median over rounds of that round's ratio).
    Raises RuntimeError when a worker fails."""
    workers: list[Worker] = []
    try:
        for c in configs:
            spec = {"config": config_path, "overrides": overrides + [f"policy.kind={c['policy']}"],
                    "devices": c["devices"], "mesh": c["mesh"]}
            w = Worker(spec)
            workers.append(w)
            try:
                ready = w.receive("ready")
            except RuntimeError as err:
                raise RuntimeError(f"{_name(c)}: {err}") from None
            log(f"  {_name(c)}: compiled in {ready['compile_s']:.1f} s")
        for r in range(rounds):
            times = [w.ask("time", "time")["s"] for w in workers]
            log(f"  round {r + 1}/{rounds}: " + ", ".join(
                f"{_name(c)} {t:.3f} s" for c, t in zip(configs, times, strict=True)))
        records = [w.ask("record", "record")["record"] for w in workers]
    finally:
        for w in workers:
            w.close()
    for rec in records:
        base = next((b for b in records if b["policy"] == rec["policy"]
                     and b["devices"] == 1), None)
        rec["ratio_to_1_device"] = (None if base is None
                                    else rec["steps_per_s"] / base["steps_per_s"])
        # Per round (the two iterations ran back to back): less sensitive to drift.
        rec["paired_ratio_to_1_device"] = (None if base is None else float(np.median(
            [b / t for b, t in zip(base["iteration_s_all"], rec["iteration_s_all"],
                                   strict=True)])))
        rec["rounds"] = rounds
    return records


def _name(c: dict) -> str:
    return f"{c['policy']} x{c['devices']}{' mesh' if c['mesh'] else ''}"


def scale_table(records: list[dict]) -> str:
    """The scaling records as a fixed-width text table."""
    head = (f"{'policy':<12}{'devices':>8}{'mesh':>6}{'compile s':>11}{'iter s':>9}"
            f"{'steps/s':>11}{'trained/s':>11}{'per device':>12}{'vs 1 dev':>10}"
            f"{'paired':>8}")
    rows = [head, "-" * len(head)]
    for r in records:
        ratio, paired = r.get("ratio_to_1_device"), r.get("paired_ratio_to_1_device")
        rows.append(f"{r['policy']:<12}{r['devices']:>8}{'yes' if r['mesh'] else 'no':>6}"
                    f"{r['compile_s']:>11.1f}{r['iteration_s']:>9.3f}"
                    f"{r['steps_per_s']:>11,.0f}{r['trained_steps_per_s']:>11,.0f}"
                    f"{r['per_device_steps_per_s']:>12,.0f}"
                    f"{'-' if ratio is None else f'{ratio:.3f}':>10}"
                    f"{'-' if paired is None else f'{paired:.3f}':>8}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(worker_main(json.loads(sys.argv[1])))

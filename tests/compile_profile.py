"""pytest plugin: where the test suite's time goes, compile by compile.

Not loaded by default. Run the suite (or some modules) with it::

    PYTHONPATH=tests python -m pytest -p compile_profile [pytest args]
    python experiments/test_time_report.py          # per-module table of the last run

Each process (every xdist worker, or the main one with ``-n 0``) writes
``$JAXDRIVE_COMPILE_PROFILE_DIR/compile_profile_<worker>.json`` (default directory:
``test_profile/`` in the working directory): per test id, its wall seconds (setup + call
+ teardown) and every XLA compilation during it as ``[jitted function, seconds]``, from
JAX's own compile log (``jax_log_compiles``). Tracing and lowering are not included in
those seconds; the report shows them from ``jax.monitoring``'s duration events.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import time

import jax
import jax.monitoring
import pytest

_FINISHED = re.compile(r"Finished XLA compilation of (.*) in ([0-9.e+-]+) sec")
_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration")

_current = ["<collection>"]
_compiles: dict[str, list] = collections.defaultdict(list)
_trace_s: dict[str, float] = collections.defaultdict(float)
_wall_s: dict[str, float] = collections.defaultdict(float)


class _CompileLog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        match = _FINISHED.search(record.getMessage())
        if match:
            _compiles[_current[0]].append([match.group(1), float(match.group(2))])


def _on_duration(event: str, duration: float, **_) -> None:
    if event in _TRACE_EVENTS:
        _trace_s[_current[0]] += duration


def pytest_configure(config) -> None:
    jax.config.update("jax_log_compiles", True)
    handler = _CompileLog(level=logging.DEBUG)
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    # jax_log_compiles logs at WARNING: keep those lines off the terminal.
    logger.propagate = False
    jax.monitoring.register_event_duration_secs_listener(_on_duration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _wall_s[item.nodeid] += time.perf_counter() - start
        _current[0] = "<between tests>"


def pytest_sessionfinish(session) -> None:
    out_dir = os.environ.get("JAXDRIVE_COMPILE_PROFILE_DIR", "test_profile")
    os.makedirs(out_dir, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    tests = sorted(set(_wall_s) | set(_compiles) | set(_trace_s))
    record = {t: {"wall_s": round(_wall_s.get(t, 0.0), 4),
                  "trace_lower_s": round(_trace_s.get(t, 0.0), 4),
                  "compiles": _compiles.get(t, [])} for t in tests}
    with open(os.path.join(out_dir, f"compile_profile_{worker}.json"), "w") as f:
        json.dump(record, f, indent=0)

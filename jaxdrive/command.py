"""How every command line ends: one line for a stop or an unexpected error, never a
traceback unless ``--debug`` asks for one.

Each ``python -m jaxdrive.X`` runs its ``main`` through ``run_command``:

- **Ctrl-C / SIGTERM** stop the command: ``stopped by Ctrl-C (...)`` and exit 130 / 143.
  Commands that must finish a write first (training, ``data convert``) install their own
  ``signals.StopRequest`` inside; everywhere else the signal unwinds the work at once
  (outputs are written atomically, so they are either complete or as they were). A
  signal that lands inside a callback, where Python only prints "Exception ignored" and
  carries on, is delivered again a moment later: it is never lost.
- **Unexpected exceptions** (a bug, not bad input: each command reports bad input itself
  as ``error: ...`` and exit 2) print one line naming the exception and the file that
  holds the full traceback, and exit 1. ``--debug`` anywhere on the command line prints
  the traceback instead.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence

from jaxdrive import compile_cache
from jaxdrive.signals import NAMES, Stopped, raise_stopped, signal_name

__all__ = ["Stopped", "add_debug_flag", "run_command", "traceback_file"]

DEBUG_FLAG = "--debug"
_REDELIVER_S = 0.05


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """Lists ``--debug`` in a command's ``--help`` (``run_command`` acts on it)."""
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help="on an unexpected error, print the full Python traceback "
                             "instead of writing it to a file")


def _redeliver(hook: Callable) -> Callable:
    """An unraisable hook that re-sends a swallowed stop signal from a timer thread (the
    main thread then raises it again, outside the callback)."""

    def unraisable(args) -> None:
        if isinstance(args.exc_value, Stopped):
            threading.Timer(_REDELIVER_S, os.kill,
                            (os.getpid(), args.exc_value.signum)).start()
            return
        hook(args)

    return unraisable


def traceback_file(command: str, error: BaseException) -> str:
    """Writes ``error``'s traceback to a new file in the temp directory; returns its path."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    fd, path = tempfile.mkstemp(prefix=f"jaxdrive-{command}-{stamp}-", suffix=".traceback.txt")
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(f"python -m jaxdrive.{command} {' '.join(sys.argv[1:])}\n\n")
        f.write("".join(traceback.format_exception(error)))
    return path


def run_command(main: Callable[[list[str]], int], command: str,
                argv: Sequence[str] | None = None, compilation_cache: bool = True) -> int:
    """Runs ``main(argv)`` (without ``--debug``) under the policy above; returns the exit
    code. ``compilation_cache``: turn on the persistent compilation cache
    (``jaxdrive.compile_cache``; off for the benchmarks, which time compiling)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if compilation_cache:
        compile_cache.enable()
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    previous = {}
    for signum in NAMES:
        try:
            previous[signum] = signal.signal(signum, raise_stopped)
        except ValueError:  # not the main thread: leave signals alone
            pass
    hook, sys.unraisablehook = sys.unraisablehook, _redeliver(sys.unraisablehook)
    # A path or value from the command line may hold undecodable bytes (surrogates); a
    # message naming it prints as a terminal's stderr would, escaped, not as an error.
    streams = {}
    for stream in (sys.stdout, sys.stderr):
        try:
            streams[stream] = stream.errors
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, io.UnsupportedOperation):
            streams.pop(stream, None)
    try:
        return main(argv)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"stopped by {signal_name(signum)}: jaxdrive.{command} did "
              "not finish; outputs are complete or as they were", file=sys.stderr, flush=True)
        return 128 + int(signum)
    except Exception as e:  # noqa: BLE001 - the point: no traceback for anything
        if debug:
            raise
        try:
            where = f"the full traceback is in {traceback_file(command, e)}"
        except OSError as write_error:
            where = f"its traceback could not be saved ({write_error})"
        message = " ".join(str(e).split())
        message = message if len(message) <= 500 else message[:497] + "..."
        print(f"error: jaxdrive.{command} failed unexpectedly: {type(e).__name__}: "
              f"{message}\n{where}; rerun with {DEBUG_FLAG} to print it. This is a bug: "
              "please report it with that file.", file=sys.stderr, flush=True)
        return 1
    finally:
        for stream, errors in streams.items():
            try:
                stream.reconfigure(errors=errors)
            except (AttributeError, ValueError, io.UnsupportedOperation):
                pass
        sys.unraisablehook = hook
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)

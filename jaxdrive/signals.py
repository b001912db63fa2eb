"""Ctrl-C and SIGTERM as a request to stop at the next safe point.

A long command (training, data conversion) installs ``StopRequest`` around its work: the
first signal is only recorded (nothing is raised in the middle of a write or inside a
callback, where Python would print "Exception ignored" and carry on), the work checks
``requested`` where stopping leaves its outputs consistent, and a second signal raises
``KeyboardInterrupt`` at once. The exit code of a stop is ``128 + signal`` (130, 143).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def signal_name(signum: int) -> str:
    """``Ctrl-C``, ``SIGTERM`` or ``signal N``."""
    return NAMES.get(signum, f"signal {signum}")


class StopRequest:
    """Context manager: records the first Ctrl-C or SIGTERM (``requested``, ``name``,
    ``exit_code``); ``notice(name)`` is printed when it arrives; a second one raises
    ``KeyboardInterrupt``. Outside the main thread nothing is installed."""

    def __init__(self, notice: Callable[[str], str] | None = None):
        # ``requested`` may also be set by the caller (e.g. when another process of a
        # job asked to stop); ``signum`` is this process's signal, if any.
        self.requested = False
        self.signum: int | None = None
        self._notice = notice
        self._previous: dict = {}

    @property
    def name(self) -> str:
        return NAMES.get(self.signum, "a stop request")

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGTERM)

    def __enter__(self) -> StopRequest:
        def handler(signum, frame):
            if self.requested:
                raise KeyboardInterrupt
            self.requested, self.signum = True, signum
            if self._notice is not None:
                print(self._notice(self.name), flush=True)

        for signum in NAMES:
            try:
                self._previous[signum] = signal.signal(signum, handler)
            except ValueError:  # not the main thread: no handler, default behaviour
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            # None: the handler was installed outside Python; the default is closest.
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()


class Stopped(KeyboardInterrupt):
    """Raised by Ctrl-C or SIGTERM while a command runs (``signum``: which)."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


def raise_stopped(signum: int, frame) -> None:
    """A signal handler: ``Stopped(signum)``."""
    raise Stopped(signum)


def stop_from_the_start(command: str) -> None:
    """For ``python -m jaxdrive.X`` (called on importing the package): Ctrl-C and SIGTERM
    raise ``Stopped`` from the first import on, and a stop that ends the program before
    the command's own handling (while JAX and the modules load) is one line and exit
    130 / 143, not a ``KeyboardInterrupt`` traceback. Nothing was written by then."""
    for signum in NAMES:
        try:
            signal.signal(signum, raise_stopped)
        except ValueError:  # not the main thread
            return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not isinstance(value, KeyboardInterrupt):
            return previous(kind, value, tb)
        signum = getattr(value, "signum", signal.SIGINT)
        print(f"stopped by {signal_name(signum)} while {command} was "
              "starting: nothing was done", file=sys.stderr, flush=True)
        os._exit(128 + int(signum))

    sys.excepthook = hook

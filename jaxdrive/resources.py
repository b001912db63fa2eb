"""Host memory: estimates checked before the work, so that a command asked for more than
the machine holds stops with the estimate instead of being killed by the kernel."""

from __future__ import annotations

import os

from jaxdrive.config import ConfigError

# A command may plan to use at most this share of the host's memory.
MEMORY_SHARE = 0.8


def host_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(what: str, need: int, fix: str, available: int | None = None) -> None:
    """``ConfigError`` when ``need`` bytes (an estimate of ``what``) exceed
    ``MEMORY_SHARE`` of ``available`` (default: the host's memory); ``fix`` says what to
    lower. Nothing is checked where the memory is unknown."""
    total = host_memory_bytes() if available is None else available
    if total is None or need <= MEMORY_SHARE * total:
        return
    raise ConfigError(f"{what} needs about {need / 2**30:,.1f} GiB of memory; this machine "
                      f"has {total / 2**30:,.1f} GiB: {fix}.")

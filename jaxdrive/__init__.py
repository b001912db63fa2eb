"""jaxdrive: JAX-native multi-agent driving simulation and reinforcement learning."""

__version__ = "0.2.0"


def __getattr__(name):  # lazy: ``import jaxdrive`` stays light
    if name == "pretrained":
        from jaxdrive.runs.pretrained import pretrained

        return pretrained
    raise AttributeError(f"module 'jaxdrive' has no attribute {name!r}")


def _run_as_a_command() -> str | None:
    """``jaxdrive.X`` when Python runs ``python -m jaxdrive.X``, else None."""
    import sys

    argv = getattr(sys, "orig_argv", [])
    if "-m" not in argv[:-1]:
        return None
    name = argv[argv.index("-m") + 1]
    return name if name == "jaxdrive" or name.startswith("jaxdrive.") else None


if _run_as_a_command():
    # A command's signal policy starts before JAX and the modules load (seconds): a
    # Ctrl-C then was a KeyboardInterrupt traceback (issue 40). A library import changes
    # nothing.
    from jaxdrive.signals import stop_from_the_start

    stop_from_the_start(_run_as_a_command())

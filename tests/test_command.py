"""How every command line ends (issue 40): a stop is one line and 128 + signal, an
unexpected exception one line naming the traceback file (exit 1), ``--debug`` the
traceback itself; a signal swallowed inside a callback is delivered again. The commands'
argument parsers are fuzzed: no input gives a traceback. In-process, no JAX work."""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from jaxdrive.command import DEBUG_FLAG, run_command


def _failing(argv):
    assert argv == ["--x", "1"]  # --debug is taken out
    raise RuntimeError("boom\nsecond line")


def test_an_unexpected_error_is_one_line_naming_the_traceback_file(capsys):
    assert run_command(_failing, "train", ["--x", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first, second = err.strip().split("\n")
    assert first == "error: jaxdrive.train failed unexpectedly: RuntimeError: boom second line"
    path = Path(second.split("the full traceback is in ")[1].split(";")[0])
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: boom" in text
    assert "_failing" in text and f"rerun with {DEBUG_FLAG}" in second
    path.unlink()


def test_debug_prints_the_traceback_instead():
    with pytest.raises(RuntimeError, match="boom"):
        run_command(_failing, "train", ["--x", DEBUG_FLAG, "1"])


def test_exit_codes_and_bad_input_pass_through(capsys):
    def usage(argv):
        argparse.ArgumentParser(prog="p").parse_args(argv)

    assert run_command(lambda argv: 2, "eval", []) == 2
    with pytest.raises(SystemExit) as e:
        run_command(usage, "eval", ["--nope"])
    assert e.value.code == 2
    assert "unrecognized arguments: --nope" in capsys.readouterr().err


@pytest.mark.parametrize("signum, code, name", [(signal.SIGINT, 130, "Ctrl-C"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_stops_the_command_with_one_line(capsys, signum, code, name):
    before = signal.getsignal(signum)

    def work(argv):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # interrupted at once
        return 0

    t0 = time.monotonic()
    assert run_command(work, "render", []) == code
    assert time.monotonic() - t0 < 4
    err = capsys.readouterr().err
    assert err == (f"stopped by {name}: jaxdrive.render did not finish; outputs are "
                   "complete or as they were\n")
    assert signal.getsignal(signum) is before  # restored


class _SignalInDel:
    """Its finaliser receives SIGTERM while running Python code: Python can only print
    "Exception ignored" there and go on."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        total = 0
        for i in range(200_000):  # the handler runs here, inside the finaliser
            total += i


def test_a_signal_swallowed_inside_a_callback_is_delivered_again(capsys):
    seen = []

    def work(argv):
        obj = _SignalInDel()
        del obj  # the stop raised in __del__ is "ignored" by Python
        seen.append("went on")
        time.sleep(5)  # the redelivered signal interrupts this
        return 0

    assert run_command(work, "eval", []) == 143
    assert seen == ["went on"]
    err = capsys.readouterr().err
    assert "Exception ignored" not in err
    assert err.startswith("stopped by SIGTERM")


# ---------------------------------------------------------------- parser fuzzing

VALUES = ["9223372036854775808", "-9223372036854775809", "1180591620717411303424", "nan",
          "inf", "-inf", "1e-320", "-0", "", " ", "x" * 5000, "\udcff\udcfe", "0x10", "1e400",
          "1_000", "１２", "gs://bucket/x"]


def _commands(tmp_path):
    """command -> (main, argv that fails fast with exit 2 after the parser accepts it)."""
    from jaxdrive import simulate
    from jaxdrive.autotune import cli as autotune_cli
    from jaxdrive.bench import cli as bench_cli
    from jaxdrive.data.__main__ import main as data_main
    from jaxdrive.eval import cli as eval_cli
    from jaxdrive.inspect import cli as inspect_cli
    from jaxdrive.render import cli as render_cli
    from jaxdrive.train import cli as train_cli

    missing = str(tmp_path / "missing")
    (tmp_path / "afile").write_text("")
    unwritable = str(tmp_path / "afile" / "out.json")  # below a regular file
    return {
        "train": (train_cli.main, ["--config", missing + ".yaml"]),
        "eval": (eval_cli.main, ["--checkpoint", missing]),
        "render": (render_cli.main, ["--checkpoint", missing, "--out", str(tmp_path)]),
        "inspect": (inspect_cli.main, ["--checkpoint", missing]),
        "simulate": (simulate.main, ["--config", missing + ".yaml", "--json", unwritable]),
        "autotune": (autotune_cli.main, ["--config", missing + ".yaml"]),
        "data convert": (data_main, ["convert", missing, "--out", str(tmp_path / "o")]),
        "bench env": (bench_cli.main, ["env", "--json", unwritable]),
    }


def _typed_options(main, argv):
    """The options of the parser ``main`` builds that take one value."""
    parser = {}

    def capture(self, args=None, namespace=None):
        parser["p"] = self
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            main(argv)
    finally:
        argparse.ArgumentParser.parse_args = original
    p = parser["p"]
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        p = subs[0].choices[argv[0]]
    return [a.option_strings[-1] for a in p._actions
            if a.option_strings and a.nargs is None and a.type is not None]


def test_no_value_of_any_typed_option_gives_a_traceback(tmp_path, capsys):
    """Every option with a type, of every command, gets odd values (past int64, NaN, inf,
    subnormal, empty, 5,000 characters, lone surrogates, ...): a usage or input error
    (exit 2), never a traceback or an unexpected error. Derandomised: a fixed sample of
    the option x value pairs."""
    rng = random.Random(40)
    tried, codes = 0, {}
    for command, (main, base) in _commands(tmp_path).items():
        options = _typed_options(main, base)
        assert options, command
        for option in options:
            for value in rng.sample(VALUES, 5):
                try:
                    code = run_command(main, command, base + [option, value])
                except SystemExit as e:
                    code = e.code
                err = capsys.readouterr().err
                assert code == 2, (command, option, value, code, err)
                assert "Traceback" not in err and "unexpectedly" not in err, (
                    command, option, value, err)
                tried += 1
                codes[command] = codes.get(command, 0) + 1
    assert tried >= 150, (tried, codes)


def test_a_signal_while_a_command_starts_is_one_line_not_a_traceback():
    """Issue 40, item 1: Ctrl-C while ``python -m jaxdrive.data`` was still importing
    JAX was a raw KeyboardInterrupt traceback. ``python -m jaxdrive.X`` installs the stop
    handling on importing the package; a stop that ends the program then is one line."""
    import subprocess
    import sys

    code = ("from jaxdrive.signals import stop_from_the_start\n"
            "stop_from_the_start('jaxdrive.data')\n"
            "import os, signal, time\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(5)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 143
    assert out.stderr == ("stopped by SIGTERM while jaxdrive.data was starting: nothing "
                          "was done\n")


def test_only_python_m_jaxdrive_installs_it(monkeypatch):
    import sys

    import jaxdrive

    for argv, expected in ((["python", "-m", "jaxdrive.data", "convert"], "jaxdrive.data"),
                           (["python", "-m", "jaxdrive"], "jaxdrive"),
                           (["python", "-m", "pytest", "-q"], None),
                           (["python", "-m", "jaxdrivex.y"], None),
                           (["python", "script.py", "-m"], None)):
        monkeypatch.setattr(sys, "orig_argv", argv)
        assert jaxdrive._run_as_a_command() == expected, argv


def test_a_message_naming_undecodable_bytes_prints_escaped_not_as_a_bug(monkeypatch):
    """A path given as raw bytes (``\\udcff`` after Python decodes argv) made a command's
    own ``error: ... does not exist`` line raise UnicodeEncodeError on a strict stream,
    which ended as an unexpected error (found by the typed-option fuzz)."""
    import io

    buffer = io.BytesIO()
    strict = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stderr", strict)

    def main(argv):
        print(f"error: run directory {argv[0]} does not exist", file=sys.stderr)
        return 2

    assert run_command(main, "test", ["\udcff\udcfe"]) == 2
    strict.flush()
    assert buffer.getvalue() == b"error: run directory \\udcff\\udcfe does not exist\n"
    assert strict.errors == "strict"  # put back

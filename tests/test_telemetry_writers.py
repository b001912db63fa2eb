"""Host-side metric writers: JSONL (strict JSON, resume truncation), console, wandb, fan-out."""

import io
import json
import math
import re
import sys
import time
import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.telemetry import writers
from jaxdrive.telemetry.writers import (
    ConsoleProgress,
    JsonlWriter,
    WandbWriter,
    Writers,
    format_metric,
)


def _strict_loads(line):
    def reject(name):
        raise ValueError(f"non-strict JSON constant {name}")
    return json.loads(line, parse_constant=reject)


# ---------------------------------------------------------------- JSONL


def test_jsonl_round_trip_converts_scalars_and_nonfinite(tmp_path):
    path = tmp_path / "a" / "b" / "metrics.jsonl"  # parents are created
    w = JsonlWriter(path)
    w.write(np.int64(10), {"f32": np.float32(0.5), "i64": np.int64(7), "jax_f": jnp.asarray(2.5),
                           "jax_i": jnp.asarray(3, jnp.int32), "nan": float("nan"),
                           "np_inf": np.float32(np.inf), "none": None, "tag": "ppo",
                           "flag": np.bool_(True)})
    # Flushed per line: readable before close.
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    w.write(20, {"f32": 0.25, "step": 999})  # "step" comes from the argument, not the metrics
    w.close()
    first, second = [_strict_loads(x) for x in path.read_text().splitlines()]
    assert list(first)[0] == "step"
    assert first == {"step": 10, "f32": 0.5, "i64": 7, "jax_f": 2.5, "jax_i": 3, "nan": None,
                     "np_inf": None, "none": None, "tag": "ppo", "flag": True}
    assert type(first["step"]) is int and type(first["i64"]) is int and type(first["jax_i"]) is int
    assert second == {"step": 20, "f32": 0.25}


def test_jsonl_resume_drops_lines_after_resume_step_and_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    kept = ['{"step": 100, "loss": 1.0}\n', '{"loss":0.5,  "step":200}\n']
    path.write_text("".join(kept) + '{"step": 300, "loss": 0.1}\n' + '{"step": 400, "lo')
    w = JsonlWriter(path, resume_step=200)
    w.write(250, {"loss": 0.3})
    w.close()
    lines = path.read_text().splitlines(keepends=True)
    assert lines[:2] == kept  # verbatim, including the odd spacing
    assert [_strict_loads(x)["step"] for x in lines] == [100, 200, 250]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp file left


def test_jsonl_resume_without_existing_file_and_without_resume(tmp_path):
    path = tmp_path / "m.jsonl"
    w = JsonlWriter(path, resume_step=5)
    w.write(6, {"x": 1})
    w.close()
    # Without resume_step, a later writer only appends (nothing is dropped).
    w = JsonlWriter(path)
    w.write(3, {"x": 2})
    w.close()
    assert [_strict_loads(x) for x in path.read_text().splitlines()] == [
        {"step": 6, "x": 1}, {"step": 3, "x": 2}]


# ---------------------------------------------------------------- console


@pytest.mark.parametrize("value, text", [
    (1234567, "1,234,567"), (np.int64(42), "42"), (0.91234, "0.9123"), (np.float32(0.912), "0.912"),
    (31234.4, "31,234"), (1.5e-5, "1.5e-05"), (-2.0, "-2"), (float("nan"), "nan"), (None, "-"),
    (jnp.asarray(0.5), "0.5"), ("ok", "ok"), (True, "True"),
])
def test_format_metric(value, text):
    assert format_metric(value) == text


def test_console_non_tty_prints_plain_lines(capsys):
    progress = ConsoleProgress(5_000_000, keys=("val/goal_rate", "loss", "absent"))
    # ETA = (5,000,000 - 1,234,567) / 31,234 = 120.6 s -> 2m01s; 1,234,567 / 5e6 = 24.7 %.
    progress.write(1_234_567, {"sps": 31234.0, "val/goal_rate": np.float32(0.912), "loss": 0.5,
                               "other": 3})
    progress.message("checkpoint saved")
    progress.close()
    out = capsys.readouterr()
    assert out.out == ""  # the default file is stderr
    assert "\r" not in out.err
    assert out.err.splitlines() == [
        "train  step 1,234,567/5,000,000 (24.7%)  sps 31,234  eta 2m01s  val/goal_rate 0.912"
        "  loss 0.5",
        "checkpoint saved",
    ]


def test_console_non_tty_measures_sps_when_not_given():
    buf = io.StringIO()
    progress = ConsoleProgress(100_000, start_step=40_000, file=buf, desc="run")
    progress._t0 = time.monotonic() - 20.0  # 20,000 steps in 20 s since the start step
    progress.write(60_000, {})
    line = buf.getvalue().strip()
    assert line.startswith("run  step 60,000/100,000 (60.0%)  sps ")
    sps = float(re.search(r"sps ([\d,.]+)", line).group(1).replace(",", ""))
    assert 980 <= sps <= 1000
    assert re.search(r"eta 4[01]s$", line)  # 40,000 steps left at ~1,000 steps/s


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_console_tty_draws_a_tqdm_bar():
    buf = _Tty()
    progress = ConsoleProgress(5_000_000, start_step=1_000_000, keys=("val/goal_rate",), file=buf)
    progress.write(1_400_000, {"val/goal_rate": 0.91234, "loss": 2.0})
    progress.message("hello")
    progress.close()
    out = buf.getvalue()
    assert "\r" in out
    assert "1.40M/5.00M" in out and "step/s" in out
    assert "val/goal_rate=0.9123" in out and "loss" not in out
    assert "hello\n" in out


# ---------------------------------------------------------------- wandb (faked)


class _FakeRun:
    def __init__(self, run_id="run123", log_error=None):
        self.id = run_id
        self.disabled = False
        self.logs = []
        self.finished = 0
        self.log_error = log_error

    def log(self, data, step=None):
        if self.log_error is not None:
            raise self.log_error
        self.logs.append((data, step))

    def finish(self):
        self.finished += 1


def _fake_wandb(monkeypatch, init=None, login=None):
    """Install a fake ``wandb`` module; returns it (``.init_calls`` records init kwargs)."""
    mod = types.ModuleType("wandb")
    mod.init_calls = []
    mod.run = _FakeRun()

    class Settings:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class Video:
        def __init__(self, data_or_path):
            self.path = data_or_path

    def default_init(**kwargs):
        mod.init_calls.append(kwargs)
        return mod.run

    mod.Settings, mod.Video = Settings, Video
    mod.init = init or default_init
    mod.login = login or (lambda prompt=True, verify=True: True)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return mod


def _one_warning(capsys):
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING: wandb"), err
    return lines[0]


def test_wandb_init_failure_warns_once_and_becomes_noop(monkeypatch, tmp_path, capsys):
    def init(**kwargs):
        raise RuntimeError("network unreachable\nretry later")
    _fake_wandb(monkeypatch, init=init)
    w = WandbWriter({"lr": 0.1}, str(tmp_path), mode="online")
    line = _one_warning(capsys)
    assert "RuntimeError: network unreachable retry later" in line
    assert "wandb login" in line and "WANDB_MODE=offline" in line
    assert not w.active and w.run_id is None
    w.write(1, {"a": 1.0})
    w.log_video("v", "x.mp4", 1)
    w.close()
    assert capsys.readouterr().err == ""


def test_wandb_forwards_values_with_step_and_drops_nonfinite(monkeypatch, tmp_path):
    fake = _fake_wandb(monkeypatch)
    run_dir = tmp_path / "run"
    w = WandbWriter({"lr": 0.1}, str(run_dir), mode="offline", name="exp", entity="team")
    assert w.active and w.run_id == "run123" and run_dir.is_dir()
    (kwargs,) = fake.init_calls
    assert {k: kwargs[k] for k in ("project", "entity", "name", "config", "dir", "mode")} == {
        "project": "jaxdrive", "entity": "team", "name": "exp", "config": {"lr": 0.1},
        "dir": str(run_dir), "mode": "offline"}
    assert kwargs["id"] is None and kwargs["resume"] is None
    assert kwargs["settings"].kwargs == {"init_timeout": 30}

    w.write(np.int64(100), {"a": np.float32(0.5), "nan": float("nan"), "inf": -math.inf,
                            "none": None, "j": jnp.asarray(3), "tag": "x"})
    w.log_video("video/eval", "/tmp/ep.mp4", 200)
    assert fake.run.logs[0] == ({"a": 0.5, "j": 3, "tag": "x"}, 100)
    video_data, video_step = fake.run.logs[1]
    assert video_step == 200 and video_data["video/eval"].path == "/tmp/ep.mp4"
    assert type(fake.run.logs[0][1]) is int
    w.close()
    w.close()
    assert fake.run.finished == 1 and not w.active


def test_wandb_resume_id_is_passed(monkeypatch, tmp_path):
    fake = _fake_wandb(monkeypatch)
    WandbWriter({}, str(tmp_path), mode="offline", resume_id="abc")
    assert fake.init_calls[0]["id"] == "abc" and fake.init_calls[0]["resume"] == "allow"


def test_wandb_log_failure_warns_once_and_disables(monkeypatch, tmp_path, capsys):
    fake = _fake_wandb(monkeypatch)
    fake.run.log_error = OSError("disk full")
    w = WandbWriter({}, str(tmp_path), mode="offline")
    w.write(1, {"a": 1.0})
    w.write(2, {"a": 2.0})
    assert "OSError: disk full" in _one_warning(capsys)
    assert not w.active and fake.run.finished == 1


def test_wandb_online_without_api_key_skips_init(monkeypatch, tmp_path, capsys):
    fake = _fake_wandb(monkeypatch, login=lambda prompt=True, verify=True: False)
    w = WandbWriter({}, str(tmp_path), mode="online")
    assert "no W&B API key" in _one_warning(capsys)
    assert not w.active and fake.init_calls == []


def test_wandb_old_login_signature_falls_through_to_init(monkeypatch, tmp_path):
    def old_login(key=None, relogin=None):  # no prompt= / verify= keywords
        return True
    fake = _fake_wandb(monkeypatch, login=old_login)
    assert WandbWriter({}, str(tmp_path), mode="online").active
    assert len(fake.init_calls) == 1


@pytest.mark.parametrize("mode, env", [("disabled", None), (None, "disabled")])
def test_wandb_disabled_never_calls_init(monkeypatch, tmp_path, capsys, mode, env):
    fake = _fake_wandb(monkeypatch)
    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    w = WandbWriter({}, str(tmp_path), mode=mode)
    w.write(1, {"a": 1.0})
    w.close()
    assert fake.init_calls == [] and not w.active
    assert capsys.readouterr().err == ""


def test_wandb_mode_defaults_to_env_then_online(monkeypatch, tmp_path):
    fake = _fake_wandb(monkeypatch)
    monkeypatch.setenv("WANDB_MODE", "offline")
    WandbWriter({}, str(tmp_path))
    monkeypatch.delenv("WANDB_MODE")
    WandbWriter({}, str(tmp_path))
    assert [c["mode"] for c in fake.init_calls] == ["offline", "online"]


def test_wandb_not_installed_warns_and_is_noop(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    w = WandbWriter({}, str(tmp_path), mode="online")
    assert "pip install" in _one_warning(capsys)
    assert not w.active
    w.write(1, {"a": 1.0})
    w.close()


# ---------------------------------------------------------------- fan-out


class _Recorder:
    def __init__(self, close_error=None):
        self.calls, self.closed, self.close_error = [], 0, close_error

    def write(self, step, metrics):
        self.calls.append((step, dict(metrics)))

    def close(self):
        self.closed += 1
        if self.close_error is not None:
            raise self.close_error


def test_writers_fan_out_to_all(tmp_path):
    a, b = _Recorder(), _Recorder()
    path, console = tmp_path / "m.jsonl", io.StringIO()
    fan = Writers(a, None, JsonlWriter(path), ConsoleProgress(1000, keys=("x",), file=console), b)
    fan.write(500, {"x": 1.5, "sps": 100})
    fan.write(1000, {"x": 2.5, "sps": 100})
    fan.close()
    expected = [(500, {"x": 1.5, "sps": 100}), (1000, {"x": 2.5, "sps": 100})]
    assert a.calls == b.calls == expected and a.closed == b.closed == 1
    assert [_strict_loads(x) for x in path.read_text().splitlines()] == [
        {"step": s, **m} for s, m in expected]
    assert console.getvalue().splitlines()[1] == (
        "train  step 1,000/1,000 (100.0%)  sps 100  eta 0s  x 2.5")


def test_writers_close_reaches_every_writer_then_reraises():
    bad, good = _Recorder(close_error=OSError("boom")), _Recorder()
    with pytest.raises(OSError, match="boom"):
        Writers(bad, good).close()
    assert bad.closed == good.closed == 1


def test_module_exports():
    assert set(writers.__all__) == {"ConsoleProgress", "JsonlWriter", "WandbWriter", "Writers",
                                    "format_metric"}

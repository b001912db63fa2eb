"""Training runs that survive what clusters and disks do to them (issue 15), end to end on
the tiny config of test_train_run (same program, so the step compiles once per test run):
SIGTERM saves and exits, a damaged newest checkpoint is skipped and the resumed run equals
the uninterrupted one, a non-finite loss stops the run without saving, a full disk is one
clear error and the run resumes after, the run lock, ``--resume --set`` recorded, failed
starts leave no run directory, out of memory names the key to lower."""

import builtins
import json
import logging
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from test_train_run import STEPS_PER_IT, TINY, _lines, _without_timing

from jaxdrive.files import OutputError
from jaxdrive.runs import integrity
from jaxdrive.runs.checkpoint import Checkpointer
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import load_policy
from jaxdrive.runs.lock import RunLock
from jaxdrive.telemetry.writers import JsonlWriter
from jaxdrive.train import cli, run


def _data(tmp_path, **sections) -> dict:
    data = json.loads(json.dumps(TINY))
    data["validation"]["every"] = 0  # no validator to compile; best/ is tested elsewhere
    data["checkpoint"]["keep_last"] = 3
    data["logging"]["output_dir"] = str(tmp_path)
    for section, values in sections.items():
        data[section].update(values)
    return data


def _leaves_equal(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _raw(run_dir, step):
    return Checkpointer(run_dir / "checkpoints").restore_raw(step=step)[0]


def _assert_same_run(run_dir, reference) -> None:
    """Same metrics lines (timing aside) and bit-identical last checkpoint."""
    assert (_without_timing(_lines(run_dir / "metrics.jsonl"))
            == _without_timing(_lines(reference / "metrics.jsonl")))
    _leaves_equal(_raw(run_dir, 3), _raw(reference, 3))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 3-iteration run (checkpoints 1, 2, 3)."""
    tmp = tmp_path_factory.mktemp("reference")
    config = RunConfig.from_dict(_data(tmp))
    run_dir = run.new_run_dir(config, "tiny")
    run.train(config, run_dir, quiet=True)
    return run_dir


def _resumable_at_1(reference, tmp_path):
    """A copy of the reference run as if it had stopped after iteration 1."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    for step in (2, 3):
        shutil.rmtree(run_dir / "checkpoints" / "last" / str(step))
    return run_dir


def test_sigterm_saves_and_resume_skips_a_damaged_checkpoint_with_identical_results(
        tmp_path, monkeypatch, capsys, reference):
    config = RunConfig.from_dict(_data(tmp_path, checkpoint={"keep_last": 2}))
    run_dir = run.new_run_dir(config, "tiny")
    original = run.JsonlWriter.write

    def write_then_sigterm(self, step, metrics):
        original(self, step, metrics)
        if step == 2 * STEPS_PER_IT:
            os.kill(os.getpid(), signal.SIGTERM)  # as a cluster does before killing a job

    def default_action(signum, frame):  # what an unhandled SIGTERM would do: end the run
        raise SystemExit("SIGTERM not handled: the run died without saving")

    monkeypatch.setattr(run.JsonlWriter, "write", write_then_sigterm)
    previous = signal.signal(signal.SIGTERM, default_action)
    try:
        run.train(config, run_dir, quiet=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        monkeypatch.undo()
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [1, 2]
    _leaves_equal(_raw(run_dir, 2), _raw(reference, 2))  # the SIGTERM save is exact

    # One flipped bit in the largest array file of the newest checkpoint.
    last2 = run_dir / "checkpoints" / "last" / "2"
    target = max((p for p in (last2 / "state").rglob("*") if p.is_file()),
                 key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    assert cli.main(["--resume", str(run_dir), "--set", "checkpoint.keep_last=3"]) == 0
    out = capsys.readouterr().out
    assert f"note: {last2} cannot be used ({target.relative_to(last2).as_posix()} does not " \
           "match its checksum" in out
    assert "resumed from iteration 1" in out
    _assert_same_run(run_dir, reference)  # == resuming from checkpoint 1 directly
    assert [p.name.split("-")[:2] for p in (run_dir / "checkpoints" / "damaged").iterdir()] \
        == [["last", "2"]]
    # --resume --set is recorded in config.yaml; the previous config is kept.
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["checkpoint"]["keep_last"] == 3
    assert yaml.safe_load((run_dir / "config.prev.yaml").read_text())["checkpoint"][
        "keep_last"] == 2
    assert f"{run_dir / 'config.prev.yaml'}" in out


def test_a_stop_saves_and_leaves_without_the_last_validation_videos_or_evaluations(
        tmp_path, monkeypatch, reference):
    """Issue 39, item 4: a SIGTERM during an iteration ran a finished run's last
    validation (a fresh compile: 233 s at the selfplay preset) before the save, past a
    scheduler's grace period. Now that iteration is logged and saved, and what runs
    between steps (validation, videos, evaluations) is skipped."""
    calls = []
    between_steps, check_finite = run._Run._between_steps, run.check_finite

    def record(self, it, metrics, final, val_params=None):
        calls.append((it, final))
        return between_steps(self, it, metrics, final, val_params)

    def sigterm_in_iteration_2(it, *args):
        check_finite(it, *args)
        if it == 2 and signal_at_2:
            os.kill(os.getpid(), signal.SIGTERM)  # after the step, before what follows it

    monkeypatch.setattr(run._Run, "_between_steps", record)
    monkeypatch.setattr(run, "check_finite", sigterm_in_iteration_2)
    for signal_at_2, want in ((False, [(1, False), (2, False), (3, True)]),
                              (True, [(1, False)])):
        calls.clear()
        config = RunConfig.from_dict(_data(tmp_path / str(signal_at_2)))
        run_dir = run.new_run_dir(config, "tiny")
        run.train(config, run_dir, quiet=True)
        assert calls == want
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [1, 2]
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [STEPS_PER_IT,
                                                                      2 * STEPS_PER_IT]
    _leaves_equal(_raw(run_dir, 2), _raw(reference, 2))


def test_a_non_finite_loss_stops_the_run_naming_the_iteration_and_saves_nothing(
        tmp_path, monkeypatch, capsys, reference):
    run_dir = _resumable_at_1(reference, tmp_path)
    record = (run_dir / "checkpoints" / "last" / "1" / integrity.RECORD).read_bytes()
    procedural_params = run.procedural_params

    def nan_scenes(*args, **kwargs):  # NaN scene data, as a bad dataset gives
        return jax.tree.map(
            lambda x: jnp.full_like(x, jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating)
            else x, procedural_params(*args, **kwargs))

    monkeypatch.setattr(run, "procedural_params", nan_scenes)
    assert cli.main(["--resume", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: training diverged at iteration 2: loss/"), err
    assert "Nothing of iteration 2 was saved" in err and "Traceback" not in err
    ckpt = Checkpointer(run_dir / "checkpoints")
    assert ckpt.all_steps() == [1] and ckpt.problems(1) == []
    assert (run_dir / "checkpoints" / "last" / "1" / integrity.RECORD).read_bytes() == record
    assert np.all(np.isfinite(jax.tree.leaves(ckpt.restore_raw()[0]["params"])[0]))


def test_a_full_disk_is_one_clear_error_and_the_run_resumes_after_space_is_freed(
        tmp_path, monkeypatch, capsys, reference):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    run_dir = _resumable_at_1(reference, tmp_path)
    real_open = builtins.open
    step2 = str(run_dir / "checkpoints" / "last" / "2")

    def open_on_full_disk(file, mode="r", *args, **kwargs):
        # The OS boundary: the files of checkpoint 2 land on a device that is full.
        if (isinstance(file, str | os.PathLike) and str(file).startswith(step2)
                and any(c in mode for c in "wax")):
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_on_full_disk)
    assert cli.main(["--resume", str(run_dir)]) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("train ")]
    assert len(lines) == 1 and "Traceback" not in err, err  # one line, no asyncio dumps
    assert lines[0].startswith(f"error: could not save the checkpoint {step2}: No space left "
                               "on device"), err
    assert lines[0].endswith(f"free disk space; then continue with --resume {run_dir}")
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [1]
    assert cli.main(["--resume", str(run_dir)]) == 0  # space freed
    _assert_same_run(run_dir, reference)


def test_a_second_process_cannot_resume_into_a_running_run_directory(reference, capsys):
    steps = Checkpointer(reference / "checkpoints").all_steps()
    with RunLock(reference):  # the running trainer's lock
        assert cli.main(["--resume", str(reference)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: run directory {reference} is in use by pid {os.getpid()}")
    assert "--force-unlock" in err
    assert Checkpointer(reference / "checkpoints").all_steps() == steps


def test_a_failed_start_leaves_no_run_directory(tmp_path, capsys):
    config_file = tmp_path / "c.yaml"
    config_file.write_text(yaml.safe_dump(_data(
        tmp_path / "runs", train={"co_players": [str(tmp_path / "nowhere")]})))
    assert cli.main(["--config", str(config_file)]) == 2
    err = capsys.readouterr().err
    assert f"error: run directory {tmp_path / 'nowhere'} does not exist" in err, err
    assert "note: removed" in err and list((tmp_path / "runs").iterdir()) == []


def test_out_of_memory_names_the_key_to_lower(tmp_path):
    try:
        jnp.zeros((1 << 50,), jnp.uint8).block_until_ready()  # a real RESOURCE_EXHAUSTED
    except jax.errors.JaxRuntimeError as e:
        error = e
    config = RunConfig.from_dict(_data(tmp_path, train={"num_envs": 64}))
    message = cli.out_of_memory_message(error, config)
    assert message.startswith("out of memory (RESOURCE_EXHAUSTED: Out of memory allocating")
    assert "train.num_envs=64 does not fit" in message
    assert "--set train.num_envs=16" in message


def test_a_full_disk_under_the_metrics_file_is_one_clear_error(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    path = tmp_path / "metrics.jsonl"
    path.symlink_to("/dev/full")
    writer = JsonlWriter(path)
    with pytest.raises(OutputError, match=f"cannot write the metrics file {path}: No space "
                                          "left on device; free disk space"):
        writer.write(1, {"loss": 0.5})


def test_load_policy_skips_a_damaged_newest_checkpoint(reference, tmp_path, caplog):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    last3 = run_dir / "checkpoints" / "last" / "3"
    (last3 / "metadata" / "metadata").write_text("{}")  # damaged metadata
    with caplog.at_level(logging.WARNING):
        loaded = load_policy(run_dir)  # no best/ in this run: the newest intact of last/
    assert loaded.step == 2 * STEPS_PER_IT
    assert f"skipped checkpoint {last3}: metadata/metadata has 2 bytes" in caplog.text
    _leaves_equal(loaded.params, _raw(reference, 2)["params"])


def test_resume_without_an_intact_checkpoint_lists_each_and_changes_nothing(
        reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    last = run_dir / "checkpoints" / "last"
    for step in (1, 2, 3):  # as if every save had been killed before its record
        (last / str(step) / integrity.RECORD).unlink()
    assert cli.main(["--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no intact checkpoint under {last}: {last / '3'}: it has no "
                          "checksum record"), err
    assert all(f"{last / str(s)}: it has no checksum record" in err for s in (1, 2, 3))
    assert "Traceback" not in err
    assert sorted(p.name for p in last.iterdir()) == ["1", "2", "3"]  # nothing moved
    assert not (run_dir / "checkpoints" / "damaged").exists()


def test_resume_to_fewer_steps_than_done_is_refused_and_changes_nothing(
        tmp_path, capsys, reference):
    """Issue 40, item 8: ``--resume --set train.total_steps=`` below the steps done printed
    ``finished: 0 agent-steps, nan s`` and rewrote config.yaml."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    before = (run_dir / "config.yaml").read_text()
    assert cli.main(["--resume", str(run_dir), "--set",
                     f"train.total_steps={STEPS_PER_IT}"]) == 2
    err = capsys.readouterr().err
    assert (f"train.total_steps={STEPS_PER_IT:,} is below the {3 * STEPS_PER_IT:,} "
            "agent-steps (3 iterations)") in err
    assert (run_dir / "config.yaml").read_text() == before
    assert not (run_dir / "config.prev.yaml").exists()


def test_sigterm_during_setup_stops_with_one_line_and_no_run_directory(
        tmp_path, monkeypatch, capsys, reference):
    """Issue 40, item 5: SIGTERM before the first iteration exited 143 with no message and
    left a run directory holding only config.yaml and run.lock."""
    original = run.Checkpointer.__init__

    def init_then_sigterm(self, *args, **kwargs):
        original(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # mid set-up: the env and policy come next

    monkeypatch.setattr(run.Checkpointer, "__init__", init_then_sigterm)
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(_data(tmp_path / "runs")))
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["--config", str(config_file)]) == 143
    err = capsys.readouterr().err
    assert "stopped by SIGTERM during set-up, before the first iteration" in err
    assert "Traceback" not in err and "error:" not in err
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # the unused run is removed
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back


def _signal_campaign(tmp_path, capsys, reference, rounds: int, seed: int) -> dict:
    """Ctrl-C or SIGTERM at random moments of a whole training run (set-up, iterations,
    saves, the summary), through ``run_command`` as ``python -m jaxdrive.train`` runs it.
    Every outcome is clean: exit 0 with intact checkpoints whose newest holds the last
    logged iteration (finished, or stopped after saving), or exit 130 / 143 with one line
    and either no run directory (stopped during set-up) or intact checkpoints. Never a
    traceback, never "ignored", no temporary directory left."""
    import random
    import threading
    import time

    from jaxdrive.command import run_command

    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(_data(tmp_path / "runs")))
    argv = ["--config", str(config_file)]
    t0 = time.perf_counter()
    assert cli.main(argv) == 0  # the program is compiled (``reference``): a warm run
    span = time.perf_counter() - t0
    rng = random.Random(seed)
    late, outcomes = [], {}
    previous = {n: signal.signal(n, lambda n, f: late.append(n))
                for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        for _ in range(rounds):
            shutil.rmtree(tmp_path / "runs")
            signum = rng.choice([signal.SIGINT, signal.SIGTERM])
            timer = threading.Timer(rng.uniform(0, 1.1 * span), os.kill,
                                    (os.getpid(), signum))
            capsys.readouterr()
            timer.start()
            code = run_command(cli.main, "train", argv)
            timer.cancel()
            timer.join()
            err = capsys.readouterr().err
            assert "Traceback" not in err and "Exception ignored" not in err, err
            assert "unexpectedly" not in err and "error:" not in err, err
            runs = list((tmp_path / "runs").iterdir()) if (tmp_path / "runs").exists() else []
            if code != 0:
                assert code == 128 + signum, (code, signum, err)
                *progress, last = err.strip().splitlines()
                assert last.startswith("stopped by "), err  # one line, after the progress
                assert all(line.startswith("train  step") for line in progress), err
            if not runs:
                assert code != 0, "a finished run lost its directory"
                key = "stopped in set-up"
            else:
                [run_dir] = runs
                ckpt = Checkpointer(run_dir / "checkpoints")
                steps = ckpt.all_steps()
                assert steps, (code, err)
                assert all(ckpt.problems(s) == [] for s in steps)
                assert not list((run_dir / "checkpoints").glob("*/*orbax-checkpoint-tmp*"))
                logged = len(_lines(run_dir / "metrics.jsonl"))
                assert ckpt.restore_metadata()["iteration"] == logged == steps[-1]
                key = ("finished" if logged == 3 else "stopped and saved") + \
                    ("" if code == 0 else f", exit {code}")
            late.clear()
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        for n, h in previous.items():
            signal.signal(n, h)
    return outcomes


def test_signals_at_random_moments_of_training(tmp_path, capsys, reference):
    outcomes = _signal_campaign(tmp_path, capsys, reference, rounds=5, seed=40)
    assert sum(outcomes.values()) == 5


@pytest.mark.slow  # a longer campaign of the same property (30 signals)
def test_signals_at_random_moments_of_training_long(tmp_path, capsys, reference):
    outcomes = _signal_campaign(tmp_path, capsys, reference, rounds=30, seed=41)
    assert sum(outcomes.values()) == 30


def test_run_dir_starts_then_resumes_with_the_same_command(tmp_path, monkeypatch, capsys,
                                                           reference):
    """Issue 39, item 4: a requeued job reruns its command. ``--config C --run-dir D``
    starts the run in D; SIGTERM saves after iteration 1; the same command again resumes
    it and ends equal to the uninterrupted run; once more, it has nothing left to do."""
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(_data(tmp_path / "unused")))
    run_dir = tmp_path / "job"
    argv = ["--config", str(config_file), "--run-dir", str(run_dir)]
    original = run.JsonlWriter.write

    def write_then_sigterm(self, step, metrics):
        original(self, step, metrics)
        if step == STEPS_PER_IT:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler preempts the job

    with monkeypatch.context() as m:
        m.setattr(run.JsonlWriter, "write", write_then_sigterm)
        assert cli.main(argv) == 0
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [1]
    assert not (tmp_path / "unused").exists()  # the run is D itself, not under output_dir
    capsys.readouterr()
    assert cli.main(argv) == 0  # requeued: the same command
    assert f"note: {run_dir} holds a run: resuming it" in capsys.readouterr().out
    _assert_same_run(run_dir, reference)
    assert cli.main(argv) == 0  # nothing left to train: the run is unchanged
    _assert_same_run(run_dir, reference)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert cli.main(["--config", str(config_file), "--run-dir", str(tmp_path / "other")]) == 2
    assert "holds no checkpoint to resume but other files (notes.txt)" in \
        capsys.readouterr().err


def test_processes_agree_on_a_stop_once_per_iteration(monkeypatch):
    """Issue 39, item 6: one stop-flag collective per agreement in a multi-process job
    (the loop asks twice); every ask after the same iteration gets the agreed answer,
    even if a signal arrived locally in between (agreed on after the next iteration)."""
    import types

    from jaxdrive.train import run as run_module

    calls = []
    monkeypatch.setattr(run_module.jax, "process_count", lambda: 2)
    monkeypatch.setattr(run_module, "any_process",
                        lambda flag: calls.append(flag) or flag)
    from jaxdrive.runs.config import RunConfig

    # Agreement after every iteration (``train.stop_check_every: 1``; every k:
    # test_train_multiprocess.py::test_stop_agreement_every_k_iterations_and_overlap_between).
    loop = types.SimpleNamespace(config=RunConfig.from_dict({"train": {"stop_check_every": 1}}),
                                 n_it=10)
    loop._stop_check_due = types.MethodType(run_module._Run._stop_check_due, loop)
    stop = types.SimpleNamespace(requested=False)
    agreed = lambda it: run_module._Run._stop_agreed(loop, stop, it)  # noqa: E731
    assert [agreed(1), agreed(1)] == [False, False] and calls == [False]
    stop.requested = True  # a signal after iteration 1's agreement
    assert agreed(1) is False and calls == [False]  # the same answer as the others got
    assert agreed(2) is True and calls == [False, True]
    assert agreed(2) is True and calls == [False, True]

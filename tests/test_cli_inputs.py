"""Odd command-line input is a usage error naming the option, before any work (issue 40,
items 6 and 8): integers past int64, out-of-range counts, NaN thresholds and scores,
scores files that are not UTF-8."""

import numpy as np
import pytest

from jaxdrive.config import ConfigError
from jaxdrive.data.subsets import read_scores

HUGE = "1180591620717411303424"  # 2**70: OverflowError once it reached JAX


def _usage_error(main, argv, capsys, *words):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)
    assert "Traceback" not in err


def test_seeds_and_indices_past_their_range_are_usage_errors(capsys):
    from jaxdrive import simulate
    from jaxdrive.inspect import cli as inspect_cli
    from jaxdrive.render import cli as render_cli

    _usage_error(simulate.main, ["--seed", HUGE], capsys, "--seed", "out of range",
                 "2,147,483,647")
    _usage_error(simulate.main, ["--seed", "-1"], capsys, "--seed", ">= 0")
    _usage_error(render_cli.main, ["--seed", "x1"], capsys, "--seed", "not an integer")
    _usage_error(inspect_cli.main, ["--checkpoint", "RUN", "--scenario", "1000000000000"],
                 capsys, "--scenario", "out of range")


def test_autotune_sweep_bounds_are_checked(capsys):
    from jaxdrive.autotune import cli

    _usage_error(cli.main, ["--config", "quickstart", "--max-envs", "0"], capsys,
                 "--max-envs", ">= 1")
    _usage_error(cli.main, ["--config", "quickstart", "--start-envs", "100", "--max-envs",
                            "10"], capsys, "--start-envs 100 is above --max-envs 10")


def test_subset_threshold_must_be_finite(capsys, tmp_path):
    from jaxdrive.data.__main__ import main

    _usage_error(main, ["subset", str(tmp_path), "--scores", "s.csv", "--threshold", "nan",
                        "--name", "x"], capsys, "--threshold", "not a finite number")


def test_scores_files_with_nan_or_other_encodings_are_refused_naming_the_line(tmp_path):
    ok = tmp_path / "ok.csv"
    ok.write_text("scenario_id,score\na,0.5\nb,2\n")
    assert read_scores(ok) == {"a": 0.5, "b": 2.0}
    nan = tmp_path / "nan.csv"
    nan.write_text("scenario_id,score\na,0.5\nb,nan\n")
    with pytest.raises(ConfigError, match="line 3: score = 'nan' is not a finite number"):
        read_scores(nan)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("scenario_id,score\nstra\xdfe,1\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        read_scores(latin)


def test_resume_refuses_model_changes_before_any_setup(tmp_path, capsys):
    """Issue 40, item 4: ``--resume RUN --set policy.model_dim=32`` was a ValueError
    traceback after minutes of set-up."""
    import yaml

    from jaxdrive.runs.config import load_run_config
    from jaxdrive.train.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(load_run_config("quickstart").to_dict()))
    assert main(["--resume", str(run), "--set", "policy.model_dim=32"]) == 2
    err = capsys.readouterr().err
    assert "policy.model_dim is 64" in err and "32" in err and "Traceback" not in err
    assert main(["--resume", str(run), "--set", "env.observation.num_road=7"]) == 2
    assert "env.observation.num_road" in capsys.readouterr().err
    # Other keys pass this check (here the run has no checkpoint to resume from).
    assert main(["--resume", str(run), "--set", "train.total_steps=100000"]) == 2
    err = capsys.readouterr().err
    assert "checkpoints not found" in err and "keeps the run's model" not in err


def test_an_eval_file_whose_eval_key_is_a_list_is_one_error():
    """Issue 40, item 6: ``eval: [1, 2]`` was a TypeError traceback in the eval CLI's
    section overrides (run before the suite loader, which names it the same way)."""
    from jaxdrive.eval.cli import apply_section_overrides

    with pytest.raises(ConfigError, match="'eval' must be a mapping of evaluator sections, "
                                          "got list"):
        apply_section_overrides({"eval": [1, 2]}, [])
    assert apply_section_overrides({"eval": {"a": {}}}, ["a.seed=3"]) == {
        "eval": {"a": {"seed": 3}}}


def test_float_settings_too_small_for_float32_are_refused():
    """Issue 40, item 8: ``train.learning_rate=1e-320`` was accepted (0 in float32)."""
    from jaxdrive.runs.config import load_run_config

    with pytest.raises(ConfigError, match="'learning_rate' = 1e-320 is too small"):
        load_run_config("quickstart", {"train.learning_rate": 1e-320})
    assert load_run_config("quickstart", {"train.learning_rate": 1e-30}).train.learning_rate \
        == 1e-30
    assert load_run_config("quickstart", {"train.entropy_coef": 0.0}).train.entropy_coef == 0.0


def test_a_setting_given_twice_in_one_file_is_an_error(tmp_path):
    """Issue 40, item 8: ``train.seed: 4`` beside ``train: {seed: 5}`` silently used 4."""
    from jaxdrive.runs.config import load_run_config

    both = tmp_path / "both.yaml"
    both.write_text("train.seed: 4\ntrain:\n  seed: 5\n")
    with pytest.raises(ConfigError, match="keys 'train.seed' and 'train' both set "
                                          "'train.seed'"):
        load_run_config(str(both))
    fine = tmp_path / "fine.yaml"
    fine.write_text("train.seed: 4\ntrain:\n  num_envs: 8\n")
    config = load_run_config(str(fine))
    assert (config.train.seed, config.train.num_envs) == (4, 8)


def test_a_name_too_long_for_a_directory_is_refused_before_the_work():
    """Issue 40, item 10: a 300-character eval section name ran 198 s, then failed making
    its video directory."""
    from jaxdrive.eval.suite import load_suite_specs
    from jaxdrive.files import MAX_NAME_BYTES, UnsafeNameError, safe_name

    long = "v" * 300
    with pytest.raises(ConfigError, match="300 bytes long.*within 200 bytes"):
        load_suite_specs({"eval": {long: {"type": "multi_scenario"}}})
    assert safe_name("v" * MAX_NAME_BYTES, "x") == "v" * MAX_NAME_BYTES
    with pytest.raises(UnsafeNameError, match="201 bytes"):
        safe_name("é" * 100 + "v", "x")  # 100 two-byte characters


def test_work_larger_than_memory_is_refused_with_the_estimate(capsys):
    """Issue 40, item 7: ``simulate --scenes 1000000000`` grew to 15 GB and was killed;
    ``render --size 100000`` / ``--fps 1e9`` were refused only minutes in."""
    from jaxdrive import simulate
    from jaxdrive.render import cli as render_cli
    from jaxdrive.resources import check_fits
    from jaxdrive.scenarios.base import ScenarioConfig

    with pytest.raises(ConfigError, match=r"x needs about 2.0 GiB of memory; this machine "
                                          r"has 2.0 GiB: lower it"):
        check_fits("x", 2 * 2**30, "lower it", available=2 * 2**30)
    check_fits("x", 2**30, "lower it", available=2 * 2**30)  # within 80 %
    # 4 bytes per leaf element: the default sizes' leaves, summed by hand.
    sc = ScenarioConfig(max_agents=2, num_steps=3, max_road_points=5, max_lanes=1,
                        max_lane_successors=1, max_traffic_lights=1)
    assert sc.nbytes() == 4 * sum(np.prod(s) for s in sc.shapes().values())
    assert simulate.main(["--scenes", str(10**12)]) == 2
    assert "--scenes 1,000,000,000,000 needs about" in capsys.readouterr().err
    _usage_error(render_cli.main, ["--size", "8192", "--envs", "4096", "--chunk", "100000"],
                 capsys, "needs about", "GiB of memory")
    _usage_error(render_cli.main, ["--size", "100000"], capsys, "--size", "<= 8,192")
    _usage_error(render_cli.main, ["--fps", "1000000000"], capsys, "--fps", "<= 240")


def test_a_stray_directory_among_the_checkpoints_is_not_a_step(tmp_path):
    """Issue 40, item 6: ``checkpoints/last/²`` ('²'.isdigit() is True) was a ValueError
    traceback wherever steps were listed."""
    from jaxdrive.runs.checkpoint import Checkpointer, is_step_name

    for name in ("7", "12", "²", "٣", "x1"):
        (tmp_path / "checkpoints" / "last" / name).mkdir(parents=True)
    assert Checkpointer(tmp_path / "checkpoints").all_steps() == [7, 12]
    assert [is_step_name(n) for n in ("7", "²", "٣", "")] == [True, False, False, False]


def test_object_store_urls_are_refused_before_any_work(capsys, tmp_path):
    """Issue 39, item 3: ``logging.output_dir=gs://bucket/runs`` silently wrote a local
    ``./gs:/bucket/runs`` directory (every host its own, a resume found nothing). Until
    object stores are supported, a URL is refused naming the key or option."""
    from jaxdrive.eval import cli as eval_cli
    from jaxdrive.runs.config import RunConfig
    from jaxdrive.train import cli as train_cli

    with pytest.raises(ConfigError, match=r"'logging': config key 'output_dir' = "
                                          r"'gs://bucket/runs' is a gs:// URL.*mount the "
                                          r"bucket"):
        RunConfig.from_dict({"logging": {"output_dir": "gs://bucket/runs"}})
    with pytest.raises(ConfigError, match="'data': config key 'path' = 's3://b/womd' is a "
                                          "s3:// URL"):
        RunConfig.from_dict({"data": {"path": "s3://b/womd"}})
    _usage_error(train_cli.main, ["--resume", "gs://bucket/runs/r1"], capsys, "--resume",
                 "gs:// URL")
    _usage_error(eval_cli.main, ["--checkpoint", str(tmp_path), "--out", "gs://b/r.json"],
                 capsys, "--out", "gs:// URL")
    assert not any(p.name.startswith("gs:") for p in tmp_path.parent.iterdir())


def test_an_empty_path_option_is_a_usage_error_not_the_option_left_out(capsys, tmp_path):
    """``render --checkpoint "$RUN"`` with RUN unset rendered the log replay and exited
    0, as if no checkpoint had been asked for (found by the typed-option fuzz)."""
    from jaxdrive.render import cli as render_cli

    _usage_error(render_cli.main, ["--checkpoint", "", "--out", str(tmp_path)], capsys,
                 "--checkpoint", "an empty path")
    _usage_error(render_cli.main, ["--checkpoint", "  ", "--out", str(tmp_path)], capsys,
                 "--checkpoint", "an empty path")


def test_multi_process_timeouts_below_one_second_are_usage_errors(capsys):
    """A zero or negative ``--heartbeat-timeout`` would end every job at once as a lost
    process; ``--distributed-timeout`` likewise as a job that never assembled."""
    from jaxdrive.train import cli as train_cli

    for option in ("--heartbeat-timeout", "--distributed-timeout"):
        for value in ("0", "-5"):
            _usage_error(train_cli.main, ["--config", "quickstart", option, value], capsys,
                         option, "out of range")

"""Trial mode through the entry points: bench --trials and simulate in trial mode."""

import json

import pytest
from eval_family import NUM_SCENES, cli_overrides

from jaxdrive import simulate
from jaxdrive.bench import cli as bench


@pytest.mark.slow
def test_bench_env_trials_records_both_modes(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = bench.main(["env", "--envs", "2", "--agents", "8", "--partners", "7", "--road-obs",
                     "20", "--road-points", "2048", "--steps", "2", "--repeats", "2",
                     "--trials", "0", "3", "--json", str(out)])
    assert rc == 0
    records = json.loads(out.read_text())["records"]
    assert [r["trials"] for r in records] == [0, 3]
    for rec in records:
        for key in ("envs", "agents", "partners", "road_obs", "road_points",
                    "agent_steps_per_s", "compile_s"):
            assert key in rec
        assert (rec["envs"], rec["agents"], rec["partners"], rec["road_obs"]) == (2, 8, 7, 20)
        assert rec["agent_steps_per_s"] > 0 and len(rec["timed_runs_s"]) == 2
    out = capsys.readouterr().out
    assert "trials" in out and "agent-steps/s" in out


def test_simulate_trial_mode_prints_trial_scores(tmp_path, capsys):
    summary = tmp_path / "s.json"
    # Tiny scenes (the sizes of the evaluation tests, see eval_family), 2 envs.
    rc = simulate.main(["--scenes", str(NUM_SCENES), "--envs", "2", "--steps", "12",
                        "--chunk", "6", *cli_overrides(),
                        "--set", "env.goal_behavior=trial",
                        "--set", "env.num_trials=2", "--set", "env.trial_timeout=3",
                        "--json", str(summary)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "trial scores (ego)" in out and "adaptation delta" in out
    s = json.loads(summary.read_text())
    # 12 steps of 2 envs with 2 trials of at most 3 steps: at least 4 episodes.
    assert s["trial_episodes"] >= 4 and s["trials_completed"] == 2
    assert "ada_delta_trial_1_minus_0" in s

"""Entry points: simulate and bench run end to end on tiny sizes; bad input exits 2."""

import json

from jaxdrive import bench, simulate


def test_simulate_prints_rates(capsys):
    rc = simulate.main(["--scenes", "4", "--steps", "6", "--chunk", "3", "--controller",
                        "log_replay", "--set", "procedural.num_agents=[2,4]"])
    out = capsys.readouterr().out
    assert rc == 0
    for line in ("goal rate", "collision rate", "off-road rate", "steps/s"):
        assert line in out


def test_simulate_rejects_unknown_key(capsys):
    rc = simulate.main(["--scenes", "2", "--set", "env.colision_behavior=stop"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "colision_behavior" in err and "collision_behavior" in err


def test_bench_env_writes_records(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = bench.main(["env", "--envs", "2", "--agents", "8", "--partners", "7", "--road-obs",
                     "20", "--road-points", "2048", "--steps", "2", "--repeats", "2",
                     "--json", str(out)])
    assert rc == 0
    records = json.loads(out.read_text())["records"]
    assert len(records) == 1
    rec = records[0]
    for key in ("envs", "agents", "partners", "road_obs", "road_points", "agent_steps_per_s",
                "compile_s"):
        assert key in rec
    assert (rec["envs"], rec["agents"], rec["partners"], rec["road_obs"]) == (2, 8, 7, 20)
    assert rec["agent_steps_per_s"] > 0
    assert "agent-steps/s" in capsys.readouterr().out

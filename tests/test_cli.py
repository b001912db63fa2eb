"""Entry points: simulate runs end to end on tiny sizes; bad input exits 2. (The bench
CLI is exercised in test_trial_cli.py, plain and trial mode in one run.)"""


from jaxdrive import simulate


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

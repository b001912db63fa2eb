"""Entry points: simulate runs end to end on tiny sizes; bad input exits 2. (The bench
CLI is exercised in test_trial_cli.py, plain and trial mode in one run.)"""

from eval_family import NUM_SCENES, cli_overrides

from jaxdrive import simulate


def test_simulate_prints_rates(capsys):
    # Tiny scenes (the sizes of the evaluation tests: their scene generator and road
    # index programs come from the shared compilation cache).
    rc = simulate.main(["--scenes", str(NUM_SCENES), "--steps", "6", "--chunk", "3",
                        "--controller", "log_replay", *cli_overrides()])
    out = capsys.readouterr().out
    assert rc == 0
    for line in ("goal rate", "collision rate", "off-road rate", "steps/s"):
        assert line in out


def test_simulate_rejects_unknown_key(capsys):
    rc = simulate.main(["--scenes", "2", "--set", "env.colision_behavior=stop"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "colision_behavior" in err and "collision_behavior" in err

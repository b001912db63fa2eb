"""Regression: an evaluation suite (multi_scenario, human_replay, adaptation, planning)
reproduces its recorded metrics, per-scenario lists and episode records exactly."""

from golden_check import check_case


def test_eval_matches_golden():
    check_case("eval")

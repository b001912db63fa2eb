"""Regression: the simulator reproduces its recorded golden rollouts bit for bit.

A covering subset runs by default (every goal behaviour, collision behaviour and control
mode at least once, trial mode with co-players, both dynamics models, both action
spaces); the full goal x collision x control matrix is marked slow."""

import golden_cases
import pytest
from golden_check import check_case

DEFAULT = (
    "env_respawn_ignore_all",
    "env_new_goal_stop_sdc",
    "env_stop_remove_fraction",
    "env_trial_remove_all",
    "env_trial_coplayers",
    "env_delta_local",
    "env_bicycle_continuous",
    "env_delta_local_continuous",
)
REST = tuple(n for n in golden_cases.env_cases() if n not in DEFAULT)


@pytest.mark.parametrize("name", DEFAULT)
def test_env_matches_golden(name):
    check_case(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", REST)
def test_env_matches_golden_full_matrix(name):
    check_case(name)

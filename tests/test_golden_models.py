"""Regression: policies (step and sequence, both kinds) and three PPO iterations (trial
mode with co-players on the transformer, plain episodes on the MLP) reproduce their
recorded golden outputs bit for bit."""

import pytest
from golden_check import check_case


@pytest.mark.parametrize("name", ["policy_transformer", "policy_mlp", "ppo_transformer",
                                  "ppo_mlp"])
def test_models_match_golden(name):
    check_case(name)

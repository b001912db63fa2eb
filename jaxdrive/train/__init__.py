"""PPO training: advantage estimation, masked losses (the trainer builds on these)."""

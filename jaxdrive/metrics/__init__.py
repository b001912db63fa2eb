"""Metrics: per-step facts about the simulator state, computed once per step (``step``),
and the on-device reduction of multi-trial episodes (``trials``)."""

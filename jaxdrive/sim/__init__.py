"""Simulator core: dynamics models, the multi-trial bookkeeping (``trials``)."""

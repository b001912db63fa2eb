"""Simulator core: geometry, dynamics, road spatial index."""

"""Scenario sources: the procedural generator, shape config, and the device pool."""

from jaxdrive.scenarios.base import ScenarioConfig, empty_scenario, validate_scenario

__all__ = ["ScenarioConfig", "empty_scenario", "validate_scenario"]

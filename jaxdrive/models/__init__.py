"""Policies: scene encoders, the temporal decoder with its KV cache, action heads."""

from jaxdrive.models.policy import Policy, PolicyConfig, PolicyOutput

__all__ = ["Policy", "PolicyConfig", "PolicyOutput"]

"""jaxdrive: JAX-native multi-agent driving simulation and reinforcement learning."""

__version__ = "0.1.0"

"""Per-agent episode statistics and their reductions, all derived from the registry.

``EpisodeStats`` holds, per agent slot, each reduced metric over the steps the agent
acted (``any``: bool, ``sum``: the metric's dtype) plus ``return_`` (summed reward) and
``length`` (acting steps). ``scored_sums`` reduces them over the agents of a role (an
env's ego agents, say) into counts; ``rates`` turns pooled counts into the reported
means (``goal_rate``, ..., ``episode_return``, ``episode_length``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.metrics.named import NamedArrays
from jaxdrive.metrics.registry import (
    EPISODE_LENGTH,
    EPISODE_RETURN,
    LENGTH_SUM,
    RETURN_SUM,
    Metric,
    episode_metrics,
)
from jaxdrive.metrics.step import StepMetrics


class EpisodeStats(NamedArrays):
    """Per-agent (A,) episode accumulators: one entry per reduced metric, ``return_``
    (float32 summed reward) and ``length`` (int32 acting steps)."""


def init_episode(num_agents: int, step_metrics: StepMetrics,
                 metrics: tuple[Metric, ...]) -> EpisodeStats:
    """Empty accumulators shaped like ``step_metrics`` (of one env, (A,) entries)."""
    out = {}
    for m in episode_metrics(metrics):
        x = step_metrics[m.name]
        out[m.name] = jnp.zeros((num_agents,), bool if m.reduce == "any" else x.dtype)
    out["return_"] = jnp.zeros((num_agents,), jnp.float32)
    out["length"] = jnp.zeros((num_agents,), jnp.int32)
    return EpisodeStats(out)


def update_episode(stats: EpisodeStats, step_metrics: StepMetrics, reward: jax.Array,
                   acting: jax.Array, metrics: tuple[Metric, ...]) -> EpisodeStats:
    """Fold in one step: each metric where the agent acted, the reward (A,) float32
    (already zero where it did not act) and one step of length per ``acting`` (A,) bool
    agent."""
    out = {}
    for m in episode_metrics(metrics):
        x = step_metrics[m.name]
        if m.reduce == "any":
            out[m.name] = stats[m.name] | (x & acting)
        else:
            out[m.name] = stats[m.name] + jnp.where(acting, x, jnp.zeros_like(x))
    out["return_"] = stats["return_"] + reward
    out["length"] = stats["length"] + acting.astype(jnp.int32)
    return EpisodeStats(out)


def scored_sums(stats: EpisodeStats, scored: jax.Array,
                metrics: tuple[Metric, ...]) -> dict[str, jax.Array]:
    """Per-env sums over the ``scored`` (..., A) agents of (..., A) stats: ``agents``
    (int32 count), each reduced metric's ``count`` name (int32 for ``any``), and
    ``return_sum`` (float32) and ``length_sum`` (int32)."""
    count = lambda x: jnp.sum(x & scored, axis=-1).astype(jnp.int32)
    out = {"agents": jnp.sum(scored, axis=-1).astype(jnp.int32)}
    for m in episode_metrics(metrics):
        x = stats[m.name]
        out[m.count] = (count(x) if m.reduce == "any"
                        else jnp.sum(jnp.where(scored, x, jnp.zeros_like(x)), axis=-1))
    out[RETURN_SUM] = jnp.sum(jnp.where(scored, stats["return_"], 0.0),
                              axis=-1).astype(jnp.float32)
    out[LENGTH_SUM] = jnp.sum(jnp.where(scored, stats["length"], 0), axis=-1).astype(jnp.int32)
    return out


def rates(sums: dict, num: float, metrics: tuple[Metric, ...]) -> dict[str, float]:
    """Host side: means over ``num`` agent-episodes from pooled ``scored_sums`` (NumPy or
    Python numbers): each reduced metric's rate, ``episode_return``, ``episode_length``
    (0 when ``num`` is 0)."""
    n = float(num)
    mean = lambda x: float(np.sum(x)) / n if n > 0 else 0.0
    out = {m.rate: mean(sums[m.count]) for m in episode_metrics(metrics)}
    out[EPISODE_RETURN] = mean(sums[RETURN_SUM])
    out[EPISODE_LENGTH] = mean(sums[LENGTH_SUM])
    return out


def report_values(stats: EpisodeStats, metrics: tuple[Metric, ...]) -> dict[str, jax.Array]:
    """Per-agent (..., A) episode values under their report names (the trainer's EMA
    inputs): each reduced metric's rate name, ``episode_return`` and ``episode_length``."""
    out = {m.rate: stats[m.name] for m in episode_metrics(metrics)}
    out[EPISODE_RETURN] = stats["return_"]
    out[EPISODE_LENGTH] = stats["length"]
    return out

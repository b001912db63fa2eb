"""The metric registry: every metric declared once, everything else derived from it.

A ``Metric`` names a per-step value of one environment (computed once per step from the
simulator state, ``jaxdrive.metrics.step``), how an agent's episode reduces it (``any``
or ``sum`` over the steps the agent acts; ``None`` for per-step quantities such as the
goal distance) and the names it is reported under. From the registry come the env's
``StepMetrics`` and ``EpisodeStats``, the rollout statistics and their rates, the
evaluators' per-episode counts and rates, and the trainer's EMA names (``train/NAME``).

Adding a metric is one definition plus one ``register`` call (before the ``Env`` is
built: an env snapshots the registry when it is constructed)::

    register(Metric("speeding", lambda v: v.present & (v.agents.speed > 20.0),
                    reduce="any", rate="speeding_rate", count="speedings"))
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

REDUCTIONS = ("any", "sum")
ROLES = ("ego", "co_player")

# Episode quantities every env keeps besides the registered metrics: their report (rate)
# and record (count) names. The return sums the rewards, the length the acting steps.
EPISODE_RETURN = "episode_return"
EPISODE_LENGTH = "episode_length"
RETURN_SUM = "return_sum"
LENGTH_SUM = "length_sum"


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric.

    Attributes:
      name: key of its per-step value in ``StepMetrics`` and of its episode value in
        ``EpisodeStats`` (e.g. ``collided``).
      compute: ``(view: StepView) -> (A,)`` per-step value of one environment, from the
        simulator state (``jaxdrive.metrics.step.StepView``); bool for events.
      reduce: episode reduction over the steps the agent acts: ``any`` (bool: happened at
        least once) or ``sum``; ``None``: a per-step quantity, not reduced.
      rate: report name of the mean over agent-episodes (logs, results), e.g.
        ``collision_rate``; required when ``reduce`` is set.
      count: name of the per-episode sum over an env's scored agents in evaluation
        records, e.g. ``collisions``; required when ``reduce`` is set.
      roles: roles it is reported for (``ego``; ``co_player`` kept apart).
      at_reset: what a reset reports: ``zero`` (no event yet) or ``compute`` (the value
        of the initial state, e.g. the goal distance).
    """

    name: str
    compute: Callable[[Any], Any]
    reduce: str | None = None
    rate: str | None = None
    count: str | None = None
    roles: tuple[str, ...] = ROLES
    at_reset: str = "zero"

    def __post_init__(self):
        if self.at_reset not in ("zero", "compute"):
            raise ValueError(f"metric {self.name!r}: at_reset must be 'zero' or 'compute', "
                             f"got {self.at_reset!r}.")
        if not self.name.isidentifier():
            raise ValueError(f"metric name {self.name!r} must be an identifier.")
        if self.reduce is not None:
            if self.reduce not in REDUCTIONS:
                raise ValueError(f"metric {self.name!r}: reduce must be one of "
                                 f"{REDUCTIONS} or None, got {self.reduce!r}.")
            if not self.rate or not self.count:
                raise ValueError(f"metric {self.name!r}: a reduced metric needs a rate and "
                                 "a count name.")
        for role in self.roles:
            if role not in ROLES:
                raise ValueError(f"metric {self.name!r}: unknown role {role!r}; allowed "
                                 f"{ROLES}.")


_REGISTRY: dict[str, Metric] = {}
_RESERVED = {EPISODE_RETURN, EPISODE_LENGTH, RETURN_SUM, LENGTH_SUM, "episodes",
             "agent_episodes", "return_", "length"}


def register(metric: Metric) -> Metric:
    """Add ``metric``; a name (or report/count name) already taken is an error."""
    taken = {n for m in _REGISTRY.values() for n in (m.name, m.rate, m.count) if n}
    for n in (metric.name, metric.rate, metric.count):
        if n and (n in taken or n in _RESERVED):
            raise ValueError(f"metric name {n!r} is already registered or reserved.")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Remove a registered metric (tests)."""
    if name not in _REGISTRY:
        raise KeyError(f"no metric named {name!r}; registered: {', '.join(_REGISTRY)}.")
    del _REGISTRY[name]


@contextlib.contextmanager
def registered(metric: Metric) -> Iterator[Metric]:
    """``with registered(m): ...``: ``m`` is registered inside the block only."""
    register(metric)
    try:
        yield metric
    finally:
        unregister(metric.name)


def metrics() -> tuple[Metric, ...]:
    """The registered metrics, in registration order (a snapshot)."""
    return tuple(_REGISTRY.values())


def episode_metrics(snapshot: tuple[Metric, ...] | None = None) -> tuple[Metric, ...]:
    """The metrics with an episode reduction."""
    return tuple(m for m in (metrics() if snapshot is None else snapshot) if m.reduce)


def report_names(snapshot: tuple[Metric, ...] | None = None) -> tuple[str, ...]:
    """Names of the per-agent-episode means: each reduced metric's rate, then the
    episode return and length (the trainer's EMA and every evaluator's rates)."""
    return tuple(m.rate for m in episode_metrics(snapshot)) + (EPISODE_RETURN,
                                                               EPISODE_LENGTH)

"""What an evaluator is configured with: ``EvaluatorConfig`` (the keys every evaluator
type accepts), ``RenderSpec`` (its videos) and ``EvaluatorSpec`` (one resolved ``eval:``
section: name, type and the typed config).

An evaluator type adds its own keys by subclassing ``EvaluatorConfig`` (a frozen
dataclass whose ``__post_init__`` checks them) and naming it as its class's ``Config``
(``jaxdrive.eval.evaluators``). ``jaxdrive.eval.suite`` builds these from config files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
from collections.abc import Mapping
from typing import Any

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_path,
)
from jaxdrive.env import EnvConfig
from jaxdrive.render.raster import VIEWS
from jaxdrive.scenarios.procedural import ProceduralConfig

MODES = ("inline", "subprocess")


@dataclasses.dataclass(frozen=True)
class RenderSpec(ConfigBase):
    """Videos an evaluator records besides its metrics.

    Attributes:
      enabled: record videos at all.
      views: ``scene`` and/or ``ego`` (one video per scenario per view).
      num_scenarios: scenarios recorded (at most the evaluator's ``num_scenarios``).
      steps: frames per video; 0 = one whole episode.
      width, height: pixels (even: the H.264 encoder needs it).
      seed: None records the first ``num_scenarios`` scenarios at every evaluation; a
        seed draws them from the evaluated set with (seed, step), so each evaluation
        shows other scenes.
    """

    enabled: bool = False
    views: tuple[str, ...] = ("scene",)
    num_scenarios: int = 2
    steps: int = 0
    width: int = 256
    height: int = 256
    seed: int | None = None

    def __post_init__(self):
        check_bool("enabled", self.enabled)
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2**31 - 1)
        if (not isinstance(self.views, tuple) or not self.views
                or len(set(self.views)) != len(self.views)):
            raise ConfigError(f"config key 'views' = {self.views!r} must list distinct "
                              f"views out of {list(VIEWS)}.")
        for view in self.views:
            check_choice("views", view, VIEWS)
        check_int("num_scenarios", self.num_scenarios, 1, 4096)
        check_int("steps", self.steps, 0, 1_000_000)
        for name in ("width", "height"):
            check_int(name, getattr(self, name), 2, 8192)
            if getattr(self, name) % 2:
                raise ConfigError(f"config key '{name}' = {getattr(self, name)} must be even "
                                  "(H.264 video needs even frame sizes).")


def as_written(value: Any) -> Any:
    """A value as YAML wrote it, for messages (``from_dict`` turned lists into tuples)."""
    return list(value) if isinstance(value, tuple) else value


def _scenario_paths(name: str, value: Any) -> tuple[str, ...] | None:
    """``scenarios`` as a tuple of paths with ``~`` and ``$VAR`` expanded (None stays)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, tuple) or not all(isinstance(p, str) and p and "\x00" not in p
                                               for p in value):
        raise ConfigError(f"config key '{name}' must be null (procedural scenes) or a list "
                          f"of scene files / shard directories, got {as_written(value)!r}.")
    paths = []
    for path in value:
        # A literal '$USER' in a path fails far from the config; expand it or say so here.
        expanded = os.path.expandvars(os.path.expanduser(path))
        unset = re.search(r"\$\{?(\w+)", expanded)
        if unset:
            raise ConfigError(f"config key '{name}': path {path!r} uses the environment "
                              f"variable '{unset[1]}', which is not set.")
        paths.append(expanded)
    return tuple(paths)


@dataclasses.dataclass(frozen=True)
class EvaluatorConfig(ConfigBase):
    """The keys every evaluator type accepts (an ``eval:`` section's, ``type`` aside).

    Attributes:
      enabled: false keeps the evaluator out of ``due`` and of the default selection.
      interval: run every this many training iterations; 0 = only when asked.
      clean: whether the clean macro was on (``jaxdrive.eval.suite.CLEAN_SETTINGS``).
      deterministic: act with the policy's mode instead of sampling.
      seed: seed of the evaluation's scenes and actions.
      num_scenarios: scenarios evaluated; batch_size: envs run in parallel.
      num_steps: steps per scenario; 0 = one whole episode.
      mode: ``inline`` (in the training process) or ``subprocess``.
      scenarios: scene files / shard directories (``$VAR`` and ``~`` expanded; one
        string is a list of one), or None for procedural scenes.
      env, procedural: the configs the evaluator runs with.
      render: videos to record (``num_scenarios`` capped at the evaluator's).
      trial_counters: in trial mode, also report ``trial_episodes`` and the trial
        counters (``jaxdrive.metrics.trials.TRIAL_COUNTERS``) among the metrics.
      co_players: frozen partner policies driving the co-player agents
        (``env.co_player_fraction`` > 0): run directories and/or population directories
        (``jaxdrive.runs.config.expand_co_players``); env ``i`` of a batch of B is driven
        by member ``i * M // B``, as in training. Set here, the ``clean`` macro keeps the
        co-players (it does not zero ``env.co_player_fraction``). Empty: co-players, if
        any, act with the evaluated policy. Metrics count ego agents only.
    """

    enabled: bool = True
    interval: int = 0
    clean: bool = True
    deterministic: bool = False
    seed: int = 0
    num_scenarios: int = 64
    batch_size: int = 64
    num_steps: int = 0
    mode: str = "inline"
    scenarios: tuple[str, ...] | None = None
    env: EnvConfig = EnvConfig()
    procedural: ProceduralConfig = ProceduralConfig()
    render: RenderSpec = RenderSpec()
    trial_counters: bool = False
    co_players: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("enabled", "clean", "deterministic", "trial_counters"):
            check_bool(name, getattr(self, name))
        check_int("interval", self.interval, 0)
        # JAX keys hold 32-bit seeds; a larger one would be silently truncated.
        check_int("seed", self.seed, 0, 2**31 - 1)
        check_int("num_scenarios", self.num_scenarios, 1, 10_000_000)
        check_int("batch_size", self.batch_size, 1, 10_000_000)
        check_int("num_steps", self.num_steps, 0, 1_000_000)
        check_choice("mode", self.mode, MODES)
        for i, path in enumerate(self.co_players):
            check_path(f"co_players[{i}]", path, optional=False)
        object.__setattr__(self, "scenarios", _scenario_paths("scenarios", self.scenarios))
        if self.render.num_scenarios > self.num_scenarios:
            object.__setattr__(self, "render",
                               self.render.replace(num_scenarios=self.num_scenarios))


def check_partners(config: EvaluatorConfig) -> None:
    """Raise ``ConfigError`` when ``co_players`` names partners that no agent would meet
    (``env.co_player_fraction`` is 0). Checked once the section's env is resolved."""
    if config.co_players and config.env.co_player_fraction <= 0:
        raise ConfigError("config key 'co_players' names partner policies but "
                          "'env.co_player_fraction' is 0, so no agent would be driven by "
                          "them; set env.co_player_fraction (e.g. 0.5).")


def set_floats(config: ConfigBase, *names: str) -> None:
    """Store the (checked) numbers ``names`` of a frozen config as floats, so that
    ``ttc_horizon: 2`` reads and is written back as ``2.0`` (for ``__post_init__``)."""
    for name in names:
        object.__setattr__(config, name, float(getattr(config, name)))


_COMMON_KEYS = frozenset(f.name for f in dataclasses.fields(EvaluatorConfig))


@dataclasses.dataclass(frozen=True)
class EvaluatorSpec:
    """One resolved evaluator section.

    Attributes:
      name: the section name.
      type: a registered evaluator type (``jaxdrive.eval.evaluators.EVALUATORS``).
      config: the section's keys, typed: that type's ``Config`` (an ``EvaluatorConfig``).
        Its common keys read through the spec too (``spec.seed``, ``spec.env``, ...).
      clean_applied, clean_overridden: dotted keys of ``CLEAN_SETTINGS`` the macro set,
        and those an explicit value won over.
    """

    name: str
    type: str
    config: EvaluatorConfig
    clean_applied: tuple[str, ...] = ()
    clean_overridden: tuple[str, ...] = ()

    def __getattr__(self, key: str) -> Any:
        # Only for names that are not attributes: the common keys of the config.
        if key in _COMMON_KEYS:
            return getattr(self.config, key)
        raise AttributeError(f"'EvaluatorSpec' object has no attribute '{key}'")

    @property
    def params(self) -> Mapping[str, Any]:
        """The type's own keys (read-only view of ``config``'s fields beyond the common
        ones); evaluators read them as ``config`` attributes."""
        return types.MappingProxyType({
            f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)
            if f.name not in _COMMON_KEYS})

    @property
    def resolved(self) -> dict[str, Any]:
        """Plain dict of the type and every key of the config (full ``env`` /
        ``procedural`` / ``render``), for results files; loading it as a section rebuilds
        the same spec."""
        return {"type": self.type, **self.config.to_dict()}

"""The evaluator types (``type:`` of an ``eval`` section): the registry, the built-in
types with their configs, and ``make_evaluators``.

``EVALUATORS`` maps each ``type:`` to its class; ``register_evaluator`` adds one (and
refuses a taken name), ``unregister_evaluator`` / ``registered_evaluator`` take it out
again. Adding a type = an ``Evaluator`` subclass with ``type_name`` and ``Config`` (an
``EvaluatorConfig`` subclass declaring its own keys) + ``register_evaluator``. The
built-in types:

- ``multi_scenario``: a fixed scenario set, every scenario played exactly once.
- ``human_replay``: the SDC is controlled, every other object replays its log.
- ``behavior_class``: one evaluator per scenario class of a converted dataset
  (``classes``), ``scenarios_per_class`` sampled with the seed.
- ``adaptation``: multi-trial episodes; per-trial scores and adaptation deltas with
  confidence intervals over scenarios, for the policy with memory and for the same
  policy with its memory wiped at every trial boundary (the control).
- ``planning``: the nuPlan-style closed-loop score of the SDC (``jaxdrive.eval.planning``).
- ``realism``: WOSAC 2025 realism scores of ``num_rollouts`` rollouts per scenario
  against the log (``jaxdrive.eval.realism``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.agents.actors import Actor, policy_actor
from jaxdrive.config import ConfigError, check_int, check_name, check_range, merge
from jaxdrive.data.shards import read_manifest
from jaxdrive.data.subsets import subset_ids
from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval import planning as pl
from jaxdrive.eval.evaluator import Evaluator
from jaxdrive.eval.planning import PlanningConfig
from jaxdrive.eval.realism import Realism
from jaxdrive.eval.spec import EvaluatorConfig, EvaluatorSpec, as_written, set_floats
from jaxdrive.metrics.trials import episode_trial_scores, masked_mean_std

# ------------------------------------------------------------------ the registry
EVALUATORS: dict[str, type[Evaluator]] = {}

# Section keys the suite loader reads itself; a type's config must not declare them.
STRUCTURAL_KEYS = ("type", "inherits", "template")


def register_evaluator(cls: type[Evaluator]) -> type[Evaluator]:
    """Register ``cls`` under ``cls.type_name`` (usable as a class decorator).

    Raises:
      ValueError: the name is taken or empty; TypeError: ``cls`` is no ``Evaluator`` or
        its ``Config`` no ``EvaluatorConfig`` subclass, or declares a structural key.
    """
    if not (isinstance(cls, type) and issubclass(cls, Evaluator)):
        raise TypeError(f"{cls!r} is not an Evaluator subclass.")
    name = cls.type_name
    if not isinstance(name, str) or not name:
        raise ValueError(f"evaluator class {cls.__qualname__} has no type_name.")
    if name in EVALUATORS:
        raise ValueError(f"evaluator type '{name}' is already registered "
                         f"({EVALUATORS[name].__qualname__}).")
    config = cls.Config
    if not (isinstance(config, type) and issubclass(config, EvaluatorConfig)):
        raise TypeError(f"{cls.__qualname__}.Config must be an EvaluatorConfig subclass, "
                        f"got {config!r}.")
    clash = sorted({f.name for f in dataclasses.fields(config)} & set(STRUCTURAL_KEYS))
    if clash:
        raise TypeError(f"{config.__qualname__} declares {clash}, which the suite loader "
                        "reserves.")
    EVALUATORS[name] = cls
    return cls


def unregister_evaluator(name: str) -> type[Evaluator]:
    """Take the type ``name`` out of the registry; returns its class."""
    if name not in EVALUATORS:
        raise ValueError(f"evaluator type '{name}' is not registered.")
    return EVALUATORS.pop(name)


@contextlib.contextmanager
def registered_evaluator(cls: type[Evaluator]) -> Iterator[type[Evaluator]]:
    """``register_evaluator(cls)`` for the duration of a ``with`` block (tests)."""
    register_evaluator(cls)
    try:
        yield cls
    finally:
        unregister_evaluator(cls.type_name)


# ------------------------------------------------------------------ the types
@register_evaluator
class MultiScenario(Evaluator):
    """The policy on every scenario of the set under ``spec.env``; the base metrics."""

    type_name = "multi_scenario"


@register_evaluator
class HumanReplay(Evaluator):
    """The policy drives the SDC only (``control_mode: sdc``); every other agent replays
    its log or, if static, stays."""

    type_name = "human_replay"

    def env_config(self) -> EnvConfig:
        """``spec.env`` with ``control_mode: sdc`` (one row per object slot)."""
        return self.spec.env.replace(control_mode="sdc", max_controlled=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BehaviorClassConfig(EvaluatorConfig):
    """Attributes:
      classes: scenario classes (subsets of the dataset), one evaluator each (required).
      scenarios_per_class: scenarios sampled from each class with the seed.
    """

    classes: tuple[str, ...]
    scenarios_per_class: int = 16

    def __post_init__(self):
        super().__post_init__()
        if (not isinstance(self.classes, tuple) or not self.classes
                or not all(isinstance(c, str) and c for c in self.classes)):
            raise ConfigError("config key 'classes' must be a non-empty list of names, "
                              f"got {as_written(self.classes)!r}.")
        for i, name in enumerate(self.classes):  # part of the evaluator's output paths
            check_name(f"classes[{i}]", name)
        check_int("scenarios_per_class", self.scenarios_per_class, 1)


@register_evaluator
class BehaviorClass(Evaluator):
    """One scenario class of a converted dataset (``spec.scenarios``: one shard dir)."""

    type_name = "behavior_class"
    Config = BehaviorClassConfig
    config: BehaviorClassConfig

    def __init__(self, spec: EvaluatorSpec, scenario_class: str):
        super().__init__(spec, name=f"{spec.name}/{scenario_class}")
        self.scenario_class = scenario_class
        self._class_rows: np.ndarray | None = None

    @classmethod
    def expand(cls, spec: EvaluatorSpec) -> list[Evaluator]:
        """One evaluator per class, named ``SECTION/CLASS``."""
        return [cls(spec, c) for c in spec.config.classes]

    def load_scenarios(self, env_config: EnvConfig):
        """The whole converted dataset of ``spec.scenarios`` (one directory); also draws, with
        the seed, the ``scenarios_per_class`` rows of class ``scenario_class`` that
        ``scenario_ids`` returns. ``ConfigError`` if the section names no single directory or
        the class is empty."""
        if not self.spec.scenarios or len(self.spec.scenarios) != 1:
            raise ConfigError(f"evaluator '{self.spec.name}' (behavior_class) needs "
                              "'scenarios' naming one converted dataset directory with "
                              "class subsets (python -m jaxdrive.data convert / subset).")
        scenes = super().load_scenarios(env_config)
        manifest = read_manifest(self.spec.scenarios[0])
        order = [str(s["scenario_id"]) for s in manifest["scenarios"]]
        wanted = set(subset_ids(self.spec.scenarios[0], self.scenario_class, manifest))
        rows = np.array([i for i, sid in enumerate(order) if sid in wanted], np.int32)
        if len(rows) == 0:
            raise ConfigError(f"class '{self.scenario_class}' of {self.spec.scenarios[0]} "
                              "has no scenarios.")
        rng = np.random.default_rng(self.spec.seed)
        n = min(int(self.config.scenarios_per_class), len(rows))
        self._class_rows = np.sort(rng.choice(rows, size=n, replace=False)).astype(np.int32)
        return scenes

    def scenario_ids(self, num_available: int) -> np.ndarray:
        """(n,) int32: the class's rows drawn by ``load_scenarios``, sorted."""
        return self._class_rows


def _z(confidence: float) -> float:
    """Two-sided normal quantile of a ``confidence`` interval."""
    return math.sqrt(2.0) * _erfinv(confidence)


@jax.jit
def _trial_reduce(memory: tuple, control: tuple) -> dict:
    """Per-scenario trial scores and deltas of both actors and their summaries, on
    device. ``memory``, ``control``: (trial_reached (S, K) int32, ego_agents (S,)).

    Returns: ``scores`` (2, S, K), the count / mean / sample standard deviation over the
    scenarios with ego agents of each actor's deltas (``delta_*``: (2,), (2, K-1)) and of
    the memory gain (memory's delta minus the control's; ``gain_*``: (), (K-1,))."""
    scores, deltas = [], []
    for reached, ego in (memory, control):
        sc = episode_trial_scores(reached, ego)
        scores.append(sc)
        deltas.append(sc[:, 1:] - sc[:, :1])
    scored = memory[1] > 0
    stats = [masked_mean_std(d, scored) for d in deltas]
    gain = masked_mean_std(deltas[0] - deltas[1], scored)
    return {"scores": jnp.stack(scores),
            "delta_n": jnp.stack([x[0] for x in stats]),
            "delta_mean": jnp.stack([x[1] for x in stats]),
            "delta_std": jnp.stack([x[2] for x in stats]),
            "gain_n": gain[0], "gain_mean": gain[1], "gain_std": gain[2]}


def _erfinv(y: float) -> float:
    """Inverse error function by bisection (no SciPy dependency)."""
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaptationConfig(EvaluatorConfig):
    """Attributes:
      num_trials: trials per episode (written into ``env.num_trials``).
      trial_timeout: steps per trial (written into ``env.trial_timeout``); None keeps
        the env's own (a run's) and resolves to it.
      confidence: level of the confidence intervals, in (0, 1).
    """

    num_trials: int = 3
    trial_timeout: int | None = None
    confidence: float = 0.95

    def __post_init__(self):
        super().__post_init__()
        check_int("num_trials", self.num_trials, 2)
        if self.trial_timeout is None:
            object.__setattr__(self, "trial_timeout", self.env.trial_timeout)
        if self.trial_timeout is not None:
            check_int("trial_timeout", self.trial_timeout, 1)
        check_range("confidence", self.confidence, 0.0, 1.0, lo_open=True, hi_open=True)
        set_floats(self, "confidence")


@register_evaluator
class Adaptation(Evaluator):
    """Per-trial scores of the policy with memory, and of the control (memory wiped at
    each trial boundary); deltas with confidence intervals over scenarios."""

    type_name = "adaptation"
    Config = AdaptationConfig
    config: AdaptationConfig

    @classmethod
    def resolve_env(cls, env_overrides: Mapping[str, Any], config: AdaptationConfig
                    ) -> Mapping[str, Any]:
        """Write ``num_trials``/``trial_timeout`` into the env, so ``spec.env`` is what
        runs; an ``env.`` value that differs is an error."""
        if not isinstance(env_overrides, Mapping):
            return env_overrides
        # trial_timeout: null keeps the env's own (a run's), where None = the episode length.
        wanted = {"num_trials": config.num_trials}
        if config.trial_timeout is not None:
            wanted["trial_timeout"] = config.trial_timeout
        for key, value in wanted.items():
            if key in env_overrides and env_overrides[key] != value:
                raise ConfigError(f"config key 'env.{key}' = {env_overrides[key]!r} "
                                  f"contradicts '{key}' = {value!r}; an adaptation evaluator "
                                  f"sets env.{key} from '{key}', so set only that.")
        return merge(env_overrides, wanted)

    def actors(self, env: Env, policy) -> dict[str, Actor]:
        """``memory`` (memory reset per episode) and ``no_memory`` (reset at every trial
        boundary: the control)."""
        det = self.spec.deterministic
        return {"memory": policy_actor(env, policy, det, memory_reset="episode"),
                "no_memory": policy_actor(env, policy, det, memory_reset="trial")}

    def aggregate(self, rows, extras):
        """Base metrics of both actors (the control's prefixed ``control/``), per-scenario
        trial scores, ``ada_delta_trial_{k}_minus_0`` over scenarios with ego agents and
        ``memory_gain_trial_{k}`` (memory's delta minus the control's), each with its
        confidence interval. Scores, deltas and their means and deviations are reduced
        on device (``_trial_reduce``); the host adds the interval's half-width."""
        z = _z(float(self.config.confidence))
        metrics: dict[str, float] = {}
        per: dict[str, list] = {}
        inputs = [(rows[a]["trial_reached"], rows[a]["ego_agents"])
                  for a in ("memory", "no_memory")]
        red = jax.device_get(_trial_reduce(*inputs))

        def interval(name, n, mean, std):
            half = z * float(std) / math.sqrt(float(n)) if n > 0 else float("nan")
            metrics[name] = float(mean)
            metrics[f"{name}_ci_low"] = float(mean) - half
            metrics[f"{name}_ci_high"] = float(mean) + half

        for i, (actor, prefix) in enumerate((("memory", ""), ("no_memory", "control/"))):
            r = rows[actor]
            # Pooled trial scores come with the base metrics; per scenario here.
            for key, value in self.base_metrics(r).items():
                metrics[f"{prefix}{key}"] = value
            scores = red["scores"][i]
            for k in range(scores.shape[1]):
                per[f"{prefix}trial_{k}_score"] = scores[:, k].tolist()
            for k in range(1, scores.shape[1]):
                interval(f"{prefix}ada_delta_trial_{k}_minus_0", red["delta_n"][i],
                         red["delta_mean"][i, k - 1], red["delta_std"][i, k - 1])
            metrics[f"{prefix}scenarios_scored"] = float(np.sum(r["ego_agents"] > 0))
        for k in range(1, red["scores"].shape[2]):
            interval(f"memory_gain_trial_{k}", red["gain_n"], red["gain_mean"][k - 1],
                     red["gain_std"][k - 1])
        return metrics, per


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanningEvaluatorConfig(EvaluatorConfig):
    """Attributes: the thresholds of ``jaxdrive.eval.planning.PlanningConfig`` a section
    may set: ``ttc_horizon`` (s), ``comfort_max_accel`` (m/s^2), ``comfort_max_jerk``
    (m/s^3), all > 0, and ``progress_min_ratio`` in [0, 1]."""

    ttc_horizon: float = 1.0
    comfort_max_accel: float = 4.0
    comfort_max_jerk: float = 4.0
    progress_min_ratio: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        for name in ("ttc_horizon", "comfort_max_accel", "comfort_max_jerk"):
            check_range(name, getattr(self, name), 0.0, None, lo_open=True)
        check_range("progress_min_ratio", self.progress_min_ratio, 0.0, 1.0)
        set_floats(self, "ttc_horizon", "comfort_max_accel", "comfort_max_jerk",
                   "progress_min_ratio")


@register_evaluator
class Planning(Evaluator):
    """nuPlan-style closed-loop score of the controlled SDC."""

    type_name = "planning"
    Config = PlanningEvaluatorConfig
    config: PlanningEvaluatorConfig

    def env_config(self) -> EnvConfig:
        """``spec.env`` with ``control_mode: sdc``: the policy drives the SDC only (one
        row per object slot: the features read the log by slot)."""
        return self.spec.env.replace(control_mode="sdc", max_controlled=None)

    def _config(self):
        c = self.config
        return PlanningConfig.from_dict({f.name: getattr(c, f.name)
                                         for f in dataclasses.fields(c)
                                         if f.name in PlanningConfig.__dataclass_fields__})

    def step_hook(self, env: Env):
        """Per-step features of the scored (ego) agents; their score per scenario."""
        cfg, ec = self._config(), env.config

        def hook(env_params, prev, state, ts):
            return jax.vmap(lambda p, s, t: pl.planning_features(
                ec, env_params, p, s, t, p.ego, cfg))(prev, state, ts)

        def reduce(env_params, state0, outs, counted):
            del counted  # the score counts each env's first episode itself

            def one(steps, s0):
                expert = pl.expert_progress(ec, env_params, s0, steps.present.shape[0])
                terms = pl.planning_score(steps, s0.ego, expert, cfg)
                scored = terms.pop("counted") > 0
                out = {k: pl.scenario_mean(v, scored) for k, v in terms.items()}
                out["scored_agents"] = jnp.sum(scored).astype(jnp.float32)
                return out

            return jax.vmap(one, in_axes=(1, 0))(outs, state0)

        return hook, reduce

    def aggregate(self, rows, extras):
        """Base metrics, each planning term's mean over scored scenarios (``total`` as
        ``score``) and ``scored_scenarios``; the terms per scenario."""
        r = rows["policy"]
        metrics = self.base_metrics(r)
        terms = extras["policy"]
        scored = terms["scored_agents"] > 0
        per = {k: v.tolist() for k, v in terms.items()}
        for k, v in terms.items():
            if k != "scored_agents":
                name = "score" if k == "total" else k
                metrics[name] = float(np.mean(v[scored])) if scored.any() else 0.0
        metrics["scored_scenarios"] = float(np.sum(scored))
        return metrics, per


register_evaluator(Realism)

# The built-in types, in registration order.
EVALUATOR_TYPES = tuple(EVALUATORS)


def make_evaluators(specs) -> list[Evaluator]:
    """Evaluator instances for resolved specs (``Evaluator.expand`` of each spec's type:
    a ``behavior_class`` spec gives one per class)."""
    out: list[Evaluator] = []
    for spec in specs:
        if spec.type not in EVALUATORS:
            raise ConfigError(f"evaluator '{spec.name}': unknown type '{spec.type}'; "
                              f"allowed: {', '.join(EVALUATORS)}")
        out.extend(EVALUATORS[spec.type].expand(spec))
    return out

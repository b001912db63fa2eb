"""The evaluator types (``type:`` of an ``eval`` section) and their construction.

- ``multi_scenario``: a fixed scenario set, every scenario played exactly once.
- ``human_replay``: the SDC is controlled, every other object replays its log.
- ``behavior_class``: one evaluator per scenario class of a converted dataset
  (``classes``), ``scenarios_per_class`` sampled with the seed.
- ``adaptation``: multi-trial episodes; per-trial scores and adaptation deltas with
  confidence intervals over scenarios, for the policy with memory and for the same
  policy with its memory wiped at every trial boundary (the control).
- ``planning``: the nuPlan-style closed-loop score of the SDC (``jaxdrive.eval.planning``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.agents.actors import Actor, policy_actor
from jaxdrive.config import ConfigError
from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval.evaluator import Evaluator, base_metrics
from jaxdrive.eval.suite import EvaluatorSpec


class MultiScenario(Evaluator):
    type_name = "multi_scenario"


class HumanReplay(Evaluator):
    type_name = "human_replay"

    def env_config(self) -> EnvConfig:
        return self.spec.env.replace(control_mode="sdc")


class BehaviorClass(Evaluator):
    """One scenario class of a converted dataset (``spec.scenarios``: one shard dir)."""

    type_name = "behavior_class"

    def __init__(self, spec: EvaluatorSpec, scenario_class: str):
        super().__init__(spec, name=f"{spec.name}/{scenario_class}")
        self.scenario_class = scenario_class
        self._class_rows: np.ndarray | None = None

    def load_scenarios(self, env_config: EnvConfig):
        from jaxdrive.data.subsets import subset_ids

        if not self.spec.scenarios or len(self.spec.scenarios) != 1:
            raise ConfigError(f"evaluator '{self.spec.name}' (behavior_class) needs "
                              "'scenarios' naming one converted dataset directory with "
                              "class subsets (python -m jaxdrive.data convert / subset).")
        scenes = super().load_scenarios(env_config)
        from jaxdrive.data.shards import read_manifest

        manifest = read_manifest(self.spec.scenarios[0])
        order = [str(s["scenario_id"]) for s in manifest["scenarios"]]
        wanted = set(subset_ids(self.spec.scenarios[0], self.scenario_class, manifest))
        rows = np.array([i for i, sid in enumerate(order) if sid in wanted], np.int32)
        if len(rows) == 0:
            raise ConfigError(f"class '{self.scenario_class}' of {self.spec.scenarios[0]} "
                              "has no scenarios.")
        rng = np.random.default_rng(self.spec.seed)
        n = min(int(self.spec.params["scenarios_per_class"]), len(rows))
        self._class_rows = np.sort(rng.choice(rows, size=n, replace=False)).astype(np.int32)
        return scenes

    def scenario_ids(self, num_available: int) -> np.ndarray:
        return self._class_rows


def _mean_ci(x: np.ndarray, confidence: float) -> tuple[float, float]:
    """Mean and half-width of a normal-approximation confidence interval."""
    if len(x) == 0:
        return 0.0, float("nan")
    z = math.sqrt(2.0) * _erfinv(confidence)
    sd = float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")
    return float(np.mean(x)), z * sd / math.sqrt(len(x))


def _erfinv(y: float) -> float:
    """Inverse error function by bisection (no SciPy dependency)."""
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return 0.5 * (lo + hi)


class Adaptation(Evaluator):
    """Per-trial scores of the policy with memory, and of the control (memory wiped at
    each trial boundary); deltas with confidence intervals over scenarios."""

    type_name = "adaptation"

    def actors(self, env: Env, policy) -> dict[str, Actor]:
        det = self.spec.deterministic
        return {"memory": policy_actor(env, policy, det, memory_reset="episode"),
                "no_memory": policy_actor(env, policy, det, memory_reset="trial")}

    def aggregate(self, rows, extras):
        conf = float(self.spec.params["confidence"])
        metrics: dict[str, float] = {}
        per: dict[str, list] = {}
        deltas = {}
        for actor, prefix in (("memory", ""), ("no_memory", "control/")):
            r = rows[actor]
            ego = np.maximum(r["ego_agents"], 1)[:, None]
            scores = r["trial_reached"] / ego  # (S, K) per scenario
            scored = r["ego_agents"] > 0
            scores = scores[scored]
            # Pooled trial scores come with the base metrics; per scenario here.
            for key, value in base_metrics(r, self._setup["env"].metrics).items():
                metrics[f"{prefix}{key}"] = value
            k_trials = scores.shape[1]
            for k in range(k_trials):
                per[f"{prefix}trial_{k}_score"] = (r["trial_reached"][:, k] / ego[:, 0]).tolist()
            for k in range(1, k_trials):
                d = scores[:, k] - scores[:, 0]
                mean, half = _mean_ci(d, conf)
                name = f"{prefix}ada_delta_trial_{k}_minus_0"
                metrics[name] = mean
                metrics[f"{name}_ci_low"] = mean - half
                metrics[f"{name}_ci_high"] = mean + half
                deltas[(actor, k)] = d
            metrics[f"{prefix}scenarios_scored"] = float(np.sum(scored))
        for k in range(1, rows["memory"]["trial_reached"].shape[1]):
            gain = deltas[("memory", k)] - deltas[("no_memory", k)]
            mean, half = _mean_ci(gain, conf)
            metrics[f"memory_gain_trial_{k}"] = mean
            metrics[f"memory_gain_trial_{k}_ci_low"] = mean - half
            metrics[f"memory_gain_trial_{k}_ci_high"] = mean + half
        return metrics, per


class Planning(Evaluator):
    """nuPlan-style closed-loop score of the controlled SDC."""

    type_name = "planning"

    def env_config(self) -> EnvConfig:
        return self.spec.env.replace(control_mode="sdc")

    def _config(self):
        from jaxdrive.eval.planning import PlanningConfig

        p = self.spec.params
        return PlanningConfig.from_dict({k: p[k] for k in p if k in
                                         PlanningConfig.__dataclass_fields__})

    def step_hook(self, env: Env):
        """Per-step features of the scored (ego) agents; their score per scenario."""
        from jaxdrive.eval import planning as pl

        cfg, ec, steps = self._config(), env.config, self.num_steps(env)

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

        del steps
        return hook, reduce

    def aggregate(self, rows, extras):
        r = rows["policy"]
        metrics = base_metrics(r, self._setup["env"].metrics)
        terms = extras["policy"]
        scored = terms["scored_agents"] > 0
        per = {k: v.tolist() for k, v in terms.items()}
        for k, v in terms.items():
            if k != "scored_agents":
                name = "score" if k == "total" else k
                metrics[name] = float(np.mean(v[scored])) if scored.any() else 0.0
        metrics["scored_scenarios"] = float(np.sum(scored))
        return metrics, per


EVALUATORS: dict[str, type[Evaluator]] = {
    c.type_name: c for c in (MultiScenario, HumanReplay, BehaviorClass, Adaptation, Planning)
}


def make_evaluators(specs) -> list[Evaluator]:
    """Evaluator instances for resolved specs (a ``behavior_class`` spec gives one per
    class)."""
    out: list[Evaluator] = []
    for spec in specs:
        if spec.type not in EVALUATORS:
            raise ConfigError(f"evaluator '{spec.name}': unknown type '{spec.type}'; "
                              f"allowed: {', '.join(EVALUATORS)}")
        if spec.type == "behavior_class":
            out.extend(BehaviorClass(spec, c) for c in spec.params["classes"])
        else:
            out.append(EVALUATORS[spec.type](spec))
    return out

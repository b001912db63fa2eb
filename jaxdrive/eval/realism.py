"""The ``realism`` evaluator: WOSAC 2025 realism scores of closed-loop rollouts
(``jaxdrive.metrics.wosac``), in the suite machinery.

Every scenario is played ``num_rollouts`` times from the env's start (``init_step``: the
logged steps ``0 .. init_step`` are the history) for the rest of its log; every object's
box centre, heading and validity are recorded at each step by the base evaluator's step
hook, and the rollouts of each scenario are scored against its logged trajectory by
``realism_scores``, all inside the jitted batch function: only per-scenario numbers
are fetched.

How the rollouts of a scenario meet: the evaluator plays each scenario id
``num_rollouts`` times in a row of the batch (``scenario_ids`` repeats each id, and the
batch holds whole groups: a multiple of ``num_rollouts`` rows, and of the device count).
Each row's episode depends on its place in the batch and the batch key, so the rows of
one group are independent rollouts; the hook's reduction reshapes the batch to
``(groups, num_rollouts, ...)`` and scores each group. (The base class's own
``num_rollouts`` plays the whole set again per rollout, in separate batches, which
cannot be scored together on device; it stays 1 here.)

Which objects move: ``simulate: all`` (the challenge's setting) lets the actor drive
every valid object of every type (``control_mode: all`` with all object types
controllable); ``simulate: controlled`` keeps the section's env, where the objects it
does not control replay their log. Objects that start within ``env.goal_radius`` of
their goal, or are static in the log, are never controlled by the env and replay.

Which objects are scored: the scenario's ``to_predict`` objects and the SDC that are
valid at ``init_step`` (all objects valid at ``init_step`` when a scene marks none); with
``simulate: controlled`` only those among them that the actor drives.

An object's recorded state after its episode ended early (every controlled agent done)
is held at its last counted step (the env auto-resets, those steps are not counted).

Actors (``actors``): ``policy`` (the checkpoint's policy, sampling unless
``deterministic``), ``log_replay`` (the challenge's log-replay oracle: the logged future
itself as every rollout; it scores each feature's highest likelihood, an upper bound),
``log_follow`` (the log-replay controller: the log as followed through the env's
dynamics and action grid; what the dynamics alone lose), ``constant_velocity`` (zero
acceleration and curvature: straight on at the initial speed, the challenge's simplest
baseline) and ``random`` (uniform random actions; a lower reference). The first
actor's metrics are reported plainly, the others' under ``ACTOR/``. ``log_replay``
still plays its rollouts (with the log-replay controller, so that every actor's batch
has one shape) but scores the log in their place.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.agents import controllers
from jaxdrive.agents.actors import Actor, controller_actor, policy_actor
from jaxdrive.config import ConfigError, check_choice, check_int
from jaxdrive.env import Env, EnvConfig
from jaxdrive.env.config import OBJECT_TYPE_NAMES
from jaxdrive.eval.evaluator import EvalResult, Evaluator
from jaxdrive.eval.rollout import make_episode_rollout
from jaxdrive.eval.spec import EvaluatorConfig, as_written
from jaxdrive.metrics import wosac

SIMULATE = ("all", "controlled")
ACTORS = ("policy", "log_replay", "log_follow", "constant_velocity", "random")

# Scalar outputs of ``realism_scores`` kept, and the names they are reported under.
_REPORTED = {"metametric": "meta_metric", "kinematic": "kinematic",
             "interactive": "interactive", "map_based": "map_based",
             **{n: n for n in wosac.FEATURE_NAMES},
             "simulated_collision_rate": "simulated_collision_rate",
             "simulated_offroad_rate": "simulated_offroad_rate",
             "simulated_traffic_light_violation_rate":
                 "simulated_traffic_light_violation_rate",
             "ade": "ade", "min_ade": "min_ade"}

# Trace counter of the reduction (tests check that new parameters do not retrace).
TRACES = [0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RealismConfig(EvaluatorConfig):
    """Attributes:
      num_rollouts: rollouts per scenario (the challenge's 32).
      simulate: ``all`` (every valid object driven by the actor, as in the challenge)
        or ``controlled`` (the env's controlled objects; the others replay the log).
      actors: who drives: any of ``policy``, ``log_replay``, ``log_follow``,
        ``constant_velocity``, ``random`` (first reported plainly, the others under
        ``ACTOR/``).
      rollout_batch: rollouts whose WOSAC features are computed at once (memory bound;
        ``jaxdrive.metrics.wosac.realism_scores``).
    """

    num_rollouts: int = 32
    simulate: str = "all"
    actors: tuple[str, ...] = ("policy",)
    rollout_batch: int = 8

    def __post_init__(self):
        super().__post_init__()
        check_int("num_rollouts", self.num_rollouts, 1, 4096)
        check_choice("simulate", self.simulate, SIMULATE)
        if (not isinstance(self.actors, tuple) or not self.actors
                or not all(isinstance(a, str) for a in self.actors)
                or len(set(self.actors)) != len(self.actors)):
            raise ConfigError(f"config key 'actors' = {as_written(self.actors)!r} must list "
                              f"distinct actors out of {list(ACTORS)}.")
        for name in self.actors:
            check_choice("actors", name, ACTORS)
        check_int("rollout_batch", self.rollout_batch, 1, 4096)


class Realism(Evaluator):
    """WOSAC realism of ``num_rollouts`` rollouts per scenario (see the module doc)."""

    type_name = "realism"
    Config = RealismConfig
    config: RealismConfig

    def env_config(self) -> EnvConfig:
        """``spec.env`` with one agent row per object slot (the scores read every
        object's trajectory by its slot; packed rows, ``max_controlled``, are a
        training layout with the same per-agent semantics); with ``simulate: all``
        every object type controllable in ``control_mode: all``."""
        env = self.spec.env.replace(max_controlled=None)
        if self.config.simulate == "all":
            return env.replace(control_mode="all", controlled_types=tuple(OBJECT_TYPE_NAMES))
        return env

    def scenario_ids(self, num_available: int) -> np.ndarray:
        """Each scenario id ``num_rollouts`` times in a row."""
        ids = super().scenario_ids(num_available)
        return np.repeat(ids, self.config.num_rollouts).astype(np.int32)

    def _build(self, policy, pools=None) -> dict:
        s = super()._build(policy, pools)
        r = self.config.num_rollouts
        d = len(s["rows"].mesh.devices.flat)
        groups = max(1, min(self.spec.batch_size, len(s["ids"]) // r))
        unit = r * d // math.gcd(r, d)  # whole groups, whole devices
        s["batch"] = -(-groups * r // unit) * unit
        if "log_replay" in s["runs"]:  # scores the log itself in place of its rollouts
            env = s["env"]
            hook, reduce = self.step_hook(env, score_log=True)
            actor = self.actors(env, policy)["log_replay"]
            s["runs"]["log_replay"] = jax.jit(make_episode_rollout(
                env, actor, s["steps"], hook, reduce, should_stop=self.should_stop(env)))
        return s

    def actors(self, env: Env, policy) -> dict[str, Actor]:
        """The configured actors by name."""
        out = {}
        for name in self.config.actors:
            if name == "policy":
                out[name] = policy_actor(env, policy, deterministic=self.spec.deterministic)
            elif name in ("log_replay", "log_follow"):  # log_replay: see _build
                out[name] = controller_actor(env, controllers.log_replay(env))
            elif name == "constant_velocity":
                out[name] = controller_actor(env, controllers.constant_velocity(env))
            else:
                out[name] = controller_actor(env, controllers.random_actions(env))
        return out

    def step_hook(self, env: Env, score_log: bool = False):
        """Every object's box per step; the WOSAC scores of each group of rollouts
        (``score_log``: of the logged future in place of every rollout)."""
        r = self.config.num_rollouts
        init = env.config.init_step
        simulate = self.config.simulate
        rollout_batch = min(self.config.rollout_batch, r)

        def hook(env_params, prev, state, ts):
            del env_params, prev
            done = ts.info.episode_done[:, None]
            agents = ts.info.terminal  # the step reached, before any auto-reset
            valid = agents.valid & (done | ~state.removed)
            return {"xy": agents.xy, "yaw": agents.yaw, "valid": valid}

        def reduce(env_params, state0, outs, counted):
            TRACES[0] += 1
            t_sim, b = counted.shape
            # Hold each row at its last counted step.
            steps = jnp.arange(t_sim, dtype=jnp.int32)[:, None]
            last = jax.lax.cummax(jnp.where(counted, steps, -1), axis=0)
            last = jnp.maximum(last, 0)
            held = jax.tree.map(
                lambda x: jnp.take_along_axis(
                    x, last.reshape(last.shape + (1,) * (x.ndim - 2)), axis=0), outs)
            sim_xy = jnp.moveaxis(held["xy"], 0, 2)  # (B, A, T_sim, 2)
            sim_yaw = jnp.moveaxis(held["yaw"], 0, 2)
            sim_valid = jnp.moveaxis(held["valid"], 0, 2)
            pool = env_params.pool
            sid = state0.scenario_id[::r]  # (G,)
            obj = jax.tree.map(lambda x: x[sid], pool.scenarios.objects)
            t = init + 1 + t_sim
            if score_log:
                future = lambda x: jnp.repeat(x[:, :, init + 1:t], r, axis=0)  # noqa: E731
                sim_xy, sim_yaw, sim_valid = future(obj.xy), future(obj.yaw), future(obj.valid)
            hist = lambda x: jnp.repeat(x[:, :, :init + 1], r, axis=0)  # noqa: E731
            sim = wosac.Trajectories(
                xy=jnp.concatenate([hist(obj.xy), sim_xy], axis=2),
                yaw=jnp.concatenate([hist(obj.yaw), sim_yaw], axis=2),
                valid=jnp.concatenate([hist(obj.valid), sim_valid], axis=2))
            g = sid.shape[0]
            sim = jax.tree.map(lambda x: x.reshape((g, r) + x.shape[1:]), sim)
            log = wosac.Trajectories(xy=obj.xy[:, :, :t], yaw=obj.yaw[:, :, :t],
                                     valid=obj.valid[:, :, :t])
            at_init = obj.valid[:, :, init]
            marked = (obj.to_predict | obj.is_sdc) & at_init
            evaluated = jnp.where(jnp.any(marked, axis=-1, keepdims=True), marked, at_init)
            if simulate == "controlled":
                evaluated = evaluated & state0.controlled[::r]
            lights = jax.tree.map(lambda x: x[sid], pool.scenarios.traffic_lights)
            lights = lights.replace(state=lights.state[:, :, :t], valid=lights.valid[:, :, :t])
            index = jax.tree.map(lambda x: x[sid], pool.road_index)
            roadgraph = jax.tree.map(lambda x: x[sid], pool.scenarios.roadgraph)

            def one(sim, log, length, width, evaluated, index, roadgraph, lights):
                out = wosac.realism_scores(
                    sim, log, length, width, evaluated, index, roadgraph,
                    init_steps=init + 1, dt=env.config.dynamics.dt,
                    rollout_batch=rollout_batch, traffic_lights=lights)
                out = {name: out[k].astype(jnp.float32) for k, name in _REPORTED.items()}
                out["evaluated_objects"] = jnp.sum(evaluated).astype(jnp.float32)
                return out

            scores = jax.lax.map(lambda a: one(*a), (sim, log, obj.length, obj.width,
                                                     evaluated, index, roadgraph, lights))
            return jax.tree.map(lambda v: jnp.repeat(v, r, axis=0)[:b], scores)

        return hook, reduce

    def aggregate(self, rows, extras):
        """Per actor: each score's mean over scenarios with evaluated objects, and the
        per-scenario values (first actor plain, the others under ``ACTOR/``)."""
        r = self.config.num_rollouts
        metrics: dict[str, float] = {}
        per: dict[str, list] = {}
        for i, (actor, terms) in enumerate(extras.items()):
            prefix = "" if i == 0 else f"{actor}/"
            terms = {k: v[::r] for k, v in terms.items()}
            scored = terms["evaluated_objects"] > 0
            for k, v in terms.items():
                per[f"{prefix}{k}"] = v.tolist()
                if k != "evaluated_objects":
                    metrics[f"{prefix}{k}"] = float(np.mean(v[scored])) if scored.any() else 0.0
            metrics[f"{prefix}scored_scenarios"] = float(np.sum(scored))
        metrics["rollouts"] = float(r)
        return metrics, per

    def finish(self, result: EvalResult, fetched, rollouts=None) -> None:
        """As the base, with ``scenario_id`` once per scenario (the per-scenario lists)."""
        super().finish(result, fetched, rollouts)
        ids = self._setup["ids"][::self.config.num_rollouts]
        result.per_scenario["scenario_id"] = [int(i) for i in ids]

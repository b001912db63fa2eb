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
``deterministic``); the challenge's two reference agents, computed from the log
(``jaxdrive.metrics.references``): ``log_replay`` (the logged oracle: the logged future
as every rollout, each object held at its last valid state across gaps in its log; it
scores each feature's highest likelihood, an upper bound) and ``constant_velocity``
(each object straight on at the velocity vector logged at ``init_step``, heading held);
``log_follow`` (the log-replay controller: the log as followed through the env's
dynamics and action grid; what the dynamics alone lose), ``straight_on`` (zero
acceleration and curvature through the env's dynamics and action grid at the initial
speed, stopping as the env's goal behaviour says) and ``random`` (uniform random
actions; a lower reference). The first actor's metrics are reported plainly, the others'
under ``ACTOR/``. The reference agents replace the objects the actor would drive (those
valid at ``init_step``; with ``simulate: controlled`` those among them the env
controls); every other object follows its log. They still play rollouts (with the
``straight_on`` controller, so that every actor's batch has one shape) and score the
references in their place.
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
from jaxdrive.metrics import references, wosac

SIMULATE = ("all", "controlled")
ACTORS = ("policy", "log_replay", "log_follow", "constant_velocity", "straight_on", "random")
# Actors whose rollouts are computed from the log (the challenge's reference agents).
REFERENCES = ("log_replay", "constant_velocity")

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
        ``constant_velocity``, ``straight_on``, ``random`` (first reported plainly, the
        others under ``ACTOR/``; see the module doc).
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
        for name in REFERENCES:  # score the reference in place of its rollouts
            if name in s["runs"]:
                env = s["env"]
                hook, reduce = self.step_hook(env, reference=name)
                actor = self.actors(env, policy)[name]
                s["runs"][name] = jax.jit(make_episode_rollout(
                    env, actor, s["steps"], hook, reduce, should_stop=self.should_stop(env)))
        return s

    def actors(self, env: Env, policy) -> dict[str, Actor]:
        """The configured actors by name."""
        out = {}
        for name in self.config.actors:
            if name == "policy":
                out[name] = policy_actor(env, policy, deterministic=self.spec.deterministic)
            elif name == "log_follow":
                out[name] = controller_actor(env, controllers.log_replay(env))
            elif name in ("straight_on",) + REFERENCES:  # references: see _build
                out[name] = controller_actor(env, controllers.straight_on(env))
            else:
                out[name] = controller_actor(env, controllers.random_actions(env))
        return out

    def step_hook(self, env: Env, reference: str | None = None):
        """Every object's box per step; the WOSAC scores of each group of rollouts
        (``reference``: of that reference agent, one of ``REFERENCES``, in place of every
        rollout)."""
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
            if reference is not None:
                # The reference drives what the actor would (the objects valid at
                # init_step, with ``controlled`` those the env controls); the rest
                # follow the log.
                if reference == "log_replay":
                    ref = jax.vmap(references.logged_oracle, in_axes=(0, 0, 0, None, None))(
                        obj.xy, obj.yaw, obj.valid, init, t_sim)
                else:
                    ref = jax.vmap(references.constant_velocity,
                                   in_axes=(0, 0, 0, 0, None, None, None))(
                        obj.xy, obj.yaw, obj.vel, obj.valid, init, t_sim,
                        env.config.dynamics.dt)
                driven = obj.valid[:, :, init]
                if simulate == "controlled":
                    driven = driven & state0.controlled[::r]
                logged = (obj.xy[:, :, init + 1:t], obj.yaw[:, :, init + 1:t],
                          obj.valid[:, :, init + 1:t])
                pick = lambda a, b: jnp.repeat(jnp.where(  # noqa: E731
                    driven.reshape(driven.shape + (1,) * (a.ndim - 2)), a, b), r, axis=0)
                sim_xy, sim_yaw, sim_valid = map(pick, ref, logged)
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
        """As the base, with ``scenario_id`` (and ``scenario_name``) once per scenario (the
        per-scenario lists)."""
        super().finish(result, fetched, rollouts)
        ids = self._setup["ids"][::self.config.num_rollouts]
        result.per_scenario["scenario_id"] = [int(i) for i in ids]
        names = self._setup.get("pool_names")
        if names is not None:
            result.per_scenario["scenario_name"] = [names[int(i)] for i in ids]

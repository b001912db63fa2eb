"""The evaluation rollout: one episode per scenario, every reduction on device.

``make_episode_rollout`` builds ``run(params, env_params, scenario_ids, valid, key)``: B
environments start at the given pool scenarios (``Env.reset_to``) and a ``lax.scan``
runs ``num_steps`` steps; only each env's first episode counts (an env that finishes
early is auto-reset by the env and its later steps are ignored). Padding rows
(``valid`` False, for the last batch of a set whose size is not a multiple of B) run
but report nothing. An optional step hook computes extra per-env quantities at every
step (e.g. the planning score's features); its outputs, stacked over time, go with the
mask of the counted steps to a reduction, still inside the jitted function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.agents.actors import Actor
from jaxdrive.agents.rollout import Transition, scan_rollout
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.metrics.episode import scored_sums

OUTCOMES = ("goal", "collision", "offroad", "timeout", "unfinished")


@struct.dataclass
class EpisodeRecord:
    """Each env's first episode, (B,) arrays (``(B, K)`` for the per-trial ones).

    Attributes:
      valid: bool, the row is a real scenario (not batch padding).
      scenario_id: int32, pool scenario played.
      finished: bool, the episode ended within the rollout (else it is cut and partial).
      end_step: int32, env steps the episode lasted (the rollout length when unfinished).
      counts: dict of per-env sums over the episode's ego agents
        (``jaxdrive.metrics.episode.scored_sums``): ``ego_agents``, each reduced
        metric's count name (``goals``, ``collisions``, ``offroads``, ...),
        ``return_sum``, ``length_sum``.
      trial_reached: (B, K) int32, ego agents that reached their goal in trial k.
      trial_length: (B, K) int32, steps trial k lasted.
    """

    valid: jax.Array
    scenario_id: jax.Array
    finished: jax.Array
    end_step: jax.Array
    counts: dict
    trial_reached: jax.Array
    trial_length: jax.Array

    def rows(self) -> dict:
        """Flat name -> (B, ...) arrays (counts inlined)."""
        return {"valid": self.valid, "scenario_id": self.scenario_id,
                "finished": self.finished, "end_step": self.end_step, **self.counts,
                "trial_reached": self.trial_reached, "trial_length": self.trial_length}


# hook(env_params, prev_state, state, timestep) -> pytree of (B, ...) for one step.
StepHook = Callable[[EnvParams, EnvState, EnvState, TimeStep], Any]
# reduce(env_params, initial states (B), stacked hook outputs (T, B, ...), counted
# (T, B) bool) -> per-env results.
StepReduce = Callable[[EnvParams, EnvState, Any, jax.Array], Any]


def _ego_counts(env: Env, episode, ego: jax.Array) -> dict:
    """Per-env sums over ego agents of an ``EpisodeStats`` (B, A)."""
    sums = scored_sums(episode, ego, env.metrics)
    return {("ego_agents" if k == "agents" else k): v for k, v in sums.items()}


def _pick(mask: jax.Array, new, old):
    """Per-env (B,) choice between two pytrees with leading axis B."""
    return jax.tree.map(
        lambda n, o: jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - 1)), n, o),
        new, old)


def make_episode_rollout(env: Env, actor: Actor, num_steps: int,
                         hook: StepHook | None = None, reduce: StepReduce | None = None,
                         should_stop: Callable[[EnvState, TimeStep], jax.Array] | None = None):
    """``run(params, env_params, scenario_ids (B,), valid (B,), key) -> (EpisodeRecord,
    reduced hook outputs or None)`` (pure; jit it). See the module doc.

    ``should_stop(state, timestep) -> (B,) bool``, evaluated after every step, ends each
    env's counted episode (default: ``timestep.info.episode_done``, the env's own end).
    """
    k = env.config.num_trials if env.trial_mode else 1

    def record_step(env_params, record: EpisodeRecord, tr: Transition):
        new_state, new_ts = tr.next_state, tr.next_timestep
        info = new_ts.info
        counting = ~record.finished  # this step belongs to the first episode
        out = None if hook is None else hook(env_params, tr.state, new_state, new_ts)
        stop = info.episode_done if should_stop is None else should_stop(new_state, new_ts)
        ends = stop & counting
        # An episode the env ended hands out its statistics in the time step; one
        # stopped earlier by ``should_stop`` reports the state's running ones.
        done = info.episode_done
        counts = _pick(done, _ego_counts(env, info.episode, info.episode_ego),
                       _ego_counts(env, new_state.episode, new_state.ego))
        record = record.replace(
            finished=record.finished | ends,
            end_step=jnp.where(counting, record.end_step + 1, record.end_step),
            counts=_pick(ends, counts, record.counts))
        if env.trial_mode:
            trials = _pick(done, info.trials, new_state.trials)
            record = record.replace(
                trial_reached=_pick(ends, trials.ego_reached, record.trial_reached),
                trial_length=_pick(ends, trials.length, record.trial_length))
        return record, (out, counting)

    def run(params, env_params: EnvParams, scenario_ids, valid, key):
        b = scenario_ids.shape[0]
        k_reset, k_run = jax.random.split(key)
        state, ts = jax.vmap(env.reset_to, in_axes=(None, 0, 0))(
            env_params, scenario_ids.astype(jnp.int32), jax.random.split(k_reset, b))
        zeros_i = jnp.zeros((b,), jnp.int32)
        counts = jax.tree.map(jnp.zeros_like, _ego_counts(env, state.episode, state.ego))
        record = EpisodeRecord(
            valid=valid, scenario_id=scenario_ids.astype(jnp.int32),
            finished=jnp.zeros((b,), bool), end_step=zeros_i, counts=counts,
            trial_reached=jnp.zeros((b, k), jnp.int32),
            trial_length=jnp.zeros((b, k), jnp.int32))

        def act(carry, state, ts, k_step):
            actor_carry, record = carry
            action, actor_carry = actor.act(params, actor_carry, env_params, state, ts,
                                            k_step)
            return action, (actor_carry, record), None

        def record_fn(carry, tr: Transition):
            actor_carry, record = carry
            record, out = record_step(env_params, record, tr)
            return (actor_carry, record), out

        state0 = state
        state, ts, (_, record), (outs, counting) = scan_rollout(
            env, env_params, act, state, ts, (actor.init(b), record),
            jax.random.split(k_run, num_steps), record=record_fn)
        # An episode cut by the rollout's end reports its partial statistics.
        record = record.replace(counts=_pick(~record.finished,
                                             _ego_counts(env, state.episode, state.ego),
                                             record.counts))
        extra = (None if hook is None or reduce is None
                 else reduce(env_params, state0, outs, counting & valid))
        return record, extra

    return run


def outcome(record_row: dict) -> str:
    """The outcome of one episode (host side, from one row of a fetched record):
    ``collision`` / ``offroad`` if any ego agent had one (collision first), else
    ``goal`` if every ego agent reached its goal, ``timeout`` for a finished episode,
    ``unfinished`` for one cut by the rollout's end."""
    if record_row["collisions"] > 0:
        return "collision"
    if record_row["offroads"] > 0:
        return "offroad"
    if record_row["ego_agents"] > 0 and record_row["goals"] == record_row["ego_agents"]:
        return "goal"
    return "timeout" if record_row["finished"] else "unfinished"

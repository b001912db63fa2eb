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
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.types import EntityKind

OUTCOMES = ("goal", "collision", "offroad", "timeout", "unfinished")


@struct.dataclass
class EpisodeRecord:
    """Each env's first episode, (B,) arrays (``(B, K)`` for the per-trial ones).

    Attributes:
      valid: the row is a real scenario (not batch padding).
      scenario_id: pool scenario played.
      finished: the episode ended within the rollout (else it is cut and partial).
      end_step: env steps the episode lasted (the rollout length when unfinished).
      ego_agents: ego agent-episodes (controlled, not co-players).
      goals, collisions, offroads: ego agents with that event in the episode.
      return_sum: summed episode return of the ego agents.
      length_sum: summed steps the ego agents acted.
      trial_reached: (B, K) ego agents that reached their goal in trial k.
      trial_length: (B, K) steps trial k lasted.
    """

    valid: jax.Array
    scenario_id: jax.Array
    finished: jax.Array
    end_step: jax.Array
    ego_agents: jax.Array
    goals: jax.Array
    collisions: jax.Array
    offroads: jax.Array
    return_sum: jax.Array
    length_sum: jax.Array
    trial_reached: jax.Array
    trial_length: jax.Array


# hook(env_params, prev_state, state, timestep) -> pytree of (B, ...) for one step.
StepHook = Callable[[EnvParams, EnvState, EnvState, TimeStep], Any]
# reduce(env_params, initial states (B), stacked hook outputs (T, B, ...), counted
# (T, B) bool) -> per-env results.
StepReduce = Callable[[EnvParams, EnvState, Any, jax.Array], Any]


def _episode_counts(ts_or_state_episode, ego: jax.Array):
    """Per-env sums over ego agents of an ``EpisodeStats`` (B, A)."""
    e = ts_or_state_episode
    count = lambda m: jnp.sum(m & ego, axis=-1).astype(jnp.int32)
    return (jnp.sum(ego, axis=-1).astype(jnp.int32), count(e.goal_reached),
            count(e.collided), count(e.offroad),
            jnp.sum(jnp.where(ego, e.return_, 0.0), axis=-1).astype(jnp.float32),
            jnp.sum(jnp.where(ego, e.length, 0), axis=-1).astype(jnp.int32))


def make_episode_rollout(env: Env, actor: Actor, num_steps: int,
                         hook: StepHook | None = None, reduce: StepReduce | None = None,
                         should_stop: Callable[[EnvState, TimeStep], jax.Array] | None = None):
    """``run(params, env_params, scenario_ids (B,), valid (B,), key) -> (EpisodeRecord,
    reduced hook outputs or None)`` (pure; jit it). See the module doc.

    ``should_stop(state, timestep) -> (B,) bool``, evaluated after every step, ends each
    env's counted episode (default: ``timestep.episode_done``, the env's own end).
    """
    trial_mode = env.config.goal_behavior == "trial"
    k = env.config.num_trials if trial_mode else 1

    def run(params, env_params: EnvParams, scenario_ids, valid, key):
        b = scenario_ids.shape[0]
        k_reset, k_run = jax.random.split(key)
        state, ts = jax.vmap(env.reset_to, in_axes=(None, 0, 0))(
            env_params, scenario_ids.astype(jnp.int32), jax.random.split(k_reset, b))
        zeros_i = jnp.zeros((b,), jnp.int32)
        record = EpisodeRecord(
            valid=valid, scenario_id=scenario_ids.astype(jnp.int32),
            finished=jnp.zeros((b,), bool), end_step=zeros_i, ego_agents=zeros_i,
            goals=zeros_i, collisions=zeros_i, offroads=zeros_i,
            return_sum=jnp.zeros((b,), jnp.float32), length_sum=zeros_i,
            trial_reached=jnp.zeros((b, k), jnp.int32),
            trial_length=jnp.zeros((b, k), jnp.int32))

        def body(carry, k_step):
            state, ts, actor_carry, record = carry
            action, actor_carry = actor.act(params, actor_carry, env_params, state, ts,
                                            k_step)
            new_state, new_ts = env.step_batch(env_params, state, action)
            counting = ~record.finished  # this step belongs to the first episode
            out = None if hook is None else hook(env_params, state, new_state, new_ts)
            stop = new_ts.episode_done if should_stop is None else should_stop(new_state,
                                                                                 new_ts)
            ends = stop & counting
            # An episode the env ended hands out its statistics in the time step; one
            # stopped earlier by ``should_stop`` reports the state's running ones.
            done = new_ts.episode_done
            live_ego = new_ts.ego & (new_state.kind == EntityKind.CONTROLLED)
            counts = [jnp.where(done, d, live) for d, live in zip(
                _episode_counts(new_ts.episode, new_ts.episode_ego),
                _episode_counts(new_state.episode, live_ego), strict=True)]
            keep = lambda old, new: jnp.where(
                ends.reshape((b,) + (1,) * (old.ndim - 1)), new, old)
            trials = jax.tree.map(
                lambda d, live: jnp.where(done.reshape((b,) + (1,) * (d.ndim - 1)), d, live),
                new_ts.trials, new_state.trials)
            record = record.replace(
                finished=record.finished | ends,
                end_step=jnp.where(counting, record.end_step + 1, record.end_step),
                ego_agents=keep(record.ego_agents, counts[0]),
                goals=keep(record.goals, counts[1]),
                collisions=keep(record.collisions, counts[2]),
                offroads=keep(record.offroads, counts[3]),
                return_sum=keep(record.return_sum, counts[4]),
                length_sum=keep(record.length_sum, counts[5]),
                trial_reached=keep(record.trial_reached, trials.ego_reached)
                if trial_mode else record.trial_reached,
                trial_length=keep(record.trial_length, trials.length)
                if trial_mode else record.trial_length,
            )
            return (new_state, new_ts, actor_carry, record), (out, counting & valid)

        state0 = state
        carry = (state, ts, actor.init(b), record)
        (state, ts, _, record), (outs, counted) = jax.lax.scan(
            body, carry, jax.random.split(k_run, num_steps))
        # An episode cut by the rollout's end reports its partial statistics.
        cut = ~record.finished
        counts = _episode_counts(state.episode,
                                 ts.ego & (state.kind == EntityKind.CONTROLLED))
        keep = lambda old, new: jnp.where(cut, new, old)
        record = record.replace(
            ego_agents=keep(record.ego_agents, counts[0]), goals=keep(record.goals, counts[1]),
            collisions=keep(record.collisions, counts[2]),
            offroads=keep(record.offroads, counts[3]),
            return_sum=keep(record.return_sum, counts[4]),
            length_sum=keep(record.length_sum, counts[5]))
        extra = (None if hook is None or reduce is None
                 else reduce(env_params, state0, outs, counted))
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

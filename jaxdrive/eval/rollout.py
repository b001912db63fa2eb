"""The evaluation rollout: one counted episode per scenario, every reduction on device.

``make_episode_rollout`` builds ``run(params, env_params, scenario_ids, valid, key)``: B
environments start at the given pool scenarios (``Env.reset_to``) and a ``lax.scan``
runs ``num_steps`` steps. Each env's first episode is the counted one (the metrics'):
its statistics go to the ``EpisodeRecord``. An env that finishes early is auto-reset by
the env (to a pool scenario its own key draws); the record keeps, per step, whether an
episode ended and that episode's scenario, counts and trial outcomes (``EpisodeEnds``),
so that every completed episode of the rollout gets a record with its start and end
step (``episode_spans``). Padding rows (``valid`` False, for the last batch of a set
whose size is not a multiple of B) run but report nothing. An optional step hook
computes extra per-env quantities at every step (e.g. the planning score's features);
its outputs, stacked over time, go with the mask of the counted steps to a reduction,
still inside the jitted function.

With ``keep_actions`` > 0, ``run`` takes a sixth argument, ``rows`` (keep_actions,) int32
batch rows, and also returns their actions (keep_actions, T, A, ...): a recording can
replay them (``jaxdrive.render.record.replay_actor``) from the same reset keys
(``reset_keys``) and show exactly the recorded episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdrive.agents.actors import Actor
from jaxdrive.agents.rollout import Transition, scan_rollout
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.metrics.episode import scored_sums

OUTCOMES = ("goal", "collision", "offroad", "timeout", "unfinished")


@struct.dataclass
class EpisodeEnds:
    """Per env and step, the episodes the env ended ((B, T) arrays, (B, T, K) per trial).

    Attributes:
      done: bool, an episode ended on step t (``end_step`` t + 1).
      scenario_id: int32, that episode's pool scenario.
      counts: dict of its per-env sums over ego agents (as ``EpisodeRecord.counts``).
      trial_reached, trial_length, trial_timed_out, trial_goal_reached: its
        ``TrialStats`` (trial mode; K = 1 and zeros otherwise).
    Values are zero on steps where ``done`` is False.
    """

    done: jax.Array
    scenario_id: jax.Array
    counts: dict
    trial_reached: jax.Array
    trial_length: jax.Array
    trial_timed_out: jax.Array
    trial_goal_reached: jax.Array


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
      trial_timed_out: (B, K) bool, trial k ended by its timeout.
      trial_goal_reached: (B, K) bool, trial k ended with every controlled agent at its
        goal.
      ends: ``EpisodeEnds``, (B, T) over the rollout's steps.
    """

    valid: jax.Array
    scenario_id: jax.Array
    finished: jax.Array
    end_step: jax.Array
    counts: dict
    trial_reached: jax.Array
    trial_length: jax.Array
    trial_timed_out: jax.Array
    trial_goal_reached: jax.Array
    ends: EpisodeEnds

    def rows(self) -> dict:
        """Flat name -> (B, ...) arrays (counts inlined; ``ends`` fields as ``ends/NAME``,
        their counts as ``ends/count/NAME``)."""
        e = self.ends
        ends = {"ends/done": e.done, "ends/scenario_id": e.scenario_id,
                **{f"ends/count/{k}": v for k, v in e.counts.items()},
                **{f"ends/{k}": getattr(e, k) for k in TRIAL_FIELDS}}
        return {"valid": self.valid, "scenario_id": self.scenario_id,
                "finished": self.finished, "end_step": self.end_step, **self.counts,
                **{k: getattr(self, k) for k in TRIAL_FIELDS}, **ends}


# The per-trial fields of a record (and of its ``EpisodeEnds``), all (..., K).
TRIAL_FIELDS = ("trial_reached", "trial_length", "trial_timed_out", "trial_goal_reached")


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


def reset_keys(key: jax.Array, num_envs: int) -> tuple[jax.Array, jax.Array]:
    """``(reset keys (num_envs,), rollout key)`` a batch's ``key`` gives ``run``: the one
    definition a replay of its rows starts from."""
    k_reset, k_run = jax.random.split(key)
    return jax.random.split(k_reset, num_envs), k_run


def _trial_fields(trials) -> dict:
    """The ``TRIAL_FIELDS`` of a ``TrialStats`` (ego agents' goals)."""
    return {"trial_reached": trials.ego_reached, "trial_length": trials.length,
            "trial_timed_out": trials.timed_out, "trial_goal_reached": trials.goal_reached}


def make_episode_rollout(env: Env, actor: Actor, num_steps: int,
                         hook: StepHook | None = None, reduce: StepReduce | None = None,
                         should_stop: Callable[[EnvState, TimeStep], jax.Array] | None = None,
                         keep_actions: int = 0):
    """``run(params, env_params, scenario_ids (B,), valid (B,), key) -> (EpisodeRecord,
    reduced hook outputs or None)`` (pure; jit it). See the module doc.

    ``should_stop(state, timestep) -> (B,) bool``, evaluated after every step, ends each
    env's counted episode (default: ``timestep.info.episode_done``, the env's own end).
    ``keep_actions`` > 0: ``run(..., key, rows)`` also returns the actions of those rows.
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
        ended_counts = _ego_counts(env, info.episode, info.episode_ego)
        counts = _pick(done, ended_counts, _ego_counts(env, new_state.episode, new_state.ego))
        record = record.replace(
            finished=record.finished | ends,
            end_step=jnp.where(counting, record.end_step + 1, record.end_step),
            counts=_pick(ends, counts, record.counts))
        zero = lambda x: jnp.where(done.reshape(done.shape + (1,) * (x.ndim - 1)), x,
                                   jnp.zeros_like(x))
        if env.trial_mode:
            trials = _pick(done, info.trials, new_state.trials)
            record = record.replace(**{
                name: _pick(ends, value, getattr(record, name))
                for name, value in _trial_fields(trials).items()})
            trial_end = {n: zero(v) for n, v in _trial_fields(info.trials).items()}
        else:
            trial_end = {n: jnp.zeros((done.shape[0], 1), getattr(record, n).dtype)
                         for n in TRIAL_FIELDS}
        # The episode that ended on this step is the one the step started from.
        ended = dict(done=done, scenario_id=zero(tr.state.scenario_id.astype(jnp.int32)),
                     counts=jax.tree.map(zero, ended_counts), **trial_end)
        return record, (out, counting, ended, tr.action if keep_actions else None)

    def run(params, env_params: EnvParams, scenario_ids, valid, key, rows=None):
        b = scenario_ids.shape[0]
        keys, k_run = reset_keys(key, b)
        state, ts = jax.vmap(env.reset_to, in_axes=(None, 0, 0))(
            env_params, scenario_ids.astype(jnp.int32), keys)
        zeros_i = jnp.zeros((b,), jnp.int32)
        counts = jax.tree.map(jnp.zeros_like, _ego_counts(env, state.episode, state.ego))
        zk = lambda dtype: jnp.zeros((b, k), dtype)
        no_ends = EpisodeEnds(None, None, None, None, None, None, None)  # filled after the scan
        record = EpisodeRecord(
            valid=valid, scenario_id=scenario_ids.astype(jnp.int32),
            finished=jnp.zeros((b,), bool), end_step=zeros_i, counts=counts,
            trial_reached=zk(jnp.int32), trial_length=zk(jnp.int32),
            trial_timed_out=zk(bool), trial_goal_reached=zk(bool), ends=no_ends)

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
        state, ts, (_, record), (outs, counting, ended, actions) = scan_rollout(
            env, env_params, act, state, ts, (actor.init(b), record),
            jax.random.split(k_run, num_steps), record=record_fn)
        # An episode cut by the rollout's end reports its partial statistics.
        record = record.replace(counts=_pick(~record.finished,
                                             _ego_counts(env, state.episode, state.ego),
                                             record.counts))
        ended = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), ended)  # (B, T, ...)
        record = record.replace(ends=EpisodeEnds(**ended))
        extra = (None if hook is None or reduce is None
                 else reduce(env_params, state0, outs, counting & valid))
        if keep_actions:
            return record, extra, jnp.swapaxes(actions[:, rows], 0, 1)
        return record, extra

    return run


def episode_spans(row: dict) -> list[dict]:
    """Every episode of one fetched record row (host side) that the records report: the
    counted one (``end_step`` as recorded; unfinished when cut by the rollout's end),
    then each later episode the env completed, with its scenario, counts and trial
    outcomes.

    Args:
      row: name -> value of one row of ``EpisodeRecord.rows()`` (NumPy; ``ends/*``
        over the rollout's T steps).
    Returns:
      one dict per episode: ``start_step``, ``end_step``, ``scenario_id``, ``finished``,
      the counts (``ego_agents``, ...), and the ``TRIAL_FIELDS`` as lists.
    """
    count_names = [k[len("ends/count/"):] for k in row if k.startswith("ends/count/")]
    first = {"start_step": 0, "end_step": int(row["end_step"]),
             "scenario_id": int(row["scenario_id"]), "finished": bool(row["finished"]),
             **{c: row[c] for c in count_names},
             **{f: np.asarray(row[f]).tolist() for f in TRIAL_FIELDS}}
    out = [first]
    start = first["end_step"]
    done = np.asarray(row["ends/done"])
    # A counted episode that ``should_stop`` ended before the env did goes on in the env
    # until its next episode end: the later records start after that one.
    skip = first["finished"] and start > 0 and not done[start - 1]
    for t in np.flatnonzero(done):
        if t + 1 <= first["end_step"]:
            continue  # the counted episode
        if skip:
            skip, start = False, t + 1
            continue
        out.append({"start_step": int(start), "end_step": int(t + 1),
                    "scenario_id": int(row["ends/scenario_id"][t]), "finished": True,
                    **{c: row[f"ends/count/{c}"][t] for c in count_names},
                    **{f: np.asarray(row[f"ends/{f}"][t]).tolist() for f in TRIAL_FIELDS}})
        start = t + 1
    return out


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

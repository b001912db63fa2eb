"""One multi-trial episode of one env, with what the memory did at every step.

``make_probe`` builds a jitted function that plays one scenario of the pool through the
rollout core (``jaxdrive.agents.rollout.scan_rollout``) with the policy's mode actions
and keeps, per step, the env's events (trial ends, removals, goals, collisions,
off-road) for every agent and, for a transformer policy, one agent's attention weights
over its KV cache (``Policy.step(..., return_attention=True)``) with the cache's slot
positions and garbage flags. ``by_position`` re-indexes the weights from ring-buffer
slots to the episode steps the slots hold.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.agents.rollout import Transition, scan_rollout
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep, episode_steps
from jaxdrive.models.policy import Policy, policy_inputs


@dataclasses.dataclass(frozen=True)
class EpisodeProbe:
    """Host arrays of one env over the T steps of its first episode.

    Step ``t`` is the action taken on observation ``t`` (position ``t`` of the episode
    in the policy's memory) and the state it led to.

    Attributes:
      agent: the inspected agent slot.
      controlled, ego, sdc: (A,) bool, at the episode start.
      trial: (T,) int32, trial of observation t.
      trial_step: (T,) int32, steps since that trial began.
      removed: (T, A) bool, removed in observation t (steps the memory marks garbage).
      reward: (T, A) float32, for step t.
      goal_reached, collided, offroad: (T, A) bool, in the state step t reached (before
        any trial restart).
      trial_done: (T,) bool, a trial ended on step t (the next observation restarts it).
      episode_done: (T,) bool, the episode ended on step t (only the last step).
      attention: (T, layers, heads, S) float32, the agent's weights over its cache
        slots at step t; None for a policy without memory.
      slot_pos: (T, S) int32, episode position held by each slot after step t's write
        (-1 = empty); None without memory.
      slot_garbage: (T, S) bool, the slot was written while the agent was removed;
        None without memory.
      query_pos: (T,) int32, step t's own position (None without memory).
    """

    agent: int
    controlled: np.ndarray
    ego: np.ndarray
    sdc: np.ndarray
    trial: np.ndarray
    trial_step: np.ndarray
    removed: np.ndarray
    reward: np.ndarray
    goal_reached: np.ndarray
    collided: np.ndarray
    offroad: np.ndarray
    trial_done: np.ndarray
    episode_done: np.ndarray
    attention: np.ndarray | None = None
    slot_pos: np.ndarray | None = None
    slot_garbage: np.ndarray | None = None
    query_pos: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        """() int: T, steps recorded."""
        return int(self.trial.shape[0])

    @property
    def has_memory(self) -> bool:
        """() bool: attention and cache arrays are present."""
        return self.attention is not None


def default_agent(state: EnvState, is_sdc: np.ndarray) -> int:
    """The agent to inspect when none is named: the SDC if it is a controlled ego agent,
    else the first controlled ego agent, else the first controlled agent (``state``: one
    env's initial state on host; ``is_sdc``: (A,) bool)."""
    controlled = np.asarray(state.controlled)
    ego = np.asarray(state.ego)
    for pick in (ego & np.asarray(is_sdc), ego, controlled):
        if pick.any():
            return int(np.argmax(pick))
    raise ValueError("the scene has no controlled agent to inspect; pick another scene "
                     "(--scenario / --seed).")


def make_probe(env: Env, policy: Policy, with_attention: bool):
    """A jitted ``run(params, env_params, state, timestep, agent) -> dict`` playing
    ``episode_steps(env)`` steps of one env.

    Args:
      env: the env (trial mode for a multi-trial episode).
      policy: the policy; ``with_attention`` needs a transformer.
      with_attention: record the agent's attention weights and cache layout.
    Returns:
      The function: ``state``/``timestep`` with a leading env axis of 1, ``agent`` ()
      int32; returns per-step device arrays with leading axis ``episode_steps(env)``
      (steps after the episode's end belong to the next episode; ``collect`` cuts them).
    """
    a = env.num_rows
    rows = lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

    def run(params, env_params: EnvParams, state: EnvState, timestep: TimeStep, agent):
        def act(cache, state, timestep, _):
            first, removed = policy_inputs(timestep)
            obs = jax.tree.map(rows, timestep.obs)
            if with_attention:
                out, cache, weights = policy.step(params, cache, obs, rows(first),
                                                  rows(removed), return_attention=True)
                aux = {"attention": weights[:, agent], "slot_pos": cache.pos[agent],
                       "slot_garbage": cache.garbage[agent],
                       "query_pos": cache.next_pos[agent] - 1}
            else:
                out, cache = policy.step(params, cache, obs, rows(first), rows(removed))
                aux = {}
            action = policy.distribution(out).mode()
            return action.reshape((1, a) + action.shape[1:]), cache, aux

        def record(cache, tr: Transition):
            info, m = tr.next_timestep.info, tr.next_timestep.info.metrics
            out = {"trial": tr.state.trial[0], "trial_step": tr.state.trial_step[0],
                   "removed": tr.timestep.removed[0], "reward": tr.next_timestep.reward[0],
                   "goal_reached": m["goal_reached"][0], "collided": m["collided"][0],
                   "offroad": m["offroad"][0], "trial_done": info.trial_done[0],
                   "episode_done": info.episode_done[0], **tr.aux}
            return cache, out

        cache = policy.init_cache(a)
        _, _, _, outs = scan_rollout(env, env_params, act, state, timestep, cache,
                                     record=record, length=episode_steps(env))
        return outs

    return jax.jit(run)


def collect(outs: dict, agent: int, state: EnvState, is_sdc: np.ndarray) -> EpisodeProbe:
    """Host ``EpisodeProbe`` of ``make_probe``'s outputs, cut after the first episode's
    last step (``state``: the env's initial state, one env, on host)."""
    outs = {k: np.asarray(v) for k, v in jax.device_get(outs).items()}
    ends = np.flatnonzero(outs["episode_done"])
    t = int(ends[0]) + 1 if ends.size else outs["trial"].shape[0]
    outs = {k: v[:t] for k, v in outs.items()}
    return EpisodeProbe(agent=agent, controlled=np.asarray(state.controlled),
                        ego=np.asarray(state.ego), sdc=np.asarray(is_sdc, bool), **outs)


def by_position(probe: EpisodeProbe) -> tuple[np.ndarray, np.ndarray]:
    """The attention weights indexed by the episode step each key holds.

    Returns:
      weights: (T, layers, heads, T) float32, ``[t, ..., p]`` = weight of step t's query
        on the key written at step p; NaN where no slot holds step p at step t (not yet
        written, or overwritten beyond the horizon).
      garbage: (T, T) bool, ``[t, p]``: the key of step p is garbage at step t (never
        its own step: a query always attends to itself).
    """
    t_len = probe.num_steps
    _, layers, heads, _ = probe.attention.shape
    weights = np.full((t_len, layers, heads, t_len), np.nan, np.float32)
    garbage = np.zeros((t_len, t_len), bool)
    for t in range(t_len):
        held = (probe.slot_pos[t] >= 0) & (probe.slot_pos[t] < t_len)
        p = probe.slot_pos[t][held]
        weights[t][..., p] = probe.attention[t][..., held]
        garbage[t, p] = probe.slot_garbage[t][held] & (p != probe.query_pos[t])
    return weights, garbage


def attendable(slot_pos: np.ndarray, slot_garbage: np.ndarray, query_pos: np.ndarray,
               horizon: int) -> np.ndarray:
    """(..., S) bool: the slots a query at ``query_pos`` (...) may attend, by the cache's
    rule (held, same episode, causal, within the horizon, not garbage; the own slot
    always). ``slot_pos``, ``slot_garbage``: (..., S)."""
    q = np.asarray(query_pos)[..., None]
    own = slot_pos == q
    return own | ((slot_pos >= 0) & (slot_pos <= q) & (q - slot_pos < horizon)
                  & ~slot_garbage)


def scene_is_sdc(env_params: EnvParams, scenario_id: int) -> np.ndarray:
    """(A,) bool: the SDC flags of one pool scenario (host)."""
    return np.asarray(jnp.asarray(env_params.pool.scenarios.objects.is_sdc)[scenario_id])

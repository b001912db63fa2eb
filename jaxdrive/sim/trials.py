"""Per-trial bookkeeping of multi-trial episodes and its on-device reduction.

An episode in ``goal_behavior: trial`` mode is K trials of one scenario (see
``jaxdrive.env``). ``TrialStats`` lives in each environment's state and records every
trial of the current episode as it ends; the step that ends the episode hands it out in
its ``TimeStep``. ``TrialTotals`` sums those records over many environments and steps
(all on device, ``jaxdrive.metrics.trials``) and turns them into the adaptation metrics:

- ``trial_{k}_score``: share of ego agents that reached their goal in trial k, pooled
  over completed episodes (co-players never count);
- ``ada_delta_trial_{k}_minus_0`` = ``trial_{k}_score - trial_0_score`` for 0 < k < K;
- ``trials_completed``, ``trials_goal_reached`` (every controlled agent reached its goal,
  so the trial ended early), ``trials_timed_out`` and ``trial_mean_length`` (steps),
  counted per environment episode;
- ``co_player_trial_{k}_score``, the same share for co-players, kept apart.

Only completed episodes count, so that every trial index is averaged over the same
episodes and the deltas compare like with like.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class TrialStats:
    """One environment's record of the trials of its current episode (K = num_trials).

    Attributes:
      ego_reached: (K,) int32, ego agents that reached their goal in trial k.
      co_reached: (K,) int32, co-players that reached their goal in trial k.
      length: (K,) int32, steps trial k lasted (0 while it has not ended).
      timed_out: (K,) bool, trial k ended by its timeout.
      goal_reached: (K,) bool, every controlled agent reached its goal in trial k.
      num_ego, num_co: () int32, ego agents and co-players in the episode.
    """

    ego_reached: jax.Array
    co_reached: jax.Array
    length: jax.Array
    timed_out: jax.Array
    goal_reached: jax.Array
    num_ego: jax.Array
    num_co: jax.Array

    @classmethod
    def zeros(cls, num_trials: int, ego: jax.Array, co_player: jax.Array) -> TrialStats:
        """Empty record for an episode whose (A,) role masks are ``ego``, ``co_player``."""
        zi = jnp.zeros((num_trials,), jnp.int32)
        zb = jnp.zeros((num_trials,), bool)
        return cls(zi, zi, zi, zb, zb, jnp.sum(ego, dtype=jnp.int32),
                   jnp.sum(co_player, dtype=jnp.int32))

    def record(
        self,
        trial: jax.Array,
        ended: jax.Array,
        reached: jax.Array,
        ego: jax.Array,
        co_player: jax.Array,
        length: jax.Array,
        timed_out: jax.Array,
    ) -> TrialStats:
        """Write trial ``trial`` () if ``ended`` (): ``reached`` (A,) bool are the agents
        that reached their goal in it, ``length`` () its steps, ``timed_out`` () why."""
        slot = (jnp.arange(self.length.shape[0]) == trial) & ended
        controlled = ego | co_player
        all_reached = jnp.all(reached | ~controlled) & jnp.any(controlled)
        put = lambda old, new: jnp.where(slot, new, old)
        return TrialStats(
            ego_reached=put(self.ego_reached, jnp.sum(reached & ego, dtype=jnp.int32)),
            co_reached=put(self.co_reached, jnp.sum(reached & co_player, dtype=jnp.int32)),
            length=put(self.length, length.astype(jnp.int32)),
            timed_out=put(self.timed_out, timed_out),
            goal_reached=put(self.goal_reached, all_reached & ~timed_out),
            num_ego=self.num_ego,
            num_co=self.num_co,
        )


class Clock(NamedTuple):
    """How one step ends for an environment.

    Attributes:
      terminated, truncated, trial_ended: (A,) bool signals (see ``jaxdrive.env``).
      episode_end, trial_end: () bool.
      trials: ``TrialStats`` with the trial that ended recorded.
    """

    terminated: jax.Array
    truncated: jax.Array
    trial_ended: jax.Array
    episode_end: jax.Array
    trial_end: jax.Array
    trials: TrialStats


def advance_clock(trial_mode: bool, num_trials: int, trial_length: int,
                  episode_length: int, step: jax.Array, trial_start: jax.Array,
                  trial: jax.Array, controlled: jax.Array, done: jax.Array,
                  out: jax.Array, reached: jax.Array, ego: jax.Array,
                  co_player: jax.Array, trials: TrialStats) -> Clock:
    """The episode / trial state machine of one environment after a step.

    Outside trial mode the episode ends at ``episode_length`` steps or when no
    controlled agent acts; agents that stopped (``out``) terminate, the others are
    truncated at the end. In trial mode a trial ends at ``trial_length`` steps or when no
    controlled agent acts; every controlled agent is truncated at a trial end and
    terminated at the K-th.

    Args:
      step: () int32 steps taken, this one included; trial_start, trial: () int32.
      controlled, done, out, reached, ego, co_player: (A,) bool after the step.
      trials: ``TrialStats`` of the current episode.
    Returns:
      ``Clock``: (A,) bool per-agent flags, () bool ends, the updated ``TrialStats``.
    """
    if trial_mode:
        timed_out = step - trial_start >= trial_length
        trial_end = timed_out | ~jnp.any(controlled & ~done)
        episode_end = trial_end & (trial == num_trials - 1)
        terminated = controlled & episode_end
        truncated = controlled & trial_end & ~episode_end
        trial_ended = controlled & trial_end
        trials = trials.record(trial, trial_end, reached, ego, co_player,
                               step - trial_start, timed_out)
    else:
        terminated = out
        episode_end = (step >= episode_length) | ~jnp.any(controlled & ~done)
        truncated = controlled & ~done & episode_end
        trial_end = episode_end
        trial_ended = jnp.zeros_like(out)
    return Clock(terminated, truncated, trial_ended, episode_end, trial_end, trials)

"""On-device reduction of multi-trial episodes' ``TrialStats`` into adaptation metrics
(see ``jaxdrive.sim.trials`` for the definitions).

``TrialTotals`` sums episodes' records; its ``counters`` (``TRIAL_COUNTERS``) are what the
training logs and trial-mode evaluators report, ``metrics`` adds the per-trial scores.
``episode_trial_scores`` and ``masked_mean_std`` are the per-episode (per-scenario) side
the adaptation evaluator reduces on device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.sim.trials import TrialStats

# Per completed episode: trials ended, trials that ended with every controlled agent at
# its goal, trials cut by the timeout; and the mean trial length in steps.
TRIAL_COUNTERS = ("trials_completed", "trials_goal_reached", "trials_timed_out",
                  "trial_mean_length")


@struct.dataclass
class TrialTotals:
    """Sums of ``TrialStats`` over completed episodes (float32, on device).

    Attributes:
      episodes: () environment episodes completed.
      ego_agents, co_agents: () ego agents / co-players in them.
      ego_reached, co_reached: (K,) goals reached per trial index.
      trials_completed, trials_goal_reached, trials_timed_out, trial_length_sum: ().
    """

    episodes: jax.Array
    ego_agents: jax.Array
    co_agents: jax.Array
    ego_reached: jax.Array
    co_reached: jax.Array
    trials_completed: jax.Array
    trials_goal_reached: jax.Array
    trials_timed_out: jax.Array
    trial_length_sum: jax.Array

    @classmethod
    def zeros(cls, num_trials: int) -> TrialTotals:
        """Zero totals for ``num_trials`` trials per episode (distinct buffers, so
        donatable)."""
        s = lambda: jnp.zeros((), jnp.float32)
        k = lambda: jnp.zeros((num_trials,), jnp.float32)
        return cls(s(), s(), s(), k(), k(), s(), s(), s(), s())

    @property
    def num_trials(self) -> int:
        """() int: K, trials per episode."""
        return self.ego_reached.shape[-1]

    def update(self, episode_done: jax.Array, stats: TrialStats) -> TrialTotals:
        """Add the episodes that ended: ``episode_done`` (...) bool, ``stats`` with the
        same leading dims (e.g. (B,) for a batched step, (T, B) for a recorded rollout)."""
        lead = tuple(range(episode_done.ndim))
        d = episode_done.astype(jnp.float32)
        dk = d[..., None]
        total = lambda x: jnp.sum(x.astype(jnp.float32) * d, axis=lead)
        total_k = lambda x: jnp.sum(x.astype(jnp.float32) * dk, axis=lead)
        ended = stats.length > 0
        return TrialTotals(
            episodes=self.episodes + jnp.sum(d),
            ego_agents=self.ego_agents + total(stats.num_ego),
            co_agents=self.co_agents + total(stats.num_co),
            ego_reached=self.ego_reached + total_k(stats.ego_reached),
            co_reached=self.co_reached + total_k(stats.co_reached),
            trials_completed=self.trials_completed + jnp.sum(total_k(ended)),
            trials_goal_reached=self.trials_goal_reached + jnp.sum(total_k(stats.goal_reached)),
            trials_timed_out=self.trials_timed_out + jnp.sum(total_k(stats.timed_out)),
            trial_length_sum=self.trial_length_sum + jnp.sum(total_k(stats.length)),
        )

    def metrics(self) -> dict[str, jax.Array]:
        """The adaptation metrics as () float32 arrays (jittable; see module doc).

        Counts are per completed episode; scores and the mean length are 0 before any
        episode completed.
        """
        k_trials = self.num_trials
        ego = jnp.maximum(self.ego_agents, 1.0)
        co = jnp.maximum(self.co_agents, 1.0)
        scores = self.ego_reached / ego
        out = adaptation_metrics([scores[k] for k in range(k_trials)])
        for k in range(k_trials):
            out[f"co_player_trial_{k}_score"] = self.co_reached[k] / co
        return {**out, **self.counters()}

    def counters(self) -> dict[str, jax.Array]:
        """``trial_episodes`` and the ``TRIAL_COUNTERS`` as () float32 (jittable): counts
        per completed episode, the mean length per completed trial; 0 before any
        episode completed."""
        eps = jnp.maximum(self.episodes, 1.0)
        return {
            "trial_episodes": self.episodes,
            "trials_completed": self.trials_completed / eps,
            "trials_goal_reached": self.trials_goal_reached / eps,
            "trials_timed_out": self.trials_timed_out / eps,
            "trial_mean_length": self.trial_length_sum / jnp.maximum(self.trials_completed,
                                                                     1.0),
        }

    def __add__(self, other: TrialTotals) -> TrialTotals:
        """Field-wise sum (totals of disjoint sets of episodes, e.g. two batches)."""
        return jax.tree.map(jnp.add, self, other)


def episode_trial_scores(ego_reached: jax.Array, num_ego: jax.Array) -> jax.Array:
    """(..., K) float32 share of an episode's ego agents that reached their goal in each
    trial, from ``ego_reached`` (..., K) and ``num_ego`` (...) (0 without ego agents)."""
    den = jnp.maximum(num_ego, 1).astype(jnp.float32)[..., None]
    return ego_reached.astype(jnp.float32) / den


def masked_mean_std(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Count, mean and sample standard deviation (ddof 1) over the rows of ``x`` (S, ...)
    where ``mask`` (S,) holds (jittable). Returns ((), (...), (...)) float32: mean 0 over
    no row, standard deviation NaN over fewer than two."""
    m = mask.astype(jnp.float32).reshape(mask.shape + (1,) * (x.ndim - 1))
    n = jnp.sum(mask.astype(jnp.float32))
    mean = jnp.sum(x * m, axis=0) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.square(x - mean) * m, axis=0) / jnp.maximum(n - 1.0, 1.0)
    std = jnp.where(n > 1, jnp.sqrt(var), jnp.nan)
    return n, mean, std


def adaptation_metrics(scores) -> dict:
    """``trial_{k}_score`` and ``ada_delta_trial_{k}_minus_0`` (k > 0) from the K per-trial
    scores (a sequence of floats or () arrays): the one place these are defined."""
    out = {f"trial_{k}_score": scores[k] for k in range(len(scores))}
    out.update({f"ada_delta_trial_{k}_minus_0": scores[k] - scores[0]
                for k in range(1, len(scores))})
    return out

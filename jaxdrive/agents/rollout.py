"""Scan-based rollouts of an env and a controller, with episode statistics on device."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.metrics.trials import TrialTotals

Controller = Callable[[EnvParams, EnvState, TimeStep, jax.Array], jax.Array]


@struct.dataclass
class RolloutStats:
    """Sums over completed agent-episodes (controlled agents of finished episodes),
    split by role: the plain names count ego agents, ``co_*`` co-players.

    Attributes (() float32 scalars unless noted):
      episodes: ego agent-episodes completed.
      goals, collisions, offroads: ego agent-episodes with at least one such event.
      return_sum: sum of ego episode returns.
      co_episodes, co_goals, co_collisions, co_offroads: the same for co-players.
      env_episodes: environment episodes completed.
      trials: ``TrialTotals`` in trial mode, else ``None``.
    """

    episodes: jax.Array
    goals: jax.Array
    collisions: jax.Array
    offroads: jax.Array
    return_sum: jax.Array
    co_episodes: jax.Array
    co_goals: jax.Array
    co_collisions: jax.Array
    co_offroads: jax.Array
    env_episodes: jax.Array
    trials: TrialTotals | None = None

    @classmethod
    def zeros(cls, env: Env | None = None) -> RolloutStats:
        """Empty sums; with ``env`` in trial mode, trial totals for its ``num_trials``."""
        trials = None
        if env is not None and env.config.goal_behavior == "trial":
            trials = TrialTotals.zeros(env.config.num_trials)
        # Distinct buffers, so that the stats can be donated to a jitted rollout.
        return cls(*[jnp.zeros((), jnp.float32) for _ in range(10)], trials=trials)

    def update(self, ts: TimeStep) -> RolloutStats:
        """Add the episodes that ended on a (batched) step."""
        ended = ts.episode_done[..., None]
        ego = ended & ts.episode_ego
        co = ended & ts.episode_mask & ~ts.episode_ego
        f = lambda m, x: jnp.sum(jnp.where(m, x, 0).astype(jnp.float32))
        e = ts.episode
        return RolloutStats(
            episodes=self.episodes + f(ego, 1),
            goals=self.goals + f(ego, e.goal_reached),
            collisions=self.collisions + f(ego, e.collided),
            offroads=self.offroads + f(ego, e.offroad),
            return_sum=self.return_sum + f(ego, e.return_),
            co_episodes=self.co_episodes + f(co, 1),
            co_goals=self.co_goals + f(co, e.goal_reached),
            co_collisions=self.co_collisions + f(co, e.collided),
            co_offroads=self.co_offroads + f(co, e.offroad),
            env_episodes=self.env_episodes + jnp.sum(ts.episode_done).astype(jnp.float32),
            trials=None if self.trials is None else self.trials.update(ts.episode_done,
                                                                       ts.trials),
        )

    def rates(self) -> dict[str, float]:
        """Host-side summary (call after ``jax.device_get``): ego rates, co-player rates
        when there were co-players, and the trial metrics in trial mode."""
        n = max(float(self.episodes), 1.0)
        out = {
            "agent_episodes": int(self.episodes),
            "env_episodes": int(self.env_episodes),
            "goal_rate": float(self.goals) / n,
            "collision_rate": float(self.collisions) / n,
            "offroad_rate": float(self.offroads) / n,
            "mean_return": float(self.return_sum) / n,
        }
        if float(self.co_episodes) > 0:
            c = float(self.co_episodes)
            out.update(
                co_player_agent_episodes=int(c),
                co_player_goal_rate=float(self.co_goals) / c,
                co_player_collision_rate=float(self.co_collisions) / c,
                co_player_offroad_rate=float(self.co_offroads) / c,
            )
        if self.trials is not None:
            out.update({k: float(v) for k, v in self.trials.metrics().items()})
        return out


def make_rollout(env: Env, controller: Controller, num_steps: int):
    """A pure function running ``num_steps`` batched steps with ``lax.scan``.

    Returns:
      ``rollout(params, state, timestep, stats, key) -> (state, timestep, stats)`` over a
      batch of environments (leading axis B); jit it at the call site.
    """
    act = jax.vmap(controller, in_axes=(None, 0, 0, 0))

    def rollout(params, state, timestep, stats, key):
        def body(carry, k):
            state, timestep, stats = carry
            b = state.step.shape[0]
            action = act(params, state, timestep, jax.random.split(k, b))
            state, timestep = env.step_batch(params, state, action)
            return (state, timestep, stats.update(timestep)), None

        keys = jax.random.split(key, num_steps)
        (state, timestep, stats), _ = jax.lax.scan(body, (state, timestep, stats), keys)
        return state, timestep, stats

    return rollout

"""Scan-based rollouts of an env and a controller, with episode statistics on device."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.env import Env, EnvParams, EnvState, TimeStep

Controller = Callable[[EnvParams, EnvState, TimeStep, jax.Array], jax.Array]


@struct.dataclass
class RolloutStats:
    """Sums over completed agent-episodes (controlled agents of finished episodes).

    Attributes (all () scalars):
      episodes: number of agent-episodes completed.
      goals, collisions, offroads: agent-episodes with at least one such event.
      return_sum: sum of episode returns.
      env_episodes: environment episodes completed.
    """

    episodes: jax.Array
    goals: jax.Array
    collisions: jax.Array
    offroads: jax.Array
    return_sum: jax.Array
    env_episodes: jax.Array

    @classmethod
    def zeros(cls) -> RolloutStats:
        # Distinct buffers, so that the stats can be donated to a jitted rollout.
        return cls(*[jnp.zeros((), jnp.float32) for _ in range(6)])

    def update(self, ts: TimeStep) -> RolloutStats:
        """Add the episodes that ended on a (batched) step."""
        done = ts.episode_done[..., None] & ts.episode_mask
        f = lambda x: jnp.sum(jnp.where(done, x, 0).astype(jnp.float32))
        return RolloutStats(
            episodes=self.episodes + f(1),
            goals=self.goals + f(ts.episode.goal_reached),
            collisions=self.collisions + f(ts.episode.collided),
            offroads=self.offroads + f(ts.episode.offroad),
            return_sum=self.return_sum + f(ts.episode.return_),
            env_episodes=self.env_episodes + jnp.sum(ts.episode_done).astype(jnp.float32),
        )

    def rates(self) -> dict[str, float]:
        """Host-side summary (call after ``jax.device_get``)."""
        n = max(float(self.episodes), 1.0)
        return {
            "agent_episodes": int(self.episodes),
            "env_episodes": int(self.env_episodes),
            "goal_rate": float(self.goals) / n,
            "collision_rate": float(self.collisions) / n,
            "offroad_rate": float(self.offroads) / n,
            "mean_return": float(self.return_sum) / n,
        }


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

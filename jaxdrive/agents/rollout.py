"""The rollout core: one ``lax.scan`` over the env and whoever acts, used by every caller.

``scan_rollout`` steps a batch of environments ``length`` times. Each caller supplies two
small hooks instead of writing its own loop: ``act`` (who drives: a controller, a policy
with memory, the trainer's learner and co-players, pre-drawn actions) and ``record``
(what the caller keeps: episode statistics, transitions for PPO, evaluation records,
video frames). Training, evaluation, rendering, ``simulate`` and the benchmarks all
run through it.

``RolloutStats`` are on-device sums over completed agent-episodes, derived from the
metric registry; ``make_rollout`` is the built-in controller rollout of ``simulate``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.metrics.episode import rates as episode_rates
from jaxdrive.metrics.episode import scored_sums
from jaxdrive.metrics.registry import Metric, episode_metrics
from jaxdrive.metrics.trials import TrialTotals

Controller = Callable[[EnvParams, EnvState, TimeStep, jax.Array], jax.Array]


class Transition(NamedTuple):
    """One batched step as the ``record`` hook sees it.

    Attributes:
      state, timestep: (B,) before the step (the observation acted on).
      action: the (B, A, ...) action taken; aux: what ``act`` returned besides it.
      next_state, next_timestep: (B,) after the step (auto-reset applied).
      x: this step's slice of the scanned inputs (e.g. a PRNG key).
    """

    state: EnvState
    timestep: TimeStep
    action: jax.Array
    aux: Any
    next_state: EnvState
    next_timestep: TimeStep
    x: Any


# act(carry, state, timestep, x) -> (action, carry, aux)
Act = Callable[[Any, EnvState, TimeStep, Any], tuple[jax.Array, Any, Any]]
# record(carry, transition) -> (carry, per-step output)
Record = Callable[[Any, Transition], tuple[Any, Any]]


def scan_rollout(env: Env, env_params: EnvParams, act: Act, state: EnvState,
                 timestep: TimeStep, carry: Any, xs: Any = None, *,
                 record: Record | None = None, length: int | None = None,
                 step_batch=None):
    """Run ``env.step_batch`` under ``lax.scan`` with the caller's hooks (pure; jit it).

    Args:
      env, env_params: the environment.
      act: ``(carry, state, timestep, x) -> (action, carry, aux)``.
      state, timestep: (B,) batch to start from.
      carry: the hooks' own carry (actor memory, statistics, ...).
      xs: scanned inputs (e.g. (T,) PRNG keys or (T, B, A) actions), or None.
      record: ``(carry, Transition) -> (carry, out)``; None keeps nothing.
      length: steps, when ``xs`` is None.
      step_batch: the batched step to use (default ``env.step_batch``; e.g.
        ``env.step_batch_sharded(mesh)`` for a batch split over devices).
    Returns:
      ``(state, timestep, carry, outs)`` with ``outs`` stacked over time.
    """

    step_batch = env.step_batch if step_batch is None else step_batch

    def body(c, x):
        state, timestep, carry = c
        action, carry, aux = act(carry, state, timestep, x)
        next_state, next_timestep = step_batch(env_params, state, action)
        out = None
        if record is not None:
            carry, out = record(carry, Transition(state, timestep, action, aux, next_state,
                                                  next_timestep, x))
        return (next_state, next_timestep, carry), out

    (state, timestep, carry), outs = jax.lax.scan(body, (state, timestep, carry), xs,
                                                  length=length)
    return state, timestep, carry, outs


@struct.dataclass
class RolloutStats:
    """Sums over completed agent-episodes (controlled agents of finished episodes), split
    by role, from the metric registry.

    Attributes:
      ego, co: dict name -> () float32 for ego agents / co-players: ``agents`` (agent-
        episodes), each reduced metric's count name, ``return_sum``, ``length_sum``.
      env_episodes: () environment episodes completed.
      trials: ``TrialTotals`` in trial mode, else ``None``.
    """

    ego: dict
    co: dict
    env_episodes: jax.Array
    trials: TrialTotals | None = None
    metrics: tuple[Metric, ...] = struct.field(pytree_node=False, default=())

    @classmethod
    def zeros(cls, env: Env) -> RolloutStats:
        """Empty sums for ``env``'s metrics; trial totals in trial mode."""
        trials = TrialTotals.zeros(env.config.num_trials) if env.trial_mode else None
        names = ("agents", *(m.count for m in episode_metrics(env.metrics)), "return_sum",
                 "length_sum")
        # Distinct buffers, so that the stats can be donated to a jitted rollout.
        z = lambda: {n: jnp.zeros((), jnp.float32) for n in names}
        return cls(ego=z(), co=z(), env_episodes=jnp.zeros((), jnp.float32),
                   trials=trials, metrics=env.metrics)

    def update(self, ts: TimeStep) -> RolloutStats:
        """Add the episodes that ended on a step; ``ts``: ``TimeStep`` with any leading
        dims, e.g. (B,)."""
        info = ts.info
        ended = info.episode_done[..., None]
        ego = ended & info.episode_ego
        co = ended & info.episode_controlled & ~info.episode_ego
        total = lambda sums: {k: jnp.sum(v).astype(jnp.float32) for k, v in sums.items()}
        add = lambda old, new: {k: old[k] + new[k] for k in old}
        return self.replace(
            ego=add(self.ego, total(scored_sums(info.episode, ego, self.metrics))),
            co=add(self.co, total(scored_sums(info.episode, co, self.metrics))),
            env_episodes=self.env_episodes + jnp.sum(info.episode_done).astype(jnp.float32),
            trials=None if self.trials is None else self.trials.update(info.episode_done,
                                                                       info.trials),
        )

    def rates(self) -> dict[str, float]:
        """Host-side summary (call after ``jax.device_get``): ego rates, co-player rates
        when there were co-players, and the trial metrics in trial mode."""
        n = float(self.ego["agents"])
        ego = episode_rates(self.ego, n, self.metrics)
        out = {"agent_episodes": int(n), "env_episodes": int(self.env_episodes), **ego,
               # The name simulate's JSON has always used for the mean return.
               "mean_return": ego["episode_return"]}
        c = float(self.co["agents"])
        if c > 0:
            out["co_player_agent_episodes"] = int(c)
            out.update({f"co_player_{k}": v for k, v in
                        episode_rates(self.co, c, self.metrics).items()})
        if self.trials is not None:
            out.update({k: float(v) for k, v in self.trials.metrics().items()})
        return out


def make_rollout(env: Env, controller: Controller, num_steps: int):
    """A pure function running ``num_steps`` batched steps of a built-in controller.

    Returns:
      ``rollout(params, state, timestep, stats, key) -> (state, timestep, stats)`` over a
      batch of environments (leading axis B); jit it at the call site.
    """
    act_batch = jax.vmap(controller, in_axes=(None, 0, 0, 0))

    def rollout(params, state, timestep, stats, key):
        def act(stats, state, timestep, k):
            b = state.step.shape[0]
            return act_batch(params, state, timestep, jax.random.split(k, b)), stats, None

        def record(stats, tr: Transition):
            return stats.update(tr.next_timestep), None

        keys = jax.random.split(key, num_steps)
        state, timestep, stats, _ = scan_rollout(env, params, act, state, timestep, stats,
                                                 keys, record=record)
        return state, timestep, stats

    return rollout


EVENTS = ("collided", "offroad", "goal_reached")


def first_episode_events(env: Env, controller: Controller):
    """One episode on each of the given scenarios, ``controller`` driving: which agents
    were controlled and which had each event while acting.

    Returns ``events(params, scenario_ids) -> dict`` (jit it at the call site):
    ``controlled`` and every name of ``EVENTS``, each (N, A) bool for N scenario ids;
    an event counts at the steps an agent acts in the first episode (``env.reset_to``
    with key 0; the auto-reset's next episode is ignored).
    """
    steps = env.config.num_episode_steps

    def episode(params: EnvParams, sid: jax.Array):
        state, ts = env.reset_to(params, sid, jax.random.key(0))

        def body(carry, _):
            state, ts, ended = carry
            live = state.active & ~ended
            nxt, nts = env.step(params, state, controller(params, state, ts, None))
            m = nts.info.metrics
            return (nxt, nts, ended | nts.info.episode_done), {k: m[k] & live for k in EVENTS}

        _, out = jax.lax.scan(body, (state, ts, jnp.asarray(False)), None, steps)
        return {"controlled": state.active, **{k: v.any(0) for k, v in out.items()}}

    return jax.vmap(episode, in_axes=(None, 0))

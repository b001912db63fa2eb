"""Recorded rollouts: frames come out of the same jitted scan as the env steps.

A ``Recorder`` compiles one function that advances ``B`` environments by ``chunk_steps``
steps (``lax.scan``: render every view of the current state, act, step) and returns that
chunk's frames and overlay facts. The host calls it until the requested number of
frames is out, handing each chunk to a sink (video encoders, a PNG grabber), so memory
holds at most one chunk of frames however long the episode. Frame ``i`` shows the state
after ``i`` steps: frame index = step index; traffic lights show their state at that
state's log step (``init_step + trial_step``, so they rewind with a trial restart).

A recording can also replay a rollout recorded elsewhere (an evaluator's): started from
that rollout's reset keys (``record(..., reset_keys=...)``) and driven by
``replay_actor`` with its actions as the parameters, it shows exactly the same
episodes (the env's own randomness, auto-resets included, comes from the reset keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdrive.agents.actors import Actor, controller_actor, policy_actor  # noqa: F401 (re-export)
from jaxdrive.agents.rollout import Transition, scan_rollout
from jaxdrive.config import ConfigBase, ConfigError, check_choice, check_int, check_range
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.render.raster import EGO_METRES_PER_PIXEL, VIEWS, RenderConfig, render_state
from jaxdrive.types import EntityKind


@dataclasses.dataclass(frozen=True)
class VideoConfig(ConfigBase):
    """What a recording draws and how it is chunked.

    Attributes:
      every: in training, record every this many iterations (0 = never).
      num_envs: environments recorded side by side (one video each per view).
      num_steps: frames per video; 0 = one whole episode (every trial in trial mode).
      views: ``scene`` and/or ``ego`` (one video per env per view).
      width, height: pixels (even: the H.264 encoder needs it).
      ego_metres_per_pixel: scale of the ego view (the scene view fits the map).
      ego_agent: agent slot the ego view follows.
      fps: frames per second of the mp4.
      chunk_steps: frames computed per device call and held in memory at once.
      trail_steps: past positions drawn behind each agent (0 = no trails).
      overlay: draw step, trial and counts on the frames (host side).
    """

    every: int = 0
    num_envs: int = 2
    num_steps: int = 0
    views: tuple[str, ...] = ("scene", "ego")
    width: int = 256
    height: int = 256
    ego_metres_per_pixel: float = EGO_METRES_PER_PIXEL
    ego_agent: int = 0
    fps: int = 10
    chunk_steps: int = 16
    trail_steps: int = 10
    overlay: bool = True

    def __post_init__(self):
        check_int("every", self.every, 0, None)
        check_int("num_envs", self.num_envs, 1, 4096)
        check_int("num_steps", self.num_steps, 0, 1_000_000)
        if not self.views or len(set(self.views)) != len(self.views):
            raise ConfigError(f"config key 'views' = {list(self.views)} must list distinct "
                              f"views out of {list(VIEWS)}.")
        for v in self.views:
            check_choice("views", v, VIEWS)
        for name in ("width", "height"):
            check_int(name, getattr(self, name), 2, 8192)
            if getattr(self, name) % 2:
                raise ConfigError(f"config key '{name}' = {getattr(self, name)} must be even "
                                  "(H.264 video needs even frame sizes).")
        check_range("ego_metres_per_pixel", self.ego_metres_per_pixel, 0.0, None,
                    lo_open=True)
        check_int("ego_agent", self.ego_agent, 0)
        check_int("fps", self.fps, 1, 240)
        check_int("chunk_steps", self.chunk_steps, 1, 100_000)
        check_int("trail_steps", self.trail_steps, 0, 1000)

    def render_configs(self) -> tuple[RenderConfig, ...]:
        """One ``RenderConfig`` per view, in ``views`` order."""
        out = []
        for v in self.views:
            mpp = self.ego_metres_per_pixel if v == "ego" else None
            out.append(RenderConfig(width=self.width, height=self.height, view=v,
                                    metres_per_pixel=mpp, ego_agent=self.ego_agent))
        return tuple(out)


@struct.dataclass
class FrameInfo:
    """Per-frame facts for the overlay, each (C, B) int32 for a chunk of C frames.

    Attributes:
      step: steps taken in the episode (the env's ``state.step``).
      trial: trial index (0 outside trial mode).
      controlled: controlled agents present.
      at_goal: controlled agents that reached their goal in this trial.
      collided, offroad: controlled agents colliding / off the road in this frame.
    """

    step: jax.Array
    trial: jax.Array
    controlled: jax.Array
    at_goal: jax.Array
    collided: jax.Array
    offroad: jax.Array


@struct.dataclass
class RecordCarry:
    """What the recording scan carries between chunks (B environments, K trail slots)."""

    state: EnvState
    timestep: TimeStep
    actor: Any
    trail_xy: jax.Array  # (B, A, K, 2) float32, newest first
    trail_valid: jax.Array  # (B, A, K) bool
    key: jax.Array


class Recorder:
    """Compiled recording of ``num_envs`` environments (see the module doc).

    ``start(params, env_params, scenario_ids, key, reset_keys=None)`` resets env ``b``
    to pool scenario ``scenario_ids[b]`` (with ``reset_keys[b]`` when given, else a key
    split from ``key``); ``chunk(params, env_params, carry)`` returns the next carry,
    frames (C, B, V, H, W, 3) uint8 and a ``FrameInfo``. Each is compiled once per
    argument shapes.
    """

    def __init__(self, env: Env, actor: Actor, config: VideoConfig):
        self.env = env
        self.actor = actor
        self.config = config
        self.views = config.render_configs()
        self.start = jax.jit(self._start)
        self.chunk = jax.jit(self._chunk, donate_argnums=2)

    @property
    def num_trials(self) -> int:
        """() int: trials per episode (``num_trials`` in trial mode, else 1)."""
        c = self.env.config
        return c.num_trials if c.goal_behavior == "trial" else 1

    def _start(self, params, env_params: EnvParams, scenario_ids: jax.Array, key: jax.Array,
               reset_keys: jax.Array | None = None):
        del params
        k_reset, k_run = jax.random.split(key)
        b = scenario_ids.shape[0]
        keys = jax.random.split(k_reset, b) if reset_keys is None else reset_keys
        state, ts = jax.vmap(self.env.reset_to, in_axes=(None, 0, 0))(
            env_params, scenario_ids.astype(jnp.int32), keys)
        a, k = self.env.config.scenario.max_agents, max(1, self.config.trail_steps)
        return RecordCarry(
            state=state, timestep=ts, actor=self.actor.init(b),
            trail_xy=jnp.zeros((b, a, k, 2), jnp.float32),
            trail_valid=jnp.zeros((b, a, k), bool), key=k_run,
        )

    def _frames(self, env_params, state: EnvState, timestep: TimeStep, trail_xy,
                trail_valid) -> jax.Array:
        """(B, V, H, W, 3) uint8: every view of every env's current state, its traffic
        lights in their state at the env's log step (``init_step + trial_step``)."""
        trails = trail_xy, trail_valid
        if self.config.trail_steps == 0:
            trails = None, None
        log_step = (self.env.config.init_step + state.trial_step).astype(jnp.int32)  # (B,)
        axes = (None, None, 0, 0, 0 if trails[0] is not None else None,
                0 if trails[1] is not None else None, 0)
        views = [
            jax.vmap(render_state, in_axes=axes)(view, env_params, state, timestep, *trails,
                                                 log_step)
            for view in self.views
        ]
        return jnp.stack(views, axis=1)

    @staticmethod
    def _info(state: EnvState, ts: TimeStep) -> FrameInfo:
        controlled = (state.kind == EntityKind.CONTROLLED) & state.agents.valid & ~state.removed
        current = ~(ts.info.episode_done | ts.info.trial_done)[:, None]
        count = lambda m: jnp.sum(m & controlled, axis=-1).astype(jnp.int32)
        return FrameInfo(
            step=state.step.astype(jnp.int32), trial=state.trial.astype(jnp.int32),
            controlled=count(controlled), at_goal=count(state.reached),
            collided=count(ts.info.metrics.collided & current),
            offroad=count(ts.info.metrics.offroad & current),
        )

    def _chunk(self, params, env_params: EnvParams, carry: RecordCarry):
        """The next ``chunk_steps`` frames: each step renders the current state, then acts
        and steps (the rollout core, ``jaxdrive.agents.rollout.scan_rollout``)."""

        def act(c, state, ts, _):
            actor_carry, trail_xy, trail_valid, key = c
            key, k_act = jax.random.split(key)
            action, actor_carry = self.actor.act(params, actor_carry, env_params, state, ts,
                                                 k_act)
            return action, (actor_carry, trail_xy, trail_valid, key), None

        def keep(c, tr: Transition):
            actor_carry, trail_xy, trail_valid, key = c
            frames = self._frames(env_params, tr.state, tr.timestep, trail_xy, trail_valid)
            info = self._info(tr.state, tr.timestep)
            # The trail holds the positions of earlier frames of the same trial.
            present = tr.state.agents.valid & ~tr.state.removed
            trail_xy = jnp.concatenate([tr.state.agents.xy[:, :, None], trail_xy[:, :, :-1]],
                                       axis=2)
            trail_valid = jnp.concatenate([present[:, :, None], trail_valid[:, :, :-1]],
                                          axis=2)
            info_next = tr.next_timestep.info
            restart = (info_next.episode_done | info_next.trial_done)[:, None, None]
            trail_valid = trail_valid & ~restart
            return (actor_carry, trail_xy, trail_valid, key), (frames, info)

        state, ts, (actor_carry, trail_xy, trail_valid, key), outs = scan_rollout(
            self.env, env_params, act, carry.state, carry.timestep,
            (carry.actor, carry.trail_xy, carry.trail_valid, carry.key), record=keep,
            length=self.config.chunk_steps)
        return RecordCarry(state=state, timestep=ts, actor=actor_carry, trail_xy=trail_xy,
                           trail_valid=trail_valid, key=key), outs


def replay_actor(env: Env) -> Actor:
    """An ``Actor`` replaying recorded actions: its parameters are the (B, T, A, ...)
    actions, its carry the step; step t takes ``actions[:, t]`` (the last one past T)."""
    del env

    def act(actions, t, env_params, state, timestep, key):
        del env_params, state, timestep, key
        i = jnp.minimum(t, actions.shape[1] - 1)
        return jax.lax.dynamic_index_in_dim(actions, i, axis=1, keepdims=False), t + 1

    return Actor(init=lambda num_envs: jnp.zeros((), jnp.int32), act=act)


Sink = Callable[[int, np.ndarray, FrameInfo], None]


def record(recorder: Recorder, params, env_params: EnvParams, scenario_ids, num_frames: int,
           sink: Sink, key: jax.Array, progress: Callable[[int], None] | None = None,
           reset_keys: jax.Array | None = None) -> int:
    """Run the recording and hand its frames to ``sink`` chunk by chunk.

    Args:
      recorder: the compiled recording.
      params: the actor's parameters (ignored by controllers).
      env_params: the env's params (its pool holds the scenarios).
      scenario_ids: (B,) int, pool scenario of each recorded env.
      num_frames: frames per env; the last chunk is cut to fit.
      sink: ``sink(first_frame, frames (n, B, V, H, W, 3) uint8, info (n, B))`` on the
        host, called with consecutive chunks, ``n <= chunk_steps``.
      key: PRNG key (resets and sampled actions).
      progress: optional ``progress(frames_done)`` after each chunk.
      reset_keys: optional (B,) PRNG keys each env is reset with (those of a rollout
        being replayed); default: split from ``key``.
    Returns:
      the number of frames delivered (``num_frames``).
    """
    if num_frames < 1:
        raise ConfigError(f"record needs at least one frame, got num_frames={num_frames}.")
    ids = jnp.asarray(scenario_ids, jnp.int32)
    if ids.shape != (recorder.config.num_envs,):
        raise ConfigError(f"scenario_ids has shape {tuple(ids.shape)}, expected "
                          f"({recorder.config.num_envs},) = (video num_envs,).")
    carry = recorder.start(params, env_params, ids, key, reset_keys)
    done = 0
    while done < num_frames:
        carry, (frames, info) = recorder.chunk(params, env_params, carry)
        frames, info = jax.device_get((frames, info))
        n = min(frames.shape[0], num_frames - done)
        sink(done, frames[:n], jax.tree.map(lambda x, n=n: x[:n], info))
        done += n
        if progress is not None:
            progress(done)
    return done

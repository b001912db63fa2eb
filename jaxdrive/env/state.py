"""The environment's pytrees: traced parameters, per-env state, what a step returns."""

from __future__ import annotations

import jax
from flax import struct

from jaxdrive.env.rewards import RewardWeights
from jaxdrive.metrics.episode import EpisodeStats
from jaxdrive.metrics.step import StepMetrics
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.sim.trials import TrialStats
from jaxdrive.types import AgentState, EntityKind, Observation, Role


@struct.dataclass
class EnvParams:
    """Traced parameters of the environment: the scenario pool and reward weights."""

    pool: ScenarioPool
    reward: RewardWeights


@struct.dataclass
class Background:
    """The objects of one environment's scene around its packed agent rows.

    Attributes:
      obj_index: (C,) int32, the object slot of each agent row (N: the row is empty).
      obj_row: (N,) int32, the agent row holding each object (C: none).
      kind: (N,) int32 ``EntityKind`` of each object for this episode (``CONTROLLED``:
        in a row; controllable objects beyond C replay their log as ``EXPERT``).
      agents: ``AgentState`` (N,) of the objects outside the rows at the state's log
        step (experts as logged, static objects at their initial pose, still); entries
        of objects in rows are not read.
      trig: ``(cos(yaw), sin(yaw))`` of ``agents``, (N,) each.
      length, width: (N,) float32; obj_type: (N,) int32.
    """

    obj_index: jax.Array
    obj_row: jax.Array
    kind: jax.Array
    agents: AgentState
    trig: tuple[jax.Array, jax.Array]
    length: jax.Array
    width: jax.Array
    obj_type: jax.Array


@struct.dataclass
class EnvState:
    """The changing state of one environment.

    Attributes:
      scenario_id: () int32, index into the pool.
      step: () int32, steps taken in this episode (log index = init_step + step).
      agents: ``AgentState`` (A agents).
      kind: (A,) int32, ``EntityKind``.
      role: (A,) int32, ``Role`` of each controlled agent (``EGO`` elsewhere).
      length, width: (A,) float32; obj_type: (A,) int32; goal: (A, 2) float32.
      done: (A,) bool, controlled agents that no longer act (terminated, or out of the
        current trial).
      removed: (A,) bool, agents taken out of the scene.
      reached: (A,) bool, agents that reached their goal in the current trial.
      goal_distance: (A,) float32, for progress.
      trial: () int32, index of the current trial (0 outside trial mode).
      trial_start: () int32, ``step`` at which the current trial began; experts replay
        log step ``init_step + step - trial_start``.
      episode: ``EpisodeStats``.
      trials: ``TrialStats`` of the current episode.
      key: PRNG key for auto-reset and goal sampling.
      background: with packed agent rows (``EnvConfig.max_controlled`` = C) the scene's
        N objects around the rows (``Background``), and the per-agent fields above have
        C rows, not A; None when every object slot is its own row (A = N).
    """

    scenario_id: jax.Array
    step: jax.Array
    agents: AgentState
    kind: jax.Array
    role: jax.Array
    length: jax.Array
    width: jax.Array
    obj_type: jax.Array
    goal: jax.Array
    done: jax.Array
    removed: jax.Array
    reached: jax.Array
    goal_distance: jax.Array
    trial: jax.Array
    trial_start: jax.Array
    episode: EpisodeStats
    trials: TrialStats
    key: jax.Array
    background: Background | None = None

    @property
    def obj_index(self) -> jax.Array | None:
        """(C,) int32 object slot of each packed agent row (N: the row is empty); None
        without packed rows."""
        return None if self.background is None else self.background.obj_index

    @property
    def controlled(self) -> jax.Array:
        """(A,) bool: agents driven by an action (``EntityKind.CONTROLLED``), done or not."""
        return self.kind == EntityKind.CONTROLLED

    @property
    def active(self) -> jax.Array:
        """(A,) bool: controlled agents that act on the next step."""
        return self.controlled & ~self.done

    @property
    def ego(self) -> jax.Array:
        """(A,) bool: controlled agents driven by the learning policy."""
        return self.controlled & (self.role == Role.EGO)

    @property
    def co_player(self) -> jax.Array:
        """(A,) bool: controlled agents driven by a frozen partner policy."""
        return self.controlled & (self.role == Role.CO_PLAYER)

    @property
    def trial_step(self) -> jax.Array:
        """() int32: steps since the current trial began (= ``step`` outside trial mode)."""
        return self.step - self.trial_start


@struct.dataclass
class StepInfo:
    """What a step produced besides the RL core (one typed record).

    Attributes:
      metrics: ``StepMetrics`` of the state the step reached (before any reset).
      terminal: ``AgentState`` the step reached, before any auto-reset or trial restart
        (what the metrics were computed on).
      trial_ended: (A,) bool, a trial ended on this step (trial mode; every controlled
        agent, the last trial included).
      episode_done: () bool, the episode ended on this step and the env was reset.
      trial_done: () bool, a trial ended on this step (trial mode; also when the env has
        no controlled agent; equal to ``episode_done`` outside trial mode).
      episode: ``EpisodeStats`` of the episode that ended (meaningful when
        ``episode_done``).
      episode_controlled: (A,) bool, controlled agents of that episode.
      episode_ego: (A,) bool, its ego agents (``episode_controlled`` minus co-players).
      trials: ``TrialStats`` of the episode that ended (meaningful when ``episode_done``).
    """

    metrics: StepMetrics
    terminal: AgentState
    trial_ended: jax.Array
    episode_done: jax.Array
    trial_done: jax.Array
    episode: EpisodeStats
    episode_controlled: jax.Array
    episode_ego: jax.Array
    trials: TrialStats


@struct.dataclass
class TimeStep:
    """What a step (or reset) returns besides the state: the RL core and one info record.

    Attributes:
      obs: ``Observation`` for choosing the next action.
      reward: (A,) float32, for the step just taken (zero at reset).
      terminated: (A,) bool, absorbing end for that agent on this step (in trial mode:
        the episode's last trial ended, for every controlled agent).
      truncated: (A,) bool, the episode's time limit (or its early end) cut the agent off;
        in trial mode, a trial other than the last ended.
      first: () bool, ``obs`` is the first of an episode (reset or auto-reset): a
        policy's memory starts afresh here, and only here.
      active: (A,) bool, agents whose next action counts (controlled and not done).
      removed: (A,) bool, agents removed in ``obs``'s state (their observations are
        garbage for the policy's memory).
      info: ``StepInfo``.

    Roles and the trial index of ``obs``'s episode are read from the state
    (``EnvState.ego``, ``.co_player``, ``.trial``).
    """

    obs: Observation
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    first: jax.Array
    active: jax.Array
    removed: jax.Array
    info: StepInfo

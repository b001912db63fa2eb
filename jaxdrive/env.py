"""The driving environment: pure ``reset``/``step`` over one scenario, vmapped over a batch.

One environment plays one scenario of a device-resident ``ScenarioPool``. Its state
holds only what changes (agent kinematics, flags, episode statistics) and the index of
its scenario; static scenario data stays in the pool and is gathered where needed, so
an auto-reset is a gather of the new scenario's initial step, not a rebuild.

Per step: controlled agents move by the dynamics model, experts replay their log,
static agents stay; then metrics are computed once (collision, off-road, goal,
progress), rewards and events derived from them, collision and goal behaviours applied,
and the episode ends at its time limit (``truncated``) or when every controlled agent
is done. Absorbing per-agent events (stopping at a goal, a collision under ``stop`` or
``remove``) emit ``terminated``. The step that ends an episode returns the new
episode's first observation (auto-reset) with the ending step's rewards and flags.

Multi-trial episodes (``goal_behavior: trial``): an episode is ``num_trials`` trials of
one scenario on one clock per environment. A controlled agent that reaches its goal is
removed (parked off the map, invisible, not collidable, no further reward) until the
trial ends; collisions under ``stop``/``remove`` take an agent out of the trial the same
way. A trial ends when no controlled agent is left acting or after ``trial_timeout``
steps; then every entity returns to the scenario's initial state (experts' replay clocks
rewind) and ``truncated`` and ``trial_ended`` fire for every controlled agent. The K-th
trial's end emits ``terminated`` for every controlled agent and auto-resets. Per-agent
events never terminate in this mode: memory is reset only between episodes. Since the
env auto-resets at once, the "episode ended" flag is the step's ``episode_done``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_choice,
    check_int,
    check_interval,
    check_range,
)
from jaxdrive.metrics import StepMetrics, compute_metrics
from jaxdrive.observation import ObservationConfig, observe
from jaxdrive.rewards import RewardConfig, RewardWeights, reward
from jaxdrive.scenarios.base import ScenarioConfig, validate_scenario
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.sim import geometry
from jaxdrive.sim.dynamics import DynamicsConfig, apply_action, make_dynamics
from jaxdrive.sim.road_index import RoadIndexConfig
from jaxdrive.trials import TrialStats
from jaxdrive.types import AgentState, EntityKind, ObjectType, Observation, RoadType, Role

CONTROL_MODES = ("all", "sdc", "fraction")
COLLISION_BEHAVIORS = ("ignore", "stop", "remove")
GOAL_BEHAVIORS = ("respawn", "new_goal", "stop", "trial")
# Where removed agents are parked: far outside any map, never collidable or observed.
REMOVED_XY = -1.0e5
_OBJECT_TYPE_NAMES = {t.name.lower(): int(t) for t in ObjectType if t != ObjectType.UNSET}


@dataclasses.dataclass(frozen=True)
class EnvConfig(ConfigBase):
    """Everything static about an environment (shapes, behaviours, model choices).

    Attributes:
      scenario, dynamics, observation, reward, road_index: per-concern configs.
      control_mode: ``all`` valid objects of ``controlled_types`` (self-play); ``sdc``
        only the self-driving car (everyone else replays the log); ``fraction`` each
        controllable object with probability ``controlled_fraction`` (the SDC always).
        Objects that start within ``goal_radius`` of their goal are never controlled.
      controlled_types: object types the policy may drive (``vehicle``, ``pedestrian``,
        ``cyclist``, ``other``).
      collision_behavior: ``ignore`` (only counted), ``stop`` (the agent freezes in place
        and terminates), ``remove`` (the agent leaves the scene and terminates).
      goal_behavior: ``respawn`` (back to its initial pose, same goal), ``new_goal`` (a new
        goal on a lane ahead), ``stop`` (freezes at the goal and terminates), ``trial``
        (removed until the trial ends; multi-trial episodes, see the module doc).
      num_trials: K, trials per episode under ``trial`` (1 = an ordinary episode).
      trial_timeout: steps per trial under ``trial``; ``None`` = ``episode_length``
        (default the rest of the log).
      co_player_fraction: each controlled agent but one (the SDC if controlled, else the
        first) is a co-player (``Role.CO_PLAYER``, driven by a frozen partner policy and
        never scored) with this probability; the rest are ego agents.
      goal_radius: metres from the goal that count as reaching it.
      new_goal_distance: [low, high] metres for ``new_goal`` sampling.
      init_step: logged step at which episodes start (10 = 1.1 s of history in WOMD).
      episode_length: steps per episode; ``None`` = the rest of the log
        (``num_steps - 1 - init_step``).
      static_threshold: a non-controlled object that moves less than this many metres
        over the episode in its log (and starts slower than this in m/s) is held
        static instead of replayed.
    """

    scenario: ScenarioConfig = ScenarioConfig()
    dynamics: DynamicsConfig = DynamicsConfig()
    observation: ObservationConfig = ObservationConfig()
    reward: RewardConfig = RewardConfig()
    road_index: RoadIndexConfig = RoadIndexConfig()
    control_mode: str = "all"
    controlled_fraction: float = 0.5
    controlled_types: tuple[str, ...] = ("vehicle",)
    collision_behavior: str = "ignore"
    goal_behavior: str = "stop"
    num_trials: int = 1
    trial_timeout: int | None = None
    co_player_fraction: float = 0.0
    goal_radius: float = 2.0
    new_goal_distance: tuple[float, float] = (10.0, 60.0)
    init_step: int = 10
    episode_length: int | None = None
    static_threshold: float = 0.5

    def __post_init__(self):
        check_choice("control_mode", self.control_mode, CONTROL_MODES)
        check_range("controlled_fraction", self.controlled_fraction, 0.0, 1.0)
        if not isinstance(self.controlled_types, tuple) or not self.controlled_types:
            raise ConfigError(
                "config key 'controlled_types' must be a non-empty list of object types, "
                f"e.g. [vehicle]; got {self.controlled_types!r}."
            )
        for name in self.controlled_types:
            check_choice("controlled_types", name, tuple(_OBJECT_TYPE_NAMES))
        check_choice("collision_behavior", self.collision_behavior, COLLISION_BEHAVIORS)
        check_choice("goal_behavior", self.goal_behavior, GOAL_BEHAVIORS)
        check_range("goal_radius", self.goal_radius, 0.0, None, lo_open=True)
        check_interval("new_goal_distance", self.new_goal_distance, 0.0, None)
        check_range("static_threshold", self.static_threshold, 0.0, None)
        t = self.scenario.num_steps
        check_int("init_step", self.init_step, 0, t - 2)
        if self.episode_length is not None:
            check_int("episode_length", self.episode_length, 1, t - 1 - self.init_step)
        check_int("num_trials", self.num_trials, 1, 1024)
        check_range("co_player_fraction", self.co_player_fraction, 0.0, 1.0)
        if self.trial_timeout is not None:
            check_int("trial_timeout", self.trial_timeout, 1, t - 1 - self.init_step)
        if self.goal_behavior != "trial" and (self.num_trials != 1
                                              or self.trial_timeout is not None):
            raise ConfigError(
                "config keys 'num_trials' / 'trial_timeout' only apply with "
                f"goal_behavior: trial (got goal_behavior: {self.goal_behavior}); set "
                "goal_behavior: trial or remove them."
            )
        if self.observation.num_road > self.road_index.road_per_cell:
            raise ConfigError(
                f"config key 'observation.num_road' = {self.observation.num_road} exceeds "
                f"'road_index.road_per_cell' = {self.road_index.road_per_cell}; raise "
                "road_per_cell or lower num_road."
            )

    @property
    def num_episode_steps(self) -> int:
        if self.episode_length is not None:
            return self.episode_length
        return self.scenario.num_steps - 1 - self.init_step

    @property
    def trial_length(self) -> int:
        """Steps per trial before the timeout (the episode length outside trial mode)."""
        return self.trial_timeout if self.trial_timeout is not None else self.num_episode_steps


@struct.dataclass
class EnvParams:
    """Traced parameters of the environment: the scenario pool and reward weights."""

    pool: ScenarioPool
    reward: RewardWeights


@struct.dataclass
class EpisodeStats:
    """Per-agent episode accumulators (A,).

    Attributes:
      goal_reached, collided, offroad: bool, happened at least once while acting.
      return_: float32, sum of rewards.
      length: int32, steps the agent acted.
    """

    goal_reached: jax.Array
    collided: jax.Array
    offroad: jax.Array
    return_: jax.Array
    length: jax.Array

    @classmethod
    def zeros(cls, num_agents: int) -> EpisodeStats:
        b = jnp.zeros((num_agents,), bool)
        return cls(b, b, b, jnp.zeros((num_agents,), jnp.float32),
                   jnp.zeros((num_agents,), jnp.int32))


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

    @property
    def controlled(self) -> jax.Array:
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
class TimeStep:
    """What a step (or reset) returns besides the state.

    Attributes:
      obs: ``Observation`` for choosing the next action.
      active: (A,) bool, agents whose next action counts (controlled and not done).
      reward: (A,) float32, for the step just taken (zero at reset).
      terminated: (A,) bool, absorbing end for that agent on this step (in trial mode:
        the episode's last trial ended, for every controlled agent).
      truncated: (A,) bool, the episode's time limit (or its early end) cut the agent off;
        in trial mode, a trial other than the last ended.
      trial_ended: (A,) bool, a trial ended on this step (trial mode; every controlled
        agent, the last trial included).
      metrics: ``StepMetrics`` of the state the step reached (before any auto-reset).
      episode_done: () bool, the episode ended on this step and the env was reset.
      trial_done: () bool, a trial ended on this step (trial mode; also when the env has
        no controlled agent; equal to ``episode_done`` outside trial mode).
      episode: ``EpisodeStats`` of the episode that ended (meaningful when
        ``episode_done``; use ``episode_mask`` for the agents that count).
      episode_mask: (A,) bool, controlled agents of the ended episode.
      episode_ego: (A,) bool, its ego agents (``episode_mask`` minus co-players).
      trials: ``TrialStats`` of the episode that ended (meaningful when ``episode_done``).
      first: () bool, ``obs`` is the first of an episode (reset or auto-reset): a
        policy's memory starts afresh here, and only here.
      trial: () int32, trial index of ``obs``.
      removed: (A,) bool, agents removed in ``obs``'s state (their observations are
        garbage for the policy's memory).
      ego, co_player: (A,) bool, roles in ``obs``'s episode.
    """

    obs: Observation
    active: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    trial_ended: jax.Array
    metrics: StepMetrics
    episode_done: jax.Array
    trial_done: jax.Array
    episode: EpisodeStats
    episode_mask: jax.Array
    episode_ego: jax.Array
    trials: TrialStats
    first: jax.Array
    trial: jax.Array
    removed: jax.Array
    ego: jax.Array
    co_player: jax.Array


class Env:
    """Driving environment with static configuration; all methods are pure functions.

    Use ``reset``/``step`` for one environment and ``jax.vmap`` (or ``reset_batch``/
    ``step_batch``) for many. Jit at the outer edge.
    """

    def __init__(self, config: EnvConfig | None = None):
        self.config = config or EnvConfig()
        self.dynamics = make_dynamics(self.config.dynamics)
        self._controlled_types = tuple(
            _OBJECT_TYPE_NAMES[n] for n in self.config.controlled_types
        )

    # ------------------------------------------------------------------ params
    def make_params(self, pool: ScenarioPool) -> EnvParams:
        """Check the pool against the config and bundle it with the reward weights."""
        validate_scenario(pool.scenarios, self.config.scenario, batch_dims=1)
        got_m = pool.road_index.road_per_cell
        if got_m < self.config.observation.num_road:
            raise ConfigError(
                f"pool road index lists {got_m} road points per cell but "
                f"observation.num_road = {self.config.observation.num_road}; build the pool "
                "with the env's road_index config: make_pool(scenarios, env.config.road_index)."
            )
        return EnvParams(pool=pool, reward=self.config.reward.weights())

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Per-agent action shape: () for discrete indices, (action_dim,) continuous."""
        if self.config.dynamics.action_space == "discrete":
            return ()
        return (self.dynamics.action_dim,)

    @property
    def num_actions(self) -> int:
        return self.dynamics.num_actions

    # ------------------------------------------------------------------ reset
    def reset(self, params: EnvParams, key: jax.Array) -> tuple[EnvState, TimeStep]:
        """Start an episode on a random scenario of the pool."""
        k_sid, k_state = jax.random.split(key)
        sid = jax.random.randint(k_sid, (), 0, params.pool.size, dtype=jnp.int32)
        return self.reset_to(params, sid, k_state)

    def reset_to(
        self, params: EnvParams, scenario_id: jax.Array, key: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Start an episode on scenario ``scenario_id`` of the pool."""
        state = self._initial_state(params, jnp.asarray(scenario_id, jnp.int32), key)
        a = self.config.scenario.max_agents
        zeros_b = jnp.zeros((a,), bool)
        metrics = StepMetrics(
            collided=zeros_b, offroad=zeros_b, goal_reached=zeros_b,
            goal_distance=state.goal_distance, progress=jnp.zeros((a,), jnp.float32),
        )
        partial = TimeStep(
            obs=None, active=None, reward=jnp.zeros((a,), jnp.float32),
            terminated=zeros_b, truncated=zeros_b, trial_ended=zeros_b, metrics=metrics,
            episode_done=jnp.asarray(False), trial_done=jnp.asarray(False),
            episode=EpisodeStats.zeros(a),
            episode_mask=zeros_b, episode_ego=zeros_b, trials=state.trials,
            first=None, trial=None, removed=None, ego=None, co_player=None,
        )
        return state, self._finish(params, state, partial)

    def _log_state(self, params: EnvParams, sid: jax.Array, t: jax.Array) -> AgentState:
        obj = params.pool.scenarios.objects
        a = self.config.scenario.max_agents
        return AgentState(
            xy=obj.xy[sid, :, t],
            yaw=obj.yaw[sid, :, t],
            vel=obj.vel[sid, :, t],
            steer=jnp.zeros((a,), jnp.float32),
            accel=jnp.zeros((a,), jnp.float32),
            valid=obj.valid[sid, :, t],
        )

    def _initial_state(self, params: EnvParams, sid: jax.Array, key: jax.Array) -> EnvState:
        cfg = self.config
        obj = params.pool.scenarios.objects
        a = cfg.scenario.max_agents
        if cfg.co_player_fraction > 0:
            key, k_frac, k_role = jax.random.split(key, 3)
        else:
            key, k_frac = jax.random.split(key)
        t0 = cfg.init_step
        t_end = t0 + cfg.trial_length
        agents = self._log_state(params, sid, t0)
        obj_type = obj.type[sid]
        is_sdc = obj.is_sdc[sid]
        type_ok = jnp.zeros((a,), bool)
        for t in self._controlled_types:
            type_ok = type_ok | (obj_type == t)
        goal = obj.goal[sid]
        goal_distance = jnp.linalg.norm(goal - agents.xy, axis=-1).astype(jnp.float32)
        # An object that starts on its goal has nothing to learn; it replays instead.
        controllable = agents.valid & type_ok & (goal_distance > cfg.goal_radius)
        if cfg.control_mode == "all":
            controlled = controllable
        elif cfg.control_mode == "sdc":
            controlled = controllable & is_sdc
        else:
            draw = jax.random.uniform(k_frac, (a,)) < cfg.controlled_fraction
            controlled = controllable & (draw | is_sdc)
        moved = jnp.linalg.norm(obj.xy[sid, :, t_end] - agents.xy, axis=-1)
        still = (
            agents.valid & obj.valid[sid, :, t_end]
            & (moved < cfg.static_threshold)
            & (jnp.linalg.norm(agents.vel, axis=-1) < cfg.static_threshold)
        )
        ever_valid = jnp.any(obj.valid[sid], axis=-1)
        kind = jnp.select(
            [controlled, still, ever_valid],
            [EntityKind.CONTROLLED, EntityKind.STATIC, EntityKind.EXPERT],
            EntityKind.INVALID,
        ).astype(jnp.int32)
        role = jnp.full((a,), int(Role.EGO), jnp.int32)  # int(): an IntEnum fill is weakly typed
        if cfg.co_player_fraction > 0:
            # One controlled agent (the SDC if controlled, else the first) stays ego.
            anchor_sdc = controlled & is_sdc
            anchor = jnp.argmax(jnp.where(jnp.any(anchor_sdc), anchor_sdc, controlled))
            draw = jax.random.uniform(k_role, (a,)) < cfg.co_player_fraction
            co = controlled & draw & (jnp.arange(a) != anchor)
            role = jnp.where(co, Role.CO_PLAYER, role).astype(jnp.int32)
        zeros_b = jnp.zeros((a,), bool)
        state = EnvState(
            scenario_id=sid,
            step=jnp.zeros((), jnp.int32),
            agents=self._initial_agents(agents, kind),
            kind=kind,
            role=role,
            length=obj.length[sid],
            width=obj.width[sid],
            obj_type=obj_type,
            goal=goal,
            done=zeros_b,
            removed=zeros_b,
            reached=zeros_b,
            goal_distance=goal_distance,
            trial=jnp.zeros((), jnp.int32),
            trial_start=jnp.zeros((), jnp.int32),
            episode=EpisodeStats.zeros(a),
            trials=None,
            key=key,
        )
        return state.replace(trials=TrialStats.zeros(cfg.num_trials, state.ego, state.co_player))

    @staticmethod
    def _initial_agents(logged: AgentState, kind: jax.Array) -> AgentState:
        """The agents' state at an episode's (and every trial's) start, from the log
        at ``init_step``; static objects use zero velocity so that observations match
        their behaviour."""
        return logged.replace(vel=jnp.where((kind == EntityKind.STATIC)[:, None], 0.0,
                                            logged.vel))

    def _restart_trial(self, params: EnvParams, state: EnvState) -> EnvState:
        """The next trial's first state: every entity back to the initial state, the
        trial clock restarted at the current step."""
        logged = self._log_state(params, state.scenario_id, jnp.int32(self.config.init_step))
        agents = self._initial_agents(logged, state.kind)
        zeros_b = jnp.zeros_like(state.done)
        return state.replace(
            agents=agents, done=zeros_b, removed=zeros_b, reached=zeros_b,
            goal_distance=jnp.linalg.norm(state.goal - agents.xy, axis=-1).astype(jnp.float32),
            trial=state.trial + 1, trial_start=state.step,
        )

    # ------------------------------------------------------------------ step
    def _transition(self, params: EnvParams, state: EnvState, action: jax.Array):
        """Everything in a step but the auto-reset and the observation."""
        cfg = self.config
        # Randomness only where used (new goals here, auto-reset later): key splitting
        # runs as its own loop on CPU and would otherwise cost every step.
        key = state.key
        if cfg.goal_behavior == "new_goal":
            key, k_goal = jax.random.split(key)
        sid = state.scenario_id
        acting = state.active
        t_next = cfg.init_step + state.trial_step + 1

        with jax.named_scope("kinematics"):
            moved = apply_action(self.dynamics, cfg.dynamics, state.agents, action, state.length)
            logged = self._log_state(params, sid, t_next)
            kind = state.kind
            expert = kind == EntityKind.EXPERT
            frozen = state.agents.replace(vel=jnp.zeros_like(state.agents.vel))
            agents = _select(acting, moved, _select(expert, logged, frozen))
            # Static and invalid slots keep their state; frozen (done) controlled agents
            # stand still with zero speed.
            agents = _select(kind == EntityKind.STATIC, state.agents, agents)
            agents = agents.replace(valid=jnp.where(expert, logged.valid, state.agents.valid))
            agents = _park_removed(agents, state.removed)
            # Store the new kinematics once: otherwise XLA fuses the dynamics (atan,
            # tan, cos, sin) into every pair and road-point loop that reads positions.
            agents = geometry.materialize(lambda x: x, agents)

        present = agents.valid & ~state.removed
        m = compute_metrics(
            params.pool, sid, agents, present, state.length, state.width, state.goal,
            state.goal_distance, cfg.goal_radius,
        )
        goal_event = m.goal_reached & acting
        collided = m.collided & acting
        offroad = m.offroad & acting
        r = reward(params.reward, goal_event, collided, offroad, m.progress, acting)

        trial_mode = cfg.goal_behavior == "trial"
        # Agents whose episode (trial, in trial mode) stops here.
        out = jnp.zeros_like(acting)
        removed = state.removed
        goal = state.goal
        if cfg.collision_behavior in ("stop", "remove"):
            out = out | collided
        if cfg.collision_behavior == "remove":
            removed = removed | collided
        if cfg.goal_behavior in ("stop", "trial"):
            out = out | goal_event
        if trial_mode:
            removed = removed | goal_event
        elif cfg.goal_behavior == "respawn":
            start = self._log_state(params, sid, jnp.int32(cfg.init_step))
            agents = _select(goal_event, start.replace(valid=agents.valid), agents)
        elif cfg.goal_behavior == "new_goal":
            goal = jnp.where(goal_event[:, None], self._sample_goals(params, sid, agents, k_goal),
                             goal)
        done = state.done | out
        agents = _park_removed(agents, removed)
        stopped = done & ~removed
        agents = agents.replace(vel=jnp.where(stopped[:, None], 0.0, agents.vel))

        step = state.step + 1
        controlled = state.controlled
        reached = state.reached | goal_event
        trials = state.trials
        if trial_mode:
            timed_out = step - state.trial_start >= cfg.trial_length
            trial_end = timed_out | ~jnp.any(controlled & ~done)
            episode_end = trial_end & (state.trial == cfg.num_trials - 1)
            terminated = controlled & episode_end
            truncated = controlled & trial_end & ~episode_end
            trial_ended = controlled & trial_end
            trials = trials.record(state.trial, trial_end, reached, state.ego, state.co_player,
                                   step - state.trial_start, timed_out)
        else:
            terminated = out
            episode_end = (step >= cfg.num_episode_steps) | ~jnp.any(controlled & ~done)
            truncated = controlled & ~done & episode_end
            trial_end = episode_end
            trial_ended = jnp.zeros_like(acting)
        ep = state.episode
        episode = EpisodeStats(
            goal_reached=ep.goal_reached | goal_event,
            collided=ep.collided | collided,
            offroad=ep.offroad | offroad,
            return_=ep.return_ + r,
            length=ep.length + acting.astype(jnp.int32),
        )
        continued = state.replace(
            step=step, agents=agents, goal=goal, done=done, removed=removed, reached=reached,
            goal_distance=jnp.linalg.norm(goal - agents.xy, axis=-1).astype(jnp.float32),
            episode=episode, trials=trials, key=key,
        )
        partial = TimeStep(
            obs=None, active=None, reward=r, terminated=terminated, truncated=truncated,
            trial_ended=trial_ended, metrics=m, episode_done=episode_end, trial_done=trial_end,
            episode=episode,
            episode_mask=controlled, episode_ego=state.ego, trials=trials,
            first=None, trial=None, removed=None, ego=None, co_player=None,
        )
        return continued, partial

    def _boundary(self, params: EnvParams, state: EnvState, partial: TimeStep) -> EnvState:
        """Where the episode ended, the initial state of a random pool scenario (auto-
        reset); in trial mode, where only a trial ended, the next trial's first state."""
        episode_end = partial.episode_done
        if self.config.goal_behavior == "trial":
            trial_end = partial.trial_done
            with jax.named_scope("trial_restart"):
                restarted = self._restart_trial(params, state)
            state = jax.tree.map(lambda r, c: jnp.where(trial_end, r, c), restarted, state)
        with jax.named_scope("auto_reset"):
            key, k_sid, k_state = jax.random.split(state.key, 3)
            new_sid = jax.random.randint(k_sid, (), 0, params.pool.size, dtype=jnp.int32)
            fresh = self._initial_state(params, new_sid, k_state).replace(key=key)
            return jax.tree.map(lambda f, c: jnp.where(episode_end, f, c), fresh, state)

    def _finish(self, params: EnvParams, state: EnvState, partial: TimeStep) -> TimeStep:
        return partial.replace(
            obs=self._observe(params, state), active=state.active, first=state.step == 0,
            trial=state.trial,
            removed=state.removed, ego=state.ego, co_player=state.co_player,
        )

    def step(
        self, params: EnvParams, state: EnvState, action: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Advance one environment by one step (dt = ``dynamics.dt``).

        Args:
          params: ``EnvParams``.
          state: ``EnvState``.
          action: (A,) int32 grid indices (discrete) or (A, action_dim) float32
            (continuous); entries of agents that are not active are ignored.
        Returns:
          (next state, ``TimeStep``); on an episode's last step the state is already the
          next episode's first.
        """
        state, partial = self._transition(params, state, action)
        state = self._boundary(params, state, partial)
        return state, self._finish(params, state, partial)

    def _observe(self, params: EnvParams, state: EnvState) -> Observation:
        visible = state.agents.valid & ~state.removed
        return observe(
            self.config.observation, params.pool, state.scenario_id, state.agents, visible,
            state.length, state.width, state.obj_type, state.goal,
        )

    def _sample_goals(self, params, sid, agents, key) -> jax.Array:
        """(A, 2): a lane-centre point at a distance within ``new_goal_distance``.

        Draws 32 random road points per agent and keeps the first that qualifies; an
        agent with none keeps its current position as goal (it is then reached again at
        once, and a fresh sample is drawn next step).
        """
        rg = params.pool.scenarios.roadgraph
        a = agents.xy.shape[0]
        n_draw = 32
        idx = jax.random.randint(key, (a, n_draw), 0, rg.xy.shape[-2])
        xy = rg.xy[sid, idx]
        d = jnp.linalg.norm(xy - agents.xy[:, None, :], axis=-1)
        lo, hi = self.config.new_goal_distance
        ok = (rg.valid[sid, idx] & (rg.type[sid, idx] == RoadType.LANE_CENTER)
              & (d >= lo) & (d <= hi))
        first = jnp.argmax(ok, axis=-1)
        pick = jnp.take_along_axis(xy, first[:, None, None], axis=1)[:, 0]
        return jnp.where(jnp.any(ok, axis=-1)[:, None], pick, agents.xy)

    # ------------------------------------------------------------------ batches
    @functools.cached_property
    def _reset_batch(self):
        return jax.vmap(self.reset, in_axes=(None, 0))

    @functools.cached_property
    def _step_batch(self):
        transition = jax.vmap(self._transition, in_axes=(None, 0, 0))
        boundary = jax.vmap(self._boundary, in_axes=(None, 0, 0))
        finish = jax.vmap(self._finish, in_axes=(None, 0, 0))

        def step_batch(params, state, action):
            state, partial = transition(params, state, action)
            # Episodes (and trials) end on few steps: skip the reset gathers when none
            # ended (same result as resetting per env, as ``step`` does). ``trial_done``
            # covers episode ends in every mode.
            state = jax.lax.cond(
                jnp.any(partial.trial_done),
                lambda s: boundary(params, s, partial),
                lambda s: s,
                state,
            )
            return state, finish(params, state, partial)

        return step_batch

    def reset_batch(self, params: EnvParams, key: jax.Array, num_envs: int):
        """Reset ``num_envs`` environments (leading axis B)."""
        return self._reset_batch(params, jax.random.split(key, num_envs))

    def step_batch(self, params: EnvParams, state: EnvState, action: jax.Array):
        """Step a batch of environments (state and action with leading axis B).

        Equal to ``jax.vmap(step)`` but computes auto-resets (and trial restarts) only on
        steps where some episode (or trial) ended.
        """
        return self._step_batch(params, state, action)


def _select(mask: jax.Array, a: AgentState, b: AgentState) -> AgentState:
    """Per-agent choice between two ``AgentState``s: ``a`` where ``mask`` (A,)."""

    def pick(x, y):
        m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        return jnp.where(m, x, y)

    return jax.tree.map(pick, a, b)


def _park_removed(agents: AgentState, removed: jax.Array) -> AgentState:
    return agents.replace(
        xy=jnp.where(removed[:, None], REMOVED_XY, agents.xy),
        vel=jnp.where(removed[:, None], 0.0, agents.vel),
        valid=agents.valid & ~removed,
    )

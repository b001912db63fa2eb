"""The driving environment: pure ``reset``/``step`` over one scenario, vmapped over a batch.

One environment plays one scenario of a device-resident ``ScenarioPool``. Its state
holds only what changes (agent kinematics, flags, episode statistics) and the index of
its scenario; static scenario data stays in the pool and is gathered where needed, so
an auto-reset is a gather of the new scenario's initial step, not a rebuild.

Per step: controlled agents move by the dynamics model, experts replay their log,
static agents stay; then metrics are computed once (collision, off-road, goal,
progress, red-light crossings), rewards and events derived from them, collision and goal
behaviours applied, and the episode ends at its time limit (``truncated``) or when every
controlled agent is done. Absorbing per-agent events (stopping at a goal, a collision
under ``stop`` or ``remove``) emit ``terminated``. The step that ends an episode returns
the new episode's first observation (auto-reset) with the ending step's rewards and flags.

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

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxdrive import geometry
from jaxdrive.config import ConfigError
from jaxdrive.env.config import OBJECT_TYPE_NAMES, EnvConfig
from jaxdrive.env.observation import observe
from jaxdrive.env.rewards import reward
from jaxdrive.env.state import Background, EnvParams, EnvState, StepInfo, TimeStep
from jaxdrive.metrics import registry
from jaxdrive.metrics.episode import init_episode, update_episode
from jaxdrive.metrics.step import StepView, compute_metrics, initial_metrics
from jaxdrive.parallel import DATA
from jaxdrive.scenarios.base import validate_scenario
from jaxdrive.scenarios.pool import ScenarioPool
from jaxdrive.sim import behaviors
from jaxdrive.sim.behaviors import REMOVED_XY, park_removed, select
from jaxdrive.sim.dynamics import DynamicsModel, apply_action, check_model, make_dynamics
from jaxdrive.sim.trials import TrialStats, advance_clock
from jaxdrive.types import AgentState, EntityKind, Observation, RoadType, Role, World

__all__ = ["REMOVED_XY", "Env", "episode_steps"]


class Env:
    """Driving environment with static configuration; all methods are pure functions.

    Use ``reset``/``step`` for one environment and ``jax.vmap`` (or ``reset_batch``/
    ``step_batch``) for many. Jit at the outer edge.

    Args:
      config: ``EnvConfig`` (default ``EnvConfig()``).
      dynamics: a dynamics model object (see ``jaxdrive.sim.dynamics.DynamicsModel``) to
        step controlled agents with, in place of ``make_dynamics(config.dynamics)``; it
        also defines the action shape and grid, and controllers read it as
        ``env.dynamics``. Its ``dt``, if it has one, must equal ``config.dynamics.dt``
        (``check_model``).

    The env snapshots the metric registry (``jaxdrive.metrics.registry``) when built:
    its ``StepMetrics`` and ``EpisodeStats`` hold every metric registered by then.
    """

    def __init__(self, config: EnvConfig | None = None,
                 dynamics: DynamicsModel | None = None):
        self.config = config or EnvConfig()
        self.dynamics = (make_dynamics(self.config.dynamics) if dynamics is None
                         else check_model(dynamics, self.config.dynamics))
        self.metrics = registry.metrics()
        self._controlled_types = tuple(
            OBJECT_TYPE_NAMES[n] for n in self.config.controlled_types
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
    def num_rows(self) -> int:
        """C: agent rows per environment (``EnvConfig.num_rows``): the leading size of
        every per-agent array of the state, actions and ``TimeStep``."""
        return self.config.num_rows

    def controlled_per_scene(self, params: EnvParams) -> jax.Array:
        """(S,) int32: the objects each scene of the pool controls at reset with one row
        per object slot (``max_controlled`` unset), the SDC included: more than
        ``num_rows`` means that the rest of them replay their log. Control modes that
        draw (``fraction``) are counted at one draw (key 0)."""
        padded = Env(self.config.replace(max_controlled=None))

        def count(sid):
            state, _ = padded.reset_to(params, sid, jax.random.key(0))
            return jnp.sum((state.kind == EntityKind.CONTROLLED).astype(jnp.int32))

        n = params.pool.scenarios.objects.xy.shape[0]
        return jax.jit(jax.vmap(count))(jnp.arange(n, dtype=jnp.int32))

    @property
    def packed(self) -> bool:
        """Agent rows are packed controlled agents (``max_controlled`` set) rather than
        one row per object slot."""
        return self.config.max_controlled is not None

    @property
    def num_actions(self) -> int:
        """() int: size of the discrete action grid (``dynamics.num_actions``)."""
        return self.dynamics.num_actions

    @property
    def trial_mode(self) -> bool:
        """() bool: multi-trial episodes (``goal_behavior: trial``)."""
        return self.config.goal_behavior == "trial"

    # ------------------------------------------------------------------ reset
    def reset(self, params: EnvParams, key: jax.Array) -> tuple[EnvState, TimeStep]:
        """Start an episode on a random scenario of the pool (``key``: PRNG key); returns
        the state and first ``TimeStep`` of one env (A agent slots)."""
        k_sid, k_state = jax.random.split(key)
        sid = jax.random.randint(k_sid, (), 0, params.pool.size, dtype=jnp.int32)
        return self.reset_to(params, sid, k_state)

    def reset_to(
        self, params: EnvParams, scenario_id: jax.Array, key: jax.Array
    ) -> tuple[EnvState, TimeStep]:
        """Start an episode on scenario ``scenario_id`` () int32 of the pool (``key``: PRNG
        key); returns the state and first ``TimeStep`` of one env (A agent slots)."""
        state = self._initial_state(params, jnp.asarray(scenario_id, jnp.int32), key)
        zeros_b = jnp.zeros_like(state.done)
        info = StepInfo(
            metrics=initial_metrics(
                self._view(params, state, state.agents, jnp.int32(self.config.init_step)),
                self.metrics),
            terminal=state.agents, trial_ended=zeros_b,
            episode_done=jnp.asarray(False), trial_done=jnp.asarray(False),
            episode=state.episode, episode_controlled=zeros_b, episode_ego=zeros_b,
            trials=state.trials,
        )
        return state, self._timestep(params, state, jnp.zeros(zeros_b.shape, jnp.float32),
                                     zeros_b, zeros_b, info)

    def _log_state(self, params: EnvParams, sid: jax.Array, t: jax.Array) -> AgentState:
        """(N,) every object slot's logged state at log index ``t``."""
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

    def logged_rows(self, params: EnvParams, state: EnvState, t: jax.Array) -> AgentState:
        """(C,) the agent rows' logged state at log index ``t`` () int32 (steer and accel
        0; a row that holds no object is invalid)."""
        logged = self._log_state(params, state.scenario_id, t)
        if state.background is None:
            return logged
        idx = state.background.obj_index
        rows = _take_rows(logged, idx)
        return rows.replace(valid=rows.valid & (idx < logged.valid.shape[0]))

    def _initial_background(self, params: EnvParams, sid: jax.Array, obj_index: jax.Array,
                            kind: jax.Array) -> Background:
        """The background of packed rows ``obj_index`` (C,) at an episode's (or trial's)
        start, the objects' kinds ``kind`` (N,)."""
        obj = params.pool.scenarios.objects
        n, c = kind.shape[0], obj_index.shape[0]
        initial = self._initial_agents(
            self._log_state(params, sid, jnp.int32(self.config.init_step)), kind)
        obj_row = jnp.full((n,), c, jnp.int32).at[obj_index].set(
            jnp.arange(c, dtype=jnp.int32), mode="drop")
        return Background(obj_index=obj_index, obj_row=obj_row, kind=kind, agents=initial,
                          trig=geometry.cos_sin(initial.yaw), length=obj.length[sid],
                          width=obj.width[sid], obj_type=obj.type[sid])

    def _advance_background(self, params: EnvParams, state: EnvState,
                            log_step: jax.Array) -> Background | None:
        """``state``'s background at log index ``log_step``: experts (and every other
        non-static object) as logged there, static objects where they stand."""
        bg = state.background
        if bg is None:
            return None
        logged = self._log_state(params, state.scenario_id, log_step)
        static = bg.kind == EntityKind.STATIC
        cos, sin = geometry.cos_sin(logged.yaw)
        return bg.replace(agents=select(static, bg.agents, logged),
                          trig=(jnp.where(static, bg.trig[0], cos),
                                jnp.where(static, bg.trig[1], sin)))

    @staticmethod
    def _world(background: Background | None, agents: AgentState, removed: jax.Array,
               trig) -> World | None:
        """The scene's N objects with the packed rows' ``agents`` (C,) (``removed`` (C,)
        bool, ``trig`` their cos/sin) in their slots; None without packed rows."""
        if background is None:
            return None
        c = agents.xy.shape[0]
        in_row = background.obj_row < c
        row = jnp.minimum(background.obj_row, c - 1)

        def merge(outside, rows):
            mask = in_row.reshape(in_row.shape + (1,) * (outside.ndim - 1))
            return jnp.where(mask, rows[row], outside)

        world = jax.tree.map(merge, background.agents, agents)
        return World(agents=world, visible=world.valid & ~(in_row & removed[row]),
                     length=background.length, width=background.width,
                     obj_type=background.obj_type,
                     trig=(merge(background.trig[0], trig[0]),
                           merge(background.trig[1], trig[1])),
                     self_index=background.obj_index)

    def _view(self, params: EnvParams, state: EnvState, agents: AgentState,
              log_step: jax.Array, moved: bool = False,
              background: Background | None = None) -> StepView:
        """What the metrics read of ``state`` with its agents at ``agents``, the state of
        log index ``log_step`` () int32; ``moved``: ``agents`` were reached by a step
        from ``state.agents`` (else nothing moved: a reset); ``background``: the packed
        rows' background at ``log_step`` (default ``state.background``)."""
        present = agents.valid & ~state.removed
        prev_xy = agents.xy
        if moved:
            # An agent that was absent (not yet logged, removed) crosses no line by
            # appearing.
            was = state.agents.valid & ~state.removed
            prev_xy = jnp.where(was[:, None], state.agents.xy, agents.xy)
        trig = geometry.cos_sin(agents.yaw)
        background = state.background if background is None else background
        return StepView(
            pool=params.pool, scenario_id=state.scenario_id, agents=agents, present=present,
            length=state.length, width=state.width, goal=state.goal,
            prev_goal_distance=state.goal_distance, goal_radius=self.config.goal_radius,
            trig=trig, prev_xy=prev_xy, log_step=jnp.asarray(log_step, jnp.int32),
            world=self._world(background, agents, state.removed, trig))

    def _initial_state(self, params: EnvParams, sid: jax.Array, key: jax.Array) -> EnvState:
        cfg = self.config
        obj = params.pool.scenarios.objects
        a = cfg.scenario.max_agents
        if cfg.co_player_fraction > 0:
            key, k_frac, k_role = jax.random.split(key, 3)
        else:
            key, k_frac, k_role = (*jax.random.split(key), None)
        agents = self._log_state(params, sid, cfg.init_step)
        goal = obj.goal[sid]
        goal_distance = jnp.linalg.norm(goal - agents.xy, axis=-1).astype(jnp.float32)
        kind = self._entity_kinds(params, sid, agents, goal_distance, k_frac)
        role = self._roles(kind, obj.is_sdc[sid], k_role)
        rows = dict(agents=self._initial_agents(agents, kind), kind=kind, role=role,
                    length=obj.length[sid], width=obj.width[sid], obj_type=obj.type[sid],
                    goal=goal, goal_distance=goal_distance)
        background = None
        if self.packed:
            obj_index, bg_kind = self._pack(kind, obj.is_sdc[sid])
            background = self._initial_background(params, sid, obj_index, bg_kind)
            used = obj_index < a
            rows = {name: _take_rows(x, obj_index) for name, x in rows.items()}
            rows["agents"] = rows["agents"].replace(valid=rows["agents"].valid & used)
            rows["kind"] = jnp.where(used, rows["kind"], EntityKind.INVALID).astype(jnp.int32)
        zeros_b = jnp.zeros(rows["kind"].shape, bool)
        state = EnvState(
            scenario_id=sid, step=jnp.zeros((), jnp.int32), **rows,
            done=zeros_b, removed=zeros_b, reached=zeros_b, trial=jnp.zeros((), jnp.int32),
            trial_start=jnp.zeros((), jnp.int32), episode=None, trials=None, key=key,
            background=background,
        )
        shapes = jax.eval_shape(lambda v: compute_metrics(v, self.metrics),
                                self._view(params, state, state.agents,
                                           jnp.int32(cfg.init_step)))
        return state.replace(
            episode=init_episode(self.num_rows, shapes, self.metrics),
            trials=TrialStats.zeros(cfg.num_trials, state.ego, state.co_player))

    def _entity_kinds(self, params: EnvParams, sid: jax.Array, agents: AgentState,
                      goal_distance: jax.Array, key: jax.Array) -> jax.Array:
        """(A,) int32 ``EntityKind`` of each slot at an episode start."""
        cfg = self.config
        obj = params.pool.scenarios.objects
        a = cfg.scenario.max_agents
        t_end = cfg.init_step + cfg.trial_length
        is_sdc = obj.is_sdc[sid]
        type_ok = jnp.zeros((a,), bool)
        for t in self._controlled_types:
            type_ok = type_ok | (obj.type[sid] == t)
        # An object that starts on its goal has nothing to learn; it replays instead.
        controllable = agents.valid & type_ok & (goal_distance > cfg.goal_radius)
        if cfg.control_mode == "all":
            controlled = controllable
        elif cfg.control_mode == "sdc":
            controlled = controllable & is_sdc
        else:
            draw = jax.random.uniform(key, (a,)) < cfg.controlled_fraction
            controlled = controllable & (draw | is_sdc)
        moved = jnp.linalg.norm(obj.xy[sid, :, t_end] - agents.xy, axis=-1)
        still = (
            agents.valid & obj.valid[sid, :, t_end]
            & (moved < cfg.static_threshold)
            & (jnp.linalg.norm(agents.vel, axis=-1) < cfg.static_threshold)
        )
        ever_valid = jnp.any(obj.valid[sid], axis=-1)
        return jnp.select(
            [controlled, still, ever_valid],
            [EntityKind.CONTROLLED, EntityKind.STATIC, EntityKind.EXPERT],
            EntityKind.INVALID,
        ).astype(jnp.int32)

    def _pack(self, kind: jax.Array, is_sdc: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Packed agent rows of one episode from the object slots' kinds (N,): the
        ``(C,)`` int32 object slot of each row (the SDC first if controlled, then the
        other controlled objects in slot order; N where a row stays empty) and the
        ``(N,)`` int32 background kinds (``CONTROLLED`` for the objects in rows; a
        controlled object beyond C replays its log as an ``EXPERT``)."""
        n, c = kind.shape[0], self.num_rows
        controlled = kind == EntityKind.CONTROLLED
        sdc = controlled & is_sdc
        others = controlled & ~is_sdc
        room = c - jnp.minimum(jnp.sum(sdc.astype(jnp.int32)), c)
        keep = sdc | (others & (jnp.cumsum(others.astype(jnp.int32)) <= room))
        (obj_index,) = jnp.nonzero(keep, size=c, fill_value=n)
        obj_index = obj_index.astype(jnp.int32)
        in_row = jnp.zeros((n,), bool).at[obj_index].set(True, mode="drop")
        bg_kind = jnp.where(controlled & ~in_row, EntityKind.EXPERT, kind)
        return obj_index, bg_kind.astype(jnp.int32)

    def _roles(self, kind: jax.Array, is_sdc: jax.Array, key: jax.Array | None) -> jax.Array:
        """(A,) int32 ``Role``: co-players drawn with ``co_player_fraction``; one
        controlled agent (the SDC if controlled, else the first) always stays ego."""
        a = kind.shape[0]
        role = jnp.full((a,), int(Role.EGO), jnp.int32)  # int(): an IntEnum fill is weakly typed
        if self.config.co_player_fraction > 0:
            controlled = kind == EntityKind.CONTROLLED
            anchor_sdc = controlled & is_sdc
            anchor = jnp.argmax(jnp.where(jnp.any(anchor_sdc), anchor_sdc, controlled))
            draw = jax.random.uniform(key, (a,)) < self.config.co_player_fraction
            co = controlled & draw & (jnp.arange(a) != anchor)
            role = jnp.where(co, Role.CO_PLAYER, role).astype(jnp.int32)
        return role

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
        logged = self.logged_rows(params, state, jnp.int32(self.config.init_step))
        agents = self._initial_agents(logged, state.kind)
        zeros_b = jnp.zeros_like(state.done)
        background = state.background
        if background is not None:
            background = self._initial_background(params, state.scenario_id,
                                                  background.obj_index, background.kind)
        return state.replace(
            agents=agents, done=zeros_b, removed=zeros_b, reached=zeros_b,
            background=background,
            goal_distance=jnp.linalg.norm(state.goal - agents.xy, axis=-1).astype(jnp.float32),
            trial=state.trial + 1, trial_start=state.step,
        )

    # ------------------------------------------------------------------ step
    def _move(self, params: EnvParams, state: EnvState, action: jax.Array) -> AgentState:
        """Kinematics of one step: acting agents by the dynamics model, experts by their
        log, done agents frozen, static and invalid slots unchanged, removed parked."""
        cfg = self.config
        with jax.named_scope("kinematics"):
            moved = apply_action(self.dynamics, cfg.dynamics, state.agents, action,
                                 state.length)
            logged = self.logged_rows(params, state, cfg.init_step + state.trial_step + 1)
            expert = state.kind == EntityKind.EXPERT
            frozen = state.agents.replace(vel=jnp.zeros_like(state.agents.vel))
            agents = select(state.active, moved, select(expert, logged, frozen))
            agents = select(state.kind == EntityKind.STATIC, state.agents, agents)
            agents = agents.replace(valid=jnp.where(expert, logged.valid, state.agents.valid))
            agents = park_removed(agents, state.removed)
            # Store the new kinematics once: otherwise XLA fuses the dynamics (atan,
            # tan, cos, sin) into every pair and road-point loop that reads positions.
            return geometry.materialize(lambda x: x, agents)

    def _transition(self, params: EnvParams, state: EnvState, action: jax.Array):
        """Everything in a step but the auto-reset and the observation: kinematics,
        metrics (once), reward, behaviours, the episode / trial clock."""
        cfg = self.config
        # Randomness only where used (new goals here, auto-reset later): key splitting
        # runs as its own loop on CPU and would otherwise cost every step.
        key, k_goal = state.key, None
        if cfg.goal_behavior == "new_goal":
            key, k_goal = jax.random.split(key)
        acting = state.active
        agents = self._move(params, state, action)
        log_next = cfg.init_step + state.trial_step + 1
        background = self._advance_background(params, state, log_next)
        m = compute_metrics(
            self._view(params, state, agents, log_next, moved=True, background=background),
            self.metrics)
        goal_event = m.goal_reached & acting
        collided = m.collided & acting
        r = reward(params.reward, goal_event, collided, m.offroad & acting, m.progress,
                   acting, m.ran_red_light & acting)
        ends = collided | (m.offroad & acting) if cfg.offroad_behavior == "collision" else collided
        outcome = behaviors.apply_behaviors(
            cfg.collision_behavior, cfg.goal_behavior, agents, state.goal, state.done,
            state.removed, ends, goal_event,
            start=(self.logged_rows(params, state, jnp.int32(cfg.init_step))
                   if cfg.goal_behavior == "respawn" else None),
            new_goals=(self._sample_goals(params, state, agents, k_goal)
                       if cfg.goal_behavior == "new_goal" else None))
        step = state.step + 1
        reached = state.reached | goal_event
        clock = advance_clock(
            self.trial_mode, cfg.num_trials, cfg.trial_length, cfg.num_episode_steps, step,
            state.trial_start, state.trial, state.controlled, outcome.done, outcome.out,
            reached, state.ego, state.co_player, state.trials)
        episode = update_episode(state.episode, m, r, acting, self.metrics)
        continued = state.replace(
            step=step, agents=outcome.agents, goal=outcome.goal, done=outcome.done,
            removed=outcome.removed, reached=reached,
            goal_distance=jnp.linalg.norm(outcome.goal - outcome.agents.xy,
                                          axis=-1).astype(jnp.float32),
            episode=episode, trials=clock.trials, key=key, background=background,
        )
        info = StepInfo(
            metrics=m, terminal=agents, trial_ended=clock.trial_ended,
            episode_done=clock.episode_end, trial_done=clock.trial_end, episode=episode,
            episode_controlled=state.controlled, episode_ego=state.ego, trials=clock.trials)
        return continued, (r, clock.terminated, clock.truncated, info)

    def _boundary(self, params: EnvParams, state: EnvState, info: StepInfo,
                  groups: int = 1) -> EnvState:
        """Where the episode ended, the initial state of a random pool scenario (auto-
        reset; with ``groups`` > 1 a scenario of the env's own pool shard: see
        ``reset_batch``); in trial mode, where only a trial ended, the next trial's first
        state."""
        if self.trial_mode:
            with jax.named_scope("trial_restart"):
                restarted = self._restart_trial(params, state)
            state = jax.tree.map(lambda r, c: jnp.where(info.trial_done, r, c), restarted,
                                 state)
        with jax.named_scope("auto_reset"):
            key, k_sid, k_state = jax.random.split(state.key, 3)
            if groups == 1:
                new_sid = jax.random.randint(k_sid, (), 0, params.pool.size, dtype=jnp.int32)
            else:
                size = params.pool.size // groups
                new_sid = _draw_in_shard(k_sid, state.scenario_id // size * size, size)
            fresh = self._initial_state(params, new_sid, k_state).replace(key=key)
            return jax.tree.map(lambda f, c: jnp.where(info.episode_done, f, c), fresh, state)

    def _timestep(self, params: EnvParams, state: EnvState, r, terminated, truncated,
                  info: StepInfo) -> TimeStep:
        """The ``TimeStep`` handing out ``state``'s observation."""
        return TimeStep(obs=self._observe(params, state), reward=r, terminated=terminated,
                        truncated=truncated, first=state.step == 0, active=state.active,
                        removed=state.removed, info=info)

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
        state, (r, terminated, truncated, info) = self._transition(params, state, action)
        state = self._boundary(params, state, info)
        return state, self._timestep(params, state, r, terminated, truncated, info)

    def _observe(self, params: EnvParams, state: EnvState) -> Observation:
        visible = state.agents.valid & ~state.removed
        # Lights rewind with a trial: the log index restarts at init_step.
        log_step = self.config.init_step + state.trial_step
        trig = world = None
        if state.background is not None:
            trig = geometry.cos_sin(state.agents.yaw)
            world = self._world(state.background, state.agents, state.removed, trig)
        return observe(
            self.config.observation, params.pool, state.scenario_id, state.agents, visible,
            state.length, state.width, state.obj_type, state.goal, log_step, trig=trig,
            world=world,
        )

    def _sample_goals(self, params, state, agents, key) -> jax.Array:
        """(C, 2): a lane-centre point at a distance within ``new_goal_distance``.

        Draws 32 random road points per object slot (a row takes its object's draws)
        and keeps the first that qualifies; an agent with none keeps its current
        position as goal (it is then reached again at once, and a fresh sample is drawn
        next step).
        """
        rg = params.pool.scenarios.roadgraph
        sid = state.scenario_id
        n_draw = 32
        idx = jax.random.randint(key, (self.config.scenario.max_agents, n_draw), 0,
                                 rg.xy.shape[-2])
        if state.obj_index is not None:
            idx = _take_rows(idx, state.obj_index)
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

    def _reset_in_shards(self, params: EnvParams, keys: jax.Array, groups: int):
        """``reset`` of each env of ``keys`` (B,) on a scenario of its own pool shard: env
        ``e`` is in block ``e // (B / groups)`` and draws from shard
        ``[g * S / groups, (g + 1) * S / groups)`` of the S scenarios."""
        if groups == 1:
            return self._reset_batch(params, keys)
        size = params.pool.size // groups
        n = keys.shape[0]
        lo = (jnp.arange(n, dtype=jnp.int32) // (n // groups)) * size

        def reset(key, first):
            k_sid, k_state = jax.random.split(key)
            return self.reset_to(params, _draw_in_shard(k_sid, first, size), k_state)

        return jax.vmap(reset)(keys, lo)

    def _step_in_shards(self, groups: int):
        """The batched step for ``groups`` pool shards, one function per ``groups`` and
        env (so jit's cache keeps it)."""
        cache = self.__dict__.setdefault("_step_fns", {})
        if groups not in cache:
            cache[groups] = self._make_step_batch(groups)
        return cache[groups]

    def _make_step_batch(self, groups: int):
        transition = jax.vmap(self._transition, in_axes=(None, 0, 0))
        boundary = jax.vmap(functools.partial(self._boundary, groups=groups),
                            in_axes=(None, 0, 0))
        finish = jax.vmap(self._timestep, in_axes=(None, 0, 0, 0, 0, 0))

        def step_batch(params, state, action):
            state, (r, terminated, truncated, info) = transition(params, state, action)
            # Episodes (and trials) end on few steps: skip the reset gathers when none
            # ended (same result as resetting per env, as ``step`` does). ``trial_done``
            # covers episode ends in every mode.
            state = jax.lax.cond(
                jnp.any(info.trial_done),
                lambda s: boundary(params, s, info),
                lambda s: s,
                state,
            )
            return state, finish(params, state, r, terminated, truncated, info)

        return step_batch

    @property
    def _step_batch(self):
        return self._step_in_shards(1)

    def reset_batch(self, params: EnvParams, key: jax.Array, num_envs: int,
                    pool_shards: int = 1):
        """Reset ``num_envs`` environments (leading axis B).

        ``pool_shards`` > 1 cuts the pool's S scenarios and the B envs into that many
        contiguous shards and blocks; the envs of block k draw their scenarios (here and
        at every auto-reset of ``step_batch`` with the same ``pool_shards``) from shard
        k only. Needs S and B multiples of ``pool_shards``."""
        return self._reset_in_shards(params, jax.random.split(key, num_envs), pool_shards)

    def step_batch(self, params: EnvParams, state: EnvState, action: jax.Array,
                   pool_shards: int = 1):
        """Step a batch of environments (state and action with leading axis B: ``action``
        (B, A) int32 grid indices or (B, A, action_dim) float32).

        Equal to ``jax.vmap(step)`` but computes auto-resets (and trial restarts) only on
        steps where some episode (or trial) ended; with ``pool_shards`` > 1 an env's
        auto-reset draws from its own pool shard (``reset_batch``).
        """
        return self._step_in_shards(pool_shards)(params, state, action)

    def step_batch_sharded(self, mesh, pool_shards: int = 1):
        """``step_batch`` for a batch split along the ``data`` axis of ``mesh``
        (``jaxdrive.parallel``): each device steps its own environments and decides on
        its own whether any of them needs an auto-reset, so the step holds no
        cross-device collective. Same results as ``step_batch``. With ``pool_shards`` > 1
        (a multiple of the devices) the pool is split along ``data`` too
        (``pool_sharding``): each device holds its envs' shards only."""
        step = self._step_in_shards(max(1, pool_shards // mesh.size))
        return per_device(mesh, step, pool_shards > 1, returns_state=True)

    def reset_batch_sharded(self, mesh, pool_shards: int = 1):
        """``reset_batch(params, key, num_envs)`` for envs split along ``data`` (the pool
        split too when ``pool_shards`` > 1): the same results as ``reset_batch``."""
        local = max(1, pool_shards // mesh.size)
        reset = per_device(mesh, lambda p, k: self._reset_in_shards(p, k, local),
                           pool_shards > 1, returns_state=True, state_in=False)
        return lambda params, key, num_envs: reset(params, jax.random.split(key, num_envs))


def _draw_in_shard(key: jax.Array, first: jax.Array, size: int) -> jax.Array:
    """() int32: a scenario of the pool shard ``[first, first + size)``."""
    return first + jax.random.randint(key, (), 0, size, dtype=jnp.int32)


def pool_specs(split: bool):
    """``EnvParams`` of ``PartitionSpec`` (a prefix tree): the pool split along its
    scenario axis over ``data`` (``split``) or whole on every device; reward weights
    whole."""
    return EnvParams(pool=PartitionSpec(DATA) if split else PartitionSpec(),
                     reward=PartitionSpec())


def per_device(mesh, fn, split_pool: bool, returns_state: bool = False,
               state_in: bool = True):
    """``fn(params, *batched)`` run per device with ``shard_map``: every argument after
    the env params and every output split along ``data``. With ``split_pool`` each
    device sees only its part of the pool, and the ``scenario_id`` of the ``EnvState``
    passed first in ``batched`` (``state_in``) and returned first (``returns_state``)
    is turned from a pool index into an index of the device's part and back, so states
    outside hold the same numbers as with the whole pool."""
    rows = PartitionSpec(DATA)

    def body(params, *batched):
        if split_pool:
            offset = jax.lax.axis_index(DATA).astype(jnp.int32) * params.pool.size
            if state_in:
                st = batched[0]
                batched = (st.replace(scenario_id=st.scenario_id - offset),) + batched[1:]
        out = fn(params, *batched)
        if split_pool and returns_state:
            st = out[0]
            out = (st.replace(scenario_id=st.scenario_id + offset),) + tuple(out[1:])
        return out

    def run(params, *batched):
        return jax.shard_map(body, mesh=mesh,
                             in_specs=(pool_specs(split_pool),) + (rows,) * len(batched),
                             out_specs=rows,
                             check_vma=False)(params, *batched)  # per-env: no collectives

    return run



def _take_rows(tree, obj_index: jax.Array):
    """``tree``'s per-object leaves (N, ...) at the rows' object slots ``obj_index`` (C,)
    (a padding row, index N, reads the last slot: callers mask it)."""
    return jax.tree.map(lambda x: x[jnp.minimum(obj_index, x.shape[0] - 1)], tree)


def episode_steps(env: Env) -> int:
    """Steps that cover one whole episode (every trial in trial mode)."""
    c = env.config
    if c.goal_behavior == "trial":
        return c.num_trials * c.trial_length
    return c.num_episode_steps

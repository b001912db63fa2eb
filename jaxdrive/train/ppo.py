"""One PPO iteration as one pure function: rollout, GAE, epochs of minibatch updates.

``PPO.train_step(state, env_params) -> (state, metrics)`` runs, inside one jit:

1. a ``lax.scan`` of T steps of the B environments and the policy over the N = B x A
   agent rows, recording each row's transition. Co-players act from frozen partner
   policies: env ``i`` is driven by member ``i * M // B`` for the whole run (fixed
   contiguous blocks, ``jaxdrive.agents.actors.env_members``), so each member's policy
   runs only on its block's B / M envs (one partner forward pass over N rows in all,
   not M);
2. GAE over the (T, N) rollout with bootstrapping stopped at terminated, truncated and
   not-valid next steps (``jaxdrive.train.gae``);
3. ``epochs`` passes of shuffled minibatches of whole agent rows: the policy's
   ``sequence`` path reruns each row's (T,) segment from the cache the row had at the
   segment start, so the transformer sees the same context as in the rollout.

With dense rows (``train.dense_rows``, ``jaxdrive.models.dense``) the scene encoder runs
only where outputs count: the learner's ego rows in the rollout (``Rollout.computed``),
each co-player member's live rows, and in the epochs the minibatch's computed steps,
packed, with the heads and loss terms, and the transformer's temporal decoder on the
rows holding them, packed (``Policy.sequence_at``; one gradient computation per (rows,
steps) buffer, chosen by ``lax.switch``). Results equal the padded path's to float
rounding.

A step is *valid* (trained on) when the agent acts on it, is controlled by the learner
(ego role) and is not removed; everything else is masked in every loss term and
statistic (``jaxdrive.train.losses``). Episode metrics are per-agent EMAs
(``jaxdrive.telemetry.ema``) over ego agent-episodes; per-trial scores are per-env EMAs.
With ``trial_counters`` (the training run's logs), trial mode also reports the trial
counters of the iteration's completed episodes (``TrialTotals.counters``, NaN when none
completed).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxdrive.agents.actors import env_members, partner_actions, partner_caches
from jaxdrive.agents.controllers import log_replay
from jaxdrive.agents.rollout import Transition, scan_rollout
from jaxdrive.config import ConfigError
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.env.environment import per_device
from jaxdrive.env.observation import goal_features, nearest_vehicle_features
from jaxdrive.metrics.episode import report_values
from jaxdrive.metrics.registry import report_names
from jaxdrive.metrics.trials import TrialTotals, adaptation_metrics
from jaxdrive.models.dense import (
    DenseRows,
    capacities_for,
    row_step_buffers,
    selected_count,
    take_rows,
    which_row_step_buffer,
)
from jaxdrive.models.kv_cache import ROW_AXES, KVCache
from jaxdrive.models.policy import Policy, policy_inputs
from jaxdrive.parallel import along, check_divisible, constrain, replicated, rows_split
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import load_policy
from jaxdrive.telemetry import ema
from jaxdrive.train.gae import bootstrap_stop, gae
from jaxdrive.train.losses import (
    LossStats,
    aux_goal_loss,
    bc_loss,
    masked_mean,
    normalize_advantages,
    ppo_loss,
)
from jaxdrive.types import Observation

# ``train.dense_rows: auto``: dense buffers of these shares of the rows (the smallest that
# holds the live rows runs).
AUTO_SHARES = (0.25, 0.5, 0.75)
AUTO_MIN_ROWS = 256  # ``auto`` runs batches of fewer rows (or agent-steps) whole


@struct.dataclass
class TrainState:
    """Everything that changes during training (a checkpoint is exactly this).

    Attributes:
      params, opt_state: learner parameters and optax state.
      env_state: ``EnvState`` (B,); timestep: ``TimeStep`` (B,) of the next step.
      cache: learner ``KVCache`` (N = B x A rows).
      co_caches: tuple of ``KVCache``, one per frozen co-player policy over its block's
        rows ((B / M) x A).
      co_member: (B,) int32, which frozen policy drives each env's co-players (fixed:
        ``env_members``).
      episode_ema: ``EmaState`` over the N agent slots (the registry's report names).
      trial_ema: ``EmaState`` over the B env slots (``trial_{k}_score``), or None.
      key: PRNG key.
      iteration: () int32, training iterations done.
    """

    params: Any
    opt_state: Any
    env_state: EnvState
    timestep: TimeStep
    cache: KVCache
    co_caches: tuple
    co_member: jax.Array
    episode_ema: ema.EmaState
    trial_ema: ema.EmaState | None
    key: jax.Array
    iteration: jax.Array


@struct.dataclass
class Rollout:
    """(T, N, ...) record of one rollout (N = agent rows).

    Attributes:
      obs: ``Observation``; first, removed: bool, as fed to ``Policy.step``.
      action: int32 (T, N) or float32 (T, N, D); logp, value: float32 of the rollout.
      reward, terminated, truncated: emitted by the step taken from ``obs``.
      valid: bool, the step is trained on (acting ego agent).
      computed: bool, the learner's outputs at this step count (ego agent, not removed:
        valid steps and the memory they attend); dense rows run the encoder only there.
      aux_goal_target: float32 (T, N, 3) true goal rows of the acting step's state
        (``train.aux_goal_coef`` > 0), else None.
    """

    obs: Observation
    first: jax.Array
    removed: jax.Array
    action: jax.Array
    logp: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array
    computed: jax.Array
    aux_goal_target: jax.Array | None = None


def bc_reference(run_dir: str, env: Env, policy: Policy) -> tuple[Policy, Any]:
    """The frozen reference policy of human-regularised PPO (``train.bc_policy``): the
    best checkpoint of ``run_dir``, checked to be an MLP policy (stateless: the KL term
    needs no memory of its own) with the learner's observation sizes and action space.

    Raises:
      ConfigError: it does not fit, naming ``train.bc_policy`` and what differs.
    """
    loaded = load_policy(run_dir)
    ref, key = loaded.policy, f"config key 'train.bc_policy' = {run_dir!r}"
    if ref.config.kind != "mlp":
        raise ConfigError(f"{key} is a {ref.config.kind} policy; the reference must be an "
                          "MLP policy (e.g. trained with objective: bc and policy.kind: mlp)")
    if loaded.config.env.observation != env.config.observation:
        raise ConfigError(f"{key} was trained with other observation sizes than this run "
                          f"(env.observation {loaded.config.env.observation.to_dict()} "
                          f"against {env.config.observation.to_dict()})")
    same = ref.discrete == policy.discrete and (
        ref.module.out_dim == policy.module.out_dim if ref.discrete else
        bool(jnp.all(ref.action_low == policy.action_low)
             & jnp.all(ref.action_high == policy.action_high)))
    if not same:
        raise ConfigError(f"{key} acts in another action space than this run (its "
                          f"env.dynamics: {loaded.config.env.dynamics.to_dict()}); train the "
                          "reference with this run's env.dynamics")
    return ref, loaded.params


def _rows(x: jax.Array) -> jax.Array:
    """(B, A, ...) -> (B*A, ...) (explicit sizes: -1 fails on zero-size leaves)."""
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _multiple(rows: int, groups: int) -> int:
    """What dense buffer sizes of ``rows`` in ``groups`` are multiples of: 8 rows a
    group, or 1 where groups hold fewer than 64 rows (tiny meshes in tests)."""
    return (8 if groups == 1 or rows // groups >= 64 else 1) * groups



class PPO:
    """The training step of one run configuration (static: env, policies, optimiser).

    Args:
      config: ``RunConfig``.
      env: the training ``Env``.
      policy: the learner ``Policy`` (built for ``env``).
      co_players: sequence of M ``(Policy, params)`` frozen partners (may be empty);
        ``train.num_envs`` must be a multiple of M.
      mesh: a ``data`` mesh (``jaxdrive.parallel.data_mesh``) to run data-parallel over,
        or None (one device). Environments, agent rows and rollouts are split along it;
        parameters, optimiser state and the scene pool are replicated. Minibatches are
        drawn by ``train.shuffle_groups`` (``epoch_rows``): with one group per device
        (``auto``) each device takes its part of every minibatch from its own rows and
        the (N, T) batch never leaves its device; with one group the batch is gathered
        onto every device once. Gradients and loss statistics are summed across the
        mesh. Results depend on the groups, not on the devices.
      trial_counters: in trial mode, add ``train/trial_episodes`` and
        ``train/{TRIAL_COUNTERS}`` over the iteration's completed episodes to the metrics.
      reference: ``(Policy, params)`` of human-regularised PPO's frozen reference when
        ``train.bc_kl_coef`` > 0 (default: loaded from ``train.bc_policy``).
    """

    def __init__(self, config: RunConfig, env: Env, policy: Policy, co_players=(),
                 mesh=None, trial_counters: bool = False, reference=None):
        self.config = config
        self.trial_counters = trial_counters
        self.mesh = mesh
        self.env = env
        self.policy = policy
        self.co_players = tuple(co_players)
        t = config.train
        self.num_envs = t.num_envs
        self.num_agents = env.num_rows
        self.num_rows = self.num_envs * self.num_agents
        self.updates_per_iteration = t.epochs * t.minibatches
        self.shuffle_groups = _shuffle_groups(t, self.num_rows, mesh)
        total_updates = config.num_iterations * self.updates_per_iteration
        if t.lr_schedule == "linear":
            self.schedule = optax.linear_schedule(t.learning_rate, 0.0, total_updates)
        else:
            self.schedule = optax.constant_schedule(t.learning_rate)
        self.tx = optax.chain(optax.clip_by_global_norm(t.max_grad_norm),
                              optax.adam(self.schedule, eps=t.adam_eps))
        self.trial_mode = env.config.goal_behavior == "trial"
        self.uses_co_players = env.config.co_player_fraction > 0
        # Human-regularised PPO: a frozen reference policy (e.g. behaviour-cloned).
        self.reference = None
        if t.bc_kl_coef > 0:
            self.reference = (reference if reference is not None
                              else bc_reference(t.bc_policy, env, policy))
        # Behaviour cloning: the expert acts (inverse dynamics of the logs) and labels.
        self.bc = t.objective == "bc"
        self._expert = (jax.vmap(log_replay(env), in_axes=(None, 0, 0, 0)) if self.bc
                        else None)
        # A data pool holds data.pool_size scenes of every process.
        pool = ((config.data.pool_size * jax.process_count(),
                 "data.pool_size x processes") if config.data.path
                else (t.num_scenes, "train.num_scenes"))
        self.pool_shards = _pool_shards(t, pool, self.num_envs, mesh)
        k = self.pool_shards
        self.env_step = env.step_batch if k == 1 else functools.partial(env.step_batch,
                                                                         pool_shards=k)
        m = len(self.co_players)
        if m and self.num_envs % m:
            raise ConfigError(
                f"config key 'train.num_envs' = {self.num_envs} must be a multiple of the "
                f"{m} partner policies of 'train.co_players' (each drives a fixed block of "
                f"envs); set train.num_envs to e.g. {max(m, self.num_envs // m * m)}.")
        if mesh is not None:
            check_divisible(self.num_envs, "train.num_envs", mesh)
            if m:
                check_divisible(self.num_envs // m, "train.num_envs / len(train.co_players)",
                                mesh)
            if mesh.size > 1:
                self.env_step = env.step_batch_sharded(mesh, k)
                if self.bc and k > 1:
                    self._expert = per_device(mesh, self._expert, True)
        # Dense rows: buffer sizes as shares of the rows (None = every row). On several
        # devices each device's rows pack into its own share of a buffer (``groups``:
        # nothing crosses devices); co-players run every row there.
        self.dense_groups = 1 if mesh is None else mesh.size
        self.dense_shares = None
        if t.dense_rows != "off":
            self.dense_shares = AUTO_SHARES if t.dense_rows == "auto" else (
                float(t.dense_rows),)

    # ------------------------------------------------------------------ dense rows
    def _capacities(self, rows: int, groups: int) -> tuple[int, ...]:
        # ``auto`` leaves small batches whole (per device): there a gather and one
        # compiled copy per buffer cost more than the rows they skip.
        if self.config.train.dense_rows == "auto" and rows // groups < AUTO_MIN_ROWS:
            return (rows,)
        return capacities_for(self.dense_shares, rows, multiple=_multiple(rows, groups))

    @property
    def rollout_capacities(self) -> tuple[int, ...]:
        """Learner rows of the rollout's dense buffers (``(num_rows,)`` = off), in
        ``dense_groups`` equal shares on a mesh."""
        return self._capacities(self.num_rows, self.dense_groups)

    def rollout_rows(self, mask: jax.Array) -> DenseRows:
        """``DenseRows`` of the rollout's (num_rows,) ``mask``."""
        return DenseRows(mask, self.rollout_capacities, groups=self.dense_groups)

    @property
    def update_capacities(self) -> tuple[int, ...]:
        """Agent-steps of a minibatch's dense buffers."""
        t = self.config.train
        return self._capacities(self.num_rows // t.minibatches * t.rollout_steps,
                                self.dense_groups)

    @property
    def update_buffers(self) -> tuple[tuple[int, int], ...]:
        """(agent rows, agent-steps) of a minibatch's dense buffers, ascending in both
        (``jaxdrive.models.dense.row_step_buffers``; empty: every minibatch padded). The
        transformer's temporal decoder runs on the buffer's rows, the rest per step on
        its steps; a policy without a decoder packs steps only."""
        t = self.config.train
        rows = self.num_rows // t.minibatches
        full = rows * t.rollout_steps
        if min(self.update_capacities) >= full:
            return ()
        g = self.dense_groups
        pack_rows = (self.policy.config.kind == "transformer"
                     and min(self._capacities(rows, g)) < rows)
        return row_step_buffers(self.dense_shares, rows, t.rollout_steps, pack_rows,
                                multiple=_multiple(rows, g))

    @property
    def dense(self) -> bool:
        """Whether any policy pass runs on dense rows (a buffer smaller than its batch)."""
        t = self.config.train
        return (min(self.rollout_capacities) < self.num_rows or min(self.update_capacities)
                < self.num_rows // t.minibatches * t.rollout_steps)

    # ------------------------------------------------------------------ placement
    def _sharding(self, axis: int | None):
        if self.mesh is None:
            return None
        return replicated(self.mesh) if axis is None else along(self.mesh, axis)

    def _cache_shardings(self) -> KVCache:
        """Each ``KVCache`` leaf split along its agent rows (``ROW_AXES``)."""
        return jax.tree.map(self._sharding, ROW_AXES)

    def state_shardings(self, state: TrainState) -> TrainState:
        """Where each leaf of ``state`` lives on the mesh (a ``TrainState`` of
        ``NamedSharding``): env-, row- and slot-major leaves split along ``data``,
        parameters, optimiser state, key and counter replicated. Needs a mesh."""
        rep, rows = self._sharding(None), self._sharding(0)
        split = lambda tree: jax.tree.map(lambda _: rows, tree)
        whole = lambda tree: jax.tree.map(lambda _: rep, tree)
        return TrainState(
            params=whole(state.params), opt_state=whole(state.opt_state),
            env_state=split(state.env_state), timestep=split(state.timestep),
            cache=self._cache_shardings(),
            co_caches=tuple(self._cache_shardings() for _ in state.co_caches),
            co_member=rows, episode_ema=split(state.episode_ema),
            trial_ema=None if state.trial_ema is None else split(state.trial_ema),
            key=rep, iteration=rep)

    # ------------------------------------------------------------------ init
    def init(self, key: jax.Array, env_params: EnvParams) -> TrainState:
        """Fresh parameters, optimiser, environments and statistics."""
        # Four keys as when members were drawn at random: the other streams stay the same.
        k_reset, k_params, _, k_run = jax.random.split(key, 4)
        env_state, ts = self._reset(env_params, k_reset)
        obs = jax.tree.map(_rows, ts.obs)
        params = self.policy.init(k_params, obs)
        n = self.num_rows
        trial_ema = None
        if self.trial_mode:
            trial_ema = ema.init(self._trial_names(), self.num_envs)
        return TrainState(
            params=params,
            opt_state=jax.jit(self.tx.init)(params),
            env_state=env_state,
            timestep=ts,
            cache=self.policy.init_cache(n),
            co_caches=partner_caches(self.co_players, self.num_envs, self.num_agents),
            co_member=self._members(),
            episode_ema=ema.init(report_names(self.env.metrics), n),
            trial_ema=trial_ema,
            key=k_run,
            iteration=jnp.zeros((), jnp.int32),
        )

    def restart_envs(self, state: TrainState, env_params: EnvParams) -> TrainState:
        """Every environment starts a new episode on ``env_params``' pool (after the
        training pool was replaced); memories reset with the episodes."""
        key, k_reset = jax.random.split(state.key)
        env_state, ts = self._reset(env_params, k_reset)
        return state.replace(env_state=env_state, timestep=ts, key=key)

    def _reset(self, env_params: EnvParams, key: jax.Array):
        """Every env reset on ``env_params``' pool (each on its own pool shard with
        ``train.pool_shards`` > 1; split over the mesh's devices where it has several)."""
        k, size = self.pool_shards, env_params.pool.size
        if size % k:
            raise ConfigError(
                f"config key 'train.pool_shards' = {self.config.train.pool_shards} ({k} "
                f"shards) must divide the pool's {size} scenes (train.num_scenes, or "
                "data.pool_size with data.path); change the pool size or train.pool_shards.")
        if self.mesh is not None and self.mesh.size > 1 and k > 1:
            return self.env.reset_batch_sharded(self.mesh, k)(env_params, key, self.num_envs)
        return jax.jit(self.env.reset_batch, static_argnums=(2, 3))(
            env_params, key, self.num_envs, k)

    def env_param_shardings(self, env_params: EnvParams) -> EnvParams:
        """Where each leaf of ``env_params`` lives on the mesh (an ``EnvParams`` of
        ``NamedSharding``): the pool split along its scenario axis when
        ``train.pool_shards`` > 1 on several devices, else whole on every device; reward
        weights whole. Needs a mesh."""
        split = self.pool_shards > 1 and self.mesh.size > 1
        pool = self._sharding(0 if split else None)
        return EnvParams(pool=jax.tree.map(lambda _: pool, env_params.pool),
                         reward=jax.tree.map(lambda _: self._sharding(None),
                                             env_params.reward))

    def _trial_names(self) -> tuple[str, ...]:
        return tuple(f"trial_{k}_score" for k in range(self.env.config.num_trials))

    def _members(self) -> jax.Array:
        return jnp.asarray(env_members(self.num_envs, max(1, len(self.co_players))))

    # ------------------------------------------------------------------ rollout
    def _act(self, params, cache, co_caches, co_member, state: EnvState, ts: TimeStep, key):
        """Actions of every agent row: the learner's, and frozen partners' for co-players."""
        obs = jax.tree.map(_rows, ts.obs)
        first, removed = (_rows(x) for x in policy_inputs(ts))
        # Outputs that count: acting ego agents, and in trial mode also finished ones that
        # are not removed (they return next trial, attending to these steps).
        live = (ts.active | ~ts.removed) if self.trial_mode else ts.active
        computed = _rows(state.ego & live)
        rows = self.rollout_rows(computed)
        out, cache = self.policy.step(params, cache, obs, first, removed, rows=rows)
        k_learner, k_co = jax.random.split(key)
        dist = self.policy.distribution(out)
        action = dist.sample(k_learner)
        logp = dist.log_prob(action)
        if self.co_players and self.uses_co_players:
            # co_member is env_members(B, M): member m's rows are its static block.
            co_action, co_caches = partner_actions(
                self.co_players, co_caches, obs, first, removed, self.num_envs, k_co,
                rows=_rows(state.co_player) & ~removed,
                dense_shares=self.dense_shares if self.dense_groups == 1 else None)
            co_action = co_action.astype(action.dtype)
            is_co = _rows(state.co_player).reshape((-1,) + (1,) * (action.ndim - 1))
            action = jnp.where(is_co, co_action, action)
        return obs, first, removed, computed, out, action, logp, cache, co_caches

    def _rollout(self, state: TrainState, env_params: EnvParams):
        """``(state, traj, completed)`` of ``_rollout_totals`` (its trial totals left out)."""
        return self._rollout_totals(state, env_params)[:3]

    def _rollout_totals(self, state: TrainState, env_params: EnvParams):
        """T steps of the rollout core (``scan_rollout``), recording each row's transition
        and folding completed episodes into the EMA statistics; with ``trial_counters``
        in trial mode also the ``TrialTotals`` of the completed episodes (else None)."""
        params = state.params
        b, a = self.num_envs, self.num_agents

        def act(carry, env_state, ts, key):
            cache, co_caches, co_member, ep_ema, tr_ema = carry
            # Split as when members were redrawn per episode: the action keys stay the same.
            k_act, _ = jax.random.split(key)
            obs, first, removed, computed, out, action, logp, cache, co_caches = self._act(
                params, cache, co_caches, co_member, env_state, ts, k_act)
            labelled = None
            if self.bc:
                action, labelled = self._expert_actions(env_params, env_state, ts, action)
            env_action = action.reshape((b, a) + action.shape[1:])
            aux = (obs, first, removed, computed, out.value, action, logp, labelled)
            return env_action, (cache, co_caches, co_member, ep_ema, tr_ema), aux

        def record(carry, tr: Transition):
            cache, co_caches, co_member, ep_ema, tr_ema = carry
            obs, first, removed, computed, value, action, logp, labelled = tr.aux
            nts = tr.next_timestep
            valid = _rows(tr.timestep.active & tr.state.ego)
            if labelled is not None:
                valid = valid & labelled
            step = Rollout(
                obs=obs, first=first, removed=removed, action=action, logp=logp,
                value=value, reward=_rows(nts.reward), terminated=_rows(nts.terminated),
                truncated=_rows(nts.truncated), valid=valid, computed=computed,
                aux_goal_target=self._aux_goal_target(tr.state),
            )
            ep_ema, tr_ema, completed = self._update_stats(ep_ema, tr_ema, nts)
            ended = (nts.info.episode_done, nts.info.trials) if counters else None
            return (cache, co_caches, co_member, ep_ema, tr_ema), (step, completed, ended)

        counters = self.trial_counters and self.trial_mode
        key, k_roll = jax.random.split(state.key)
        carry = (state.cache, state.co_caches, state.co_member, state.episode_ema,
                 state.trial_ema)
        env_state, ts, carry, (traj, completed, ended) = scan_rollout(
            self.env, env_params, act, state.env_state, state.timestep, carry,
            jax.random.split(k_roll, self.config.train.rollout_steps), record=record,
            step_batch=self.env_step)
        cache, co_caches, co_member, ep_ema, tr_ema = carry
        state = state.replace(env_state=env_state, timestep=ts, cache=cache,
                              co_caches=co_caches, co_member=co_member, episode_ema=ep_ema,
                              trial_ema=tr_ema, key=key)
        # Summed after the scan: a sum per step would be a cross-device reduction per step.
        totals = None if ended is None else TrialTotals.zeros(
            self.env.config.num_trials).update(*ended)
        return state, traj, jnp.sum(completed.astype(jnp.int32)), totals

    def _expert_actions(self, env_params: EnvParams, env_state: EnvState, ts: TimeStep,
                        action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Behaviour cloning: ``action`` (B * A, ...) with the learner's rows replaced by
        the expert's (``log_replay``), and (B * A,) bool, whether a row's expert action
        is a label (its log has the next state; across a gap the expert only drives
        straight on)."""
        keys = jax.random.split(jax.random.key(0), self.num_envs)  # the expert ignores it
        expert = _rows(self._expert(env_params, env_state, ts, keys)).astype(action.dtype)
        learner = _rows(env_state.ego).reshape((-1,) + (1,) * (action.ndim - 1))
        nxt = self.env.config.init_step + env_state.trial_step + 1
        logged_rows = jax.vmap(self.env.logged_rows, in_axes=(None, 0, 0))
        if self.mesh is not None and self.mesh.size > 1 and self.pool_shards > 1:
            logged_rows = per_device(self.mesh, logged_rows, True)
        logged = logged_rows(env_params, env_state, nxt)
        return jnp.where(learner, expert, action), _rows(logged.valid)

    @property
    def aux_goal(self) -> bool:
        """Whether the loss has the auxiliary goal term (``train.aux_goal_coef`` > 0)."""
        return self.config.train.aux_goal_coef > 0

    def _aux_goal_target(self, state: EnvState) -> jax.Array | None:
        """(B * A, 3) float32 targets of the auxiliary head (``train.aux_target``): the
        goal rows of ``state`` as ``goal: visible`` would show them, or where the nearest
        other vehicle is (``nearest_vehicle_features``); None without the auxiliary loss."""
        if not self.aux_goal:
            return None
        cfg = self.env.config.observation
        if self.config.train.aux_target == "nearest_vehicle":
            rows = jax.vmap(lambda agents, removed: nearest_vehicle_features(
                cfg, agents, agents.valid & ~removed))(state.agents, state.removed)
        else:
            rows = jax.vmap(lambda agents, goal: jnp.stack(
                goal_features(cfg, agents, goal), axis=-1))(state.agents, state.goal)
        return _rows(rows)

    def _update_stats(self, ep_ema, tr_ema, ts: TimeStep):
        alpha = self.config.train.ema_alpha
        info = ts.info
        completed = _rows(info.episode_done[:, None] & info.episode_ego)
        episode = {k: _rows(v) for k, v in report_values(info.episode, self.env.metrics).items()}
        ep_ema = ema.update(ep_ema, completed, episode, alpha)
        if tr_ema is not None:
            tr = info.trials
            scored = info.episode_done & (tr.num_ego > 0)
            score = tr.ego_reached / jnp.maximum(tr.num_ego, 1)[:, None]
            tr_ema = ema.update(tr_ema, scored,
                                {f"trial_{k}_score": score[:, k]
                                 for k in range(score.shape[1])}, alpha)
        return ep_ema, tr_ema, completed

    # ------------------------------------------------------------------ update
    def _loss(self, params, cache: KVCache, mb: dict, buffer: tuple[int, int] | None = None):
        """PPO loss of a minibatch of (R, T) agent steps. With ``buffer`` (rows, steps)
        the encoder, the heads and the loss terms run on a dense buffer of that many
        steps, the minibatch's computed ones, and the temporal decoder on that many rows,
        those holding them (the caller checked that they fit): every sum is over the
        same valid steps, so the loss equals the padded one to float rounding."""
        pol = self.policy
        if buffer is None:
            out = pol.sequence(params, cache, mb["obs"], mb["first"], mb["removed"])
            step = mb
        else:
            row_cap, step_cap = buffer
            g = self.dense_groups
            out, idx, used = pol.sequence_at(params, cache, mb["obs"], mb["first"],
                                             mb["removed"], mb["computed"], step_cap,
                                             row_capacity=row_cap, groups=g)
            at = lambda x: take_rows(x.reshape((-1,) + x.shape[2:]), idx, g)
            step = {k: at(mb[k]) for k in ("action", "logp", "value", "advantages",
                                            "returns", "valid")
                    + (("aux_goal_target",) if self.aux_goal else ())}
            step["valid"] = step["valid"] & used
        dist = pol.distribution(out)
        valid = step["valid"]
        # A neutral action where the step is masked keeps log_prob (and its gradient)
        # finite there, so masking can never turn into 0 * inf.
        if pol.discrete:
            action = jnp.where(valid, step["action"], 0)
        else:
            mid = 0.5 * (pol.action_low + pol.action_high)
            action = jnp.where(valid[..., None], step["action"], mid)
        t = self.config.train
        if self.bc:
            total, stats = bc_loss(dist.log_prob(action), dist.entropy(), valid)
        else:
            adv = normalize_advantages(step["advantages"], valid)
            total, stats = ppo_loss(
                dist.log_prob(action), step["logp"], adv, out.value, step["value"],
                step["returns"], dist.entropy(), valid, clip_eps=t.clip_eps,
                value_clip_eps=t.value_clip_eps, value_coef=t.value_coef,
                entropy_coef=t.entropy_coef)
        if self.reference is not None:
            ref_policy, ref_params = self.reference
            inputs = (ref_params, None, mb["obs"], mb["first"], mb["removed"])
            if buffer is None:
                ref_out = ref_policy.sequence(*inputs)
            else:  # the same steps as the learner's dense outputs (the same mask)
                ref_out = ref_policy.sequence_at(*inputs, mb["computed"], buffer[1],
                                                 row_capacity=buffer[0],
                                                 groups=self.dense_groups)[0]
            ref = jax.lax.stop_gradient(ref_policy.distribution(ref_out))
            kl = masked_mean(ref.kl(dist), valid)
            lam = t.bc_kl_coef
            total = (1.0 - lam) * total + lam * kl
            stats = stats.replace(total=total, bc_kl=kl)
        if not self.aux_goal:
            return total, stats
        aux = aux_goal_loss(out.aux_goal, step["aux_goal_target"], valid)
        total = total + t.aux_goal_coef * aux
        return total, stats.replace(total=total, aux_goal=aux)

    def _grads(self, params, cache: KVCache, mb: dict):
        """Gradients and ``LossStats`` of a minibatch. With dense rows, one whole gradient
        computation per buffer (``update_buffers``), the first that holds the
        minibatch's computed steps and the rows holding them chosen by ``lax.switch`` (a
        switch inside the gradient would make every branch carry every other branch's
        residuals); ``stats.dense_overflow`` is 1.0 when none held them and the padded
        computation ran."""
        buffers = self.update_buffers
        grad = lambda buf: (lambda p, c, b: jax.grad(self._loss, has_aux=True)(p, c, b, buf))
        if not buffers:
            return grad(None)(params, cache, mb)
        which = which_row_step_buffer(mb["computed"], buffers, self.dense_groups)
        grads, stats = jax.lax.switch(which, [grad(b) for b in buffers] + [grad(None)],
                                      params, cache, mb)
        return grads, stats.replace(
            dense_overflow=(which == len(buffers)).astype(jnp.float32))

    def _update(self, params, opt_state, cache0: KVCache, batch: dict, key):
        t = self.config.train
        n, m, g = self.num_rows, t.minibatches, self.shuffle_groups

        if g == 1:
            # One shuffle of all rows: every device holds the whole batch and computes its
            # part of each minibatch's rows; the loss's sums (hence the gradients) are
            # reduced by XLA.
            batch, cache0 = constrain((batch, cache0), self._sharding(None))
            take = lambda idx: (jax.tree.map(lambda x: x[idx], batch), cache0.rows(idx))
        else:
            # G groups of contiguous rows, each device holding whole groups: a minibatch
            # is gathered group by group where the rows live, nothing crosses devices.
            batch = constrain(jax.tree.map(lambda x: _groups(x, g, 0), batch),
                              self._sharding(0))
            blocks = jax.tree.map(lambda x, ax: _groups(x, g, ax), cache0, ROW_AXES)
            if self.mesh is not None:
                blocks = constrain(blocks, self._cache_shardings())

            def take(idx):  # idx: (G, rows per group in a minibatch), within each group
                mb = jax.tree.map(lambda x: _take_in_groups(x, idx, 0), batch)
                cache = jax.tree.map(lambda x, ax: _take_in_groups(x, idx, ax), blocks,
                                     ROW_AXES)
                return mb, cache

        def minibatch(carry, idx):
            params, opt_state = carry
            mb, cache = take(idx)
            mb = constrain(mb, self._sharding(0))
            if self.mesh is not None:
                cache = constrain(cache, self._cache_shardings())
            grads, stats = self._grads(params, cache, mb)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), stats

        def epoch(carry, k):
            return jax.lax.scan(minibatch, carry, epoch_rows(k, n, g, m, within_groups=True))

        (params, opt_state), stats = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(key, t.epochs))
        return params, opt_state, stats

    def train_step(self, state: TrainState, env_params: EnvParams):
        """One iteration. Returns (new state, metrics: dict of () arrays)."""
        with rows_split(self.mesh is not None and self.mesh.size > 1):  # at trace time
            return self._train_step(state, env_params)

    def _train_step(self, state: TrainState, env_params: EnvParams):
        t = self.config.train
        cache0 = state.cache
        state, traj, completed, totals = self._rollout_totals(state, env_params)
        ts = state.timestep
        obs = jax.tree.map(_rows, ts.obs)
        first, removed = (_rows(x) for x in policy_inputs(ts))
        next_valid = _rows(ts.active & state.env_state.ego)
        # Values only where the bootstrap is used (the next step is valid).
        boot, _ = self.policy.step(state.params, state.cache, obs, first, removed,
                                   rows=self.rollout_rows(next_valid))
        stop = bootstrap_stop(traj.terminated, traj.truncated, traj.valid, next_valid)
        advantages, returns = gae(traj.reward, traj.value, boot.value, stop, t.gamma,
                                  t.gae_lambda)
        to_rows = lambda x: jnp.swapaxes(x, 0, 1)  # (T, N, ...) -> (N, T, ...)
        batch = {
            "obs": jax.tree.map(to_rows, traj.obs), "first": to_rows(traj.first),
            "removed": to_rows(traj.removed), "action": to_rows(traj.action),
            "logp": to_rows(traj.logp), "value": to_rows(traj.value),
            "advantages": to_rows(advantages), "returns": to_rows(returns),
            "valid": to_rows(traj.valid), "computed": to_rows(traj.computed),
        }
        if self.aux_goal:
            batch["aux_goal_target"] = to_rows(traj.aux_goal_target)
        key, k_update = jax.random.split(state.key)
        lr = self.schedule(state.iteration * self.updates_per_iteration)
        params, opt_state, stats = self._update(state.params, state.opt_state, cache0, batch,
                                                k_update)
        state = state.replace(params=params, opt_state=opt_state, key=key,
                              iteration=state.iteration + 1)
        return state, self._metrics(state, traj, advantages, returns, stats, completed, lr,
                                    totals)

    def _metrics(self, state, traj: Rollout, advantages, returns, stats: LossStats,
                 completed, lr, totals: TrialTotals | None = None) -> dict:
        valid = traj.valid
        var_ret = masked_mean(jnp.square(returns - masked_mean(returns, valid)), valid)
        resid = returns - traj.value
        var_res = masked_mean(jnp.square(resid - masked_mean(resid, valid)), valid)
        out = {
            "loss/total": stats.total.mean(), "loss/policy": stats.policy.mean(),
            "loss/value": stats.value.mean(), "loss/entropy": stats.entropy.mean(),
            "loss/approx_kl": stats.approx_kl.mean(),
            "loss/clip_fraction": stats.clip_fraction.mean(),
            "loss/explained_variance": 1.0 - var_res / jnp.maximum(var_ret, 1e-8),
            "loss/learning_rate": jnp.asarray(lr, jnp.float32),
            "rollout/valid_steps": jnp.sum(valid.astype(jnp.float32)),
            "rollout/reward_mean": masked_mean(traj.reward, valid),
            "rollout/advantage_mean": masked_mean(advantages, valid),
            "rollout/agent_episodes": completed.astype(jnp.float32),
        }
        if self.aux_goal:
            out["loss/aux_goal"] = stats.aux_goal.mean()
        if self.reference is not None:
            out["loss/bc_kl"] = stats.bc_kl.mean()
        if self.dense:
            if stats.dense_overflow is not None:  # the update ran on buffers
                out["loss/dense_overflow_minibatches"] = stats.dense_overflow.sum()
            need = jax.vmap(lambda m: selected_count(m, self.dense_groups))(traj.computed)
            out["rollout/dense_overflow_steps"] = jnp.sum(
                (need > max(self.rollout_capacities)).astype(jnp.float32))
        emitted = ema.emit(state.episode_ema)
        for name in report_names(self.env.metrics):
            out[f"train/{name}"] = emitted[name]
        out["train/agents_with_episodes"] = emitted["slots_with_data"]
        if state.trial_ema is not None:
            trials = ema.emit(state.trial_ema)
            scores = [trials[f"trial_{k}_score"] for k in range(self.env.config.num_trials)]
            for name, value in adaptation_metrics(scores).items():
                out[f"train/{name}"] = value
        if totals is not None:
            none = totals.episodes == 0  # no completed episode in this iteration
            for name, value in totals.counters().items():
                out[f"train/{name}"] = value if name == "trial_episodes" else jnp.where(
                    none, jnp.nan, value)
        return out


def _shuffle_groups(t, rows: int, mesh) -> int:
    """``train.shuffle_groups`` resolved (``auto``: the devices) and checked against the
    rows, the minibatches and the mesh."""
    devices = 1 if mesh is None else mesh.size
    g = devices if t.shuffle_groups == "auto" else t.shuffle_groups
    if rows % g or (rows // g) % t.minibatches:
        raise ConfigError(
            f"config key 'train.shuffle_groups' = {t.shuffle_groups} ({g} groups) must "
            f"divide the {rows} agent rows (train.num_envs x agent rows) into groups whose "
            f"rows are a multiple of train.minibatches = {t.minibatches}; change "
            "train.num_envs, train.minibatches or train.shuffle_groups.")
    _whole_per_device("train.shuffle_groups", g, devices, "groups")
    return g


def _pool_shards(t, pool: tuple[int, str], num_envs: int, mesh) -> int:
    """``train.pool_shards`` resolved and checked against the configured pool (``pool``:
    its size and config key), the envs and the mesh. ``auto``: one shard per device
    where the pool and the envs split evenly over the devices, else 1 (the whole pool on
    every device)."""
    devices = 1 if mesh is None else mesh.size
    pool_size, pool_key = pool
    if t.pool_shards == "auto":
        return devices if pool_size % devices == 0 and num_envs % devices == 0 else 1
    k = t.pool_shards
    for count, key in ((num_envs, "train.num_envs"),
                       (pool_size, pool_key)):
        if count % k:
            raise ConfigError(
                f"config key 'train.pool_shards' = {k} must divide {key} = {count} (each "
                f"of the {k} shards of the pool serves a block of envs); change one of them.")
    _whole_per_device("train.pool_shards", k, devices, "shards")
    return k


def _whole_per_device(key: str, count: int, devices: int, what: str) -> None:
    """ConfigError unless config key ``key``'s ``count`` groups (or shards) are 1 or
    split whole over the ``devices``."""
    if count > 1 and count % devices:
        raise ConfigError(
            f"config key '{key}' = {count} must be 1 or a multiple of the {devices} "
            f"devices (each device holds whole {what}); set it to auto (= {devices}) or a "
            "multiple.")


def epoch_rows(key: jax.Array, rows: int, groups: int, minibatches: int,
               within_groups: bool = False) -> jax.Array:
    """One epoch's minibatches of agent rows (``train.shuffle_groups``).

    ``groups`` = 1: one permutation of all rows, cut into ``minibatches``. Otherwise the
    rows form ``groups`` contiguous groups, each permuted with its own key (split off
    ``key``), and minibatch ``j`` takes the ``j``-th share of every group.

    Returns:
      (minibatches, rows // minibatches) int32 row indices, or with ``within_groups``
      and ``groups`` > 1, (minibatches, groups, rows per group per minibatch) indices
      within each group.
    """
    if groups == 1:
        return jax.random.permutation(key, rows).reshape(minibatches, rows // minibatches)
    size = rows // groups
    perms = jax.vmap(lambda k: jax.random.permutation(k, size))(jax.random.split(key, groups))
    local = jnp.swapaxes(perms.reshape(groups, minibatches, size // minibatches), 0, 1)
    if within_groups:
        return local
    offsets = (jnp.arange(groups, dtype=local.dtype) * size)[None, :, None]
    return (local + offsets).reshape(minibatches, rows // minibatches)


def _groups(x: jax.Array, groups: int, axis: int) -> jax.Array:
    """Splits ``x``'s row axis ``axis`` (N) into (groups, N // groups)."""
    n = x.shape[axis]
    return x.reshape(x.shape[:axis] + (groups, n // groups) + x.shape[axis + 1:])


def _take_in_groups(x: jax.Array, idx: jax.Array, axis: int) -> jax.Array:
    """Rows ``idx`` (G, M) of each group of ``x`` (grouped at ``axis``: (..., G, N/G,
    ...)), merged into (..., G * M, ...): a gather per group, so that a group's rows are
    read on the device that holds it."""
    taken = jax.vmap(lambda xg, i: jnp.take(xg, i, axis=axis), in_axes=(axis, 0),
                     out_axes=axis)(x, idx)
    merged = taken.shape[axis] * taken.shape[axis + 1]
    return taken.reshape(x.shape[:axis] + (merged,) + x.shape[axis + 2:])

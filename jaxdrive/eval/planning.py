"""A nuPlan-style closed-loop planning score, computed on device.

The score follows the closed-loop score (CLS) of nuPlan: H. Caesar et al., "nuPlan: A
closed-loop ML-based planning benchmark for autonomous vehicles" (2021), as defined by
the nuPlan devkit's metric documentation (``docs/metrics_description.md``) and its
closed-loop weighted-average aggregator config. Per scored agent::

    total = no_at_fault_collision * drivable_area * driving_direction
            * (5 * ttc + 5 * progress + 2 * comfort) / 12

nuPlan's devkit metric names: ``no_ego_at_fault_collisions``,
``drivable_area_compliance``, ``driving_direction_compliance`` (multipliers),
``time_to_collision_within_bound`` (weight 5), ``ego_progress_along_expert_route``
(5), ``ego_is_comfortable`` (2) and ``speed_limit_compliance`` (4). Our maps carry no
speed limits, so that term is dropped and the weights renormalised (divide by 12, not
16). nuPlan's ``ego_is_making_progress`` multiplier is folded into the progress term
(progress 0 below ``progress_min_ratio``). ``docs/planning_score.md`` lists every
definition, default and its source, and where we differ from nuPlan.

Two pure functions: ``planning_features`` once per env step inside the rollout scan
(one env, vmap it), ``planning_score`` once over the stacked (T, A) series.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive import geometry
from jaxdrive.config import ConfigBase, ConfigError, check_range
from jaxdrive.scenarios import road_index
from jaxdrive.scenarios.road_index import PointRow
from jaxdrive.types import RoadType

F32 = jnp.float32
# nuPlan counts collisions and time-to-collision only for a moving ego (m/s).
STATIONARY_SPEED = 0.05
# driving_direction_compliance: metres against the lane within one window that are
# tolerated (score 1), and beyond which the score is 0 (0.5 in between); nuPlan values.
DIRECTION_COMPLIANCE_M = 2.0
DIRECTION_VIOLATION_M = 6.0
WEIGHT_TTC = 5.0
WEIGHT_PROGRESS = 5.0
WEIGHT_COMFORT = 2.0
SCORE_KEYS = ("no_at_fault_collision", "drivable_area", "driving_direction", "ttc",
              "progress", "comfort", "total", "counted")


@dataclasses.dataclass(frozen=True)
class PlanningConfig(ConfigBase):
    """Thresholds of the planning score (see ``docs/planning_score.md``).

    Attributes:
      ttc_horizon: seconds the constant-velocity projection for time to collision looks
        ahead (only TTC below ``ttc_threshold`` matters to the score).
      ttc_threshold: seconds; a moving agent whose TTC falls below it fails ``ttc``
        (nuPlan ``least_min_ttc`` = 0.95).
      comfort_max_accel: m/s^2, bound on |longitudinal acceleration|.
      comfort_max_jerk: m/s^3, bound on |longitudinal jerk|.
      progress_min_ratio: ego / expert progress ratios below this score 0 (nuPlan's
        ``ego_is_making_progress`` threshold, 0.2).
      min_expert_progress: metres; when the expert advances less than this the
        progress term is 1.
      direction_window_s: seconds of the sliding window for driving direction.
      dt: seconds per env step (must equal the env's ``dynamics.dt``).
    """

    ttc_horizon: float = 1.0
    ttc_threshold: float = 0.95
    comfort_max_accel: float = 4.0
    comfort_max_jerk: float = 4.0
    progress_min_ratio: float = 0.2
    min_expert_progress: float = 5.0
    direction_window_s: float = 1.0
    dt: float = 0.1

    def __post_init__(self):
        check_range("dt", self.dt, 0.0, 10.0, lo_open=True)
        for name in ("ttc_horizon", "ttc_threshold", "comfort_max_accel", "comfort_max_jerk",
                     "direction_window_s"):
            check_range(name, getattr(self, name), 0.0, None, lo_open=True)
        check_range("progress_min_ratio", self.progress_min_ratio, 0.0, 1.0)
        check_range("min_expert_progress", self.min_expert_progress, 0.0, None)

    @property
    def ttc_steps(self) -> int:
        """Projection sub-steps of ``dt`` seconds up to ``ttc_horizon``."""
        return max(1, round(self.ttc_horizon / self.dt))

    @property
    def direction_window_steps(self) -> int:
        """() int: env steps of the driving-direction window (at least 1)."""
        return max(1, round(self.direction_window_s / self.dt))


@struct.dataclass
class PlanningStep:
    """Per-agent planning features of one env step, (A,) each ((T, A) when stacked).

    Attributes:
      present: bool, a scored agent that was in the scene (valid, not removed) at the
        start of the step; its collision, off-road and progress count.
      kinematic: bool, ``present`` and the post-step state is the agent's own motion:
        not overwritten by an auto-reset or trial restart, not removed, not stopped or
        respawned by the env at a goal or collision on this step. Speed, accel, yaw
        rate, wrong-way distance and TTC are meaningful only here.
      ended: bool, the episode (trial, in trial mode) ended on this step; the same for
        every agent. ``planning_score`` scores steps up to the first such step.
      speed: float32, m/s along the heading after the step.
      accel: float32, m/s^2, (speed after - speed before) / dt.
      yaw_rate: float32, rad/s over the step.
      at_fault_collision: bool, a collision this agent is at fault for (see
        ``planning_features``).
      collision_any: bool, the agent's box overlaps another present agent's box.
      offroad: bool, a box corner beyond the road edges (the env's metric).
      wrong_way_distance: float32, metres moved against the nearest lane centre's
        direction this step, from the scenario's road graph (see ``_wrong_way``; 0 when
        the agent's grid cell lists no lane centre).
      min_ttc: float32, seconds to the first projected contact with any other agent
        within ``ttc_horizon``; +inf when none or when not moving forward.
      progress: float32, metres gained towards the goal this step.
    """

    present: jax.Array
    kinematic: jax.Array
    ended: jax.Array
    speed: jax.Array
    accel: jax.Array
    yaw_rate: jax.Array
    at_fault_collision: jax.Array
    collision_any: jax.Array
    offroad: jax.Array
    wrong_way_distance: jax.Array
    min_ttc: jax.Array
    progress: jax.Array


def _heading_speed(vel: jax.Array, yaw: jax.Array) -> jax.Array:
    return (vel[..., 0] * jnp.cos(yaw) + vel[..., 1] * jnp.sin(yaw)).astype(F32)


def _behind(xy: jax.Array, yaw: jax.Array, length: jax.Array, width: jax.Array) -> jax.Array:
    """(A, A) bool: agent j's centre lies in agent i's rear sector.

    The rear sector is bounded by i's rear face and the lines from i's centre through
    its two rear corners: ``x < 0`` and ``|y| * length <= -x * width`` in i's frame (x
    forward). It holds for a car behind i whether or not the boxes already overlap, up
    to the point where the centres pass each other.

    Args:
      xy: (A, 2); yaw, length, width: (A,).
    """
    dx = xy[None, :, 0] - xy[:, None, 0]
    dy = xy[None, :, 1] - xy[:, None, 1]
    c, s = jnp.cos(yaw)[:, None], jnp.sin(yaw)[:, None]
    lx = c * dx + s * dy
    ly = -s * dx + c * dy
    return (lx < 0.0) & (jnp.abs(ly) * length[:, None] <= -lx * width[:, None])


def planning_features(env_config, env_params, prev_state, state, timestep, scored,
                      config: PlanningConfig | None = None) -> PlanningStep:
    """Planning features of one env step (one env; vmap over envs).

    Collision fault: a scored agent i overlapping agent j is at fault unless i is
    stationary (speed below ``STATIONARY_SPEED`` both before and after the step) or j's
    centre lies in i's rear sector (hit from behind; see ``_behind``). Side contacts
    count as at fault (nuPlan exempts them while the ego keeps its lane; we have no lane
    membership).

    Time to collision: for a moving scored agent (speed after the step above
    ``STATIONARY_SPEED``), every present agent is projected at its speed along its
    heading in sub-steps of ``dt`` up to ``ttc_horizon``; the first sub-step at which i's
    box overlaps j's is the pair's TTC, unless j is then in i's rear sector (it runs
    into i). Pairs already in contact are left to the collision term.

    Wrong way: the step's displacement, in the post-step agent frame, against the
    direction of the nearest LANE_CENTER point of the scenario's road graph among the
    road index's candidates for the agent's grid cell (``_wrong_way``). It reads the
    simulator's road data, never the policy's observation, so the observation config
    does not change it.

    On a step that ends the episode (or trial), or removes an agent, the env has
    already replaced the post-step pose in ``state``; the collision geometry then uses
    the pose the step reached, ``timestep.info.terminal`` (what the env's own metrics
    were computed on), and the motion terms skip the agent on that step.

    Args:
      env_config: ``EnvConfig`` of the env (``dynamics.dt`` must equal ``config.dt``).
      env_params: ``EnvParams``; its pool's road index supplies the lane centres.
      prev_state: ``EnvState`` before the step.
      state, timestep: ``Env.step``'s outputs.
      scored: (A,) bool, agents to score (e.g. ``prev_state.ego``).
      config: ``PlanningConfig``; default ``PlanningConfig()``.
    Returns:
      ``PlanningStep`` with (A,) fields.
    """
    config = config or PlanningConfig()
    dt = float(env_config.dynamics.dt)
    if abs(config.dt - dt) > 1e-9:
        raise ConfigError(
            f"planning config key 'dt' = {config.dt!r} must equal the env's dynamics.dt = "
            f"{dt!r}.")
    with jax.named_scope("planning_features"):
        prev = prev_state.agents
        post = state.agents
        # The pre-step scenario's sizes: after an auto-reset ``state`` holds the next one's.
        length, width = prev_state.length, prev_state.width
        a = prev.yaw.shape[0]
        ended = jnp.broadcast_to(jnp.asarray(timestep.info.trial_done, bool), (a,))
        was_present = prev.valid & ~prev_state.removed
        replaced = ended | (state.removed & ~prev_state.removed)
        terminal = timestep.info.terminal
        xy = jnp.where(replaced[:, None], terminal.xy, post.xy).astype(F32)
        yaw = jnp.where(replaced, terminal.yaw, post.yaw).astype(F32)
        vel = jnp.where(replaced[:, None], terminal.vel, post.vel)
        here = jnp.where(replaced, terminal.valid & ~prev_state.removed,
                         post.valid & ~state.removed)

        m = timestep.info.metrics
        present = scored & was_present
        newly_done = state.done & ~prev_state.done
        kinematic = present & here & ~replaced & ~newly_done & ~m.goal_reached

        speed_prev = _heading_speed(prev.vel, prev.yaw)
        speed = _heading_speed(vel, yaw)
        accel = (speed - speed_prev) / dt
        diff = yaw - prev.yaw
        yaw_rate = (jnp.arctan2(jnp.sin(diff), jnp.cos(diff)) / dt).astype(F32)

        trig = geometry.cos_sin(yaw)
        hit = geometry.pairwise_overlap(xy, yaw, length, width, here, trig)
        rear = _behind(xy, yaw, length, width)
        moving = jnp.maximum(jnp.abs(speed_prev), jnp.abs(speed)) >= STATIONARY_SPEED
        collision_any = present & m.collided
        at_fault = collision_any & moving & jnp.any(hit & ~rear, axis=-1)

        min_ttc = _min_ttc(config, xy, yaw, speed, length, width, here, trig, hit)
        min_ttc = jnp.where(kinematic & (speed > STATIONARY_SPEED), min_ttc, jnp.inf)

        wrong_way = _wrong_way(env_params.pool.road_index, state.scenario_id, post.xy,
                               post.xy - prev.xy, post.yaw)
        wrong_way = jnp.where(kinematic, wrong_way, 0.0)

        return PlanningStep(
            present=present,
            kinematic=kinematic,
            ended=ended,
            speed=jnp.where(kinematic, speed, 0.0).astype(F32),
            accel=jnp.where(kinematic, accel, 0.0).astype(F32),
            yaw_rate=jnp.where(kinematic, yaw_rate, 0.0).astype(F32),
            at_fault_collision=at_fault,
            collision_any=collision_any,
            offroad=present & m.offroad,
            wrong_way_distance=wrong_way.astype(F32),
            min_ttc=min_ttc.astype(F32),
            progress=jnp.where(present, m.progress, 0.0).astype(F32),
        )


def _min_ttc(config, xy, yaw, speed, length, width, valid, trig, touching):
    """(A,) float32: seconds to the first projected contact with any agent, skipping
    pairs whose first contact comes from i's rear sector and pairs already touching."""
    k = config.ttc_steps
    times = (jnp.arange(1, k + 1, dtype=F32) * config.dt).astype(F32)  # (K,)
    c, s = trig
    step = (speed[:, None] * jnp.stack([c, s], axis=-1)).astype(F32)  # (A, 2) m/s
    future = xy[None] + times[:, None, None] * step[None]  # (K, A, 2)

    def contact(xy_k):
        hit = geometry.pairwise_overlap(xy_k, yaw, length, width, valid, trig)
        return hit, _behind(xy_k, yaw, length, width)

    hit, rear = jax.vmap(contact)(future)  # (K, A, A) each
    first = jnp.argmax(hit, axis=0)  # (A, A) first contact sub-step
    rear_at_first = jnp.take_along_axis(rear, first[None], axis=0)[0]
    counts = jnp.any(hit, axis=0) & ~rear_at_first & ~touching
    return jnp.min(jnp.where(counts, times[first], jnp.inf), axis=-1).astype(F32)


def _wrong_way(index, scenario_id, xy, displacement, yaw):
    """(A,) float32: metres of ``displacement`` against the nearest lane centre's direction.

    The lane centres searched are fixed by the scenario's road index, not by any
    observation setting: every point of the chunks listed for the grid cell of ``xy``
    (``road_per_cell`` points, the chunks nearest the cell centre), with no radius. The
    nearest LANE_CENTER point among them gives the direction; 0 where there is none.

    Args:
      index: the pool's ``RoadIndex``; scenario_id: () int32.
      xy: (A, 2) post-step positions, world frame.
      displacement: (A, 2) the step's displacement, world frame.
      yaw: (A,) post-step headings.
    """
    block = road_index.road_block(index, xy, index.road_per_cell, scenario_id)  # (A, 5, k, S)
    a = block.shape[0]
    row = lambda r: block[:, r].reshape(a, -1)  # (A, k * S)
    lane = row(PointRow.TYPE) == RoadType.LANE_CENTER
    dx = row(PointRow.X) - xy[:, 0, None]
    dy = row(PointRow.Y) - xy[:, 1, None]
    d2 = jnp.where(lane, dx * dx + dy * dy, jnp.inf)
    nearest = jnp.argmin(d2, axis=-1)
    pick = lambda v: jnp.take_along_axis(v, nearest[:, None], axis=1)[:, 0]
    dir_x, dir_y = pick(row(PointRow.DIR_X)), pick(row(PointRow.DIR_Y))
    c, s = jnp.cos(yaw), jnp.sin(yaw)
    # The lane direction and the displacement, both in the frame of heading ``yaw``.
    lane_fwd = c * dir_x + s * dir_y
    lane_left = -s * dir_x + c * dir_y
    fwd = c * displacement[:, 0] + s * displacement[:, 1]
    left = -s * displacement[:, 0] + c * displacement[:, 1]
    along = fwd * lane_fwd + left * lane_left
    return jnp.where(jnp.any(lane, axis=-1), jnp.maximum(-along, 0.0), 0.0).astype(F32)


def planning_score(steps: PlanningStep, scored: jax.Array, expert_progress: jax.Array,
                   config: PlanningConfig | None = None) -> dict[str, jax.Array]:
    """Per-agent planning score of one env's rollout (vmap over envs).

    Only steps up to and including the first ``ended`` step count (the first episode);
    within them, events count where ``present`` and motion terms where ``kinematic``.

    Args:
      steps: ``PlanningStep`` with (T, A) fields, in time order.
      scored: (A,) bool, agents to score.
      expert_progress: (A,) float32, metres the logged expert advances towards the goal
        over the same horizon (see ``expert_progress``).
      config: ``PlanningConfig``; default ``PlanningConfig()``.
    Returns:
      dict of (A,) float32: ``SCORE_KEYS`` — the six terms, ``total``, and ``counted``
      (1 for a scored agent present on some counted step). Every value is 0 where
      ``counted`` is 0; reduce with ``scenario_mean(values, counted > 0)``.
    """
    config = config or PlanningConfig()
    with jax.named_scope("planning_score"):
        ended = steps.ended.astype(jnp.int32)
        first_episode = (jnp.cumsum(ended, axis=0) - ended) == 0
        present = steps.present & first_episode & scored[None]
        kin = steps.kinematic & present
        counted = jnp.any(present, axis=0)

        no_collision = ~jnp.any(steps.at_fault_collision & present, axis=0)
        drivable = ~jnp.any(steps.offroad & present, axis=0)

        w = config.direction_window_steps
        run = jnp.cumsum(jnp.where(kin, steps.wrong_way_distance, 0.0), axis=0)
        shifted = jnp.concatenate([jnp.zeros_like(run[:w]), run[:-w]], axis=0)[: run.shape[0]]
        worst = jnp.max(run - shifted, axis=0)
        direction = jnp.where(worst > DIRECTION_VIOLATION_M, 0.0,
                              jnp.where(worst > DIRECTION_COMPLIANCE_M, 0.5, 1.0))

        ttc = ~jnp.any(kin & (steps.min_ttc < config.ttc_threshold), axis=0)

        ego = jnp.sum(jnp.where(present, steps.progress, 0.0), axis=0)
        expert = jnp.asarray(expert_progress, F32)
        ratio = jnp.clip(ego / jnp.maximum(expert, 1e-6), 0.0, 1.0)
        ratio = jnp.where(ratio < config.progress_min_ratio, 0.0, ratio)
        progress = jnp.where(expert < config.min_expert_progress, 1.0, ratio)

        accel_ok = ~jnp.any(kin & (jnp.abs(steps.accel) > config.comfort_max_accel), axis=0)
        jerk = (steps.accel[1:] - steps.accel[:-1]) / config.dt
        both = kin[1:] & kin[:-1]
        jerk_ok = ~jnp.any(both & (jnp.abs(jerk) > config.comfort_max_jerk), axis=0)
        comfort = accel_ok & jerk_ok

        f = lambda x: jnp.asarray(x, F32)
        weighted = (WEIGHT_TTC * f(ttc) + WEIGHT_PROGRESS * progress
                    + WEIGHT_COMFORT * f(comfort)) / (WEIGHT_TTC + WEIGHT_PROGRESS
                                                      + WEIGHT_COMFORT)
        total = f(no_collision) * f(drivable) * direction * weighted
        out = {
            "no_at_fault_collision": f(no_collision), "drivable_area": f(drivable),
            "driving_direction": f(direction), "ttc": f(ttc), "progress": f(progress),
            "comfort": f(comfort), "total": f(total), "counted": f(counted),
        }
        return {k: jnp.where(counted, v, 0.0).astype(F32) for k, v in out.items()}


def scenario_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``values`` over the masked agents; 0 when none (never NaN).

    Args:
      values: (..., A) float32. mask: (..., A) bool.
    Returns:
      (...) float32.
    """
    n = jnp.sum(mask, axis=-1).astype(F32)
    s = jnp.sum(jnp.where(mask, values, 0.0), axis=-1).astype(F32)
    return (s / jnp.maximum(n, 1.0)).astype(F32)


def expert_progress(env_config, env_params, state, num_steps: int) -> jax.Array:
    """(A,) float32: metres each logged trajectory advances towards ``state.goal`` over
    ``num_steps`` steps from the episode start (capped at the episode length).

    Uses the last valid logged position within the horizon; 0 for agents not logged at
    the start.

    Args:
      env_config: ``EnvConfig``; env_params: ``EnvParams``.
      state: ``EnvState`` at the episode start (its scenario and goals).
      num_steps: static int, the rollout horizon in env steps.
    """
    obj = env_params.pool.scenarios.objects
    sid = state.scenario_id
    t0 = env_config.init_step
    t1 = min(t0 + min(num_steps, env_config.num_episode_steps),
             env_config.scenario.num_steps - 1)
    xy = obj.xy[sid, :, t0 : t1 + 1]  # (A, n, 2)
    valid = obj.valid[sid, :, t0 : t1 + 1]
    n = valid.shape[-1]
    last = (n - 1) - jnp.argmax(valid[:, ::-1], axis=-1)
    end = jnp.take_along_axis(xy, last[:, None, None], axis=1)[:, 0]
    start = xy[:, 0]
    gained = (jnp.linalg.norm(state.goal - start, axis=-1)
              - jnp.linalg.norm(state.goal - end, axis=-1))
    return jnp.where(valid[:, 0], gained, 0.0).astype(F32)

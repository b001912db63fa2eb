"""Built-in controllers (no learning): lane following, log replay, straight on, random.

A controller is a pure function ``(params, state, timestep, key) -> action`` for one
environment, with the action in the env's action space; vmap it with the env.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive import geometry
from jaxdrive.env import Env, EnvParams, EnvState, TimeStep
from jaxdrive.types import EgoFeature, PartnerFeature, RoadFeature, RoadType


def _nearest_grid_action(env: Env, cont: jax.Array) -> jax.Array:
    """(A, D) continuous actions -> (A,) int32 index of the nearest grid action."""
    model = env.dynamics
    grid = model.action_grid()
    scale = model.action_high - model.action_low
    d = jnp.sum(jnp.square((cont[:, None, :] - grid[None]) / scale), axis=-1)
    return jnp.argmin(d, axis=-1).astype(jnp.int32)


def _to_env_action(
    env: Env, accel: jax.Array, curvature: jax.Array, speed: jax.Array, length: jax.Array
):
    """(A,) target acceleration and path curvature -> the env's action (A,) or (A, D).

    The env's dynamics model converts the targets (``action_from_accel_curvature``,
    which also clips the acceleration to the model's bounds); a discrete action space
    then takes the nearest grid action.
    """
    cont = env.dynamics.action_from_accel_curvature(accel, curvature, speed, length)
    if env.config.dynamics.action_space == "continuous":
        return cont.astype(jnp.float32)
    return _nearest_grid_action(env, cont)


def straight_on(env: Env):
    """Controller ``(params, state, timestep, key) -> action`` of one env: zero
    acceleration and zero curvature at the current speed (straight on at constant speed
    through the env's dynamics; the nearest grid action in a discrete action space). Not
    the challenge's constant-velocity agent, which extrapolates the logged velocity
    vector without dynamics: ``jaxdrive.metrics.references.constant_velocity``."""

    def act(params: EnvParams, state: EnvState, timestep: TimeStep, key: jax.Array):
        del params, timestep, key
        speed = state.agents.speed
        zeros = jnp.zeros_like(speed)
        return _to_env_action(env, zeros, zeros, speed, state.length)

    return act


def lane_follow(
    env: Env, max_speed: float = 10.0, lookahead_time: float = 0.8, min_lookahead: float = 5.0
):
    """A goal-directed lane follower that reads only the observation.

    Pure pursuit towards a lane-centre point about ``lookahead`` metres ahead whose lane
    direction agrees with the heading, choosing among such points the one nearest the
    goal (which picks the branch at junctions); straight at the goal once it is within
    the lookahead. Speed: ``max_speed`` (m/s), slowing to stop at the goal and to keep a
    1.5 s gap behind a partner ahead in the same lane. ``lookahead`` is
    ``max(min_lookahead, lookahead_time * speed)`` (``lookahead_time`` in seconds,
    ``min_lookahead`` in metres).

    Returns the controller ``(params, state, timestep, key) -> action`` of one env:
    (A,) int32 grid indices or (A, action_dim) float32, per the action space.
    """
    ocfg = env.config.observation

    def act(params: EnvParams, state: EnvState, timestep: TimeStep, key: jax.Array):
        del params, state, key
        obs = timestep.obs
        ego = obs.ego  # (A, EGO_FEATURES)
        speed = ego[:, EgoFeature.SPEED] * ocfg.speed_scale
        goal = jnp.stack([ego[:, EgoFeature.GOAL_X], ego[:, EgoFeature.GOAL_Y]],
                         axis=-1) * ocfg.goal_scale  # ego frame
        goal_dist = ego[:, EgoFeature.GOAL_DISTANCE] * ocfg.goal_scale
        look = jnp.maximum(min_lookahead, lookahead_time * speed)

        road = obs.road  # (A, ROAD_FEATURES, M)
        pts = jnp.stack([road[:, RoadFeature.X], road[:, RoadFeature.Y]],
                        axis=-1) * ocfg.road_radius  # (A, M, 2)
        dist = jnp.linalg.norm(pts, axis=-1)
        ok = (
            obs.road_mask
            & (obs.road_type == RoadType.LANE_CENTER)
            & (road[:, RoadFeature.DIR_X] > 0.5)
            & (pts[..., 0] > 1.0)
            & (jnp.abs(dist - look[:, None]) < 3.0)
        )
        to_goal = jnp.linalg.norm(pts - goal[:, None, :], axis=-1)
        best = jnp.argmin(jnp.where(ok, to_goal, jnp.inf), axis=-1)
        target = jnp.take_along_axis(pts, best[:, None, None], axis=1)[:, 0]
        use_goal = (~jnp.any(ok, axis=-1)) | (goal_dist < look)
        target = jnp.where(use_goal[:, None], goal, target)
        ld2 = jnp.maximum(jnp.sum(target * target, axis=-1), 1.0)
        curvature = 2.0 * target[:, 1] / ld2  # pure pursuit: 2 sin(alpha) / ld

        # Longitudinal: cruise, brake for the goal, keep a gap to the leader.
        v_goal = jnp.sqrt(2.0 * 2.0 * jnp.maximum(goal_dist - 1.0, 0.0)) + 1.0
        partners = obs.partners  # (A, PARTNER_FEATURES, K)
        rel_x = partners[:, PartnerFeature.X] * ocfg.partner_radius
        rel_y = partners[:, PartnerFeature.Y] * ocfg.partner_radius
        half_len = 0.5 * partners[:, PartnerFeature.LENGTH] * ocfg.size_scale
        ahead = obs.partner_mask & (rel_x > 0) & (jnp.abs(rel_y) < 2.2)
        gap = jnp.min(jnp.where(ahead, rel_x - half_len - 2.5, jnp.inf), axis=-1,
                      initial=jnp.inf)  # num_partners may be 0
        v_gap = jnp.maximum(gap - 2.0, 0.0) / 1.5
        target_speed = jnp.minimum(jnp.minimum(max_speed, v_goal), v_gap)
        # The model clips the acceleration to its own bounds.
        accel = (target_speed - speed) / 0.5
        length = ego[:, EgoFeature.LENGTH] * ocfg.size_scale
        return _to_env_action(env, accel, curvature, speed, length)

    return act


def keep_line(env: Env, lateral: float, speed: float = 6.0, lookahead: float = 8.0):
    """A scripted driver for straight roads: pure pursuit of the line ``lateral`` metres
    to the left (negative: right) of the agent's own start axis (its logged pose at
    ``init_step``), at ``speed`` m/s, aiming ``lookahead`` metres ahead. It reads the
    state, not the observation: the reference egos of the narrow-passing family
    (``procedural.partner_convention``), whose egos start on the road's centre line
    heading along it.

    Returns the controller ``(params, state, timestep, key) -> action`` of one env.
    """
    cfg = env.config

    def act(params: EnvParams, state: EnvState, timestep: TimeStep, key: jax.Array):
        del timestep, key
        start = env.logged_rows(params, state, jnp.int32(cfg.init_step))
        axis = jnp.stack([jnp.cos(start.yaw), jnp.sin(start.yaw)], axis=-1)  # (A, 2)
        left = jnp.stack([-axis[:, 1], axis[:, 0]], axis=-1)
        now = state.agents
        along = jnp.sum((now.xy - start.xy) * axis, axis=-1)
        target = start.xy + (along + lookahead)[:, None] * axis + lateral * left
        local = geometry.to_local(target, now.xy, now.yaw)
        curvature = 2.0 * local[:, 1] / jnp.maximum(jnp.sum(local * local, axis=-1), 1.0)
        accel = (speed - now.speed) / 0.5
        return _to_env_action(env, accel, curvature, now.speed, state.length)

    return act


# Candidate values per action component in each pass of the continuous log-replay search.
LOG_REPLAY_GRID = 65
LOG_REPLAY_PASSES = 2


def _box_mismatch(env: Env, state: EnvState, actions: jax.Array, target) -> jax.Array:
    """(A, C) how far each of C candidate actions (A, C, D) float32 leaves each agent from
    its logged next state: the sum of squared distances (m^2) between the corners of the
    box reached and of the logged box, plus the speed mismatch carried over one step,
    ``4 (dv dt)^2`` (as if each corner were that much off)."""
    xy, yaw, speed = target
    c = actions.shape[1]
    spread = lambda x: jnp.broadcast_to(x[:, None], (x.shape[0], c) + x.shape[1:])
    length, width = spread(state.length), spread(state.width)
    reached = env.dynamics.step(jax.tree.map(spread, state.agents), actions, length)
    corners = geometry.box_corners(reached.xy, reached.yaw, length, width)
    logged = geometry.box_corners(xy, yaw, state.length, state.width)[:, None]
    dv = (reached.speed - speed[:, None]) * env.config.dynamics.dt
    return jnp.sum(jnp.square(corners - logged), axis=(-1, -2)) + 4.0 * jnp.square(dv)


def _component_values(env: Env) -> list[np.ndarray]:
    """Per action component, the values a search tries: the bins of the discrete grid
    (static, from the config), or ``LOG_REPLAY_GRID`` values across the continuous
    range."""
    model = env.dynamics
    if env.config.dynamics.action_space == "discrete":
        grid = np.asarray(model.action_grid())
        return [np.unique(grid[:, d]) for d in range(model.action_dim)]
    low, high = np.asarray(model.action_low), np.asarray(model.action_high)
    return [np.linspace(low[d], high[d], LOG_REPLAY_GRID, dtype=np.float32)
            for d in range(model.action_dim)]


def log_replay(env: Env):
    """Drive controlled agents along their logged trajectories by inverse dynamics.

    Each step takes the action whose next box best matches the logged next box
    (``_box_mismatch``: corner distances and speed), from the agent's actual state: a
    closed loop, so that errors do not accumulate. The search starts from the model's
    closed-form ``inverse`` (the nearest grid action in a discrete space) and improves
    one component at a time over that component's grid bins, or over
    ``LOG_REPLAY_GRID`` values of its continuous range, ``LOG_REPLAY_PASSES`` times; the
    start is always a candidate, so an exact inverse (``delta_local``'s) is kept.
    Matching the box rather than the heading alone keeps the bicycle model on its lane
    in junction turns: its centre slips sideways of its heading, so steering to the
    logged yaw drifted up to 13 m off the log. Across a gap in an agent's log it drives
    straight on at its speed.

    Returns the controller ``(params, state, timestep, key) -> action`` of one env:
    (A,) int32 grid indices or (A, action_dim) float32, per the action space.
    """
    cfg = env.config
    model = env.dynamics
    discrete = cfg.dynamics.action_space == "discrete"
    values = _component_values(env)
    sizes = [len(v) for v in values]
    # Grid index = sum_d bin_d * stride_d (the first component varies slowest).
    strides = np.cumprod([1] + sizes[::-1])[:-1][::-1].astype(np.int32)

    def act(params: EnvParams, state: EnvState, timestep: TimeStep, key: jax.Array):
        del timestep, key
        logged = env.logged_rows(params, state, cfg.init_step + state.trial_step + 1)
        nxt_xy, nxt_yaw, v = logged.xy, logged.yaw, logged.vel
        nxt_speed = v[:, 0] * jnp.cos(nxt_yaw) + v[:, 1] * jnp.sin(nxt_yaw)
        # Where the log has a gap (its entries are padding), keep going straight on at
        # the current speed rather than steer for the padding position.
        now = state.agents
        gap = ~logged.valid
        ahead = now.xy + (now.speed * cfg.dynamics.dt)[:, None] * jnp.stack(
            [jnp.cos(now.yaw), jnp.sin(now.yaw)], axis=-1)
        nxt_xy = jnp.where(gap[:, None], ahead, nxt_xy)
        nxt_yaw = jnp.where(gap, now.yaw, nxt_yaw)
        nxt_speed = jnp.where(gap, now.speed, nxt_speed)
        target = (nxt_xy, nxt_yaw, nxt_speed)
        best = model.inverse(state.agents, nxt_xy, nxt_yaw, nxt_speed, state.length)
        best = jnp.clip(best.astype(jnp.float32), model.action_low, model.action_high)
        if discrete:  # start from the nearest grid action, component by component
            best = jnp.stack([jnp.asarray(vals)[jnp.argmin(jnp.abs(best[:, d, None] - vals),
                                                             axis=-1)]
                              for d, vals in enumerate(values)], axis=-1)
        for _ in range(LOG_REPLAY_PASSES):
            for d, vals in enumerate(values):
                cand = jnp.repeat(best[:, None], len(vals) + 1, axis=1)
                cand = cand.at[:, 1:, d].set(jnp.asarray(vals))  # 0: the current best
                pick = jnp.argmin(_box_mismatch(env, state, cand, target), axis=-1)
                best = jnp.take_along_axis(cand, pick[:, None, None], axis=1)[:, 0]
        if not discrete:
            return best
        bins = [jnp.argmin(jnp.abs(best[:, d, None] - vals), axis=-1)
                for d, vals in enumerate(values)]
        return sum(b * int(s) for b, s in zip(bins, strides, strict=True)).astype(jnp.int32)

    return act


def random_actions(env: Env):
    """Uniformly random actions: the controller returns (A,) int32 grid indices or
    (A, action_dim) float32 within the action bounds, per the action space."""
    a = env.num_rows

    def act(params: EnvParams, state: EnvState, timestep: TimeStep, key: jax.Array):
        del params, state, timestep
        if env.config.dynamics.action_space == "discrete":
            return jax.random.randint(key, (a,), 0, env.num_actions, dtype=jnp.int32)
        m = env.dynamics
        u = jax.random.uniform(key, (a, m.action_dim))
        return (m.action_low + u * (m.action_high - m.action_low)).astype(jnp.float32)

    return act


CONTROLLERS = {"lane_follow": lane_follow, "log_replay": log_replay, "random": random_actions}

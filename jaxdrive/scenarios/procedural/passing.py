"""The narrow-passing scene family (``partner_convention``): two cars meet head-on on a
straight road, and the oncoming one keeps to the side its convention says.

The SDC (slot 0, the ego) starts near one end of a straight two-lane road, on the road's
centre line, heading along it; its goal is on the centre line near the other end. The
partner (slot 1) starts near that other end, driving towards the ego at a constant speed,
``partner_offset`` metres to its own right (``keep_right``, the map's right-hand traffic)
or to its own left (``keep_left``: in the ego's lane), and keeps that offset until the end
of the road, where it stops. It never yields: it is a logged object the env replays.

The offsets are chosen so that the side decides the outcome: a partner at
``partner_offset`` overlaps an ego on the centre line and an ego hugging the road edge on
the partner's side, and leaves room on the other side. An ego that keeps the partner's
side (the side the partner keeps, seen from each car: both right, or both left) passes;
one that guesses wrong meets it head-on. With a short ``observation.partner_radius`` the
ego sees the partner only when it is too late to change sides, so a fixed strategy
scores 1 in 2 and a policy with memory can learn the convention in trial 0 and keep to it
in trials 1 and 2 (``docs/adaptation.md``).

The side is drawn from its own key, ``fold_in(key, _SIDE_SALT)`` (``either``), or fixed
(``keep_right`` / ``keep_left``), and nothing else reads it: two scenes that differ in the
side are equal in every array but the partner's lateral position, so the ego's view is
identical until the partner comes into sight. ``side_key`` redraws only the side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural.config import PARTNER_CONVENTIONS
from jaxdrive.scenarios.procedural.roads import _Scene
from jaxdrive.types import ObjectLog, ObjectType

__all__ = ["PARTNER_CONVENTIONS", "SIDE_SIGN", "partner_side", "passing_objects"]
# +1: the partner keeps to its right (the map's convention), -1: to its left.
SIDE_SIGN = {"keep_right": 1, "keep_left": -1}
_SIDE_SALT = 0x51DE  # the side draw (``either``)
_PASSING_SALT = 0x9A55  # speeds, sizes and offsets of the two cars
START_MARGIN = 1.0  # m between a car's rear and the road's end at its start
GOAL_MARGIN = 4.0  # m from the road's end to the ego's goal


def partner_side(key: jax.Array, convention: str) -> jax.Array:
    """() int32: +1 (the partner keeps right) or -1 (keeps left); ``either`` draws it
    from ``key`` with equal odds."""
    if convention == "either":
        return jnp.where(jax.random.bernoulli(key), 1, -1).astype(jnp.int32)
    return jnp.asarray(SIDE_SIGN[convention], jnp.int32)


def _straight_log(start, direction, lateral, speed, stop_s, times):
    """(T, 2) positions and (T,) constant yaw of a car driving ``direction`` (2,) from
    ``start`` (2,) at ``speed`` with a fixed ``lateral`` offset (along the left normal),
    standing still once it has covered ``stop_s`` metres."""
    s = jnp.minimum(speed * times, stop_s)
    left = jnp.stack([-direction[1], direction[0]])
    xy = start[None] + s[:, None] * direction[None] + lateral * left[None]
    yaw = jnp.arctan2(direction[1], direction[0])
    return xy, jnp.broadcast_to(yaw, times.shape)


def passing_objects(key: jax.Array, cfg, scfg: ScenarioConfig, sc: _Scene,
                    side: jax.Array) -> ObjectLog:
    """The ego and the partner of one narrow-passing scene (every other slot empty).

    Args:
      key: the scene's key (speeds, sizes and offsets come from ``fold_in(key,
        _PASSING_SALT)``).
      cfg: ``ProceduralConfig``; scfg: ``ScenarioConfig`` (A >= 2 slots, T steps).
      sc: the straight road's scene parameters (arm 0 points along ``sc.u[0]``).
      side: () int32, ``partner_side``.
    Returns:
      ``(ObjectLog (A, T), speed (2,), travel (2,))``: slot 0 the ego (the SDC), slot 1
      the partner; their speeds (m/s) and the distances (m) their logs cover before
      standing.
    """
    a, t, f32 = scfg.max_agents, scfg.num_steps, jnp.float32
    k_speed, k_pspeed, k_len, k_wid, k_off = jax.random.split(
        jax.random.fold_in(key, _PASSING_SALT), 5)
    uni = lambda k, lo_hi, shape=(): jax.random.uniform(k, shape, f32, *lo_hi)
    speed = jnp.stack([uni(k_speed, cfg.speed), uni(k_pspeed, cfg.speed)])
    length = uni(k_len, cfg.length, (2,))
    width = uni(k_wid, cfg.width, (2,))
    offset = uni(k_off, cfg.partner_offset)
    end = sc.r_j + cfg.arm_length  # the road's ends lie at +-end along u[0]
    u0 = sc.u[0]
    # Both cars are at their start at log step junction_clear_steps (the env's episode
    # start, init_step): earlier log steps lie behind them, beyond the road's ends.
    times = (jnp.arange(t, dtype=f32) - cfg.junction_clear_steps) * cfg.dt
    # The ego drives -u0 along the centre line from near the +u0 end.
    ego_start = (end - START_MARGIN - length[0] / 2) * u0
    ego_goal = -(end - GOAL_MARGIN) * u0
    ego_travel = 2 * end - START_MARGIN - length[0] / 2 - GOAL_MARGIN
    ego_xy, ego_yaw = _straight_log(ego_start, -u0, 0.0, speed[0], ego_travel, times)
    # The partner drives +u0 from near the -u0 end, offset to its right (side +1) or left.
    p_start = -(end - START_MARGIN - length[1] / 2) * u0
    p_stop = 2 * (end - START_MARGIN) - length[1]
    p_xy, p_yaw = _straight_log(p_start, u0, -side.astype(f32) * offset, speed[1], p_stop,
                                times)
    p_goal = p_start + p_stop * u0 - side.astype(f32) * offset * jnp.stack([-u0[1], u0[0]])
    xy = jnp.stack([ego_xy, p_xy]) + sc.offset
    yaw = jnp.stack([ego_yaw, p_yaw]).astype(f32)
    vel = jnp.concatenate([
        (speed[:, None] * jnp.stack([jnp.cos(yaw[:, 0]), jnp.sin(yaw[:, 0])], -1))[:, None],
        (xy[:, 1:] - xy[:, :-1]) / cfg.dt], axis=1)
    goal = jnp.stack([ego_goal, p_goal]) + sc.offset
    pad = lambda x, fill=0: jnp.concatenate(
        [x, jnp.full((a - 2,) + x.shape[1:], fill, x.dtype)], axis=0)
    two = jnp.ones((2,), bool)
    objects = ObjectLog(
        xy=pad(xy.astype(f32)), yaw=pad(yaw), vel=pad(vel.astype(f32)),
        valid=pad(jnp.ones((2, t), bool), False),
        length=pad(length), width=pad(width),
        type=pad(jnp.full((2,), int(ObjectType.VEHICLE), jnp.int32), int(ObjectType.UNSET)),
        goal=pad(goal.astype(f32)),
        is_sdc=pad(jnp.array([True, False]), False),
        of_interest=pad(two, False), to_predict=pad(two, False),
    )
    return objects, speed, jnp.stack([ego_travel, p_stop])

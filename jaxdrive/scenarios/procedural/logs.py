"""The logged objects of one scene: trajectories along the routes, uniform exit goals
(``goal_exit: uniform``), and the vehicles dropped for conflicts
(``log_conflicts: drop``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdrive import geometry
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural.config import (
    _CONFLICT_CLEARANCE,
    ProceduralConfig,
)
from jaxdrive.scenarios.procedural.layout import (
    _Layout,
)
from jaxdrive.scenarios.procedural.lights import (
    _signal_arc,
    _Signals,
)
from jaxdrive.scenarios.procedural.roads import (
    _Connectors,
    _interp_route,
    _lerp,
    _Scene,
)
from jaxdrive.scenarios.procedural.vehicles import (
    _Routes,
    _Spawn,
)
from jaxdrive.types import (
    ObjectLog,
    ObjectType,
)


def _object_log(
    cfg: ProceduralConfig,
    scfg: ScenarioConfig,
    lay: _Layout,
    sc: _Scene,
    routes: _Routes,
    sp: _Spawn,
    speed,
    goal_s,
    sigma,
    draws,
    sig: _Signals | None,
) -> ObjectLog:
    """Logged trajectories (A, T): constant ``speed`` along the route from ``sigma`` until
    ``goal_s`` (all (A,)), then standing; box sizes from ``draws`` length/width. With
    ``sig`` (a signalised scene), vehicles on incoming lanes follow ``_signal_arc``."""
    A, T, f32 = scfg.max_agents, scfg.num_steps, jnp.float32
    offset, spawned, agent_lane = sc.offset, sp.spawned, sp.agent_lane
    length = _lerp(draws["length"], *cfg.length)
    width = _lerp(draws["width"], *cfg.width)
    times = jnp.arange(T, dtype=f32) * cfg.dt
    s_t = jnp.minimum(sigma[:, None] + speed[:, None] * times[None, :], goal_s[:, None])
    v0 = speed
    if sig is not None:
        incoming = (agent_lane // lay.n_max) % 2 == 1
        obeys = sig.on & spawned & incoming
        s_sig, v0_sig = _signal_arc(cfg, lay, routes, sp, sig, speed, goal_s, sigma, length)
        s_t = jnp.where(obeys[:, None], s_sig, s_t)
        v0 = jnp.where(obeys, v0_sig, speed)
    xy, yaw = jax.vmap(_interp_route)(routes.pts[agent_lane], routes.cum[agent_lane], s_t)
    goal_xy, _ = jax.vmap(_interp_route)(
        routes.pts[agent_lane], routes.cum[agent_lane], goal_s[:, None]
    )
    xy = (xy + offset).astype(f32)
    vel0 = v0[:, None] * jnp.stack([jnp.cos(yaw[:, 0]), jnp.sin(yaw[:, 0])], -1)
    vel = jnp.concatenate([vel0[:, None], (xy[:, 1:] - xy[:, :-1]) / cfg.dt], axis=1)
    m1, m2 = spawned[:, None], spawned[:, None, None]
    ar = jnp.arange(A)
    return ObjectLog(
        xy=jnp.where(m2, xy, 0.0),
        yaw=jnp.where(m1, yaw, 0.0).astype(f32),
        vel=jnp.where(m2, vel, 0.0).astype(f32),
        valid=jnp.broadcast_to(m1, (A, T)),
        length=jnp.where(spawned, length, 0.0),
        width=jnp.where(spawned, width, 0.0),
        type=jnp.where(spawned, int(ObjectType.VEHICLE), int(ObjectType.UNSET)).astype(jnp.int32),
        goal=jnp.where(spawned[:, None], goal_xy[:, 0] + offset, 0.0).astype(f32),
        is_sdc=spawned & (ar == 0),
        of_interest=spawned & (ar < 2),
        to_predict=spawned & (ar < 4),
    )


def _uniform_exit_goals(exit_key: jax.Array, cfg: ProceduralConfig, lay: _Layout,
                        sc: _Scene, conns: _Connectors, sp: _Spawn, goal: jax.Array):
    """Goals of ``goal_exit: uniform`` from the draws of ``exit_key`` only.

    Args:
      goal: (A, 2) float32, the route goals (kept for vehicles on outgoing lanes).
    Returns:
      goal (A, 2) float32 and exit arm (A,) int32 of every agent slot (incoming lanes
      only; the other entries are -1 and the caller fills them in).
    """
    nm = lay.n_max
    u_exit, u_dist = jax.random.uniform(exit_key, (2, sp.spawned.shape[0]), jnp.float32)
    lane = sp.agent_lane
    arm, incoming, k = lane // (2 * nm), (lane // nm) % 2 == 1, lane % nm
    j = jnp.clip(jnp.floor(u_exit * (sc.n_arms - 1)).astype(jnp.int32), 0,
                 jnp.maximum(sc.n_arms - 2, 0))
    b = conns.b_arm[arm, j]
    # The outgoing lane k of arm b is s * u_b - y_k * n_b for s >= r_j (``_arm_lanes``).
    s = sc.r_j + _lerp(u_dist, *cfg.exit_goal_distance)
    xy = s[:, None] * sc.u[b] - sc.y[k][:, None] * sc.nrm[b] + sc.offset
    moved = sp.spawned & incoming
    return (jnp.where(moved[:, None], xy, goal).astype(jnp.float32),
            jnp.where(moved, b, -1).astype(jnp.int32))


def _conflict_free(objects: ObjectLog, agent_lane: jax.Array, stop_radius: float) -> jax.Array:
    """(A,) bool: the vehicles kept by ``log_conflicts: drop``. Greedy in slot order: a
    spawned vehicle is kept unless, at some log step, its box comes within
    ``_CONFLICT_CLEARANCE`` of the box of a vehicle kept before it from another spawn lane
    (vehicles of one lane keep their gap by construction). Besides its logged box, each
    vehicle counts with its box at the first log step within ``stop_radius`` of its goal,
    from that step on: a simulated vehicle may stop there (``goal_behavior: stop``)."""
    A, T = objects.xy.shape[:2]
    pad = 2.0 * _CONFLICT_CLEARANCE
    near = jnp.linalg.norm(objects.xy - objects.goal[:, None], axis=-1) <= stop_radius
    t_near = jnp.where(jnp.any(near, 1), jnp.argmax(near, 1), T)
    at_near = lambda x: jnp.take_along_axis(
        x, jnp.minimum(t_near, T - 1).reshape((A, 1) + (1,) * (x.ndim - 2)), 1)
    stopped = objects.valid & (jnp.arange(T)[None, :] >= t_near[:, None])  # (A, T)
    # 2A boxes per step: the logged ones, then the early stops.
    xy = jnp.concatenate([objects.xy, jnp.broadcast_to(at_near(objects.xy), (A, T, 2))])
    yaw = jnp.concatenate([objects.yaw, jnp.broadcast_to(at_near(objects.yaw), (A, T))])
    valid = jnp.concatenate([objects.valid, stopped])
    length = jnp.tile(objects.length, 2) + pad
    width = jnp.tile(objects.width, 2) + pad

    def overlaps_at(xy, yaw, valid):  # (2A, 2), (2A,) x2 -> (A, A)
        hit = geometry.pairwise_overlap(xy, yaw, length, width, valid).reshape(2, A, 2, A)
        return jnp.any(hit, axis=(0, 2))

    hit = jnp.any(jax.vmap(overlaps_at, in_axes=(1, 1, 1))(xy, yaw, valid), axis=0)
    hit = hit & (agent_lane[:, None] != agent_lane[None, :])
    spawned = objects.valid[:, 0]

    def keep_next(i, keep):
        return keep.at[i].set(spawned[i] & ~jnp.any(hit[i] & keep))

    return jax.lax.fori_loop(0, A, keep_next, jnp.zeros((A,), bool))


def _keep_agents(objects: ObjectLog, info_agents: dict, keep: jax.Array):
    """Agents ``keep`` (A,) bool moved to the front slots in their order, the rest
    emptied: the new ``ObjectLog`` (SDC / interest / prediction flags by slot as the
    generator sets them) and ``info_agents`` (name -> (A, ...) array) likewise."""
    A = keep.shape[0]
    order = jnp.argsort(~keep, stable=True)
    kept = keep[order]
    ar = jnp.arange(A)

    def take(x, empty):
        x = x[order]
        m = kept.reshape((A,) + (1,) * (x.ndim - 1))
        return jnp.where(m, x, jnp.asarray(empty, x.dtype))

    objects = objects.replace(
        xy=take(objects.xy, 0.0), yaw=take(objects.yaw, 0.0), vel=take(objects.vel, 0.0),
        valid=take(objects.valid, False), length=take(objects.length, 0.0),
        width=take(objects.width, 0.0), type=take(objects.type, int(ObjectType.UNSET)),
        goal=take(objects.goal, 0.0), is_sdc=kept & (ar == 0), of_interest=kept & (ar < 2),
        to_predict=kept & (ar < 4),
    )
    empty = {"agent_speed": 0.0, "agent_goal_distance": 0.0}
    info_agents = {k: take(v, empty.get(k, -1)) for k, v in info_agents.items()}
    return objects, info_agents

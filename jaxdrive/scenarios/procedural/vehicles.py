"""Vehicles of one scene: each lane's route, the spawned vehicles, their speeds and goals
(a follower keeps ``follow_gap`` behind its leader)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxdrive.scenarios.procedural.config import (
    ProceduralConfig,
)
from jaxdrive.scenarios.procedural.layout import (
    _Layout,
)
from jaxdrive.scenarios.procedural.roads import (
    _ArmLanes,
    _Connectors,
    _lerp,
    _randint,
    _Scene,
    _scene_draw,
)


class _Routes(NamedTuple):
    """One route per arm lane slot (all vehicles of a lane share it), P points each."""

    pts: jax.Array  # (n_arm_lanes, P, 2), P = 2 K + Kc
    cum: jax.Array  # (n_arm_lanes, P) arc length at each point
    length: jax.Array  # (n_arm_lanes,) total arc length
    lane_ids: jax.Array  # (n_arm_lanes, 3) int32 lanes along the route, -1 padded
    exit_arm: jax.Array  # (n_arm_lanes,) int32 arm the route leaves by


def _routes(
    lay: _Layout, sc: _Scene, arms: _ArmLanes, conns: _Connectors, conn_id, out_id, pick_u
) -> _Routes:
    """Incoming lanes take a random connector (``pick_u``: (N * nm,) uniforms) and its
    outgoing lane; outgoing lanes drive outward (their tail repeats the last point)."""
    N, nm, K, k_idx = lay.num_slots, lay.n_max, lay.k_arm, sc.k_idx
    pick = jnp.floor(pick_u.reshape(N, nm) * (sc.n_arms - 1)).astype(jnp.int32)
    pick = jnp.clip(pick, 0, jnp.maximum(sc.n_arms - 2, 0))
    a_ix = jnp.arange(N)[:, None]
    route_conn = conns.pts[a_ix, pick, k_idx[None, :]]  # (N, nm, Kc, 2)
    route_b = conns.b_arm[a_ix, pick]  # (N, nm)
    route_out = arms.pts[route_b, 0, k_idx[None, :]]  # (N, nm, K, 2)
    in_route = jnp.concatenate([arms.pts[:, 1], route_conn, route_out], axis=2)
    tail = jnp.broadcast_to(arms.lane_out[:, :, -1:], (N, nm, lay.k_conn + K, 2))
    out_route = jnp.concatenate([arms.lane_out, tail], axis=2)
    routes = jnp.stack([out_route, in_route], axis=1).reshape(lay.n_arm_lanes, -1, 2)
    seg = jnp.sqrt(jnp.sum(jnp.diff(routes, axis=1) ** 2, -1))
    cum = jnp.concatenate([jnp.zeros((lay.n_arm_lanes, 1)), jnp.cumsum(seg, axis=1)], axis=1)
    route_len = cum[:, -1]
    route_ids = jnp.stack(
        [
            jnp.stack([out_id, jnp.full_like(out_id, -1), jnp.full_like(out_id, -1)], -1),
            jnp.stack(
                [out_id + nm, conn_id[a_ix, pick, k_idx[None, :]], out_id[route_b, k_idx[None, :]]],
                -1,
            ),
        ],
        axis=1,
    ).reshape(lay.n_arm_lanes, 3)
    exit_arm = jnp.stack([jnp.broadcast_to(a_ix, (N, nm)), route_b], axis=1)
    return _Routes(routes, cum, route_len, route_ids,
                   exit_arm.reshape(lay.n_arm_lanes).astype(jnp.int32))


class _Spawn(NamedTuple):
    """Which spawn slots got a vehicle (A agent slots; slot = (lane, j))."""

    spawned: jax.Array  # (A,) bool
    agent_lane: jax.Array  # (A,) arm lane index of each agent
    agent_j: jax.Array  # (A,) slot index along that lane
    slot_spawned: jax.Array  # (n_arm_lanes, k_slots) bool


def _spawn(cfg: ProceduralConfig, lay: _Layout, num_agents: int, sc: _Scene, draws) -> _Spawn:
    """Random eligible slots (``draws`` prio, sdc); the SDC, preferably on an incoming
    lane (always, under ``goal_exit: uniform``), is swapped into agent slot 0."""
    A = num_agents
    n_slots = lay.n_arm_lanes * lay.k_slots
    lane_dir = (jnp.arange(lay.n_arm_lanes) // lay.n_max) % 2
    slot_ok = sc.lane_on.reshape(-1)[:, None] & jnp.asarray(lay.eligible)[lane_dir]
    prio = jnp.where(slot_ok.reshape(-1), draws["prio"], -1.0)
    if cfg.goal_exit == "uniform":
        # The best incoming slot outranks every other (prio < 1), so it is spawned and
        # the SDC, the best-scored incoming vehicle below, exists.
        slot_in = (slot_ok & (lane_dir == 1)[:, None]).reshape(-1)
        best = jnp.argmax(jnp.where(slot_in, prio, -1.0))
        prio = prio.at[best].set(jnp.where(slot_in[best], 2.0, prio[best]))
    k_top = min(A, n_slots)
    _, idx = jax.lax.top_k(prio, k_top)
    idx = jnp.concatenate([idx, jnp.full((A - k_top,), n_slots, idx.dtype)])
    n_target = _randint(_scene_draw(draws, "num_agents"), *cfg.num_agents).astype(jnp.int32)
    n_spawn = jnp.minimum(jnp.minimum(n_target, jnp.sum(slot_ok)), A)
    spawned = jnp.arange(A) < n_spawn
    agent_lane = jnp.minimum(idx // lay.k_slots, lay.n_arm_lanes - 1)
    # SDC: a random spawned vehicle, preferring incoming lanes; swapped into slot 0.
    incoming = lane_dir[agent_lane] == 1
    score = jnp.where(spawned, incoming + 0.5 * draws["sdc"], -1.0)
    sdc = jnp.argmax(score)
    idx = idx.at[0].set(idx[sdc]).at[sdc].set(idx[0])
    agent_lane = jnp.minimum(idx // lay.k_slots, lay.n_arm_lanes - 1)
    agent_j = jnp.minimum(idx % lay.k_slots, lay.k_slots - 1)
    slot_spawned = (
        jnp.zeros((n_slots,), bool)
        .at[idx]
        .set(spawned, mode="drop")
        .reshape(lay.n_arm_lanes, lay.k_slots)
    )
    return _Spawn(spawned, agent_lane, agent_j, slot_spawned)


def _speeds_and_goals(
    cfg: ProceduralConfig, num_steps: int, lay: _Layout, draws, route_len, sp: _Spawn
):
    """Per-lane speeds and goals, leader (largest sigma) first, so followers never
    rear-end. ``route_len``: (n_arm_lanes,).

    Returns:
      speed, goal_s (arc length of the goal), sigma (arc length at spawn): (A,) each.
    """
    f32 = jnp.float32
    v_lo, v_hi = cfg.speed
    g_lo, g_hi = cfg.goal_distance
    t_end = (num_steps - 1) * cfg.dt
    v_samp = _lerp(draws["speed"], v_lo, v_hi).reshape(lay.k_slots, lay.n_arm_lanes)
    u_goal = draws["goal"].reshape(lay.k_slots, lay.n_arm_lanes)
    goal_cap = route_len - lay.l_max / 2

    def follow(carry, xs):
        has, s_l, v_l, g_l = carry
        on, sig, vs, ug = xs
        t_l = jnp.minimum((g_l - s_l) / v_l, t_end)
        v_cap = v_l + (s_l - sig - lay.follow_gap) / jnp.maximum(t_l, 1e-6)
        v = jnp.where(has, jnp.minimum(vs, v_cap), vs)
        ub = (
            jnp.minimum(
                jnp.minimum(sig + g_hi, goal_cap), jnp.where(has, g_l - lay.slot_gap, jnp.inf)
            )
            - sig
        )
        g = sig + g_lo + ug * jnp.maximum(ub - g_lo, 0.0)
        new = (has | on, jnp.where(on, sig, s_l), jnp.where(on, v, v_l), jnp.where(on, g, g_l))
        return new, (v, g)

    init = (
        jnp.zeros(lay.n_arm_lanes, bool),
        jnp.zeros(lay.n_arm_lanes),
        jnp.ones(lay.n_arm_lanes),
        jnp.zeros(lay.n_arm_lanes),
    )
    xs = (sp.slot_spawned.T, jnp.asarray(lay.sigma, f32), v_samp, u_goal)
    _, (v_slot, g_slot) = jax.lax.scan(follow, init, xs, reverse=True)
    speed = v_slot[sp.agent_j, sp.agent_lane]
    goal_s = g_slot[sp.agent_j, sp.agent_lane]
    sigma = jnp.asarray(lay.sigma, f32)[sp.agent_j]
    return speed, goal_s, sigma

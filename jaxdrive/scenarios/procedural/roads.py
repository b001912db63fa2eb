"""The road graph of one scene: the scene's draws, arm lanes, junction connectors, road
edges, road lines, crosswalks, and the packed ``Roadgraph`` / ``LaneGraph``."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural.config import (
    _CROSSWALK_SETBACK,
    _CROSSWALK_WIDTH,
    NUM_ARMS,
    ProceduralConfig,
)
from jaxdrive.scenarios.procedural.layout import (
    _base_angles,
    _connector_ends,
    _corner_ends,
    _frames,
    _hermite_points,
    _junction_radius,
    _Layout,
    _next_arm,
)
from jaxdrive.types import (
    LaneGraph,
    Roadgraph,
    RoadType,
)

# ----------------------------------------------------------------------------------------
# The generator.


def _flat_polylines(xy, valid, rtype, ids):
    """(P, K, 2) points, (P, K) valid, (P,) ids -> flat (P*K,) road-point arrays."""
    p, k = xy.shape[:2]
    rep = lambda x: jnp.broadcast_to(x[:, None], (p, k)).reshape(-1)
    return (
        xy.reshape(-1, 2),
        jnp.full((p * k,), int(rtype), jnp.int32),
        rep(ids.astype(jnp.int32)),
        valid.reshape(-1),
    )


def _polyline_dirs(xy, ids, valid):
    """(R, 2) unit vector to the next point of the same polyline (previous segment's at
    the last point, zero for single points)."""
    has_next = valid[1:] & valid[:-1] & (ids[1:] == ids[:-1])
    d = xy[1:] - xy[:-1]
    norm = jnp.sqrt(jnp.sum(d * d, -1, keepdims=True))
    d = jnp.where(has_next[:, None] & (norm > 0), d / jnp.where(norm > 0, norm, 1.0), 0.0)
    fwd = jnp.concatenate([d, jnp.zeros((1, 2), d.dtype)])
    back = jnp.concatenate([jnp.zeros((1, 2), d.dtype), d])
    has_next = jnp.concatenate([has_next, jnp.zeros(1, bool)])
    return jnp.where(has_next[:, None], fwd, back)


def _interp_route(pts, cum, s):
    """Position and tangent yaw at arc lengths s (T,) along one polyline (P, 2)."""
    i = jnp.clip(jnp.searchsorted(cum, s, side="right") - 1, 0, pts.shape[0] - 2)
    c0 = cum[i]
    seg = cum[i + 1] - c0
    f = jnp.clip((s - c0) / jnp.where(seg > 0, seg, 1.0), 0.0, 1.0)
    a, b = pts[i], pts[i + 1]
    xy = a + f[:, None] * (b - a)
    yaw = jnp.arctan2(b[:, 1] - a[:, 1], b[:, 0] - a[:, 0])
    return xy, yaw


def _lerp(x, lo, hi):
    """Uniform draw(s) ``x`` in [0, 1) mapped onto [lo, hi) (same shape as ``x``)."""
    return lo + x * (hi - lo)


def _randint(x, lo, hi):
    """() uniform ``x`` in [0, 1) -> () float integer in [lo, hi] (cast by the caller)."""
    return jnp.minimum(lo + jnp.floor(x * (hi - lo + 1)), hi)


# The scalar draws of one scene, in their slots of the "scene" piece (12 slots, 2 spare).
_SCENE_DRAWS = (
    "topology",
    "lanes",
    "lane_width",
    "curve_turn",
    "rotation",
    "curve_radius",
    "corner_radius",
    "offset_x",
    "offset_y",
    "num_agents",
)


def _scene_draw(draws: dict, name: str) -> jax.Array:
    """() float32: the uniform of the named scalar draw (see ``_SCENE_DRAWS``)."""
    return jax.lax.index_in_dim(draws["scene"], _SCENE_DRAWS.index(name), keepdims=False)


def _draw_uniforms(key: jax.Array, lay: _Layout, num_agents: int) -> dict:
    """Every uniform draw of one scene, from one ``jax.random.uniform`` call.

    One draw carved into pieces: far less code to compile than many draws.

    Returns:
      dict of float32 pieces: ``scene`` (12,) scalar draws (see ``_scene_draw``),
      ``jitter`` (N,), ``pick`` (N * n_max,), ``prio``, ``speed`` and ``goal``
      (n_arm_lanes * k_slots,), ``sdc``, ``length`` and ``width`` (A,).
    """
    N, nm = lay.num_slots, lay.n_max
    sizes = {
        "scene": 12,
        "jitter": N,
        "pick": N * nm,
        "prio": lay.n_arm_lanes * lay.k_slots,
        "sdc": num_agents,
        "speed": lay.k_slots * lay.n_arm_lanes,
        "goal": lay.k_slots * lay.n_arm_lanes,
        "length": num_agents,
        "width": num_agents,
    }
    flat = jax.random.uniform(key, (sum(sizes.values()),), jnp.float32)
    draws, start = {}, 0
    for name, size in sizes.items():
        draws[name], start = flat[start : start + size], start + size
    return draws


class _Scene(NamedTuple):
    """Sampled scene parameters and arm frames (N arm slots, nm = n_max lanes)."""

    topo: jax.Array  # () int32, index into TOPOLOGIES
    n: jax.Array  # () int32, lanes per direction
    w: jax.Array  # () float32, lane width
    n_arms: jax.Array  # () int32
    h: jax.Array  # () float32, road half-width n * w
    offset: jax.Array  # (2,) float32, world shift of the scene
    u: jax.Array  # (N, 2) arm directions
    nrm: jax.Array  # (N, 2) arm left normals
    r_j: jax.Array  # () junction radius
    arm_on: jax.Array  # (N,) bool
    k_idx: jax.Array  # (nm,) int32 lane index from the arm axis
    y: jax.Array  # (nm,) lateral lane-centre offsets
    lane_on: jax.Array  # (N, 2, nm) bool arm lanes present (direction 0 out, 1 in)


def _sample_scene(cfg: ProceduralConfig, lay: _Layout, draws: dict) -> _Scene:
    """Topology, lanes, width, arm angles, radii and offset from the scene draws."""
    N, nm = lay.num_slots, lay.n_max
    f32, i32 = jnp.float32, jnp.int32
    draw = lambda name: _scene_draw(draws, name)
    uni = lambda name, lo, hi: _lerp(draw(name), lo, hi)

    cum_w = np.cumsum(cfg.topology.as_tuple()) / sum(cfg.topology.as_tuple())
    topo = jnp.sum(draw("topology") >= jnp.asarray(cum_w[:-1], f32)).astype(i32)
    n_lo, n_hi = cfg.lanes_per_direction
    n = _randint(draw("lanes"), n_lo, n_hi).astype(i32)
    w = uni("lane_width", *cfg.lane_width)
    n_arms = jnp.asarray(NUM_ARMS, i32)[topo]
    turn = jnp.deg2rad(uni("curve_turn", *cfg.curve_turn))
    jit_deg = _lerp(draws["jitter"], -cfg.angle_jitter, cfg.angle_jitter) * (topo >= 2)
    psi = uni("rotation", 0.0, 2 * np.pi)
    theta = _base_angles(jnp, turn)[topo, :N] + jnp.deg2rad(jit_deg) + psi
    rho_curve = uni("curve_radius", *cfg.curve_radius)
    rho_corner = uni("corner_radius", *cfg.corner_radius)
    rho = jnp.where(topo == 1, rho_curve, rho_corner)
    h = n * w
    offset = jnp.stack([uni(f"offset_{c}", -cfg.max_offset, cfg.max_offset) for c in "xy"])
    u, nrm = _frames(jnp, theta)
    r_j = _junction_radius(jnp, theta, n_arms, h, rho)
    arm_on = jnp.arange(N) < n_arms
    k_idx = jnp.arange(nm)
    y = (k_idx + 0.5) * w
    lane_on = arm_on[:, None, None] & (k_idx < n)[None, None, :]  # (N, 2, nm)
    lane_on = jnp.broadcast_to(lane_on, (N, 2, nm))
    return _Scene(
        topo=topo,
        n=n,
        w=w,
        n_arms=n_arms,
        h=h,
        offset=offset,
        u=u,
        nrm=nrm,
        r_j=r_j,
        arm_on=arm_on,
        k_idx=k_idx,
        y=y,
        lane_on=lane_on,
    )


class _ArmLanes(NamedTuple):
    """Straight arm lanes in the local frame (K = k_arm points each)."""

    s_out: jax.Array  # (K,) distance from the hub, outward
    s_in: jax.Array  # (K,) the same, inward
    ua: jax.Array  # (N, 1, 1, 2) arm directions, broadcastable
    na: jax.Array  # (N, 1, 1, 2) arm normals, broadcastable
    lane_out: jax.Array  # (N, nm, K, 2) outgoing lanes
    pts: jax.Array  # (N, 2, nm, K, 2) outgoing and incoming lanes


def _arm_lanes(cfg: ProceduralConfig, lay: _Layout, sc: _Scene) -> _ArmLanes:
    """Lane-centre polylines of every arm lane slot (local frame, no offset)."""
    s_out = sc.r_j + jnp.linspace(0.0, cfg.arm_length, lay.k_arm)
    s_in = s_out[::-1]
    ua, na = sc.u[:, None, None, :], sc.nrm[:, None, None, :]
    yk = sc.y[None, :, None, None]
    lane_out = s_out[None, None, :, None] * ua - yk * na  # (N, nm, K, 2)
    lane_in = s_in[None, None, :, None] * ua + yk * na
    arm_pts = jnp.stack([lane_out, lane_in], axis=1)  # (N, 2, nm, K, 2)
    return _ArmLanes(s_out, s_in, ua, na, lane_out, arm_pts)


class _Connectors(NamedTuple):
    """Junction connector slots (Kc = k_conn points each)."""

    pts: jax.Array  # (N, N - 1, nm, Kc, 2)
    pt_on: jax.Array  # (N, N - 1, nm, Kc) bool, used points of each curve
    on: jax.Array  # (N, N - 1, nm) bool, connector present
    b_arm: jax.Array  # (N, N - 1) int32, target arm


def _connectors(cfg: ProceduralConfig, lay: _Layout, sc: _Scene) -> _Connectors:
    """Hermite connectors from each incoming lane to the same lane of every other arm."""
    N = lay.num_slots
    p0, d0, p1, d1, b_arm = _connector_ends(jnp, sc.u, sc.nrm, sc.r_j, sc.y, sc.n_arms)
    ps = cfg.point_spacing
    cap = jnp.asarray(lay.k_conn_topo, jnp.float32)[sc.topo]  # keeps the valid count within R
    conn_pts, conn_pt_on = _hermite_points(p0, d0, p1, d1, lay.k_conn, ps, cap)
    j_idx = jnp.arange(N - 1)
    conn_on = (
        sc.arm_on[:, None, None]
        & (j_idx < sc.n_arms - 1)[None, :, None]
        & (sc.k_idx < sc.n)[None, None, :]
    )
    return _Connectors(conn_pts, conn_pt_on, conn_on, b_arm)


def _road_edges(cfg: ProceduralConfig, lay: _Layout, sc: _Scene, arms: _ArmLanes):
    """Curbs between adjacent arms: (N, k_edge, 2) points and (N, k_edge) bool valid."""
    N, K = lay.num_slots, lay.k_arm
    u, nrm, h = sc.u, sc.nrm, sc.h
    c0, cd0, c1, cd1 = _corner_ends(jnp, u, nrm, sc.r_j, h, sc.n_arms)
    cap = jnp.asarray(lay.k_corner_topo, jnp.float32)[sc.topo]
    corner, corner_on = _hermite_points(c0, cd0, c1, cd1, lay.k_corner, cfg.point_spacing, cap)
    nxt = _next_arm(jnp, sc.n_arms, N)
    side_a = arms.s_in[None, :, None] * u[:, None, :] + h * nrm[:, None, :]
    side_b = arms.s_out[None, :, None] * u[nxt][:, None, :] - h * nrm[nxt][:, None, :]
    edges = jnp.concatenate([side_a[:, :-1], corner, side_b[:, 1:]], axis=1)
    ones = lambda m: jnp.ones((N, m), bool)
    edge_on = sc.arm_on[:, None] & jnp.concatenate([ones(K - 1), corner_on, ones(K - 1)], 1)
    return edges, edge_on


def _road_lines(lay: _Layout, sc: _Scene, arms: _ArmLanes):
    """Centre line and lane dividers per arm: (N, M, K, 2) points, (N, M) bool valid."""
    nm, n = lay.n_max, sc.n
    off = jnp.concatenate([jnp.zeros(1), jnp.arange(1, nm), -jnp.arange(1, nm)]) * sc.w
    line_on = (
        sc.arm_on[:, None]
        & jnp.concatenate([jnp.ones(1, bool), jnp.arange(1, nm) < n, jnp.arange(1, nm) < n])[
            None, :
        ]
    )
    lines = arms.s_out[None, None, :, None] * arms.ua + off[None, :, None, None] * arms.na
    return lines, line_on


def _crosswalks(sc: _Scene):
    """Crosswalk rectangles at arm mouths: (N, 5, 2) points, (N,) bool valid."""
    s0 = sc.r_j + _CROSSWALK_SETBACK
    s1 = s0 + _CROSSWALK_WIDTH
    cw_s = jnp.stack([s0, s1, s1, s0, s0])
    cw_l = jnp.stack([-sc.h, -sc.h, sc.h, sc.h, -sc.h])
    cross = cw_s[None, :, None] * sc.u[:, None, :] + cw_l[None, :, None] * sc.nrm[:, None, :]
    cross_on = sc.arm_on & (sc.topo >= 2)
    return cross, cross_on


def _pack_roadgraph(
    scfg: ScenarioConfig,
    lay: _Layout,
    sc: _Scene,
    arms: _ArmLanes,
    conns: _Connectors,
    edges,
    lines,
    cross,
    lane_ids: jax.Array,
) -> Roadgraph:
    """All polylines laid out statically, valid points compacted to the front of (R,).

    ``edges``, ``lines``, ``cross``: (points, valid) pairs from ``_road_edges``,
    ``_road_lines``, ``_crosswalks``; ``lane_ids``: (n_arm_lanes + n_conn,) int32.
    """
    N, K, L = lay.num_slots, lay.k_arm, scfg.max_lanes
    (edge_xy, edge_on), (line_xy, line_on), (cross_xy, cross_on) = edges, lines, cross
    base = L + N
    full = lambda on, k: jnp.broadcast_to(on.reshape(-1, 1), (on.size, k))
    groups = [
        _flat_polylines(
            arms.pts.reshape(-1, K, 2),
            full(sc.lane_on, K),
            RoadType.LANE_CENTER,
            lane_ids[: lay.n_arm_lanes],
        ),
        _flat_polylines(
            conns.pts.reshape(-1, lay.k_conn, 2),
            (conns.on[..., None] & conns.pt_on).reshape(-1, lay.k_conn),
            RoadType.LANE_CENTER,
            lane_ids[lay.n_arm_lanes :],
        ),
        _flat_polylines(edge_xy, edge_on, RoadType.ROAD_EDGE, L + jnp.arange(N)),
        _flat_polylines(
            line_xy.reshape(-1, K, 2),
            full(line_on, K),
            RoadType.ROAD_LINE,
            base + jnp.arange(N * lay.n_lines),
        ),
        _flat_polylines(
            cross_xy,
            full(cross_on, 5),
            RoadType.CROSSWALK,
            base + N * lay.n_lines + jnp.arange(N),
        ),
    ]
    return _compact_roadgraph(groups, scfg.max_road_points, sc.offset)


def _compact_roadgraph(groups, num_points: int, offset: jax.Array) -> Roadgraph:
    """``_flat_polylines`` groups -> Roadgraph of (R,) points, valid ones first, shifted
    by the (2,) ``offset``; padding is zeros with id -1."""
    R, f32, i32 = num_points, jnp.float32, jnp.int32
    rg_xy, rg_type, rg_id, rg_valid = (jnp.concatenate(x) for x in zip(*groups, strict=True))
    target = jnp.where(rg_valid, jnp.cumsum(rg_valid) - 1, R)
    put = lambda fill, x: fill.at[target].set(x, mode="drop")
    local_xy = put(jnp.zeros((R, 2), f32), rg_xy.astype(f32))
    ids = put(jnp.full((R,), -1, i32), rg_id)
    valid = put(jnp.zeros((R,), bool), rg_valid)
    return Roadgraph(
        xy=jnp.where(valid[:, None], local_xy + offset, 0.0).astype(f32),
        dir=_polyline_dirs(local_xy, ids, valid).astype(f32),
        type=put(jnp.zeros((R,), i32), rg_type),
        id=ids,
        valid=valid,
    )


def _lane_graph(
    scfg: ScenarioConfig, lay: _Layout, sc: _Scene, conns: _Connectors, lane_ids: jax.Array
):
    """Successors: incoming lane -> its connectors -> the connector's outgoing lane.

    Returns:
      LaneGraph (L, S); conn_id (N, N - 1, nm) and out_id (N, nm) int32 lane ids.
    """
    N, nm, k_idx = lay.num_slots, lay.n_max, sc.k_idx
    L, S, i32 = scfg.max_lanes, scfg.max_lane_successors, jnp.int32
    conn_on = conns.on
    conn_id = lane_ids[lay.n_arm_lanes :].reshape(N, N - 1, nm)
    out_id = ((jnp.arange(N)[:, None] * 2) * nm + k_idx[None, :]).astype(i32)  # (N, nm)
    succ_in = jnp.where(conn_on, conn_id, -1).transpose(0, 2, 1)  # (N, nm, N-1)
    succ_arm = jnp.full((N, 2, nm, S), -1, i32).at[:, 1, :, : N - 1].set(succ_in)
    conn_target = out_id[conns.b_arm[:, :, None], k_idx[None, None, :]]  # (N, N-1, nm)
    succ_conn = (
        jnp.full((N, N - 1, nm, S), -1, i32).at[..., 0].set(jnp.where(conn_on, conn_target, -1))
    )
    lanes = LaneGraph(
        successors=jnp.full((L, S), -1, i32)
        .at[: lay.need_lanes]
        .set(jnp.concatenate([succ_arm.reshape(-1, S), succ_conn.reshape(-1, S)])),
        valid=jnp.zeros((L,), bool)
        .at[: lay.need_lanes]
        .set(jnp.concatenate([sc.lane_on.reshape(-1), conn_on.reshape(-1)])),
    )
    return lanes, conn_id, out_id

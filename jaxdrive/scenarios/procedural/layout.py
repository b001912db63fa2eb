"""Junction geometry shared by the jitted generator (``xp = jnp``) and the static size
bound (``xp = np``), and the static layout of a config: worst-case sizes
(``required_sizes``, ``check_fits``)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax.numpy as jnp
import numpy as np

from jaxdrive.config import (
    ConfigError,
)
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural.config import (
    _MAX_GAP,
    NUM_ARMS,
    ProceduralConfig,
    follow_gap,
)

# ----------------------------------------------------------------------------------------
# Geometry shared by the jitted generator (xp = jnp) and the static size bound (xp = np).
# All functions take arbitrary leading batch axes.


def _frames(xp, theta):
    """(..., N) arm angles -> unit directions and left normals, (..., N, 2) each."""
    c, s = xp.cos(theta), xp.sin(theta)
    return xp.stack([c, s], -1), xp.stack([-s, c], -1)


def _next_arm(xp, n_arms, num_slots):
    """(...,) n_arms -> (..., N) index of the counter-clockwise next active arm."""
    a = xp.arange(num_slots)
    return xp.where(a + 1 < n_arms[..., None], a + 1, 0)


def _take_arms(xp, x, idx):
    """x (..., N, 2), idx (..., M) -> (..., M, 2)."""
    return xp.take_along_axis(x, idx[..., None], axis=-2)


def _junction_radius(xp, theta, n_arms, h, rho):
    """Smallest radius at which adjacent arm strips (half-width h) are disjoint with a
    curb of radius ~rho between them. theta (..., N); n_arms, h, rho (...,) -> (...,)."""
    num_slots = theta.shape[-1]
    nxt = _next_arm(xp, n_arms, num_slots)
    gap = xp.mod(xp.take_along_axis(theta, nxt, axis=-1) - theta, 2 * np.pi)
    active = xp.arange(num_slots) < n_arms[..., None]
    terms = (h + rho)[..., None] / xp.tan(xp.minimum(gap, _MAX_GAP) / 2)
    return xp.maximum(rho, xp.max(xp.where(active, terms, 0.0), axis=-1))


def _connector_ends(xp, u, nrm, r_j, y, n_arms):
    """Hermite end conditions of every connector slot.

    Args:
      u, nrm: (..., N, 2) arm frames; r_j: (...,); y: (..., K) lateral lane offsets;
      n_arms: (...,).
    Returns:
      p0, d0, p1, d1: (..., N, N - 1, K, 2); target arm b: (..., N, N - 1).
    """
    num_slots = u.shape[-2]
    a = xp.arange(num_slots)[:, None]
    j = xp.arange(num_slots - 1)[None, :]
    b = xp.mod(a + 1 + j, n_arms[..., None, None])
    lead = b.shape[:-2]
    flat = b.reshape(lead + (num_slots * (num_slots - 1),))
    ub = _take_arms(xp, u, flat).reshape(lead + (num_slots, num_slots - 1, 2))
    nb = _take_arms(xp, nrm, flat).reshape(lead + (num_slots, num_slots - 1, 2))
    r = r_j[..., None, None, None, None]
    yk = y[..., None, None, :, None]
    ua, na = u[..., :, None, None, :], nrm[..., :, None, None, :]
    ub, nb = ub[..., :, :, None, :], nb[..., :, :, None, :]
    shape = lead + (num_slots, num_slots - 1, y.shape[-1], 2)
    p0 = xp.broadcast_to(r * ua + yk * na, shape)
    d0 = xp.broadcast_to(-ua, shape)
    p1 = xp.broadcast_to(r * ub - yk * nb, shape)
    d1 = xp.broadcast_to(ub, shape)
    return p0, d0, p1, d1, b


def _corner_ends(xp, u, nrm, r_j, h, n_arms):
    """Curb curve from arm a's left side to the next arm's right side: (..., N, 2) x4."""
    nxt = _next_arm(xp, n_arms, u.shape[-2])
    ub, nb = _take_arms(xp, u, nxt), _take_arms(xp, nrm, nxt)
    r, hh = r_j[..., None, None], h[..., None, None]
    return r * u + hh * nrm, -u, r * ub - hh * nb, ub


def _hermite_coeffs(xp, p0, d0, p1, d1):
    """Tangent magnitude that makes a cubic Hermite close to a circular arc: chord /
    cos^2(turn / 4) (the Bezier arc approximation), exact for straight lines."""
    chord = xp.sqrt(xp.sum((p1 - p0) ** 2, axis=-1))
    cos_turn = xp.clip(xp.sum(d0 * d1, axis=-1), -1.0, 1.0)
    return chord / xp.cos(xp.arccos(cos_turn) / 4) ** 2


def _hermite_eval(xp, p0, d0, p1, d1, t, derivative=False):
    """(..., 2) end conditions, t (..., K) -> (..., K, 2) points (or dH/dt)."""
    m = _hermite_coeffs(xp, p0, d0, p1, d1)[..., None, None]
    t = t[..., None]
    t2, t3 = t * t, t * t * t
    if derivative:
        c = (6 * t2 - 6 * t, 3 * t2 - 4 * t + 1, -6 * t2 + 6 * t, 3 * t2 - 2 * t)
    else:
        c = (2 * t3 - 3 * t2 + 1, t3 - 2 * t2 + t, -2 * t3 + 3 * t2, t3 - t2)
    return (
        c[0] * p0[..., None, :]
        + c[1] * m * d0[..., None, :]
        + c[2] * p1[..., None, :]
        + c[3] * m * d1[..., None, :]
    )


def _hermite_max_speed(xp, p0, d0, p1, d1, samples):
    """max over the curve of |dH/dt| (length per unit parameter), (...,)."""
    dh = _hermite_eval(xp, p0, d0, p1, d1, xp.linspace(0.0, 1.0, samples), derivative=True)
    return xp.max(xp.sqrt(xp.sum(dh**2, axis=-1)), axis=-1)


def _hermite_points(p0, d0, p1, d1, num, spacing, cap):
    """Up to ``cap <= num`` points at uniform curve parameter, as few as keep the spacing
    <= ``spacing``; the unused tail repeats the end point and is masked out.

    Returns:
      (..., num, 2) points and (..., num) bool mask.
    """
    need = jnp.ceil(1.05 * _hermite_max_speed(jnp, p0, d0, p1, d1, 17) / spacing) + 1
    count = jnp.clip(need, 2, cap)
    i = jnp.arange(num, dtype=jnp.float32)
    t = jnp.minimum(i / (count[..., None] - 1), 1.0)
    return _hermite_eval(jnp, p0, d0, p1, d1, t), i < count[..., None]


def _base_angles(xp, turn):
    """(...,) curve turn (rad) -> (..., 4 topologies, 4 arm slots) arm angles."""
    turn = xp.asarray(turn)
    z = xp.zeros_like(turn)
    pi = z + np.pi
    rows = [
        [z, pi, pi, pi],
        [z, pi - turn, pi, pi],
        [z, z + np.pi / 2, pi, pi],
        [z, z + np.pi / 2, pi, z + 1.5 * np.pi],
    ]
    return xp.stack([xp.stack(r, -1) for r in rows], -2)


# ----------------------------------------------------------------------------------------
# Static layout (python ints / numpy, from the config only).


@dataclasses.dataclass(frozen=True)
class _Layout:
    num_slots: int  # N, arm slots: most arms among enabled topologies
    n_max: int
    k_arm: int  # points per arm-long polyline
    k_conn: int  # points per connector
    k_corner: int  # points per curb corner
    k_conn_topo: tuple  # per topology: the valid-point cap of its connectors
    k_corner_topo: tuple
    k_edge: int
    k_slots: int  # spawn slots per arm lane
    sigma: np.ndarray  # (k_slots,) slot centre distance from the lane start
    eligible: np.ndarray  # (2, k_slots) bool, by direction (0 out, 1 in)
    n_arm_lanes: int
    n_conn: int
    n_lines: int  # lines per arm
    need_points: int
    need_lanes: int
    need_successors: int
    l_max: float
    slot_gap: float  # slot spacing
    follow_gap: float  # centre distance a moving follower keeps to its leader
    signalled: bool  # some scene can have lights (signals > 0, a junction enabled)
    need_lights: int  # light slots of the largest signalised scene (0 if none)


def _bound_curve_points(config: ProceduralConfig, num_slots: int):
    """Per topology, points per connector / curb corner so that spacing <= point_spacing,
    from the worst Hermite speed over the extreme parameter combinations (+5 %).

    Returns:
      two 4-tuples (connector, corner) of point counts, 0 for disabled topologies.
    """
    enabled = [i for i, w in enumerate(config.topology.as_tuple()) if w > 0]
    jit = math.radians(config.angle_jitter)
    ps = config.point_spacing
    k_conn, k_corner = [0] * 4, [0] * 4
    n_hi, w_hi = config.lanes_per_direction[1], config.lane_width[1]
    for topo in enabled:
        na = NUM_ARMS[topo]
        jitters = itertools.product((-jit, 0.0, jit), repeat=na) if topo >= 2 else [(0.0,) * na]
        turns = config.curve_turn if topo == 1 else (0.0,)
        radii = config.curve_radius if topo == 1 else config.corner_radius
        # Lengths grow with the road half-width, so only the widest roads are checked.
        combos = list(itertools.product(jitters, turns, radii, [w_hi], [n_hi]))
        jitter = np.zeros((len(combos), num_slots))
        jitter[:, :na] = np.array([c[0] for c in combos])
        turn = np.radians(np.array([c[1] for c in combos]))
        rho = np.array([c[2] for c in combos], float)
        w = np.array([c[3] for c in combos], float)
        n = np.array([c[4] for c in combos], float)
        theta = _base_angles(np, turn)[:, topo, :num_slots] + jitter
        n_arms = np.full(len(combos), na)
        h = n * w
        u, nrm = _frames(np, theta)
        r_j = _junction_radius(np, theta, n_arms, h, rho)
        y = (np.arange(n_hi)[None, :] + 0.5) * w[:, None]
        valid_k = np.arange(n_hi)[None, :] < n[:, None]
        p0, d0, p1, d1, _ = _connector_ends(np, u, nrm, r_j, y, n_arms)
        sp = _hermite_max_speed(np, p0, d0, p1, d1, 65)  # (B, N, N-1, K)
        valid = (
            (np.arange(num_slots)[None, :, None, None] < na)
            & (np.arange(num_slots - 1)[None, None, :, None] < na - 1)
            & valid_k[:, None, None, :]
        )
        speed_conn = float(np.max(np.where(valid, sp, 0.0)))
        c = _corner_ends(np, u, nrm, r_j, h, n_arms)
        speed_corner = float(_hermite_max_speed(np, *c, 65)[:, :na].max())
        k_conn[topo] = max(2, math.ceil(1.05 * speed_conn / ps) + 1)
        k_corner[topo] = max(2, math.ceil(1.05 * speed_corner / ps) + 1)
    return tuple(k_conn), tuple(k_corner)


@functools.lru_cache(maxsize=64)
def _layout(config: ProceduralConfig) -> _Layout:
    weights = config.topology.as_tuple()
    enabled = [i for i, w in enumerate(weights) if w > 0]
    num_slots = max(NUM_ARMS[i] for i in enabled)
    n_max = config.lanes_per_direction[1]
    k_arm = math.ceil(config.arm_length / config.point_spacing - 1e-9) + 1
    k_conn_topo, k_corner_topo = _bound_curve_points(config, num_slots)
    k_conn, k_corner = max(k_conn_topo), max(k_corner_topo)
    k_edge = 2 * k_arm + k_corner - 2
    l_max = float(config.length[1])
    slot_gap = l_max + config.spawn_gap
    # Slot limits: outgoing vehicles need goal_distance[0] of road ahead (their goal stays
    # l_max / 2 inside the arm end); incoming ones must not reach the junction before
    # junction_clear_steps.
    lim_out = config.arm_length - l_max / 2 - config.goal_distance[0]
    lim_in = (
        config.arm_length - l_max / 2 - config.speed[1] * config.junction_clear_steps * config.dt
    )
    k_slots = int(math.floor((max(lim_out, lim_in) - l_max / 2) / slot_gap + 1e-9)) + 1
    sigma = l_max / 2 + slot_gap * np.arange(k_slots)
    eligible = np.stack([sigma <= lim_out + 1e-6, sigma <= lim_in + 1e-6])
    n_lines = 2 * n_max - 1
    need_points = 0
    for topo in enabled:
        na = NUM_ARMS[topo]
        pts = (
            2 * na * n_max * k_arm
            + na * (na - 1) * n_max * k_conn_topo[topo]
            + na * (2 * k_arm + k_corner_topo[topo] - 2)
            + na * n_lines * k_arm
            + (5 * na if topo >= 2 else 0)
        )
        need_points = max(need_points, pts)
    n_arm_lanes = 2 * num_slots * n_max
    signalled = config.signals > 0 and (weights[2] > 0 or weights[3] > 0)
    n_conn = num_slots * (num_slots - 1) * n_max
    return _Layout(
        num_slots=num_slots,
        n_max=n_max,
        k_arm=k_arm,
        k_conn=k_conn,
        k_corner=k_corner,
        k_conn_topo=k_conn_topo,
        k_corner_topo=k_corner_topo,
        k_edge=k_edge,
        k_slots=k_slots,
        sigma=sigma,
        eligible=eligible,
        n_arm_lanes=n_arm_lanes,
        n_conn=n_conn,
        n_lines=n_lines,
        need_points=need_points,
        need_lanes=n_arm_lanes + n_conn,
        need_successors=max(1, num_slots - 1),
        l_max=l_max,
        slot_gap=slot_gap,
        follow_gap=follow_gap(config),
        signalled=signalled,
        need_lights=num_slots * n_max if signalled else 0,
    )


def required_sizes(config: ProceduralConfig) -> dict[str, int]:
    """Worst-case ``ScenarioConfig`` sizes this config needs.

    Returns:
      ``{"max_road_points": ..., "max_lanes": ..., "max_lane_successors": ...,
      "max_traffic_lights": ..., "spawn_slots": ...}`` (lights: one per incoming lane of
      the largest signalised scene, 0 without signals; spawn slots: eligible vehicle
      slots of the largest scene).
    """
    lay = _layout(config)
    most_arms = lay.num_slots
    slots = most_arms * lay.n_max * int(lay.eligible.sum())
    return {
        "max_road_points": lay.need_points,
        "max_lanes": lay.need_lanes,
        "max_lane_successors": lay.need_successors,
        "max_traffic_lights": lay.need_lights,
        "spawn_slots": slots,
    }


def check_fits(config: ProceduralConfig, scenario_config: ScenarioConfig) -> None:
    """Raise ``ConfigError`` naming the ``ScenarioConfig`` key that is too small."""
    need = required_sizes(config)
    if config.partner_convention != "none" and scenario_config.max_agents < 2:
        raise ConfigError(
            f"max_agents={scenario_config.max_agents} too small for partner_convention="
            f"{config.partner_convention!r}: the narrow-passing scene has 2 cars; raise "
            "scenario max_agents to 2.")
    what = (
        f"arm_length={config.arm_length}, point_spacing={config.point_spacing}, "
        f"lanes_per_direction={list(config.lanes_per_direction)}"
    )
    if scenario_config.max_road_points < need["max_road_points"]:
        raise ConfigError(
            f"max_road_points={scenario_config.max_road_points} too small for {what}: needs "
            f"{need['max_road_points']}; raise scenario max_road_points or point_spacing, or "
            "lower arm_length / lanes_per_direction."
        )
    if scenario_config.max_lanes < need["max_lanes"]:
        raise ConfigError(
            f"max_lanes={scenario_config.max_lanes} too small for "
            f"lanes_per_direction={list(config.lanes_per_direction)}: needs {need['max_lanes']}; "
            "raise scenario max_lanes or lower lanes_per_direction."
        )
    if scenario_config.max_lane_successors < need["max_lane_successors"]:
        raise ConfigError(
            f"max_lane_successors={scenario_config.max_lane_successors} too small for the "
            f"enabled topologies: needs {need['max_lane_successors']}; raise scenario "
            "max_lane_successors or set topology weights of junctions to 0."
        )
    if scenario_config.max_traffic_lights < need["max_traffic_lights"]:
        raise ConfigError(
            f"scenario.max_traffic_lights={scenario_config.max_traffic_lights} too small for "
            f"signals={config.signals} with lanes_per_direction="
            f"{list(config.lanes_per_direction)}: needs {need['max_traffic_lights']} (one light "
            "per incoming lane); raise scenario max_traffic_lights or set signals to 0."
        )

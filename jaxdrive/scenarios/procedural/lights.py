"""Traffic lights of a signalised scene: the two-phase cycle, and each incoming vehicle's
log stepped through it (stops at red, dilemma zone at yellow, keeps behind its leader)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural.config import (
    _SIGNAL_SALT,
    _STOP_MARGIN,
    _STOP_TOL,
    ProceduralConfig,
)
from jaxdrive.scenarios.procedural.layout import (
    _Layout,
)
from jaxdrive.scenarios.procedural.roads import (
    _ArmLanes,
    _lerp,
    _Scene,
)
from jaxdrive.scenarios.procedural.vehicles import (
    _Routes,
    _Spawn,
)
from jaxdrive.types import (
    TrafficLights,
    TrafficLightState,
)


class _Signals(NamedTuple):
    """The light cycle of one scene (all steps are log steps)."""

    on: jax.Array  # () bool, the scene is signalised
    green: jax.Array  # () int32 steps of green per phase
    cycle: jax.Array  # () int32 steps of the whole cycle
    offset: jax.Array  # () int32 cycle step at log step 0
    state: jax.Array  # (N, nm, T) int32 TrafficLightState of each incoming lane
    lights: TrafficLights


def _signals(
    key: jax.Array, cfg: ProceduralConfig, scfg: ScenarioConfig, lay: _Layout, sc: _Scene,
    arms: _ArmLanes,
) -> _Signals:
    """Phase cycle and lights of a scene; draws from ``fold_in(key, _SIGNAL_SALT)`` only.

    Two phases: arms {0, 2} (an intersection's one axis, a T-junction's through road),
    then arms {1, 3} (the other axis, the T's side arm). Each phase is green, yellow, then
    all-red; the other phase's approaches are red throughout. Durations are rounded to
    whole log steps; the cycle starts at a uniform offset.
    """
    N, nm, T = lay.num_slots, lay.n_max, scfg.num_steps
    i32 = jnp.int32
    u = jax.random.uniform(jax.random.fold_in(key, _SIGNAL_SALT), (3,), jnp.float32)
    on = (sc.topo >= 2) & (u[0] < cfg.signals)
    green = jnp.maximum(jnp.round(_lerp(u[1], *cfg.green) / cfg.dt), 1).astype(i32)
    yellow, all_red = round(cfg.yellow / cfg.dt), round(cfg.all_red / cfg.dt)
    phase_len = green + yellow + all_red
    cycle = 2 * phase_len
    offset = jnp.minimum(jnp.floor(u[2] * cycle).astype(i32), cycle - 1)
    tm = jnp.mod(jnp.arange(T, dtype=i32) + offset, cycle)
    phase, within = tm // phase_len, jnp.mod(tm, phase_len)
    own = phase[None, :] == (jnp.arange(N, dtype=i32) % 2)[:, None]  # (N, T)
    arm_state = jnp.where(
        own & (within < green)[None, :],
        int(TrafficLightState.GO),
        jnp.where(
            own & (within < green + yellow)[None, :],
            int(TrafficLightState.CAUTION),
            int(TrafficLightState.STOP),
        ),
    ).astype(i32)
    state = jnp.broadcast_to(arm_state[:, None, :], (N, nm, T))
    # One light per incoming lane slot (arm, k), at the lane's junction end.
    used = (on & sc.lane_on[:, 1, :]).reshape(-1)  # (N * nm,)
    lane_id = ((jnp.arange(N)[:, None] * 2 + 1) * nm + sc.k_idx[None, :]).reshape(-1)
    stop_xy = (arms.pts[:, 1, :, -1] + sc.offset).reshape(-1, 2)
    n = N * nm  # check_fits: TL >= n; the slots past n stay invalid
    lights = _no_traffic_lights(scfg)
    lights = TrafficLights(
        lane_id=lights.lane_id.at[:n].set(jnp.where(used, lane_id, -1).astype(i32)),
        stop_xy=lights.stop_xy.at[:n].set(jnp.where(used[:, None], stop_xy, 0.0)),
        state=lights.state.at[:n].set(jnp.where(used[:, None], state.reshape(n, T), 0)),
        valid=lights.valid.at[:n].set(jnp.broadcast_to(used[:, None], (n, T))),
    )
    return _Signals(on, green, cycle, offset, state, lights)


def _safe_speed(gap, b, dt):
    """Largest speed for the next step after which braking at ``b`` still stops within
    ``gap`` (m): ``v dt + v^2 / (2 b) = gap``, 0 for ``gap <= 0``."""
    return b * (jnp.sqrt(dt * dt + 2.0 * jnp.maximum(gap, 0.0) / b) - dt)


def _signal_arc(
    cfg: ProceduralConfig,
    lay: _Layout,
    routes: _Routes,
    sp: _Spawn,
    sig: _Signals,
    speed,
    goal_s,
    sigma,
    length,
):
    """Arc length (A, T) of vehicles that obey lights and their same-lane leader.

    Per step (Gipps-like): ``v' = min(v + launch_accel dt, speed, safe speeds)`` towards
    each obstacle, ``s' = min(s + v' dt, obstacles)``. Obstacles: the stop point (front
    ``_STOP_MARGIN`` before the line) when the lane's light is red at the next step, or
    yellow and the vehicle can stop at ``stop_decel``; the leader's previous position
    minus ``follow_gap`` (its stopping distance added to the safe-speed gap); the goal.
    A vehicle whose centre is past the line ignores the light; one between its stop point
    and the line when red comes stays put (the dilemma-zone rule on ``yellow`` keeps this
    rare).
    """
    nm = lay.n_max
    b, a, dt = cfg.stop_decel, cfg.launch_accel, cfg.dt
    lane = sp.agent_lane
    arm, k = lane // (2 * nm), lane % nm
    s_stop = routes.cum[lane, lay.k_arm - 1]  # the incoming lane's junction end
    s_tgt = s_stop - length / 2 - _STOP_MARGIN
    st = sig.state[arm, k]  # (A, T)
    red = st == int(TrafficLightState.STOP)
    yellow = st == int(TrafficLightState.CAUTION)
    # Leader: the spawned vehicle on the same lane nearest ahead.
    ahead = (
        (lane[:, None] == lane[None, :])
        & sp.spawned[None, :]
        & (sigma[None, :] > sigma[:, None])
    )
    leader = jnp.argmin(jnp.where(ahead, sigma[None, :], jnp.inf), axis=1)
    has_leader = jnp.any(ahead, axis=1)
    # Start at a speed the first step's rules keep (a light that is not green, the goal,
    # the leader at its own start speed), so nobody brakes hard at step 0. Leaders settle
    # before followers: k_slots passes reach the end of the longest chain.
    not_green = red[:, 0] | yellow[:, 0] | red[:, 1] | yellow[:, 1]
    v_own = jnp.minimum(speed, _safe_speed(goal_s - sigma, b, dt))
    v_own = jnp.where(
        not_green & (sigma <= s_tgt), jnp.minimum(v_own, _safe_speed(s_tgt - sigma, b, dt)), v_own
    )
    lead_gap0 = sigma[leader] - lay.follow_gap - sigma
    v0 = v_own
    for _ in range(lay.k_slots):
        v_lead = _safe_speed(lead_gap0 + v0[leader] ** 2 / (2.0 * b), b, dt)
        v0 = jnp.where(has_leader, jnp.minimum(v_own, v_lead), v_own)

    def step(carry, xs):
        s, v = carry
        red_n, yellow_n = xs
        # The tolerance keeps a vehicle that already brakes for yellow (safe-speed braking
        # lands it exactly on this boundary) from flipping to "cannot stop" on rounding.
        can_stop = v * v / (2.0 * b) <= s_tgt - s + _STOP_TOL
        light = (s < s_stop) & (red_n | (yellow_n & can_stop))
        obs_light = jnp.where(light, jnp.maximum(s_tgt, s), jnp.inf)
        obs_lead = jnp.where(has_leader, s[leader] - lay.follow_gap, jnp.inf)
        v_lead = v[leader]
        v_new = jnp.minimum(jnp.minimum(v + a * dt, speed), _safe_speed(goal_s - s, b, dt))
        v_new = jnp.where(light, jnp.minimum(v_new, _safe_speed(obs_light - s, b, dt)), v_new)
        lead_gap = obs_lead - s + v_lead * v_lead / (2.0 * b)
        v_new = jnp.where(has_leader, jnp.minimum(v_new, _safe_speed(lead_gap, b, dt)), v_new)
        obstacle = jnp.minimum(jnp.minimum(obs_light, obs_lead), goal_s)
        s_new = jnp.maximum(jnp.minimum(s + v_new * dt, obstacle), s)
        return (s_new, (s_new - s) / dt), s_new

    xs = (red[:, 1:].T, yellow[:, 1:].T)
    _, s_next = jax.lax.scan(step, (sigma, v0), xs)
    return jnp.concatenate([sigma[:, None], s_next.T], axis=1), v0


def _no_traffic_lights(scfg: ScenarioConfig) -> TrafficLights:
    """All TL traffic-light slots invalid: (TL,), (TL, 2), (TL, T) x2."""
    TL, T = scfg.max_traffic_lights, scfg.num_steps
    return TrafficLights(
        lane_id=jnp.full((TL,), -1, jnp.int32),
        stop_xy=jnp.zeros((TL, 2), jnp.float32),
        state=jnp.zeros((TL, T), jnp.int32),
        valid=jnp.zeros((TL, T), bool),
    )


def _signal_info(cfg: ProceduralConfig, sig: _Signals | None) -> dict:
    """``ProceduralInfo`` light fields (seconds; zeros unless signalised)."""
    f32 = jnp.float32
    if sig is None:
        return dict(signalised=jnp.zeros((), bool), green=jnp.zeros((), f32),
                    cycle=jnp.zeros((), f32), cycle_offset=jnp.zeros((), f32))
    sec = lambda steps: jnp.where(sig.on, steps * cfg.dt, 0.0).astype(f32)
    return dict(signalised=sig.on, green=sec(sig.green), cycle=sec(sig.cycle),
                cycle_offset=sec(sig.offset))

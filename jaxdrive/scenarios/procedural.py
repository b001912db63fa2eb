"""Built-in procedural scenario generator: seeded, jittable, vmappable, fixed shapes.

Every scene is a hub with 2, 3 or 4 straight arms around a junction of radius ``r_j``:

- ``straight``: 2 arms 180 degrees apart (one straight road; the "junction" is a plain
  continuation of length ``2 r_j``).
- ``curve``: 2 arms whose directions differ by ``180 - curve_turn`` degrees; the bend is a
  circular-like arc inside the junction with inner curb radius ``curve_radius``.
- ``t_junction``: 3 arms at 0, 90, 180 degrees (each jittered by ``angle_jitter``).
- ``intersection``: 4 arms at 0, 90, 180, 270 degrees (each jittered).

The whole scene is rotated by a uniform random angle and shifted by up to ``max_offset``.
Traffic is right-handed. Each arm carries ``n`` outgoing lanes (driving away from the
junction, right of the arm axis) and ``n`` incoming lanes (left of the axis), straight from
``r_j`` to ``r_j + arm_length``. ``r_j`` is chosen so that the arms' road strips are
disjoint and every junction corner has a curb of radius about ``corner_radius``.

Map conventions (see ``jaxdrive.types``):

- Lane centres (``LANE_CENTER``) have polyline ids in ``[0, L)``: arm lanes first, id
  ``(arm * 2 + d) * n_max + k`` (``d`` 0 = outgoing, 1 = incoming; ``k`` counts from the arm
  axis outwards), then junction connectors, id ``2 N n_max + (arm * (N - 1) + j) * n_max
  + k``, a cubic Hermite curve from the end of incoming lane ``k`` of ``arm`` to the start of
  outgoing lane ``k`` of arm ``(arm + 1 + j) mod n_arms`` (``N`` = most arms among the
  enabled topologies, ``n_max = lanes_per_direction[1]``). Lanes of absent arms or lanes
  are invalid, so valid ids need not be contiguous. ``lanes.successors``: incoming lane ->
  its connectors -> the connector's outgoing lane; outgoing lanes have none.
- Road edges (``ROAD_EDGE``), one polyline per pair of angularly adjacent arms: inward along
  one arm's side, round the curb, outward along the next arm's side, oriented so the
  drivable area is on the LEFT. Together they enclose the road except at the arm ends.
- Road lines (``ROAD_LINE``): each arm's centre line and lane dividers. Crosswalks
  (``CROSSWALK``, closed 5-point rectangles) at the mouth of every arm of a T-junction or
  intersection.
- Non-lane polylines have ids ``>= L``: edges ``L + arm``, lines ``L + N + arm * M + i``
  (``M = 2 n_max - 1``), crosswalks ``L + N + N M + arm``.
- Valid road points come first (compacted, in the order above); padding is zeros, id -1.
  Straight parts have exactly ``point_spacing`` between points; junction curves use as few
  points as keep the spacing <= ``point_spacing``, up to a static per-topology cap that
  ``required_sizes`` counts, so the valid points always fit ``max_road_points``.
- Traffic lights: a ``t_junction`` or ``intersection`` is signalised with probability
  ``signals`` (straight roads and curves never are; unsignalised scenes have every light
  slot invalid). A signalised scene has one light per incoming lane, in slot ``arm * n_max
  + k``: ``lane_id`` that lane's id, ``stop_xy`` the lane's end point at the junction (the
  last road point of the lane), ``state`` for every log step from a two-phase cycle,
  ``valid`` at every step; unused slots are invalid with lane id -1. Phase 0 is arms
  {0, 2} (one axis of an intersection; the through road of a T-junction, whose arms sit at
  0 and 180 degrees), phase 1 arms {1, 3} (the other axis; the T's side arm). A phase is
  ``green`` (``GO``), ``yellow`` (``CAUTION``), then ``all_red`` (every approach
  ``STOP``); the other phase's approaches are ``STOP`` throughout, so approaches from
  perpendicular arms are never ``GO``/``CAUTION`` at once. Durations are rounded to whole
  log steps; ``green`` is drawn per scene and the cycle starts at a uniform offset. Light
  draws come from ``fold_in(key, _SIGNAL_SALT)``, so every other draw (map, vehicles) is
  the one an unsignalised config makes for the same key.

Objects: vehicles spawn on arm lanes (never on connectors) at slots ``length[1] +
spawn_gap`` apart, centred on the lane, heading along it. A vehicle on an incoming lane
drives incoming lane -> connector -> outgoing lane (every vehicle of one lane takes the
same, randomly chosen, connector); one on an outgoing lane drives outward. Each drives at
a constant speed along its route until its goal (``goal_distance`` along the route, always
inside the interval: slots whose route is too short are never used) and then stands still.
In a signalised scene, vehicles on incoming lanes instead follow a Gipps-like car-following
rule step by step (``_signal_arc``): accelerate at ``launch_accel`` up to their speed,
brake (at about ``stop_decel``) to stop with their front ``_STOP_MARGIN`` before the stop
line when their light is red at the next step (or yellow and they can stop comfortably),
keep behind their same-lane leader, and brake to a stop at their goal. Logged
``vel[t] = (xy[t] - xy[t-1]) / dt`` (backward difference, as the ``delta_local``
dynamics), ``vel[0]`` = the starting speed (the sampled one, or less where a light, the
goal or the leader would otherwise force hard braking at once) times the lane direction;
``yaw`` is the route tangent (a stopped vehicle keeps its heading).

Guarantees: no two boxes overlap at any log step ``t <= junction_clear_steps`` (incoming
vehicles have not reached the junction yet, as lights only ever slow them, and arm strips
are disjoint); vehicles that start on the same lane never overlap in the whole log (a
follower's speed is capped so it stays ``follow_gap(config)`` behind its leader while the
leader moves, and it stops at least one slot behind the leader's goal; under lights its
position at ``t + 1`` is at most its leader's at ``t`` minus ``follow_gap``); no logged
vehicle's centre crosses a stop line while that light is red (one whose front is already
past its stop point when red comes stands where it is; the ``yellow`` dilemma-zone rule,
``min_yellow``, keeps that rare). Unsignalised scenes are bit-identical to those of
``signals: 0`` for the same key. Vehicles from different lanes whose routes cross or
merge inside the junction could collide later in the log; ``log_conflicts: drop`` (the
default) removes them: in agent-slot order (the SDC first), a vehicle whose logged box
comes within ``_CONFLICT_CLEARANCE`` (0.25 m) of that of a vehicle from another lane
already kept, at any log step, is dropped, and the kept ones
move to the front slots, so no two logged boxes ever overlap. Dropping never creates a
new overlap (nobody's log depends on a vehicle behind it), so one pass suffices.

The SDC is agent 0: a random spawned vehicle, preferably on an incoming lane.
``of_interest`` marks agents 0-1 and ``to_predict`` agents 0-3 (when spawned).

Goal exits (``goal_exit``): ``route`` (default) puts each goal on the vehicle's logged
route, as above. ``uniform`` (the hidden-destination task, ``docs/adaptation.md``) draws
for every vehicle on an incoming lane an exit uniformly among the arms its lane connects
to, and puts its goal ``exit_goal_distance`` metres (drawn per vehicle) past the junction
on the same-index outgoing lane of that arm; the SDC then always starts on an incoming
lane. The exit and distance come from ``fold_in(key, _EXIT_SALT)`` (or ``exit_key``) and
nothing else reads them, so every array but ``objects.goal`` (map, lights, every logged
trajectory, the SDC's start) is the one that key gives for any exit: a vehicle's logged
trajectory still follows its lane's route and need not pass its goal, and vehicles on a
lane shared with the SDC say nothing about its exit. Outgoing-lane goals stay on the route.

API: ``generate(key, config, scenario_config)`` (pure; jit with both configs static and
vmap over keys), ``generate_with_info`` (also returns ``ProceduralInfo``: topology, lanes,
per-agent route, ...), ``generate_batch(key, num, config, scenario_config)`` (cached
jit + vmap), ``required_sizes(config)`` / ``check_fits`` (worst-case R, L, S, TL).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdrive import geometry
from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_choice,
    check_int,
    check_interval,
    check_range,
)
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.types import (
    LaneGraph,
    ObjectLog,
    ObjectType,
    Roadgraph,
    RoadType,
    Scenario,
    TrafficLights,
    TrafficLightState,
)

TOPOLOGIES = ("straight", "curve", "t_junction", "intersection")
NUM_ARMS = (2, 2, 3, 4)
# Junction gaps of 180 degrees or more need no clearance; cap them to keep tan() finite.
_MAX_GAP = math.radians(179.0)
_CROSSWALK_SETBACK = 0.5  # m from the junction radius to the crosswalk's inner side
_CROSSWALK_WIDTH = 3.0  # m
_STOP_MARGIN = 0.5  # m a vehicle stopped at a light keeps between its front and the line
_STOP_TOL = 0.01  # m, float32 slack of the "can stop before the line" test
# Salt of the signal draws: fold_in leaves every other draw of a scene unchanged.
_SIGNAL_SALT = 0x516E
# m of clearance ``log_conflicts: drop`` asks between the logged boxes of vehicles from
# different lanes: a replay through a vehicle model strays up to ~0.6 m from the log at
# the tightest junction corners (measured, inverse-dynamics replay), so near misses in the
# log must not become collisions in the replay.
_CONFLICT_CLEARANCE = 0.25
# Salt of the goal-exit draws (``goal_exit: uniform``), likewise.
_EXIT_SALT = 0xE817
GOAL_EXITS = ("route", "uniform")
LOG_CONFLICTS = ("drop", "keep")


@dataclasses.dataclass(frozen=True)
class TopologyWeights(ConfigBase):
    """Relative sampling weights of the four topologies (at least one > 0).

    Attributes:
      straight: weight of one straight road (2 arms 180 degrees apart).
      curve: weight of a bend (2 arms, ``curve_turn`` apart).
      t_junction: weight of a T-junction (3 arms).
      intersection: weight of a four-way intersection (4 arms).
    """

    straight: float = 1.0
    curve: float = 1.0
    t_junction: float = 1.0
    intersection: float = 1.0

    def __post_init__(self):
        for name in TOPOLOGIES:
            check_range(f"topology.{name}", getattr(self, name), 0.0, 1e6)
        if sum(self.as_tuple()) <= 0:
            raise ConfigError(
                "config key 'topology' needs at least one weight > 0 among "
                f"{', '.join(TOPOLOGIES)}."
            )

    def as_tuple(self) -> tuple[float, float, float, float]:
        """The weights as floats, in ``TOPOLOGIES`` order (straight, curve, t_junction,
        intersection)."""
        return tuple(float(getattr(self, name)) for name in TOPOLOGIES)


@dataclasses.dataclass(frozen=True)
class ProceduralConfig(ConfigBase):
    """Distribution of procedural scenes. Pairs are ``(low, high)`` sampled uniformly.

    Attributes:
      topology: sampling weights of straight / curve / t_junction / intersection.
      lanes_per_direction: lanes each way per arm (ints); ``high`` fixes the static shapes.
      lane_width: m.
      arm_length: m, length of every arm (static: fixes point counts).
      point_spacing: m, spacing of road points along polylines (an upper bound on curves).
      corner_radius: m, curb radius at junction corners. The default's low end lets the
        default bicycle model turn the longest vehicle on the inner lane: that lane's
        centre line turns at about ``corner_radius + lane_width / 2 >= 8.6 m``, and
        the model's centre cannot turn tighter than 8.5 m at 5.5 m length
        (``BicycleModel.min_turn_radius``). Tighter corners are a harder distribution
        (``configs/simulate_hard.yaml``).
      curve_radius: m, inner curb radius of the ``curve`` topology.
      curve_turn: degrees, heading change along a ``curve`` (0 = straight, <= 90).
      angle_jitter: degrees, uniform jitter of each arm of junctions (<= 30).
      max_offset: m, the scene is shifted by a uniform offset in ``[-max_offset, max_offset]^2``.
      speed: m/s, logged driving speed (followers may be capped to avoid rear-ending).
      goal_distance: m, goal distance along the route.
      num_agents: vehicles to spawn (ints), capped by ``max_agents`` and the free slots.
      length, width: m, vehicle box size (``width[1]`` must be below ``lane_width[0]``).
      spawn_gap: m, extra longitudinal gap between spawn slots beyond ``length[1]``.
      junction_clear_steps: no incoming vehicle enters the junction before this log step,
        so nothing overlaps up to it; keep it >= the environment's episode start step.
      dt: s, log step (10 Hz like WOMD); must match the simulator's.
      signals: probability that a ``t_junction`` / ``intersection`` scene is signalised
        (straight roads and curves never are).
      green: s, green time of every phase of a signalised scene (sampled per scene).
      yellow: s, yellow time; with ``signals > 0`` it must let a vehicle at ``speed[1]``
        that cannot stop comfortably when yellow starts clear the stop line before red
        (dilemma zone, ``min_yellow``).
      all_red: s, every approach red between two phases.
      stop_decel: m/s^2, comfortable braking of logged vehicles at lights, leaders, goals.
      launch_accel: m/s^2, acceleration of logged vehicles back to their speed (green).
      goal_exit: ``route`` (goals on the logged route) or ``uniform`` (vehicles on
        incoming lanes get a goal past the junction on an exit drawn uniformly and
        independently of everything else in the scene; the SDC starts on an incoming
        lane). See the module doc.
      exit_goal_distance: m past the junction mouth, along the exit lane, of a
        ``uniform`` goal (drawn per vehicle).
      log_conflicts: ``drop`` (default) removes every vehicle whose logged box would come
        within 0.25 m, at any log step, of the box of a vehicle from another lane kept
        before it (agent-slot order, the SDC first), so that the log never collides and
        a replay through a vehicle model does not either; ``keep`` keeps them
        (routes crossing or merging in the junction may then collide in the log).
      stop_radius: m, the env's ``goal_radius`` that ``log_conflicts: drop`` allows for:
        under ``goal_behavior: stop`` a vehicle stops where it first comes this close to
        its goal, short of its logged stop, and that box is kept clear too.
    """

    topology: TopologyWeights = TopologyWeights()
    lanes_per_direction: tuple[int, int] = (1, 2)
    lane_width: tuple[float, float] = (3.2, 4.0)
    arm_length: float = 60.0
    point_spacing: float = 1.0
    corner_radius: tuple[float, float] = (7.0, 10.0)
    curve_radius: tuple[float, float] = (10.0, 25.0)
    curve_turn: tuple[float, float] = (30.0, 80.0)
    angle_jitter: float = 10.0
    max_offset: float = 20.0
    speed: tuple[float, float] = (5.0, 12.0)
    goal_distance: tuple[float, float] = (20.0, 60.0)
    num_agents: tuple[int, int] = (4, 24)
    length: tuple[float, float] = (4.0, 5.5)
    width: tuple[float, float] = (1.8, 2.2)
    spawn_gap: float = 2.5
    junction_clear_steps: int = 10
    dt: float = 0.1
    signals: float = 0.5
    green: tuple[float, float] = (4.0, 7.0)
    yellow: float = 2.5
    all_red: float = 1.0
    stop_decel: float = 4.0
    launch_accel: float = 2.0
    goal_exit: str = "route"
    exit_goal_distance: tuple[float, float] = (5.0, 15.0)
    log_conflicts: str = "drop"
    stop_radius: float = 2.0

    def __post_init__(self):
        for f in dataclasses.fields(self):  # lists -> tuples so the config stays hashable
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        if isinstance(self.topology, dict):
            object.__setattr__(self, "topology", TopologyWeights.from_dict(self.topology))
        if not isinstance(self.topology, TopologyWeights):
            raise ConfigError("config key 'topology' must be a mapping of topology weights.")
        check_interval("lanes_per_direction", self.lanes_per_direction, 1, 16)
        check_int("lanes_per_direction[0]", self.lanes_per_direction[0], 1, 16)
        check_int("lanes_per_direction[1]", self.lanes_per_direction[1], 1, 16)
        check_interval("lane_width", self.lane_width, 1.0, 20.0)
        check_range("arm_length", self.arm_length, 5.0, 10_000.0)
        check_range("point_spacing", self.point_spacing, 0.05, 100.0)
        check_interval("corner_radius", self.corner_radius, 0.5, 200.0)
        check_interval("curve_radius", self.curve_radius, 0.5, 1000.0)
        check_interval("curve_turn", self.curve_turn, 0.0, 90.0)
        check_range("angle_jitter", self.angle_jitter, 0.0, 30.0)
        check_range("max_offset", self.max_offset, 0.0, 10_000.0)
        check_interval("speed", self.speed, 0.0, 100.0)
        if self.speed[0] <= 0:
            raise ConfigError(f"config key 'speed' = {list(self.speed)}: low must be > 0.")
        check_interval("goal_distance", self.goal_distance, 0.0, 100_000.0)
        if self.goal_distance[0] <= 0:
            raise ConfigError(
                f"config key 'goal_distance' = {list(self.goal_distance)}: low must be > 0."
            )
        check_interval("num_agents", self.num_agents, 1, 1_000_000)
        check_int("num_agents[0]", self.num_agents[0], 1)
        check_int("num_agents[1]", self.num_agents[1], 1)
        check_interval("length", self.length, 0.1, 50.0)
        check_interval("width", self.width, 0.1, 20.0)
        check_range("spawn_gap", self.spawn_gap, 0.0, 1000.0)
        check_int("junction_clear_steps", self.junction_clear_steps, 0, 100_000)
        check_range("dt", self.dt, 0.0, 10.0, lo_open=True)
        check_range("signals", self.signals, 0.0, 1.0)
        check_interval("green", self.green, 0.0, 3600.0)
        if self.green[0] < self.dt:
            raise ConfigError(
                f"config key 'green' = {list(self.green)}: low must be >= dt = {self.dt}."
            )
        check_range("yellow", self.yellow, 0.0, 600.0)
        check_range("all_red", self.all_red, 0.0, 600.0)
        check_range("stop_decel", self.stop_decel, 0.0, 20.0, lo_open=True)
        check_range("launch_accel", self.launch_accel, 0.0, 20.0, lo_open=True)
        check_choice("goal_exit", self.goal_exit, GOAL_EXITS)
        check_choice("log_conflicts", self.log_conflicts, LOG_CONFLICTS)
        check_range("stop_radius", self.stop_radius, 0.0, 1000.0)
        check_interval("exit_goal_distance", self.exit_goal_distance, 0.0, None)
        if (self.goal_exit == "uniform"
                and self.exit_goal_distance[1] > self.arm_length - self.length[1] / 2):
            raise ConfigError(
                f"config key 'exit_goal_distance' = {list(self.exit_goal_distance)}: high "
                f"must be <= arm_length - length[1] / 2 = "
                f"{self.arm_length - self.length[1] / 2:.2f} so that the goal lies on the "
                "exit arm. Lower it or raise arm_length."
            )
        need_yellow = min_yellow(self)
        if self.signals > 0 and self.yellow < need_yellow:
            raise ConfigError(
                f"config key 'yellow' = {self.yellow} is too short: needs >= "
                f"{need_yellow:.2f} s (speed[1] / (2 stop_decel) + (length[1] / 2 + "
                f"{_STOP_MARGIN}) / speed[1] + dt) so that a vehicle at speed[1] that cannot "
                "stop comfortably when yellow starts clears the stop line before red. Raise "
                "yellow or stop_decel, or lower speed[1]."
            )
        gap = follow_gap(self) - self.length[1]
        if self.spawn_gap < gap:
            raise ConfigError(
                f"config key 'spawn_gap' = {self.spawn_gap} is too small: needs >= {gap:.2f} so "
                f"that vehicles of length {self.length[1]} and width {self.width[1]} following "
                "each other round the tightest junction curve (corner_radius[0] / "
                "curve_radius[0]) never touch. Raise spawn_gap or those radii."
            )
        if self.width[1] >= self.lane_width[0]:
            raise ConfigError(
                f"config key 'width' = {list(self.width)}: the widest vehicle must be narrower "
                f"than the narrowest lane (lane_width[0] = {self.lane_width[0]})."
            )
        need = self.length[1] + max(
            self.goal_distance[0], self.speed[1] * self.junction_clear_steps * self.dt
        )
        if self.arm_length < need:
            raise ConfigError(
                f"config key 'arm_length' = {self.arm_length} is too short: needs >= {need:.2f} "
                "(length[1] + max(goal_distance[0], speed[1] * junction_clear_steps * dt)) "
                "so that every lane has a spawn slot. Raise arm_length or lower those."
            )


def _min_arc_gap(length: float, width: float, radius: float) -> float:
    """Smallest arc distance ``d0`` such that two ``length x width`` boxes centred on a
    circle of ``radius`` and tangent to it are apart (by a separating axis of one box) at
    every arc distance in ``[d0, pi * radius]`` (``length`` + 5 cm on a straight path)."""
    if not math.isfinite(radius):
        return length + 0.05
    d = np.arange(length, max(length, min(math.pi * radius, length + 100.0)) + 0.01, 0.01)
    phi = d / radius
    along = radius * np.abs(np.sin(phi))  # leader offset in the follower's frame
    across = radius * (1.0 - np.cos(phi))
    half_l, half_w = length / 2, width / 2
    sep = (along > half_l + half_l * np.abs(np.cos(phi)) + half_w * np.abs(np.sin(phi)) + 0.05) | (
        across > half_w + half_l * np.abs(np.sin(phi)) + half_w * np.abs(np.cos(phi)) + 0.05
    )
    bad = np.flatnonzero(~sep)
    return float(length + 0.05 if len(bad) == 0 else d[bad[-1]] + 0.01)


def follow_gap(config: ProceduralConfig) -> float:
    """Centre distance (m, along the route) a moving follower keeps behind its leader.

    Computed for the longest/widest vehicles on a circle 20 % tighter than the tightest
    lane curve (curb radius + half a lane): connectors are only near-circular.
    """
    radii = [math.inf]
    if config.topology.curve > 0:
        radii.append(config.curve_radius[0])
    if config.topology.t_junction > 0 or config.topology.intersection > 0:
        radii.append(config.corner_radius[0])
    radius = 0.8 * (min(radii) + config.lane_width[0] / 2)
    return _min_arc_gap(config.length[1], config.width[1], radius)


def min_yellow(config: ProceduralConfig) -> float:
    """Shortest yellow (s) of the dilemma-zone rule: a vehicle at ``speed[1]`` that is
    within its comfortable stopping distance (at ``stop_decel``) of its stop point when
    yellow starts gets its centre over the stop line before red, one log step to spare."""
    v, b = config.speed[1], config.stop_decel
    return v / (2 * b) + (config.length[1] / 2 + _STOP_MARGIN) / v + config.dt


@struct.dataclass
class ProceduralInfo:
    """What the generator chose for one scene (leading batch axes when vmapped).

    Attributes:
      topology: () int32, index into ``TOPOLOGIES``.
      num_arms: () int32.
      lanes_per_direction: () int32.
      lane_width: () float32.
      junction_radius: () float32, ``r_j``.
      agent_lane: (A,) int32, lane id each vehicle spawned on (-1 for empty slots).
      agent_route: (A, 3) int32, lane ids along the route (-1 padded / empty).
      agent_speed: (A,) float32, m/s.
      agent_goal_distance: (A,) float32, m along the route from spawn to goal (the
        logged route's goal; ``goal_exit: uniform`` moves incoming vehicles' goals).
      agent_exit: (A,) int32, the arm whose outgoing lane holds the goal under
        ``goal_exit: uniform``, else the arm the route leaves by (the own arm on an
        outgoing lane); -1 for empty slots.
      signalised: () bool, the scene has traffic lights.
      green: () float32, s, green time of each phase (0 unless signalised).
      cycle: () float32, s, length of the light cycle (0 unless signalised).
      cycle_offset: () float32, s, cycle time at log step 0 (0 unless signalised).
    """

    topology: jax.Array
    num_arms: jax.Array
    lanes_per_direction: jax.Array
    lane_width: jax.Array
    junction_radius: jax.Array
    agent_lane: jax.Array
    agent_route: jax.Array
    agent_speed: jax.Array
    agent_goal_distance: jax.Array
    agent_exit: jax.Array
    signalised: jax.Array
    green: jax.Array
    cycle: jax.Array
    cycle_offset: jax.Array


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


def generate_with_info(
    key: jax.Array, config: ProceduralConfig, scenario_config: ScenarioConfig,
    exit_key: jax.Array | None = None,
) -> tuple[Scenario, ProceduralInfo]:
    """Like ``generate``, also returning what was sampled.

    Stages run in a fixed order (the order of random draws and of traced ops matters for
    bit-identical scenes): draws, scene parameters, polylines, roadgraph, lane graph,
    routes, spawns, speeds/goals, light cycle (drawn from its own folded key), logged
    trajectories, goal exits (``goal_exit: uniform``, from their own folded key).

    ``exit_key`` (``goal_exit: uniform`` only) replaces ``fold_in(key, _EXIT_SALT)`` as
    the key of the goal-exit draws: another ``exit_key`` changes ``objects.goal`` and
    nothing else.

    Returns:
      (Scenario, ProceduralInfo); see ``ProceduralInfo`` for the (A,)-shaped per-agent
      fields (spawn lane, route lane ids, speed, goal distance).
    """
    check_fits(config, scenario_config)
    lay = _layout(config)
    cfg, scfg = config, scenario_config
    f32, i32 = jnp.float32, jnp.int32
    draws = _draw_uniforms(key, lay, scfg.max_agents)
    sc = _sample_scene(cfg, lay, draws)
    # --- polylines (local frame; the offset is added when packing)
    arms = _arm_lanes(cfg, lay, sc)
    conns = _connectors(cfg, lay, sc)
    edges = _road_edges(cfg, lay, sc, arms)
    lines = _road_lines(lay, sc, arms)
    cross = _crosswalks(sc)
    lane_ids = jnp.arange(lay.n_arm_lanes + lay.n_conn, dtype=i32)
    roadgraph = _pack_roadgraph(scfg, lay, sc, arms, conns, edges, lines, cross, lane_ids)
    lanes, conn_id, out_id = _lane_graph(scfg, lay, sc, conns, lane_ids)
    # --- vehicles
    routes = _routes(lay, sc, arms, conns, conn_id, out_id, draws["pick"])
    sp = _spawn(cfg, lay, scfg.max_agents, sc, draws)
    speed, goal_s, sigma = _speeds_and_goals(cfg, scfg.num_steps, lay, draws, routes.length, sp)
    sig = _signals(key, cfg, scfg, lay, sc, arms) if lay.signalled else None
    objects = _object_log(cfg, scfg, lay, sc, routes, sp, speed, goal_s, sigma, draws, sig)
    agent_exit = routes.exit_arm[sp.agent_lane]
    if cfg.goal_exit == "uniform":
        if exit_key is None:
            exit_key = jax.random.fold_in(key, _EXIT_SALT)
        goal, uniform_exit = _uniform_exit_goals(exit_key, cfg, lay, sc, conns, sp,
                                                 objects.goal)
        objects = objects.replace(goal=goal)
        agent_exit = jnp.where(uniform_exit >= 0, uniform_exit, agent_exit)
    elif exit_key is not None:
        raise ValueError("exit_key applies only with goal_exit: uniform.")
    lights = _no_traffic_lights(scfg) if sig is None else sig.lights
    spawned, agent_lane = sp.spawned, sp.agent_lane
    agents = dict(
        agent_lane=jnp.where(spawned, agent_lane, -1).astype(i32),
        agent_route=jnp.where(spawned[:, None], routes.lane_ids[agent_lane], -1).astype(i32),
        agent_speed=jnp.where(spawned, speed, 0.0).astype(f32),
        agent_goal_distance=jnp.where(spawned, goal_s - sigma, 0.0).astype(f32),
        agent_exit=jnp.where(spawned, agent_exit, -1).astype(i32),
    )
    if cfg.log_conflicts == "drop":
        objects, agents = _keep_agents(objects, agents, _conflict_free(objects, agent_lane,
                                                                  cfg.stop_radius))
    scenario = Scenario(roadgraph=roadgraph, lanes=lanes, traffic_lights=lights, objects=objects)
    info = ProceduralInfo(
        topology=sc.topo.astype(i32),
        num_arms=sc.n_arms,
        lanes_per_direction=sc.n.astype(i32),
        lane_width=sc.w,
        junction_radius=sc.r_j.astype(f32),
        **agents,
        **_signal_info(cfg, sig),
    )
    return scenario, info


def generate(key: jax.Array, config: ProceduralConfig, scenario_config: ScenarioConfig) -> Scenario:
    """One procedural scenario, shaped by ``scenario_config`` (pure; jit/vmap it).

    ``config`` and ``scenario_config`` are static (hashable); the same key gives the same
    scene. Raises ``ConfigError`` (at trace time) if the worst case does not fit.

    Args:
      key: PRNG key.
      config: the scene distribution.
      scenario_config: padded sizes A, T, R, L, S, TL.
    Returns:
      Scenario with unbatched leaves shaped as ``scenario_config.shapes()``.
    """
    return generate_with_info(key, config, scenario_config)[0]


@functools.lru_cache(maxsize=32)
def _batched_fn(config: ProceduralConfig, scenario_config: ScenarioConfig, with_info: bool):
    fn = generate_with_info if with_info else generate
    return jax.jit(jax.vmap(lambda k: fn(k, config, scenario_config)))


def generate_batch(
    key: jax.Array,
    num: int,
    config: ProceduralConfig | None = None,
    scenario_config: ScenarioConfig | None = None,
    with_info: bool = False,
    part: tuple[int, int] | None = None,
):
    """``num`` scenarios from ``num`` keys split off ``key``, jitted and vmapped.

    The compiled function is cached per (config, scenario_config, with_info), so repeated
    calls with the same ``num`` do not recompile.

    ``part=(lo, hi)`` generates only scenarios ``lo..hi-1`` of the ``num`` (the same
    scenarios the full batch holds there): one process's share of a multi-process job.

    Returns:
      Scenario with a leading (num,) axis (``hi - lo`` with ``part``);
      ``(Scenario, ProceduralInfo)`` if ``with_info``.
    """
    config = ProceduralConfig() if config is None else config
    scenario_config = ScenarioConfig() if scenario_config is None else scenario_config
    check_fits(config, scenario_config)
    keys = jax.random.split(key, num)
    if part is not None:
        keys = keys[part[0]:part[1]]
    return _batched_fn(config, scenario_config, bool(with_info))(keys)

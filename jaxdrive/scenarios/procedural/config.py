"""The procedural generator's config (``ProceduralConfig``), its constants, the
per-scene ``ProceduralInfo``, and the follow-gap and yellow-time bounds derived from the
config."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from flax import struct

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_choice,
    check_int,
    check_interval,
    check_range,
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
PARTNER_CONVENTIONS = ("none", "keep_right", "keep_left", "either")
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
      partner_convention: ``none`` (default), or the narrow-passing family
        (``jaxdrive.scenarios.procedural.passing``): the ego and one oncoming partner on
        a straight road, the partner keeping to its right (``keep_right``), its left
        (``keep_left``) or either with equal odds, drawn per scene (``either``). Needs
        ``topology`` straight only and one lane per direction; ``speed``, ``length`` and
        ``width`` size the two cars, and ``log_conflicts`` does not apply (the ego's log
        drives the centre line, through the partner).
      partner_offset: m, the partner's lateral distance from the centre line, drawn per
        scene; it must block an ego on the centre line (``high < width[0]``) and one
        hugging the edge on the partner's side (``low > lane_width[1] - 1.5 width[0]``).
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
    partner_convention: str = "none"
    partner_offset: tuple[float, float] = (1.0, 1.5)

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
        self._check_passing()
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

    def _check_passing(self) -> None:
        """The narrow-passing family's own requirements (``partner_convention``)."""
        check_choice("partner_convention", self.partner_convention, PARTNER_CONVENTIONS)
        check_interval("partner_offset", self.partner_offset, 0.0, 20.0)
        if self.partner_convention == "none":
            return
        others = [n for n in TOPOLOGIES[1:] if getattr(self.topology, n) > 0]
        if others or self.topology.straight <= 0:
            raise ConfigError(
                f"config key 'partner_convention' = {self.partner_convention!r} builds "
                "straight roads only: set topology to {straight: 1, curve: 0, t_junction: 0, "
                "intersection: 0} (now "
                f"{dict(zip(TOPOLOGIES, self.topology.as_tuple(), strict=True))}).")
        if tuple(self.lanes_per_direction) != (1, 1):
            raise ConfigError(
                f"config key 'partner_convention' = {self.partner_convention!r} needs "
                f"lanes_per_direction [1, 1], not {list(self.lanes_per_direction)}.")
        lo, hi = self.partner_offset
        if hi >= self.width[0]:
            raise ConfigError(
                f"config key 'partner_offset' = {list(self.partner_offset)}: high must be < "
                f"width[0] = {self.width[0]} so that the partner blocks an ego on the centre "
                "line.")
        need_lo = self.lane_width[1] - 1.5 * self.width[0]
        if lo <= need_lo:
            raise ConfigError(
                f"config key 'partner_offset' = {list(self.partner_offset)}: low must be > "
                f"lane_width[1] - 1.5 width[0] = {need_lo:.2f} so that the partner blocks an "
                "ego hugging the road edge on its side.")


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
      partner_side: () int32, the narrow-passing partner's side (``partner_convention``):
        +1 it keeps to its right, -1 to its left, 0 not a passing scene.
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
    partner_side: jax.Array

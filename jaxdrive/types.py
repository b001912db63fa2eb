"""Pytrees shared by every layer: scenarios, simulator state, observations.

Named dimensions used in shapes throughout the package:

- ``A``: agents (objects) per scenario, fixed by ``ScenarioConfig.max_agents``.
- ``T``: logged time steps per scenario (``ScenarioConfig.num_steps``, 91 at 10 Hz).
- ``R``: road points per scenario (``ScenarioConfig.max_road_points``).
- ``L``: lane polylines with connectivity (``ScenarioConfig.max_lanes``); a lane's
  index is its polyline id.
- ``S``: successors per lane (``ScenarioConfig.max_lane_successors``).
- ``TL``: traffic-light slots (``ScenarioConfig.max_traffic_lights``).
- ``N``: scenarios in a pool; ``B``: parallel environments.

Everything is padded to those sizes and carries a validity mask; invalid entries hold
finite filler values (zeros) so that arithmetic on them never produces NaN.
All positions are metres in the scenario's world frame; yaw is radians,
counter-clockwise from +x.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


class RoadType(enum.IntEnum):
    """Coarse road-point type shared by procedural and logged maps."""

    UNKNOWN = 0
    LANE_CENTER = 1
    ROAD_EDGE = 2
    ROAD_LINE = 3
    CROSSWALK = 4
    STOP_SIGN = 5
    SPEED_BUMP = 6
    DRIVEWAY = 7


NUM_ROAD_TYPES = len(RoadType)


class ObjectType(enum.IntEnum):
    """Object class, following the Waymo Open Motion Dataset numbering."""

    UNSET = 0
    VEHICLE = 1
    PEDESTRIAN = 2
    CYCLIST = 3
    OTHER = 4


NUM_OBJECT_TYPES = len(ObjectType)


class TrafficLightState(enum.IntEnum):
    """Traffic-light signal state, following the WOMD ``TrafficSignalLaneState`` enum."""

    UNKNOWN = 0
    ARROW_STOP = 1
    ARROW_CAUTION = 2
    ARROW_GO = 3
    STOP = 4
    CAUTION = 5
    GO = 6
    FLASHING_STOP = 7
    FLASHING_CAUTION = 8


class EntityKind(enum.IntEnum):
    """Who moves an agent slot during an episode."""

    INVALID = 0  # padding, or an object not present at the episode start
    CONTROLLED = 1  # driven by the policy's action
    EXPERT = 2  # replays its logged trajectory
    STATIC = 3  # held at its initial pose


class Role(enum.IntEnum):
    """Who drives a controlled agent: the learning policy or a frozen partner."""

    EGO = 0  # the policy being trained or evaluated; the only role metrics score
    CO_PLAYER = 1  # a frozen partner policy (e.g. loaded from a checkpoint)


class EgoFeature(enum.IntEnum):
    """Rows of ``Observation.ego`` (last axis): the observing agent itself, normalised.

    Written by ``jaxdrive.env.observation.observe``; positions in the agent's frame
    (x forward, y left).
    """

    SPEED = 0  # signed speed along the heading / speed_scale
    LENGTH = 1  # box length / size_scale
    WIDTH = 2  # box width / size_scale
    GOAL_X = 3  # goal position, agent frame / goal_scale
    GOAL_Y = 4
    GOAL_DISTANCE = 5  # distance to the goal / goal_scale
    STEER = 6  # current steering angle, rad (0 for models without one)
    ACCEL = 7  # current acceleration / speed_scale


class PartnerFeature(enum.IntEnum):
    """Rows of ``Observation.partners`` (axis -2): one other agent, in the observer's frame.

    Continuous rows first, then ``VALID`` and ``TYPE`` last (encoders rely on that
    layout; checked below).
    """

    X = 0  # position / partner_radius
    Y = 1
    COS_YAW = 2  # cos(partner yaw - observer yaw)
    SIN_YAW = 3
    VEL_X = 4  # relative velocity / speed_scale
    VEL_Y = 5
    LENGTH = 6  # box length / size_scale
    WIDTH = 7  # box width / size_scale
    VALID = 8  # 1.0 observed, 0.0 masked (every row is 0 where masked)
    TYPE = 9  # ``ObjectType`` as float


class RoadFeature(enum.IntEnum):
    """Rows of ``Observation.road`` (axis -2): one road point, in the observer's frame.

    Continuous rows first, then ``VALID`` and ``TYPE`` last (checked below).
    """

    X = 0  # position / road_radius
    Y = 1
    DIR_X = 2  # unit direction of the polyline
    DIR_Y = 3
    VALID = 4  # 1.0 observed, 0.0 masked (every row is 0 where masked)
    TYPE = 5  # ``RoadType`` as float


class LightFeature(enum.IntEnum):
    """Rows of ``Observation.lights`` (axis -2): one traffic light's stop point, in the
    observer's frame.

    Continuous rows first, then ``VALID`` and ``TYPE`` last (checked below).
    """

    X = 0  # stop point / light_radius
    Y = 1
    DIR_X = 2  # unit direction of the light's lane at the stop point (0 without a lane)
    DIR_Y = 3
    VALID = 4  # 1.0 observed, 0.0 masked (every row is 0 where masked)
    TYPE = 5  # ``jaxdrive.scenarios.signals.LightColor`` as float (0 unknown)


EGO_FEATURES = len(EgoFeature)
PARTNER_FEATURES = len(PartnerFeature)
ROAD_FEATURES = len(RoadFeature)
LIGHT_FEATURES = len(LightFeature)


def _check_schema(schema: type[enum.IntEnum], masked: bool) -> None:
    """Rows are numbered 0..n-1 in definition order; token schemas end in VALID, TYPE."""
    if [int(f) for f in schema] != list(range(len(schema))):
        raise TypeError(f"{schema.__name__} rows must be numbered 0..n-1 in order.")
    if masked and (schema["VALID"] != len(schema) - 2 or schema["TYPE"] != len(schema) - 1):
        raise TypeError(f"{schema.__name__}: VALID and TYPE must be the last two rows.")


_check_schema(EgoFeature, masked=False)
_check_schema(PartnerFeature, masked=True)
_check_schema(RoadFeature, masked=True)
_check_schema(LightFeature, masked=True)


@struct.dataclass
class Roadgraph:
    """Road points with type, direction and polyline id.

    Attributes:
      xy: (R, 2) float32, point position.
      dir: (R, 2) float32, unit vector to the next point of the same polyline
        (the previous segment's direction at a polyline's last point; zero for
        single-point features such as stop signs).
      type: (R,) int32, ``RoadType``.
      id: (R,) int32, polyline id; lane centres have ids in ``[0, L)``.
      valid: (R,) bool.
    """

    xy: jax.Array
    dir: jax.Array
    type: jax.Array
    id: jax.Array
    valid: jax.Array

    @property
    def num_points(self) -> int:
        """() int: R, road point slots."""
        return self.xy.shape[-2]

    def segment_mask(self) -> jax.Array:
        """(R,) bool: point i starts a segment to point i+1 of the same polyline."""
        same_next = jnp.concatenate(
            [
                (self.id[..., 1:] == self.id[..., :-1]) & self.valid[..., 1:],
                jnp.zeros(self.id.shape[:-1] + (1,), bool),
            ],
            axis=-1,
        )
        return self.valid & same_next


@struct.dataclass
class LaneGraph:
    """Lane connectivity.

    Attributes:
      successors: (L, S) int32, polyline ids of lanes that continue lane ``l`` at its
        end, ``-1`` padded.
      valid: (L,) bool, lane ``l`` exists.
    """

    successors: jax.Array
    valid: jax.Array


@struct.dataclass
class TrafficLights:
    """Traffic-light states per logged step (all invalid where a map has none).

    Attributes:
      lane_id: (TL,) int32, controlled lane polyline id (``-1`` if unknown).
      stop_xy: (TL, 2) float32, stop point.
      state: (TL, T) int32, ``TrafficLightState``.
      valid: (TL, T) bool.
    """

    lane_id: jax.Array
    stop_xy: jax.Array
    state: jax.Array
    valid: jax.Array


@struct.dataclass
class ObjectLog:
    """Logged object trajectories and per-object metadata.

    Attributes:
      xy: (A, T, 2) float32, box centre.
      yaw: (A, T) float32.
      vel: (A, T, 2) float32, world-frame velocity, m/s.
      valid: (A, T) bool.
      length: (A,) float32, box length along the heading, metres.
      width: (A,) float32.
      type: (A,) int32, ``ObjectType``.
      goal: (A, 2) float32, goal position (the final valid logged position for
        logged data; a point along the lane graph for procedural scenes).
      is_sdc: (A,) bool, the self-driving car (exactly one in a valid scenario).
      of_interest: (A,) bool, WOMD ``objects_of_interest``.
      to_predict: (A,) bool, WOMD ``tracks_to_predict``.
    """

    xy: jax.Array
    yaw: jax.Array
    vel: jax.Array
    valid: jax.Array
    length: jax.Array
    width: jax.Array
    type: jax.Array
    goal: jax.Array
    is_sdc: jax.Array
    of_interest: jax.Array
    to_predict: jax.Array

    @property
    def num_agents(self) -> int:
        """() int: A, agent slots."""
        return self.xy.shape[-3]

    @property
    def num_steps(self) -> int:
        """() int: T, logged steps."""
        return self.xy.shape[-2]


@struct.dataclass
class Scenario:
    """One driving scenario: map, lane graph, traffic lights, logged objects."""

    roadgraph: Roadgraph
    lanes: LaneGraph
    traffic_lights: TrafficLights
    objects: ObjectLog


@struct.dataclass
class AgentState:
    """Kinematic state of every agent slot at one step.

    Attributes:
      xy: (A, 2) float32, box centre.
      yaw: (A,) float32.
      vel: (A, 2) float32, world-frame velocity.
      steer: (A,) float32, current steering angle (bicycle model; 0 otherwise).
      accel: (A,) float32, current longitudinal acceleration.
      valid: (A,) bool, the agent is physically present (collidable, observable).
    """

    xy: jax.Array
    yaw: jax.Array
    vel: jax.Array
    steer: jax.Array
    accel: jax.Array
    valid: jax.Array

    @property
    def speed(self) -> jax.Array:
        """(A,) signed speed along the heading."""
        return self.vel[..., 0] * jnp.cos(self.yaw) + self.vel[..., 1] * jnp.sin(self.yaw)


class World(NamedTuple):
    """Every object of one scene as the others see it, for observers that are a subset of
    the objects (packed agent rows, ``EnvConfig.max_controlled``).

    Attributes:
      agents: ``AgentState`` of the N objects.
      visible: (N,) bool, objects others can see and collide with.
      length, width: (N,) float32; obj_type: (N,) int32.
      trig: ``(cos(yaw), sin(yaw))``, (N,) each.
      self_index: (C,) int32, each observer's own object index (N for a row that holds
        no object), left out of its partners.
    """

    agents: AgentState
    visible: jax.Array
    length: jax.Array
    width: jax.Array
    obj_type: jax.Array
    trig: tuple[jax.Array, jax.Array]
    self_index: jax.Array


@struct.dataclass
class Observation:
    """Ego-frame observation of every agent slot (normalised; see ``jaxdrive.env.observation``).

    Partner, road and light arrays are *feature-major*: one contiguous row of K (or M,
    K_l) values per feature, which is what lets the simulator write them at memory
    speed. Rows are named by ``EgoFeature``, ``PartnerFeature``, ``RoadFeature`` and
    ``LightFeature`` (read them by name: ``obs.ego[..., EgoFeature.SPEED]``,
    ``obs.road[..., RoadFeature.DIR_X, :]``); the last two partner, road and light rows
    are the validity mask (1.0 / 0.0) and the type id (as float); masked entries are zero
    in every row. ``partner_tokens``, ``road_tokens`` and ``light_tokens`` give the usual
    token-major view, and the ``*_mask`` / ``*_type`` properties the typed rows.

    Attributes:
      ego: (A, EGO_FEATURES) float32.
      partners: (A, PARTNER_FEATURES, K) float32, the K nearest other agents.
      road: (A, ROAD_FEATURES, M) float32, the M nearest road points.
      lights: (A, LIGHT_FEATURES, K_l) float32, the K_l nearest traffic-light stop
        points (K_l may be 0: no light tokens).
    """

    ego: jax.Array
    partners: jax.Array
    road: jax.Array
    lights: jax.Array

    @property
    def partner_tokens(self) -> jax.Array:
        """(A, K, F_partner) float32."""
        return jnp.swapaxes(self.partners, -1, -2)

    @property
    def road_tokens(self) -> jax.Array:
        """(A, M, F_road) float32."""
        return jnp.swapaxes(self.road, -1, -2)

    @property
    def partner_mask(self) -> jax.Array:
        """(A, K) bool."""
        return self.partners[..., PartnerFeature.VALID, :] > 0.5

    @property
    def partner_type(self) -> jax.Array:
        """(A, K) int32, ``ObjectType`` (0 where masked)."""
        return self.partners[..., PartnerFeature.TYPE, :].astype(jnp.int32)

    @property
    def road_mask(self) -> jax.Array:
        """(A, M) bool."""
        return self.road[..., RoadFeature.VALID, :] > 0.5

    @property
    def road_type(self) -> jax.Array:
        """(A, M) int32, ``RoadType`` (0 where masked)."""
        return self.road[..., RoadFeature.TYPE, :].astype(jnp.int32)

    @property
    def light_tokens(self) -> jax.Array:
        """(A, K_l, F_light) float32."""
        return jnp.swapaxes(self.lights, -1, -2)

    @property
    def light_mask(self) -> jax.Array:
        """(A, K_l) bool."""
        return self.lights[..., LightFeature.VALID, :] > 0.5

    @property
    def light_type(self) -> jax.Array:
        """(A, K_l) int32, ``jaxdrive.scenarios.signals.LightColor`` (0 where masked)."""
        return self.lights[..., LightFeature.TYPE, :].astype(jnp.int32)


def tree_stack(trees):
    """Stack a sequence of identically shaped pytrees along a new leading axis. Leaves that
    are all host (NumPy) arrays stack on the host and move to the device once: an eager
    ``jnp.stack`` compiles a program for every leaf shape."""

    def stack(*xs):
        if all(isinstance(x, np.ndarray) for x in xs):
            return jnp.asarray(np.stack(xs))
        return jnp.stack(xs)

    return jax.tree.map(stack, *trees)


def merge_rows(tree):
    """Merge the two leading axes of every leaf: (B, A, ...) -> (B*A, ...). Sizes are
    explicit, not -1, so zero-size leaves (an observation without light slots) work."""
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]),
                        tree)

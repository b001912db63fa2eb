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

Modules: ``config`` (the config and constants), ``layout`` (junction geometry, static
sizes), ``roads`` (the road graph), ``vehicles`` (routes, spawns, speeds), ``lights``
(signal cycles), ``logs`` (logged trajectories, exit goals, conflicts), ``generator``
(the API below).

API: ``generate(key, config, scenario_config)`` (pure; jit with both configs static and
vmap over keys), ``generate_with_info`` (also returns ``ProceduralInfo``: topology, lanes,
per-agent route, ...), ``generate_batch(key, num, config, scenario_config)`` (cached
jit + vmap), ``required_sizes(config)`` / ``check_fits`` (worst-case R, L, S, TL).
"""

from __future__ import annotations

from jaxdrive.scenarios.procedural.config import (
    GOAL_EXITS,
    LOG_CONFLICTS,
    NUM_ARMS,
    TOPOLOGIES,
    ProceduralConfig,
    ProceduralInfo,
    TopologyWeights,
    follow_gap,
    min_yellow,
)
from jaxdrive.scenarios.procedural.generator import (
    generate,
    generate_batch,
    generate_with_info,
)
from jaxdrive.scenarios.procedural.layout import (
    check_fits,
    required_sizes,
)

__all__ = [
    "GOAL_EXITS",
    "LOG_CONFLICTS",
    "NUM_ARMS",
    "ProceduralConfig",
    "ProceduralInfo",
    "TOPOLOGIES",
    "TopologyWeights",
    "check_fits",
    "follow_gap",
    "generate",
    "generate_batch",
    "generate_with_info",
    "min_yellow",
    "required_sizes",
]

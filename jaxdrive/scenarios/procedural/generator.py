"""``generate``, ``generate_with_info`` and ``generate_batch``: one scene (or a batch)
from a key, composing roads, vehicles, lights and logs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.procedural.config import (
    _EXIT_SALT,
    ProceduralConfig,
    ProceduralInfo,
)
from jaxdrive.scenarios.procedural.layout import (
    _layout,
    check_fits,
)
from jaxdrive.scenarios.procedural.lights import (
    _no_traffic_lights,
    _signal_info,
    _signals,
)
from jaxdrive.scenarios.procedural.logs import (
    _conflict_free,
    _keep_agents,
    _object_log,
    _uniform_exit_goals,
)
from jaxdrive.scenarios.procedural.passing import _SIDE_SALT, partner_side, passing_objects
from jaxdrive.scenarios.procedural.roads import (
    _arm_lanes,
    _connectors,
    _crosswalks,
    _draw_uniforms,
    _lane_graph,
    _pack_roadgraph,
    _road_edges,
    _road_lines,
    _sample_scene,
)
from jaxdrive.scenarios.procedural.vehicles import (
    _routes,
    _spawn,
    _speeds_and_goals,
)
from jaxdrive.types import (
    Scenario,
)


def generate_with_info(
    key: jax.Array, config: ProceduralConfig, scenario_config: ScenarioConfig,
    exit_key: jax.Array | None = None, side_key: jax.Array | None = None,
) -> tuple[Scenario, ProceduralInfo]:
    """Like ``generate``, also returning what was sampled.

    Stages run in a fixed order (the order of random draws and of traced ops matters for
    bit-identical scenes): draws, scene parameters, polylines, roadgraph, lane graph,
    routes, spawns, speeds/goals, light cycle (drawn from its own folded key), logged
    trajectories, goal exits (``goal_exit: uniform``, from their own folded key).

    ``exit_key`` (``goal_exit: uniform`` only) replaces ``fold_in(key, _EXIT_SALT)`` as
    the key of the goal-exit draws: another ``exit_key`` changes ``objects.goal`` and
    nothing else.

    ``side_key`` (``partner_convention: either`` only) likewise replaces
    ``fold_in(key, _SIDE_SALT)`` as the key of the narrow-passing partner's side draw.

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
    side = jnp.zeros((), i32)
    if cfg.partner_convention != "none":
        if side_key is None:
            side_key = jax.random.fold_in(key, _SIDE_SALT)
        side = partner_side(side_key, cfg.partner_convention)
        objects, speed2, travel = passing_objects(key, cfg, scfg, sc, side)
        two = jnp.arange(scfg.max_agents) < 2
        pad2 = lambda x: jnp.zeros((scfg.max_agents,), f32).at[:2].set(x)
        agents = dict(
            agent_lane=jnp.full((scfg.max_agents,), -1, i32),
            agent_route=jnp.full(agents["agent_route"].shape, -1, i32),
            agent_speed=pad2(speed2), agent_goal_distance=jnp.where(two, pad2(travel), 0.0),
            agent_exit=jnp.full((scfg.max_agents,), -1, i32))
    elif side_key is not None:
        raise ValueError("side_key applies only with partner_convention: either.")
    elif cfg.log_conflicts == "drop":
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
        partner_side=side,
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

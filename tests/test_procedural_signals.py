"""Signalised procedural junctions: light arrays, phase cycles, logged vehicles that obey
them, and scenes without lights unchanged.

One module-scoped batch with ``signals: 1`` (every junction signalised) and one with
``signals: 0`` from the same keys feed every check.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxdrive import geometry
from jaxdrive.config import ConfigError
from jaxdrive.metrics.wosac import red_light_crossings
from jaxdrive.scenarios.base import ScenarioConfig, validate_scenario
from jaxdrive.scenarios.procedural import (
    NUM_ARMS,
    ProceduralConfig,
    check_fits,
    generate,
    generate_batch,
    min_yellow,
    required_sizes,
)
from jaxdrive.types import RoadType, TrafficLightState

NUM = 40
GO, CAUTION, STOP = (int(TrafficLightState.GO), int(TrafficLightState.CAUTION),
                     int(TrafficLightState.STOP))


@pytest.fixture(scope="module")
def gen():
    # Conflicting vehicles kept: the comparison with ``signals: 0`` below needs the same
    # vehicles in both (which ones conflict depends on the lights).
    cfg = ProceduralConfig(signals=1.0, num_agents=(6, 12), log_conflicts="keep")
    scfg = ScenarioConfig(max_agents=12)
    key = jax.random.PRNGKey(11)
    sc, info = jax.device_get(generate_batch(key, NUM, cfg, scfg, with_info=True))
    off, off_info = jax.device_get(
        generate_batch(key, NUM, cfg.replace(signals=0.0), scfg, with_info=True))
    ob = sc.objects
    speed = np.linalg.norm(ob.vel.astype(np.float64), axis=-1)  # (B, A, T)
    # Vehicles that obey lights: spawned on an incoming lane (route through a connector).
    obeys = info.signalised[:, None] & (info.agent_route[..., 1] >= 0) & ob.valid[..., 0]
    return SimpleNamespace(cfg=cfg, scfg=scfg, sc=sc, info=info, off=off, off_info=off_info,
                           speed=speed, obeys=obeys)


def _steps(seconds, dt):
    return int(round(seconds / dt))


def _runs(x):
    """(T,) -> list of (value, run length, touches an end of the log)."""
    edges = np.flatnonzero(np.diff(x)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(x)]])
    return [(int(x[s]), int(e - s), s == 0 or e == len(x)) for s, e in zip(starts, ends,
                                                                           strict=True)]


def _lane_points(rg, i, lane_id):
    m = rg.valid[i] & (rg.type[i] == RoadType.LANE_CENTER) & (rg.id[i] == lane_id)
    return rg.xy[i][m]


def test_shapes_and_every_junction_signalised(gen):
    validate_scenario(gen.sc, gen.scfg, batch_dims=1)
    topo = gen.info.topology
    np.testing.assert_array_equal(gen.info.signalised, topo >= 2)
    assert 8 <= gen.info.signalised.sum() <= NUM - 8, "want both kinds of scene in the batch"
    assert not gen.off_info.signalised.any() and not gen.off.traffic_lights.valid.any()


def test_one_light_per_incoming_lane_at_its_end(gen):
    tl, rg, nm = gen.sc.traffic_lights, gen.sc.roadgraph, gen.cfg.lanes_per_direction[1]
    for i in range(NUM):
        used = tl.valid[i, :, 0]
        # valid is all-or-nothing over the log; unused slots are padding.
        assert (tl.valid[i] == used[:, None]).all()
        assert (tl.lane_id[i][~used] == -1).all() and not tl.stop_xy[i][~used].any()
        assert not tl.state[i][~used].any()
        if not gen.info.signalised[i]:
            assert not used.any()
            continue
        n, arms = int(gen.info.lanes_per_direction[i]), NUM_ARMS[gen.info.topology[i]]
        assert used.sum() == arms * n, (i, used.sum(), arms, n)
        # Incoming lane k of arm a has id (2 a + 1) nm + k and sits in slot a nm + k.
        want = {(2 * a + 1) * nm + k for a in range(arms) for k in range(n)}
        assert set(tl.lane_id[i][used].tolist()) == want
        for slot in np.flatnonzero(used):
            lane = int(tl.lane_id[i, slot])
            assert slot == (lane // nm - 1) // 2 * nm + lane % nm
            pts = _lane_points(rg, i, lane)
            # The stop point is the lane's last road point (at the junction), bit for bit.
            np.testing.assert_array_equal(tl.stop_xy[i, slot], pts[-1])


def test_phase_cycle_durations_and_conflicts(gen):
    tl, cfg, nm = gen.sc.traffic_lights, gen.cfg, gen.cfg.lanes_per_direction[1]
    dt = cfg.dt
    yellow, all_red = _steps(cfg.yellow, dt), _steps(cfg.all_red, dt)  # 25, 10
    checked = 0
    for i in np.flatnonzero(gen.info.signalised):
        green = _steps(gen.info.green[i], dt)
        lo, hi = (_steps(g, dt) for g in cfg.green)
        assert lo <= green <= hi
        cycle = _steps(gen.info.cycle[i], dt)
        assert cycle == 2 * (green + yellow + all_red)
        assert 0 <= _steps(gen.info.cycle_offset[i], dt) < cycle
        used = np.flatnonzero(tl.valid[i, :, 0])
        arm = (tl.lane_id[i, used] // nm - 1) // 2
        st = tl.state[i, used]  # (lights, T)
        for row in st:
            assert set(row.tolist()) <= {GO, CAUTION, STOP}
            runs = _runs(row)
            for (v0, _, _), (v1, _, _) in zip(runs[:-1], runs[1:], strict=True):
                assert (v0, v1) in {(GO, CAUTION), (CAUTION, STOP), (STOP, GO)}, runs
            # Runs cut by the log's ends may be short; inner ones have the full length.
            want = {GO: green, CAUTION: yellow, STOP: cycle - green - yellow}
            for v, n, at_end in runs:
                assert n <= want[v] if at_end else n == want[v], (i, runs)
                checked += not at_end
        # Lanes of one arm, and opposite arms, share a phase; perpendicular arms conflict.
        moving = np.isin(st, [GO, CAUTION])
        for a, b in zip(*np.triu_indices(len(used), 1), strict=True):
            if arm[a] % 2 == arm[b] % 2:
                np.testing.assert_array_equal(st[a], st[b])
            else:
                assert not (moving[a] & moving[b]).any(), (i, arm[a], arm[b])
        # Between the phases every approach is red for all_red steps.
        all_stop = (st == STOP).all(0)
        inner = [n for v, n, end in _runs(all_stop.astype(int)) if v == 1 and not end]
        assert all(n == all_red for n in inner), inner
    assert checked > 50


def test_logged_vehicles_never_cross_a_red_line(gen):
    ob, tl, rg = gen.sc.objects, gen.sc.traffic_lights, gen.sc.roadgraph
    crossings = jax.jit(jax.vmap(red_light_crossings))
    cross = np.asarray(crossings(ob.xy, ob.yaw, ob.valid, tl, rg))
    assert not cross.any(), np.argwhere(cross)[:10]
    # Not vacuous: the same vehicles at constant speed (signals: 0 keeps every other draw)
    # run red lights under these lights.
    off = gen.off.objects
    np.testing.assert_array_equal(off.valid, ob.valid)
    naive = np.asarray(crossings(off.xy, off.yaw, off.valid, tl, rg))
    assert naive.sum() >= 5, naive.sum()


def test_vehicles_stop_at_red_and_go_on_green(gen):
    """Some vehicle stands still for 1 s right before its stop line while its light is
    red, and later drives on after the light turned green."""
    ob, tl, info = gen.sc.objects, gen.sc.traffic_lights, gen.info
    found = 0
    for i, a in np.argwhere(gen.obeys):
        slot = np.flatnonzero(tl.lane_id[i] == info.agent_lane[i, a])
        assert len(slot) == 1
        state, stop = tl.state[i, slot[0]], tl.stop_xy[i, slot[0]]
        u = (stop - ob.xy[i, a, 0]) / np.linalg.norm(stop - ob.xy[i, a, 0])
        ahead = (stop - ob.xy[i, a]) @ u  # centre distance to the line (straight lane)
        still = (gen.speed[i, a] < 0.05) & (state == STOP) & (ahead > 0)
        still &= ahead < ob.length[i, a] / 2 + 1.0
        runs = _runs(still.astype(int))
        t = 0
        for v, n, _ in runs:
            if v == 1 and n >= 10:
                later = np.arange(len(still)) >= t + n
                if (later & (state == GO) & (gen.speed[i, a] > 1.0)).any():
                    found += 1
                break
            t += n
    assert found >= 3, found


def test_same_lane_never_overlaps_and_nothing_overlaps_early(gen):
    ob, lane = gen.sc.objects, gen.info.agent_lane
    xy, yaw = ob.xy, ob.yaw
    ln, wd = ob.length[:, :, None], ob.width[:, :, None]
    hit = np.asarray(geometry.boxes_overlap(
        xy[:, :, None], yaw[:, :, None], ln[:, :, None], wd[:, :, None],
        xy[:, None], yaw[:, None], ln[:, None], wd[:, None]))  # (B, A, A, T)
    a_idx = np.arange(ob.xy.shape[1])
    pair = ob.valid[:, :, None, 0] & ob.valid[:, None, :, 0] & (a_idx[:, None] != a_idx)
    same = pair & (lane[:, :, None] == lane[:, None, :])
    assert same[gen.info.signalised].sum() > 50
    assert not (hit & same[..., None]).any(), np.argwhere(hit & same[..., None])[:5]
    early = hit[..., : gen.cfg.junction_clear_steps + 1] & pair[..., None]
    assert not early.any(), np.argwhere(early)[:5]


def test_kinematics_bounded(gen):
    ob, cfg, speed = gen.sc.objects, gen.cfg, gen.speed
    valid = ob.valid
    assert speed[valid].max() <= cfg.speed[1] + 1e-3
    fd = np.diff(ob.xy.astype(np.float64), axis=2) / cfg.dt
    assert np.abs(ob.vel[:, :, 1:] - fd)[valid[..., 1:]].max() < 1e-3
    # Light-obeying vehicles brake at about stop_decel and launch at about launch_accel
    # (10 % slack: the discrete safe-speed rule and chords through connector curves).
    # Others keep the constant-speed log, which stops dead at the goal, as before lights.
    acc = np.diff(speed, axis=2) / cfg.dt
    obeying = acc[gen.obeys]
    assert obeying.min() >= -1.1 * cfg.stop_decel, obeying.min()
    assert obeying.max() <= 1.1 * cfg.launch_accel, obeying.max()
    # A stopped vehicle keeps its heading (yaw is the route tangent at a fixed point).
    stopped = (speed[:, :, 1:] < 1e-4) & valid[:, :, 1:]
    dyaw = np.abs(np.angle(np.exp(1j * np.diff(ob.yaw.astype(np.float64), axis=2))))
    assert stopped[gen.obeys].sum() > 100
    assert dyaw[stopped].max() < 1e-6
    # vel[0] points along the lane at the starting speed (no faster than sampled).
    v0 = speed[..., 0][valid[..., 0]]
    assert (v0 <= cfg.speed[1] + 1e-3).all() and (v0 > 0).all()


def test_unsignalised_scenes_and_other_draws_unchanged(gen):
    """signals: 0 vs 1 from the same keys: maps and vehicle draws are the same; scenes
    without lights and vehicles that ignore lights are bit-identical."""
    plain = ~gen.info.signalised
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(gen.sc)[0],
                            jax.tree_util.tree_leaves(gen.off), strict=True):
        np.testing.assert_array_equal(a[plain], b[plain], err_msg=f"{path}")
    for name in ("roadgraph", "lanes"):
        for a, b in zip(jax.tree_util.tree_leaves(getattr(gen.sc, name)),
                        jax.tree_util.tree_leaves(getattr(gen.off, name)), strict=True):
            np.testing.assert_array_equal(a, b)
    for name in ("topology", "agent_lane", "agent_route", "agent_speed",
                 "agent_goal_distance"):
        np.testing.assert_array_equal(getattr(gen.info, name), getattr(gen.off_info, name))
    ob, off = gen.sc.objects, gen.off.objects
    ignore = ob.valid[..., 0] & ~gen.obeys
    np.testing.assert_array_equal(ob.xy[ignore], off.xy[ignore])
    np.testing.assert_array_equal(ob.vel[ignore], off.vel[ignore])
    for name in ("length", "width", "goal", "is_sdc", "type"):
        np.testing.assert_array_equal(getattr(ob, name), getattr(off, name))
    assert (ob.xy[gen.obeys] != off.xy[gen.obeys]).any()


def test_sizes_and_config_errors():
    cfg = ProceduralConfig()
    assert cfg.signals == 0.5  # the default distribution has lights
    # 4 arms x 2 incoming lanes; no lights without signals or without junctions.
    assert required_sizes(cfg)["max_traffic_lights"] == 8
    assert required_sizes(cfg.replace(signals=0.0))["max_traffic_lights"] == 0
    no_junctions = ProceduralConfig.from_dict(
        {"topology": {"t_junction": 0, "intersection": 0}})
    assert required_sizes(no_junctions)["max_traffic_lights"] == 0
    check_fits(no_junctions, ScenarioConfig(max_traffic_lights=1))
    check_fits(cfg.replace(signals=0.0), ScenarioConfig(max_traffic_lights=1))
    with pytest.raises(ConfigError, match=r"scenario.max_traffic_lights=4 .*needs 8"):
        generate(jax.random.PRNGKey(0), cfg, ScenarioConfig(max_traffic_lights=4))
    with pytest.raises(ConfigError, match="'signals'"):
        ProceduralConfig.from_dict({"signals": 1.5})
    with pytest.raises(ConfigError, match="'signals'"):
        ProceduralConfig.from_dict({"signals": -0.1})
    with pytest.raises(ConfigError, match="green"):
        ProceduralConfig.from_dict({"green": [7.0, 4.0]})
    with pytest.raises(ConfigError, match="stop_decel"):
        ProceduralConfig.from_dict({"stop_decel": 0.0})
    with pytest.raises(ConfigError, match="launch_accel"):
        ProceduralConfig.from_dict({"launch_accel": -1.0})
    # Dilemma zone at the defaults: 12 / (2 * 4) + (5.5 / 2 + 0.5) / 12 + 0.1 = 1.8708 s.
    assert min_yellow(cfg) == pytest.approx(1.5 + 3.25 / 12 + 0.1)
    with pytest.raises(ConfigError, match=r"'yellow' = 1.5 is too short: needs >= 1.87"):
        ProceduralConfig.from_dict({"yellow": 1.5})
    ProceduralConfig.from_dict({"yellow": 1.5, "speed": [5.0, 7.0]})  # 0.88 + 0.46 + 0.1
    ProceduralConfig.from_dict({"yellow": 1.5, "signals": 0.0})  # no lights, no rule

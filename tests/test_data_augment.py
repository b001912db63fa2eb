"""Mirrored scenes (``jaxdrive.data.augment``, ``data convert --mirror``): an exact
involution, hand-computed on a tiny map, and the simulator's judgement unchanged: the
off-road and collision flags of every logged box are the same on the mirrored scene, on
real WOMD scenes (``../shared/data/womd_json``, skipped when absent) and procedural ones.
One pool, one compiled flag program for the whole module."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_data_reliability import SIZES, scene

from jaxdrive import geometry
from jaxdrive.data import load_scenarios
from jaxdrive.data.__main__ import main as cli
from jaxdrive.data.augment import mirror_scenario
from jaxdrive.data.convert import polyline_directions
from jaxdrive.env import EnvConfig
from jaxdrive.scenarios import road_index
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch
from jaxdrive.types import LaneGraph, ObjectLog, Roadgraph, RoadType, Scenario, TrafficLights

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "womd_json"
REAL = sorted(DATA.glob("*.json"))[:3] if DATA.is_dir() else []
needs_real = pytest.mark.skipif(not REAL, reason=f"real JSON scenes not found in {DATA}")

SC = ScenarioConfig(max_agents=32, num_steps=30, max_road_points=2048, max_lanes=128,
                    max_traffic_lights=16)
PROC = ProceduralConfig(point_spacing=2.0)  # its maps fit SC's 2048 road points
EDGE, LANE = int(RoadType.ROAD_EDGE), int(RoadType.LANE_CENTER)


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _take(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def _reflect_only(s: Scenario) -> Scenario:
    """The mirror without reversing road edges (the bug the invariant must catch)."""
    m = mirror_scenario(s)
    v = s.roadgraph.valid[..., None]
    flip = np.array([1.0, -1.0], np.float32)
    rg = m.roadgraph.replace(xy=np.where(v, s.roadgraph.xy * flip, s.roadgraph.xy),
                             dir=np.where(v, s.roadgraph.dir * flip, s.roadgraph.dir))
    return m.replace(roadgraph=rg)


def _assert_bits_equal(a: Scenario, b: Scenario) -> None:
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b),
                            strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert x.tobytes() == y.tobytes(), jax.tree_util.keystr(path)


@pytest.fixture(scope="module")
def scenes():
    """(name, unbatched host Scenario) of the real scenes (when present) and 3 procedural
    ones, all shaped by SC."""
    out = []
    if REAL:
        real, report = load_scenarios([str(p) for p in REAL], SC)
        out += [(sid, _take(real, i)) for i, sid in enumerate(report["scenario_ids"])]
    proc = _host(generate_batch(jax.random.key(5), 3, PROC, SC))
    out += [(f"procedural{i}", _take(proc, i)) for i in range(3)]
    return out


@jax.jit
def _flags(pool):
    """(N, A, T) off-road of every valid logged box, (N, T, A, A) pairwise overlaps."""
    def one(index, s):
        o = s.objects
        off = road_index.is_offroad(index, s.roadgraph, o.xy, o.yaw, o.length[:, None],
                                    o.width[:, None])
        hit = jax.vmap(lambda xy, yaw, v: geometry.pairwise_overlap(
            xy, yaw, o.length, o.width, v), in_axes=(1, 1, 1))(o.xy, o.yaw, o.valid)
        return off & o.valid, hit
    return jax.vmap(one)(pool.road_index, pool.scenarios)


@pytest.fixture(scope="module")
def flags(scenes):
    """Flags of the originals, their mirrors and their reflect-only copies (k, N, ...)."""
    variants = [[s for _, s in scenes], [mirror_scenario(s) for _, s in scenes],
                [_reflect_only(s) for _, s in scenes]]
    stacked = jax.tree.map(lambda *x: jnp.asarray(np.stack(x)),
                           *[s for v in variants for s in v])
    pool = make_pool(stacked, EnvConfig().road_index)  # the env's road grid
    off, hit = jax.device_get(_flags(pool))
    n = len(scenes)
    return [(off[k * n:(k + 1) * n], hit[k * n:(k + 1) * n]) for k in range(3)]


def _tiny() -> Scenario:
    """R = 8: lane 0 (2 points), edge id 9 (3 points), a stop sign, a padded slot, edge
    id 10 (2 points); one agent, T = 2, valid at step 0 only; one light."""
    f32 = np.float32
    xy = np.array([[0, 0], [2, 0], [0, 3], [1, 3], [3, 3], [5, 5], [0, 0], [4, -1],
                   [6, -1]], f32)
    rtype = np.array([LANE, LANE, EDGE, EDGE, EDGE, int(RoadType.STOP_SIGN), 0, EDGE, EDGE],
                     np.int32)
    rid = np.array([0, 0, 9, 9, 9, 11, -1, 10, 10], np.int32)
    valid = rid >= 0
    same_next = np.zeros(9, bool)
    same_next[:-1] = valid[:-1] & valid[1:] & (rid[1:] == rid[:-1])
    dirs = polyline_directions(xy.astype(np.float64), same_next).astype(f32)
    rg = Roadgraph(xy=xy, dir=dirs, type=rtype, id=rid, valid=valid)
    obj = ObjectLog(
        xy=np.array([[[1, 2], [0, 0]]], f32), yaw=np.array([[0.5, 0]], f32),
        vel=np.array([[[3, 1], [0, 0]]], f32), valid=np.array([[True, False]]),
        length=np.array([4], f32), width=np.array([2], f32), type=np.array([1], np.int32),
        goal=np.array([[7, 2]], f32), is_sdc=np.array([True]), of_interest=np.array([False]),
        to_predict=np.array([False]))
    tl = TrafficLights(lane_id=np.array([0, -1], np.int32),
                       stop_xy=np.array([[2, 0.5], [0, 0]], f32),
                       state=np.zeros((2, 2), np.int32),
                       valid=np.array([[True, True], [False, False]]))
    lanes = LaneGraph(successors=np.full((1, 1), -1, np.int32), valid=np.array([True]))
    return Scenario(roadgraph=rg, lanes=lanes, traffic_lights=tl, objects=obj)


def test_mirror_by_hand_on_a_tiny_scene():
    s = _tiny()
    m = mirror_scenario(s)
    rg = m.roadgraph
    # Lane 0 keeps its order, y negated (0 -> -0 compares equal). Edge 9, (0,3) (1,3)
    # (3,3), becomes (3,-3) (1,-3) (0,-3): directions (-1,0) (-1,0) and the last point
    # takes the previous segment's (-1,0). Edge 10, (4,-1) (6,-1), becomes (6,1) (4,1)
    # with (-1,0) twice. The stop sign is reflected, dir zero; the padded slot untouched.
    np.testing.assert_array_equal(rg.xy, [[0, 0], [2, 0], [3, -3], [1, -3], [0, -3],
                                          [5, -5], [0, 0], [6, 1], [4, 1]])
    np.testing.assert_array_equal(rg.dir, [[1, 0], [1, 0], [-1, 0], [-1, 0], [-1, 0],
                                           [0, 0], [0, 0], [-1, 0], [-1, 0]])
    np.testing.assert_array_equal(rg.id, s.roadgraph.id)
    np.testing.assert_array_equal(rg.type, s.roadgraph.type)
    assert np.signbit(rg.xy[6]).sum() == 0  # padding keeps its bits (no -0.0)
    o = m.objects
    np.testing.assert_array_equal(o.xy, [[[1, -2], [0, 0]]])
    np.testing.assert_array_equal(o.yaw, [[-0.5, 0]])
    np.testing.assert_array_equal(o.vel, [[[3, -1], [0, 0]]])
    np.testing.assert_array_equal(o.goal, [[7, -2]])
    assert not np.signbit(o.yaw[0, 1]) and not np.signbit(o.xy[0, 1]).any()
    np.testing.assert_array_equal(m.traffic_lights.stop_xy, [[2, -0.5], [0, 0]])
    assert not np.signbit(m.traffic_lights.stop_xy[1]).any()
    _assert_bits_equal(mirror_scenario(m), s)


def test_mirroring_twice_is_the_identity_bit_for_bit(scenes):
    for name, s in scenes:
        m = mirror_scenario(s)
        assert m.objects.xy.dtype == np.float32, name
        _assert_bits_equal(mirror_scenario(m), s)
    both = jax.tree.map(lambda *x: np.stack(x), *[s for _, s in scenes])  # batched input
    _assert_bits_equal(mirror_scenario(mirror_scenario(both)), both)
    _assert_bits_equal(mirror_scenario(both),
                       jax.tree.map(lambda *x: np.stack(x),
                                    *[mirror_scenario(s) for _, s in scenes]))


def test_mirrored_edge_directions_follow_the_loader_rule(scenes):
    """The reversed edges' directions are what the loader computes from the mirrored
    points (to float32 rounding of the points)."""
    for name, s in scenes:
        rg = mirror_scenario(s).roadgraph
        same_next = np.asarray(Roadgraph.segment_mask(rg))
        want = polyline_directions(rg.xy.astype(np.float64), same_next)
        edge = rg.valid & (rg.type == EDGE)
        np.testing.assert_allclose(rg.dir[edge], want[edge], atol=1e-4, err_msg=name)
        assert edge.any(), name


def test_offroad_and_collision_flags_unchanged_by_the_mirror(scenes, flags):
    (off, hit), (m_off, m_hit), _ = flags
    for i, (name, s) in enumerate(scenes):
        assert s.objects.valid.any(), name
        np.testing.assert_array_equal(m_off[i], off[i], err_msg=f"{name}: off-road")
        np.testing.assert_array_equal(m_hit[i], hit[i], err_msg=f"{name}: collisions")


def test_reflecting_without_reversing_edges_changes_offroad(scenes, flags):
    """The invariant above can fail: keeping the edges' order puts the road on the wrong
    side."""
    (off, _), _, (bad_off, _) = flags
    changed = [name for i, (name, _) in enumerate(scenes)
               if (bad_off[i] != off[i]).any()]
    assert changed, "reflect-only copies keep every off-road flag"


@needs_real
def test_real_scenes_take_part(scenes, flags):
    """Real scenes hold boxes on both sides of the edges and colliding boxes (parked
    cars, pedestrians), so equal flags are not equal by being all False."""
    (off, hit), _, _ = flags
    real = [i for i, (name, _) in enumerate(scenes) if not name.startswith("procedural")]
    assert len(real) == len(REAL)
    valid = np.stack([scenes[i][1].objects.valid for i in real])
    assert off[real].any() and (valid & ~off[real]).any() and hit[real].any()


def test_convert_cli_mirror_writes_both_and_refuses_validation(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    (src / "s.json").write_text(json.dumps(scene(2)))
    out = tmp_path / "out"
    assert cli(["convert", str(src), "--out", str(out), *SIZES, "--mirror"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    ids = [r["scenario_id"] for r in m["scenarios"]]
    assert ids == ["scene2", "scene2~mirror"] and m["num_scenarios"] == 2
    assert m["augment"] == {"mirror": True, "id_suffix": "~mirror", "mirrored_scenes": 1}
    assert m["scenarios"][1]["mirror_of"] == "scene2"
    assert "mirror_of" not in m["scenarios"][0]
    sc = ScenarioConfig(max_agents=8, num_steps=20, max_road_points=128, max_lanes=8,
                        max_traffic_lights=4)
    cached, _ = load_scenarios([str(out)], sc)
    _assert_bits_equal(_take(cached, 1), mirror_scenario(_take(cached, 0)))
    plain = tmp_path / "plain"
    assert cli(["convert", str(src), "--out", str(plain), *SIZES]) == 0
    assert "augment" not in json.loads((plain / "manifest.json").read_text())
    assert (plain / "shard-00000.npz").stat().st_size > 0
    capsys.readouterr()
    rc = cli(["convert", str(src), "--out", str(tmp_path / "val"), *SIZES, "--mirror",
              "--split", "validation"])
    err = capsys.readouterr().err
    assert rc == 2 and "--mirror" in err and "--split validation" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "val").exists()

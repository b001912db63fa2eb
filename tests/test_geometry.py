"""Geometry against shapely (an independent float64 reference) on >= 10,000 random cases."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

shapely = pytest.importorskip("shapely")
from shapely.geometry import Point, Polygon  # noqa: E402

from jaxdrive import geometry  # noqa: E402
from jaxdrive.scenarios import road_index  # noqa: E402
from jaxdrive.types import Roadgraph, RoadType  # noqa: E402

# Cases whose float64 reference margin is below this are ambiguous in float32
# (touching boxes, points on an edge); they are counted and must stay rare.
AMBIGUOUS = 1e-4


def _corners_np(x, y, yaw, length, width):
    c, s = np.cos(yaw), np.sin(yaw)
    hl, hw = length / 2, width / 2
    local = np.array([[hl, hw], [-hl, hw], [-hl, -hw], [hl, -hw]])
    rot = np.array([[c, -s], [s, c]])
    return local @ rot.T + np.array([x, y])


overlap_jit = jax.jit(geometry.boxes_overlap)


def test_box_corners_hand_computed():
    # Box at (1, 2), yaw = 90 deg, length 4, width 2: heading is +y, so the front-left
    # corner is (1 - 1, 2 + 2) = (0, 4), rear-left (0, 0), rear-right (2, 0),
    # front-right (2, 4).
    c = geometry.box_corners(jnp.array([1.0, 2.0]), jnp.float32(np.pi / 2), 4.0, 2.0)
    np.testing.assert_allclose(c, [[0, 4], [0, 0], [2, 0], [2, 4]], atol=1e-6)


def test_boxes_overlap_matches_shapely_on_10000_pairs():
    rng = np.random.default_rng(0)
    n = 10_000
    xy_a = rng.uniform(-3, 3, (n, 2))
    xy_b = rng.uniform(-3, 3, (n, 2))
    yaw_a, yaw_b = rng.uniform(-np.pi, np.pi, (2, n))
    len_a, len_b = rng.uniform(0.5, 6.0, (2, n))
    wid_a, wid_b = rng.uniform(0.3, 3.0, (2, n))
    got = np.asarray(
        overlap_jit(
            jnp.asarray(xy_a, jnp.float32), jnp.asarray(yaw_a, jnp.float32),
            jnp.asarray(len_a, jnp.float32), jnp.asarray(wid_a, jnp.float32),
            jnp.asarray(xy_b, jnp.float32), jnp.asarray(yaw_b, jnp.float32),
            jnp.asarray(len_b, jnp.float32), jnp.asarray(wid_b, jnp.float32),
        )
    )
    disagree, ambiguous, positives = 0, 0, 0
    for i in range(n):
        pa = Polygon(_corners_np(*xy_a[i], yaw_a[i], len_a[i], wid_a[i]))
        pb = Polygon(_corners_np(*xy_b[i], yaw_b[i], len_b[i], wid_b[i]))
        inter = pa.intersection(pb).area
        ref = inter > 0
        positives += ref
        # Ambiguous in float32: barely touching, or a corner grazing the other box.
        if (0 < inter < 1e-8) or (inter == 0 and pa.distance(pb) < 1e-5):
            ambiguous += 1
            continue
        disagree += bool(got[i]) != ref
    assert disagree == 0, f"{disagree} disagreements with shapely out of {n}"
    assert ambiguous < n // 1000
    assert 0.2 * n < positives < 0.8 * n  # both outcomes well represented


def test_pairwise_overlap_masks_self_and_invalid():
    # Three unit boxes: 0 and 1 overlap (centres 0.5 m apart), 2 is far away but
    # would overlap 0 if it were valid and placed there; we place it on 0 and mark it
    # invalid, so only the (0, 1) pair remains.
    xy = jnp.array([[0.0, 0.0], [0.5, 0.0], [0.0, 0.0]])
    ones = jnp.ones(3)
    valid = jnp.array([True, True, False])
    hit = jax.jit(geometry.pairwise_overlap)(xy, jnp.zeros(3), ones, ones, valid)
    expected = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
    np.testing.assert_array_equal(hit, expected)


def _star_polygon(rng, n_min=8, n_max=20, r_min=5.0, r_max=20.0):
    # Jittered even angles keep every gap below 90 degrees, so each edge stays at least
    # r_min * cos(45 deg) from the origin and a hole of radius < 3 never touches it.
    n = int(rng.integers(n_min, n_max + 1))
    ang = (np.arange(n) + rng.uniform(0.0, 0.8, n)) * (2 * np.pi / n)
    rad = rng.uniform(r_min, r_max, n)
    return np.stack([rad * np.cos(ang), rad * np.sin(ang)], axis=1)  # counter-clockwise


def _roadgraph_from_rings(rings, num_points):
    """Closed rings (each (n, 2)) -> a padded Roadgraph of ROAD_EDGE polylines.

    Each ring is split into two polylines sharing their end vertices, so ties at
    vertices shared between different polylines are exercised too.
    """
    xy, ids = [], []
    pid = 0
    for ring in rings:
        closed = np.concatenate([ring, ring[:1]], axis=0)
        half = len(ring) // 2
        for part in (closed[: half + 1], closed[half:]):
            xy.append(part)
            ids.append(np.full(len(part), pid))
            pid += 1
    xy = np.concatenate(xy)
    ids = np.concatenate(ids)
    n = len(xy)
    assert n <= num_points
    pad = num_points - n
    d = np.zeros_like(xy)
    same = ids[1:] == ids[:-1]
    seg = xy[1:] - xy[:-1]
    d[:-1][same] = seg[same] / np.linalg.norm(seg[same], axis=1, keepdims=True)
    return Roadgraph(
        xy=jnp.asarray(np.pad(xy, ((0, pad), (0, 0))), jnp.float32),
        dir=jnp.asarray(np.pad(d, ((0, pad), (0, 0))), jnp.float32),
        type=jnp.asarray(np.pad(np.full(n, RoadType.ROAD_EDGE), (0, pad)), jnp.int32),
        id=jnp.asarray(np.pad(ids, (0, pad), constant_values=-1), jnp.int32),
        valid=jnp.asarray(np.arange(num_points) < n),
    )


NUM_POLYGONS = 50
POINTS_PER_POLYGON = 200
MAX_POINTS = 64


@functools.lru_cache(maxsize=1)
def _polygon_cases():
    rng = np.random.default_rng(1)
    cases = []
    for k in range(NUM_POLYGONS):
        shell = _star_polygon(rng)
        rings, holes = [shell], []
        if k % 2 == 0:  # a clockwise hole: drivable area is outside it (on its left)
            hole = _star_polygon(rng, 3, 8, 1.0, 3.0)[::-1]
            rings.append(hole)
            holes.append(hole)
        poly = Polygon(shell, holes)
        assert poly.is_valid
        pts = rng.uniform(-22, 22, (POINTS_PER_POLYGON, 2))
        cases.append((_roadgraph_from_rings(rings, MAX_POINTS), poly, pts))
    return cases


def _brute_force_signed(rg, pts):
    seg = rg.segment_mask()
    a = rg.xy
    b = jnp.concatenate([rg.xy[1:], rg.xy[-1:]])
    return geometry.signed_distance_to_edges(pts, a[None], b[None], seg[None])


brute_force_jit = jax.jit(jax.vmap(_brute_force_signed))


def test_signed_distance_matches_shapely_on_10000_points():
    cases = _polygon_cases()
    rgs = jax.tree.map(lambda *x: jnp.stack(x), *[c[0] for c in cases])
    pts = jnp.asarray(np.stack([c[2] for c in cases]), jnp.float32)
    got = np.asarray(brute_force_jit(rgs, pts))
    disagree = ambiguous = outside = 0
    for k, (_, poly, p) in enumerate(cases):
        for i, q in enumerate(p):
            pt = Point(q)
            ref_dist = poly.boundary.distance(pt)
            if ref_dist < AMBIGUOUS:
                ambiguous += 1
                continue
            ref_off = not poly.contains(pt)
            outside += ref_off
            disagree += bool(got[k, i] > 0) != ref_off
            assert abs(abs(got[k, i]) - ref_dist) < 1e-3, (k, i, got[k, i], ref_dist)
    total = NUM_POLYGONS * POINTS_PER_POLYGON
    assert total >= 10_000
    assert disagree == 0, f"{disagree} sign disagreements with shapely out of {total}"
    assert ambiguous < total // 1000
    assert 0.2 * total < outside < 0.8 * total


def _side_by_float_max_then_any(points, ax, ay, ux, uy, length):
    """Reference for the side rule of ``signed_distance_to_segments``, written as the
    rule reads: among the segments tied for nearest, the largest |cross| wins, and the
    point is right (off-road) if any winner has it on its right (two passes)."""
    px = points[..., 0, None] - ax
    py = points[..., 1, None] - ay
    along = px * ux + py * uy
    cross = ux * py - uy * px
    excess = along - jnp.clip(along, 0.0, jnp.maximum(length, 0.0))
    d2 = jnp.where(length >= 0, excess * excess + cross * cross, jnp.float32(1e30))
    d2min = jnp.min(d2, axis=-1, keepdims=True)
    tied = d2 <= d2min * (1.0 + geometry._TIE_REL) + geometry._TIE_ABS2
    score = jnp.where(tied, jnp.abs(cross), -1.0)
    best = jnp.max(score, axis=-1, keepdims=True)
    right = jnp.any((score >= best) & (cross < 0), axis=-1)
    dist = jnp.sqrt(d2min[..., 0])
    return jnp.where(d2min[..., 0] < 1e29, jnp.where(right, dist, -dist),
                     geometry.NO_EDGE_DISTANCE)


def test_side_rule_equals_the_two_pass_reference_on_exact_ties():
    # Axis-aligned segments between integer grid points and points on a half-integer
    # grid: every product is exact (no rounding for a fused multiply-add to change), and
    # many points are exactly as near to two segments (shared vertices, a segment and its
    # reverse, parallel neighbours) with |cross| equal too, where the one-pass integer
    # key must still give the rule's answer. Invalid segments (length -1) are mixed in.
    rng = np.random.default_rng(7)
    n, e = 4096, 12
    a = rng.integers(-3, 4, (n, e, 2)).astype(np.float32)
    axis = rng.integers(0, 2, (n, e))
    step = rng.integers(-2, 3, (n, e)).astype(np.float32)
    d = np.stack([np.where(axis == 0, step, 0.0), np.where(axis == 1, step, 0.0)], -1)
    b = a + d
    b[:, 1::4] = a[:, 0::4]  # reversed copies and shared vertices
    a[:, 1::4] = b[:, 0::4]
    d = b - a
    length = np.sqrt((d * d).sum(-1))
    unit = d / np.where(length > 0, length, 1.0)[..., None]
    length = np.where(rng.random((n, e)) < 0.1, -1.0, length).astype(np.float32)
    pts = (rng.integers(-8, 9, (n, 2)) / 2.0).astype(np.float32)
    args = (jnp.asarray(pts), jnp.asarray(a[..., 0]), jnp.asarray(a[..., 1]),
            jnp.asarray(unit[..., 0]), jnp.asarray(unit[..., 1]), jnp.asarray(length))
    got = np.asarray(jax.jit(geometry.signed_distance_to_segments)(*args))
    want = np.asarray(jax.jit(_side_by_float_max_then_any)(*args))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # The cases that matter occur (counted exactly in float64): points whose farthest
    # tied segments disagree on the side, and both signs overall.
    px, py = pts[:, None, 0] - a[..., 0], pts[:, None, 1] - a[..., 1]
    ux, uy = unit[..., 0].astype(np.float64), unit[..., 1].astype(np.float64)
    along, cross = px * ux + py * uy, ux * py - uy * px
    excess = along - np.clip(along, 0.0, np.maximum(length, 0.0))
    d2 = np.where(length >= 0, excess**2 + cross**2, np.inf)
    tied = d2 == d2.min(-1, keepdims=True)
    far = tied & (np.abs(cross) == np.where(tied, np.abs(cross), -1).max(-1, keepdims=True))
    contested = (far & (cross < 0)).any(-1) & (far & (cross > 0)).any(-1)
    assert contested.sum() > 100, contested.sum()
    assert np.all(got[contested] > 0)  # right of one winner is right
    assert (got > 0).sum() > n // 20 and (got < 0).sum() > n // 20
    # A hand case: the corner (0, 0) of segments +x and +y, the point (-1, -1) on the
    # bisector: both at distance sqrt(2) with |cross| 1, the point right of the +x
    # segment (cross -1) and left of the +y one: right of a winner, so off-road.
    one = lambda *v: jnp.asarray([v], jnp.float32)  # noqa: E731
    corner = geometry.signed_distance_to_segments(
        one(-1.0, -1.0), one(0.0, 0.0), one(0.0, 0.0), one(1.0, 0.0), one(0.0, 1.0),
        one(1.0, 1.0))
    np.testing.assert_allclose(corner, [np.sqrt(2.0)], rtol=1e-6)


# No edge merging: the grid must then equal the brute force exactly.
index_cfg = road_index.RoadIndexConfig(
    grid_size=8, road_per_cell=16, chunk_size=4, edges_per_cell=32, edge_merge_tolerance=0.0
)
build_jit = jax.jit(jax.vmap(functools.partial(road_index.build_road_index, config=index_cfg)))


def _grid_offroad(idx, rg, pts):
    return road_index.offroad_distance(idx, rg, pts)


grid_offroad_jit = jax.jit(jax.vmap(_grid_offroad))


def test_grid_offroad_equals_brute_force_and_shapely():
    cases = _polygon_cases()
    rgs = jax.tree.map(lambda *x: jnp.stack(x), *[c[0] for c in cases])
    pts = jnp.asarray(np.stack([c[2] for c in cases]) * 0.9, jnp.float32)
    idx = build_jit(rgs)
    assert int(jnp.sum(idx.edge_overflow)) == 0
    grid = np.asarray(grid_offroad_jit(idx, rgs, pts))
    brute = np.asarray(brute_force_jit(rgs, pts))
    inside = np.isfinite(grid)
    assert inside.mean() > 0.9
    np.testing.assert_allclose(grid[inside], brute[inside], atol=1e-5)
    # Beyond the grid (> 10 m from every edge point) everything is off-road.
    assert np.all(brute[~inside] > 0)


def test_is_offroad_box_corners_vs_shapely():
    cases = _polygon_cases()
    rng = np.random.default_rng(2)
    n_box = 200
    rgs = jax.tree.map(lambda *x: jnp.stack(x), *[c[0] for c in cases])
    idx = build_jit(rgs)
    xy = rng.uniform(-18, 18, (NUM_POLYGONS, n_box, 2))
    yaw = rng.uniform(-np.pi, np.pi, (NUM_POLYGONS, n_box))
    length = rng.uniform(1.0, 6.0, (NUM_POLYGONS, n_box))
    width = rng.uniform(0.5, 2.5, (NUM_POLYGONS, n_box))
    f = jax.jit(jax.vmap(road_index.is_offroad))
    got = np.asarray(
        f(idx, rgs, jnp.asarray(xy, jnp.float32), jnp.asarray(yaw, jnp.float32),
          jnp.asarray(length, jnp.float32), jnp.asarray(width, jnp.float32))
    )
    disagree = ambiguous = 0
    for k, (_, poly, _) in enumerate(cases):
        for i in range(n_box):
            corners = _corners_np(*xy[k, i], yaw[k, i], length[k, i], width[k, i])
            if min(poly.boundary.distance(Point(c)) for c in corners) < AMBIGUOUS:
                ambiguous += 1
                continue
            ref = any(not poly.contains(Point(c)) for c in corners)
            disagree += bool(got[k, i]) != ref
    assert NUM_POLYGONS * n_box >= 10_000
    assert disagree == 0
    assert ambiguous < 10


def test_outside_grid_is_offroad_and_no_edges_is_onroad():
    # Through the module's compiled build_jit / grid_offroad_jit (the polygon batch's
    # shapes): polygon 0 as it is, and polygon 1 replaced by polygon 0 with no edges.
    cases = _polygon_cases()
    rg = cases[0][0]
    no_edges = rg.replace(type=jnp.full_like(rg.type, RoadType.LANE_CENTER))
    rgs = jax.tree.map(lambda *x: jnp.stack(x), rg, no_edges, *[c[0] for c in cases[2:]])
    pts = np.zeros(np.stack([c[2] for c in cases]).shape, np.float32)
    pts[0, :] = 1e4  # far outside polygon 0's grid
    pts[1, 1::2, 0] = 1e4  # no edges: on-road at (0, 0) and at (1e4, 0) alike
    idx = build_jit(rgs)
    assert bool(idx.has_edges[0]) and not bool(idx.has_edges[1])
    d = np.asarray(grid_offroad_jit(idx, rgs, jnp.asarray(pts)))
    assert np.all(d[0] > 0)
    assert np.all(d[1] < 0)


def test_road_chunks_are_nearest_to_cell_centre():
    # Reference: split the padded point array into chunks of S, rank chunks by their
    # nearest valid point's distance to the cell centre, keep the first K; the block for
    # a query inside that cell must hold exactly those chunks' points.
    (rg, _, _), = _polygon_cases()[:1]
    cfg = road_index.RoadIndexConfig(grid_size=8, road_per_cell=12, chunk_size=4)
    # Jitted: run eagerly, the build's ~130 operations compile one by one.
    idx = jax.jit(road_index.build_road_index, static_argnames="config")(rg, config=cfg)
    g, size, k = cfg.grid_size, cfg.chunk_size, cfg.road_per_cell // cfg.chunk_size
    xy = np.asarray(rg.xy)
    valid = np.asarray(rg.valid)
    for c in [0, g * g // 2 + 3, g * g - 1]:
        centre = np.asarray(idx.origin) + float(idx.cell_size) * (np.array([c // g, c % g]) + 0.5)
        d = np.where(valid, np.linalg.norm(xy - centre, axis=1), np.inf)
        chunk_d = d.reshape(-1, size).min(axis=1)
        want_chunks = np.argsort(chunk_d, kind="stable")[:k]
        want = xy.reshape(-1, size, 2)[want_chunks].reshape(-1, 2)
        want_valid = valid.reshape(-1, size)[want_chunks].reshape(-1)
        block = road_index.road_block(idx, jnp.asarray(centre, jnp.float32), 12)  # (5, K, S)
        block = np.asarray(block).reshape(5, -1).T
        np.testing.assert_array_equal(block[:, 4] >= 0, want_valid)
        np.testing.assert_allclose(block[want_valid, :2], want[want_valid], atol=1e-6)


def test_geometry_traces_once():
    f = chex.assert_max_traces(geometry.pairwise_overlap, n=1)
    f = jax.jit(f)
    for seed in range(2):
        xy = jax.random.normal(jax.random.key(seed), (4, 2))
        f(xy, jnp.zeros(4), jnp.ones(4), jnp.ones(4), jnp.ones(4, bool))


def test_within_radius_and_frames():
    # A point 3 m ahead and 4 m left of an agent at (1, 1) heading +y (yaw = pi/2) is at
    # world (1 - 4, 1 + 3) = (-3, 4); it is 5 m away.
    local = geometry.to_local(jnp.array([-3.0, 4.0]), jnp.array([1.0, 1.0]), np.pi / 2)
    np.testing.assert_allclose(local, [3.0, 4.0], atol=1e-6)
    assert bool(geometry.within_radius(jnp.array([-3.0, 4.0]), jnp.array([1.0, 1.0]), 5.0))
    assert not bool(geometry.within_radius(jnp.array([-3.0, 4.0]), jnp.array([1.0, 1.0]), 4.99))


def test_grid_offroad_on_procedural_scenes_within_merge_tolerance():
    # Default index config (edge runs merged within 2 cm) on generated maps: signs agree
    # with the brute force over all original segments wherever the point is farther than
    # twice the tolerance from an edge, and distances differ by at most that.
    from jaxdrive.scenarios.procedural import generate_batch

    cfg = road_index.RoadIndexConfig()
    tol = 2 * cfg.edge_merge_tolerance + 1e-4
    scenes = generate_batch(jax.random.key(1), 4)

    def check(rg, key):
        idx = road_index.build_road_index(rg, cfg)
        lo = idx.origin
        p = lo + jax.random.uniform(key, (3000, 2)) * idx.cell_size * cfg.grid_size
        grid = road_index.offroad_distance(idx, rg, p)
        nxt = jnp.concatenate([rg.xy[1:], rg.xy[-1:]])
        seg = road_index.edge_segment_mask(rg)
        brute = jax.lax.map(
            lambda q: geometry.signed_distance_to_edges(q, rg.xy, nxt, seg), p, batch_size=500
        )
        return grid, brute, idx.edge_overflow

    grid, brute, overflow = jax.jit(jax.vmap(check))(
        scenes.roadgraph, jax.random.split(jax.random.key(2), 4)
    )
    grid, brute = np.asarray(grid), np.asarray(brute)
    clear = np.abs(brute) > tol
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(grid[clear] > 0, brute[clear] > 0)
    if int(jnp.sum(overflow)) == 0:
        np.testing.assert_allclose(grid, brute, atol=tol)
    else:  # cells over the candidate budget may report a farther edge, never a wrong side
        assert np.mean(np.abs(grid - brute) <= tol) > 0.99

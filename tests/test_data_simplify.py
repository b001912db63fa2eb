"""Shape-preserving road simplification (``jaxdrive.data.simplify``): corners kept,
collinear points dropped, deviation within the tolerance (brute force), equal to a plain
recursive Douglas-Peucker; and on the real scenes in ``../shared/data`` (skipped when
absent)."""

from pathlib import Path

import numpy as np
import pytest

from jaxdrive.data.convert import ConvertConfig, convert_scene, real_data_config
from jaxdrive.data.simplify import douglas_peucker, resample, significance
from jaxdrive.data.sources import expand_inputs, iter_items, read_item
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.types import RoadType

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _seg_dist(q, a, b) -> float:
    """Point-to-segment distance, written out independently of the module."""
    (qx, qy), (ax, ay), (bx, by) = q, a, b
    dx, dy = bx - ax, by - ay
    n2 = dx * dx + dy * dy
    t = 0.0 if n2 == 0 else min(1.0, max(0.0, ((qx - ax) * dx + (qy - ay) * dy) / n2))
    return float(np.hypot(qx - ax - t * dx, qy - ay - t * dy))


def _reference_dp(pts, tol) -> set[int]:
    """Textbook recursive Douglas-Peucker: indices kept."""
    keep = {0, len(pts) - 1}

    def rec(i, j):
        if j - i < 2:
            return
        d = [_seg_dist(pts[k], pts[i], pts[j]) for k in range(i + 1, j)]
        k = int(np.argmax(d))
        if d[k] > tol:
            keep.add(i + 1 + k)
            rec(i, i + 1 + k)
            rec(i + 1 + k, j)

    rec(0, len(pts) - 1)
    return keep


def _max_deviation(pts, kept) -> float:
    """Largest distance of an original vertex to the simplified segment spanning it."""
    idx = np.flatnonzero(kept)
    worst = 0.0
    for a, b in zip(idx[:-1], idx[1:], strict=True):
        for k in range(a + 1, b):
            worst = max(worst, _seg_dist(pts[k], pts[a], pts[b]))
    return worst


def test_collinear_runs_keep_corners_exactly():
    # An L with a return: runs along x, up y, back along x; 0.5 m spacing.
    run1 = [(x * 0.5, 0.0) for x in range(7)]  # (0,0)..(3,0)
    run2 = [(3.0, y * 0.5) for y in range(1, 7)]  # ..(3,3)
    run3 = [(3.0 - x * 0.5, 3.0) for x in range(1, 5)]  # ..(1,3)
    pts = np.array(run1 + run2 + run3)
    kept = douglas_peucker(pts, np.array([0, len(pts)]), 0.05)
    # Corners (3,0) and (3,3) and the endpoints stay, every interior collinear point goes.
    np.testing.assert_array_equal(pts[kept], [[0, 0], [3, 0], [3, 3], [1, 3]])


def test_kerb_corner_is_never_dropped():
    # A kerb with a 0.2 m jog (a parked car's bay): the jog's vertices deviate by 0.2 m
    # from any shortcut, so a 0.1 m tolerance keeps them.
    pts = np.array([(0, 0), (1, 0), (2, 0), (2, 0.2), (3, 0.2), (4, 0.2), (5, 0.2)], float)
    kept = douglas_peucker(pts, np.array([0, len(pts)]), 0.1)
    np.testing.assert_array_equal(pts[kept], [[0, 0], [2, 0], [2, 0.2], [5, 0.2]])


@pytest.mark.parametrize("seed", range(6))
def test_matches_recursive_reference_and_deviation_within_tolerance(seed):
    rng = np.random.default_rng(seed)
    polys = [np.cumsum(rng.normal(size=(n, 2)) * rng.uniform(0.05, 2.0), axis=0)
             for n in rng.integers(1, 40, size=5)]
    polys.append(np.array([(0, 0), (1, 0), (1, 1), (0, 1), (0, 0)], float))  # closed
    start = np.concatenate([[0], np.cumsum([len(p) for p in polys])])
    xy = np.concatenate(polys)
    sig = significance(xy, start)
    for tol in (0.0, 0.05, 0.3, 1.0, 5.0):
        kept = sig > tol
        for k, p in enumerate(polys):
            mine = kept[start[k]:start[k + 1]]
            ref = _reference_dp(p, tol)
            assert set(np.flatnonzero(mine)) == ref, (seed, k, tol)
            assert mine[0] and mine[-1]
            assert _max_deviation(p, mine) <= tol + 1e-12
        # The pruned computation answers the same for every tolerance at or above floor.
        np.testing.assert_array_equal(significance(xy, start, floor=tol) > tol, kept)


def test_conversion_keeps_every_point_when_the_map_fits():
    from test_data_convert import ROADS, make_raw

    raw = make_raw([(0, 0, None)], ROADS)  # 42 points
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=42, max_lanes=4)
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    assert info["num_road_points"] == 42 and info["road_tolerance"] == [0.0, 0.0]
    assert info["simplified_road_points"] == 0 and info["truncated_road_points"] == 0


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_real_road_edges_within_tolerance_after_simplification():
    cc = ConvertConfig()
    # womd_json_train/ (read since .json.gz is): three of its 44 scenes hold more objects
    # than the 128 slots (131, 141, 149 in its SOURCES.tsv), the rest beyond the slots
    # counted as truncated, and some maps need more than the base tolerance.
    table = DATA / "womd_json_train" / "SOURCES.tsv"
    sources = {line.split("\t")[0]: int(line.split("\t")[4]) for line in
               table.read_text().splitlines()[1:] if line.strip()} if table.exists() else {}
    for item in iter_items(expand_inputs([str(DATA)])):
        raw = read_item(item)
        rel = raw.road_xy - raw.road_xy.mean(axis=0)
        kept = douglas_peucker(rel, raw.road_start, cc.road_tolerance)
        edges = np.flatnonzero(raw.road_type == RoadType.ROAD_EDGE)
        worst = 0.0
        for k in edges[:40]:  # brute force on 40 edges per scene keeps this fast
            a, b = raw.road_start[k], raw.road_start[k + 1]
            worst = max(worst, _max_deviation(rel[a:b], kept[a:b]))
        assert worst <= cc.road_tolerance + 1e-9, raw.source
        _, info = convert_scene(raw, real_data_config(), cc)
        name = Path(raw.source).name
        if name in sources:  # womd_json_train/: denser maps than the six original scenes
            assert max(info["road_tolerance"]) <= cc.max_road_tolerance, raw.source
            assert info["truncated_agents"] == max(
                0, sources[name] - real_data_config().max_agents), (raw.source, info)
            continue
        # The real-data defaults keep the six original maps at the base tolerance:
        # nothing coarser.
        assert max(info["road_tolerance"]) <= cc.road_tolerance, raw.source
        assert info["truncated_road_points"] == info["simplified_road_points"], raw.source
        # ... and every object, lane and traffic light.
        for key in ("truncated_agents", "truncated_lanes", "dropped_polylines",
                    "truncated_traffic_lights", "truncated_lane_successors"):
            assert info[key] == 0, (raw.source, key)


def test_resample_at_uniform_arc_length_on_the_original_polyline():
    # An L: 10 m along x, then 4 m up y (14 m); spacing 3 -> arc lengths 0, 3, 6, 9, 12,
    # 14 (the end point kept); a single-point polyline stays; a 2 m segment -> its ends.
    xy = np.array([[0, 0], [10, 0], [10, 4], [5, 5], [0, 9], [2, 9]], np.float64)
    start = np.array([0, 3, 4, 6])
    new, new_start = resample(xy, start, 3.0)
    np.testing.assert_array_equal(new_start, [0, 6, 7, 9])
    np.testing.assert_allclose(new[:6], [[0, 0], [3, 0], [6, 0], [9, 0], [10, 2], [10, 4]])
    np.testing.assert_allclose(new[6], [5, 5])
    np.testing.assert_allclose(new[7:], [[0, 9], [2, 9]])
    # A random polyline: every gap <= spacing, every new point on the original polyline,
    # same ends and the same length to within the chords' shortening.
    rng = np.random.default_rng(3)
    pts = np.cumsum(rng.normal(size=(30, 2)) * 2.0, axis=0)
    out, out_start = resample(pts, np.array([0, 30]), 0.7)
    assert np.all(np.linalg.norm(np.diff(out, axis=0), axis=1) <= 0.7 + 1e-9)
    np.testing.assert_allclose(out[[0, -1]], pts[[0, -1]])
    for q in out:
        assert min(_seg_dist(q, pts[i], pts[i + 1]) for i in range(29)) < 1e-9


def test_conversion_with_road_spacing_resamples_before_the_budget():
    from test_data_convert import ROADS, make_raw

    raw = make_raw([(0, 0, None)], ROADS)
    cfg = ScenarioConfig(max_agents=2, num_steps=6, max_road_points=4096, max_lanes=4)
    plain, _ = convert_scene(raw, cfg, ConvertConfig(init_step=0))
    arrays, info = convert_scene(raw, cfg, ConvertConfig(init_step=0, road_spacing=0.5))
    n_plain, n = int(plain["roadgraph.valid"].sum()), int(arrays["roadgraph.valid"].sum())
    assert n == info["num_road_points"] > n_plain
    xy, ids, ok = arrays["roadgraph.xy"], arrays["roadgraph.id"], arrays["roadgraph.valid"]
    same = ok[1:] & ok[:-1] & (ids[1:] == ids[:-1])
    gaps = np.linalg.norm(np.diff(xy, axis=0), axis=1)[same]
    assert gaps.max() <= 0.5 + 1e-5 and info["simplified_road_points"] == 0
    with pytest.raises(Exception, match="road_spacing"):
        ConvertConfig(road_spacing=-1.0)

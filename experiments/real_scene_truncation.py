"""Truncation of real scenes by a conversion: the table in docs/data.md ("Real-data
defaults").

    python -m jaxdrive.data convert ../shared/data --out /tmp/conv-after
    python experiments/real_scene_truncation.py ../shared/data /tmp/conv-after [BEFORE_DIR]

Per scene: objects in the source and agents kept, road points in / kept and the
simplification tolerances (or strides, for caches written before road simplification),
lanes dropped, kept road-edge segments (consecutive edge point pairs), and the largest
distance of an original road-edge / lane-centre vertex from its kept polyline (brute
force). Polylines are matched by order (lanes first, then the rest, both in source
order), so the deviation is skipped for a scene whose lanes or polylines were dropped.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from jaxdrive.data.sources import expand_inputs, iter_items, read_item
from jaxdrive.types import RoadType


def _seg_dist(q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, 2) points, (m, 2) segments a->b -> (n,) distance to the nearest segment."""
    d = b - a
    rel = q[:, None, :] - a[None]
    l2 = (d * d).sum(-1)
    t = np.clip((rel * d[None]).sum(-1) / np.where(l2 > 0, l2, 1.0), 0.0, 1.0)
    off = rel - t[..., None] * d[None]
    return np.sqrt((off ** 2).sum(-1)).min(1)


def _deviation(raw, rec, z, i, rtype) -> float | None:
    """Largest distance of a source vertex of type ``rtype`` from its kept polyline."""
    origin = np.asarray(rec["origin"])
    v, t, ids = z["roadgraph.valid"][i], z["roadgraph.type"][i], z["roadgraph.id"][i]
    xy = z["roadgraph.xy"][i].astype(np.float64)
    sel = v & (t == rtype)
    kept_ids = list(dict.fromkeys(ids[sel].tolist()))
    src = np.flatnonzero(raw.road_type == rtype)
    if len(kept_ids) != len(src):
        return None
    worst = 0.0
    for pid, k in zip(kept_ids, src, strict=True):
        kept = xy[sel & (ids == pid)]
        orig = raw.road_xy[raw.road_start[k]:raw.road_start[k + 1]] - origin
        dist = (np.linalg.norm(orig - kept[0], axis=1) if len(kept) == 1
                else _seg_dist(orig, kept[:-1], kept[1:]))
        worst = max(worst, float(dist.max()))
    return worst


def summarise(cache: str, raws: dict) -> dict:
    """Cache directory -> {source file name: row dict}."""
    with open(os.path.join(cache, "manifest.json")) as f:
        m = json.load(f)
    shards = [np.load(os.path.join(cache, s["file"])) for s in m["shards"]]
    rows = {}
    for rec in m["scenarios"]:
        z, i = shards[rec["shard"]], rec["index"]
        raw = raws[os.path.basename(rec["source"])]
        v, t, ids = z["roadgraph.valid"][i], z["roadgraph.type"][i], z["roadgraph.id"][i]
        e = v & (t == RoadType.ROAD_EDGE)
        simplify = "road_tolerance" in rec
        rows[os.path.basename(rec["source"]).split("#")[0]] = {
            "objects": rec["num_objects_in"], "agents": rec["num_agents"],
            "road_in": rec["num_road_points_in"], "road": rec["num_road_points"],
            "how": ("tol " + "/".join(f"{x:g}" for x in rec["road_tolerance"]) if simplify
                    else "stride " + "/".join(map(str, rec["road_stride"]))),
            "lanes_dropped": rec["truncated_lanes"],
            "edge_segments": int((e[:-1] & e[1:] & (ids[:-1] == ids[1:])).sum()),
            "edge_dev": _deviation(raw, rec, z, i, RoadType.ROAD_EDGE),
            "lane_dev": _deviation(raw, rec, z, i, RoadType.LANE_CENTER),
            "sdc_inferred": rec.get("sdc_inferred"),
        }
    return rows


def main(argv: list[str]) -> None:
    data, after = argv[:2]
    raws = {}
    for item in iter_items(expand_inputs([data])):
        raw = read_item(item)
        raws[os.path.basename(raw.source)] = raw
    rows_after = summarise(after, raws)
    rows_before = summarise(argv[2], raws) if len(argv) > 2 else {}

    def fmt(row, key):
        if row is None:
            return "-"
        value = row[key]
        return "n/a" if value is None else (f"{value:.3f}" if isinstance(value, float)
                                             else str(value))

    keys = ("agents", "road", "how", "lanes_dropped", "edge_segments", "edge_dev", "lane_dev")
    print("| scene | objects | road points in | " + " | ".join(
        f"{k} before / after" for k in keys) + " |")
    print("|---|" + "---:|" * (2 + len(keys)))
    for name, row in rows_after.items():
        before = rows_before.get(name)
        mark = " (SDC inferred)" if row["sdc_inferred"] else ""
        cells = [f"{fmt(before, k)} / {fmt(row, k)}" for k in keys]
        print(f"| {name}{mark} | {row['objects']} | {row['road_in']} | " + " | ".join(cells)
              + " |")


if __name__ == "__main__":
    main(sys.argv[1:])

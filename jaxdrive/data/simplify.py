"""Shape-preserving polyline simplification (Douglas-Peucker), NumPy on the host.

Conversion uses it instead of keeping every ``s``-th point: a vertex is removed only when
the simplified polyline stays within a tolerance of every original vertex (and so of the
whole original polyline: the distance to a segment is convex along a segment), so corners
(a kerb vertex, a lane's turn) are kept and only nearly collinear interior points go.

``significance`` runs Douglas-Peucker once with tolerance 0 over all polylines at once,
level by level (vectorised over every open range), and records for each vertex the
largest tolerance at which it is still removed. ``significance > tol`` is then exactly the
vertex set ``douglas_peucker(tol)`` keeps, for any ``tol``, so the conversion can pick the
smallest tolerance that fits a point budget by sorting, without re-running anything.
"""

from __future__ import annotations

import numpy as np


def _segment_distance(q: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """(n, 2) points, (n, 2) segment ends -> (n,) distance of each point to its segment."""
    d = p1 - p0
    rel = q - p0
    len2 = np.einsum("ij,ij->i", d, d)
    t = np.einsum("ij,ij->i", rel, d) / np.where(len2 > 0, len2, 1.0)
    t = np.where(len2 > 0, np.clip(t, 0.0, 1.0), 0.0)
    off = rel - t[:, None] * d
    return np.sqrt(np.einsum("ij,ij->i", off, off))


def significance(xy: np.ndarray, start: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Douglas-Peucker significance of every vertex.

    Args:
      xy: (P, 2) float64, points of all polylines concatenated (metres; use coordinates
        near the origin for precision).
      start: (K + 1,) int64, polyline ``k`` is ``xy[start[k]:start[k + 1]]`` (non-empty).
      floor: metres; only tolerances ``>= floor`` will be asked about, so a range whose
        points all lie within ``floor`` of its chord is not split further (its points get
        values ``<= floor``). Saves most of the work on densely sampled maps.
    Returns:
      (P,) float64: a vertex is kept by Douglas-Peucker at tolerance ``tol >= floor`` iff
      its value is ``> tol``; first and last points of each polyline are ``inf`` (always
      kept).
    """
    xy = np.asarray(xy, np.float64)
    start = np.asarray(start, np.int64)
    sig = np.zeros(xy.shape[0], np.float64)
    if start.shape[0] < 2:
        return sig
    first, last = start[:-1], start[1:] - 1
    sig[first] = np.inf
    sig[last] = np.inf
    # Open ranges (a, b) with interior points, and the significance of their parent split.
    a, b = first, last
    parent = np.full(a.shape[0], np.inf)
    while True:
        open_ = b - a >= 2
        a, b, parent = a[open_], b[open_], parent[open_]
        if a.shape[0] == 0:
            return sig
        n = b - a - 1
        offs = np.cumsum(n) - n
        owner = np.repeat(np.arange(a.shape[0]), n)
        idx = np.repeat(a + 1, n) + (np.arange(int(n.sum())) - np.repeat(offs, n))
        dist = _segment_distance(xy[idx], xy[a[owner]], xy[b[owner]])
        # Farthest interior point of each range (ties: the lowest index).
        order = np.lexsort((idx, -dist, owner))
        pick = order[offs]
        top = dist[pick]
        flat = top <= floor  # every point within floor: all go at any tolerance asked
        sig[idx[flat[owner]]] = top[owner[flat[owner]]]
        pick, a, b, parent, top = pick[~flat], a[~flat], b[~flat], parent[~flat], top[~flat]
        split = idx[pick]
        s = np.minimum(top, parent)  # removed with the parent range if that goes
        sig[split] = s
        a, b = np.concatenate([a, split]), np.concatenate([split, b])
        parent = np.concatenate([s, s])


def douglas_peucker(xy: np.ndarray, start: np.ndarray, tolerance: float) -> np.ndarray:
    """(P,) bool: the vertices Douglas-Peucker keeps at ``tolerance`` (metres), per
    polyline (see ``significance``); endpoints always."""
    return significance(xy, start, tolerance) > tolerance


def resample(xy: np.ndarray, start: np.ndarray, spacing: float) -> tuple[np.ndarray, np.ndarray]:
    """Polylines resampled at uniform arc length: each polyline's points at 0, s, 2s, ...
    along it, plus its last point (so no gap exceeds ``spacing``), linearly interpolated
    between the original vertices. A single-point polyline stays as it is.

    Procedural maps are laid out this way (``procedural.point_spacing``); resampling a
    real map at the same spacing gives the policy the road-point density it trained on.

    Args:
      xy: (P, 2) float64 points of all polylines, concatenated.
      start: (K + 1,) int64, polyline k is ``xy[start[k]:start[k + 1]]``.
      spacing: metres (> 0).
    Returns:
      (xy, start) of the resampled polylines, in the same layout.
    """
    out, starts = [], [0]
    for k in range(start.shape[0] - 1):
        pts = xy[start[k]:start[k + 1]]
        if pts.shape[0] < 2:
            out.append(pts)
            starts.append(starts[-1] + pts.shape[0])
            continue
        seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
        cum = np.concatenate([[0.0], np.cumsum(seg)])
        total = cum[-1]
        n = int(np.ceil(total / spacing - 1e-9)) if total > 0 else 0
        s = np.minimum(np.arange(n + 1) * spacing, total)
        s[-1] = total
        new = np.stack([np.interp(s, cum, pts[:, 0]), np.interp(s, cum, pts[:, 1])], axis=1)
        out.append(new)
        starts.append(starts[-1] + new.shape[0])
    if not out:
        return xy[:0], np.zeros(1, start.dtype)
    return np.concatenate(out), np.asarray(starts, start.dtype)

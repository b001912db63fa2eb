"""Exact 2-D geometry: oriented-box overlap, signed distance to road edges, goal radius.

Conventions: boxes are (centre xy, yaw, length along the heading, width); road-edge
polylines are oriented with the drivable area on their LEFT, so a point to the right of
its nearest edge segment is off-road. All functions broadcast over leading axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Signed distance reported when a query has no valid edge segment at all: "deep inside".
NO_EDGE_DISTANCE = -1.0e6
# Squared distances within these of the minimum count as ties at a shared vertex.
_TIE_REL = 1.0e-5
_TIE_ABS2 = 1.0e-10


def materialize(fn, *args):
    """``fn(*args)``, computed once and stored before any consumer reads it.

    XLA fuses cheap-looking producers (``cos``, ``sin``, selects, gathers) into every
    consumer loop and recomputes them per element; for per-agent values read by
    (A, A) pair loops or (A, M) road loops that multiplies their cost by A or M and
    stops vectorisation (3x slower collision and observation loops on CPU). Fusion does
    not cross a loop boundary, so ``fn`` runs inside a while loop whose trip count (1)
    XLA cannot fold. (``optimization_barrier`` does not help: XLA removes it before
    fusion.)
    """
    first = jax.tree.leaves(args)[0].ravel()[0]
    # Always 1, but not provably so: x == x is False for NaN, and x != x then holds.
    trips = ((first == first) | (first != first)).astype(jnp.int32)
    shapes = jax.eval_shape(fn, *args)
    init = jax.tree.map(lambda sd: jnp.zeros(sd.shape, sd.dtype), shapes)
    return jax.lax.fori_loop(0, trips, lambda i, _: fn(*args), init)


def cos_sin(yaw: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin of ``yaw`` (any shape, radians), each of its shape, materialised (see
    ``materialize``)."""
    return materialize(lambda y: (jnp.cos(y), jnp.sin(y)), yaw)


def box_corners(
    xy: jax.Array, yaw: jax.Array, length: jax.Array, width: jax.Array, trig=None
) -> jax.Array:
    """Corners of oriented boxes, counter-clockwise from front-left... front-right.

    Args:
      xy: (..., 2) centre. yaw: (...,). length, width: (...,).
      trig: optional precomputed ``(cos(yaw), sin(yaw))``.
    Returns:
      (..., 4, 2): front-left, rear-left, rear-right, front-right (counter-clockwise).
    """
    c, s = (jnp.cos(yaw), jnp.sin(yaw)) if trig is None else trig
    hl, hw = 0.5 * length, 0.5 * width
    fx, fy = c * hl, s * hl  # half-length along heading
    lx, ly = -s * hw, c * hw  # half-width to the left
    dx = jnp.stack([fx + lx, -fx + lx, -fx - lx, fx - lx], axis=-1)
    dy = jnp.stack([fy + ly, -fy + ly, -fy - ly, fy - ly], axis=-1)
    return xy[..., None, :] + jnp.stack([dx, dy], axis=-1)


def boxes_overlap(
    xy_a: jax.Array, yaw_a: jax.Array, len_a: jax.Array, wid_a: jax.Array,
    xy_b: jax.Array, yaw_b: jax.Array, len_b: jax.Array, wid_b: jax.Array,
) -> jax.Array:
    """Exact overlap of two oriented boxes by the separating-axis theorem.

    Boxes that only touch (zero-area contact) do not overlap.

    Args:
      xy_*: (..., 2); yaw_*, len_*, wid_*: (...,), broadcast against each other.
    Returns:
      (...,) bool.
    """
    ca, sa = jnp.cos(yaw_a), jnp.sin(yaw_a)
    cb, sb = jnp.cos(yaw_b), jnp.sin(yaw_b)
    return _overlap_from_cos_sin(xy_a, ca, sa, len_a, wid_a, xy_b, cb, sb, len_b, wid_b)


def _overlap_from_cos_sin(xy_a, ca, sa, len_a, wid_a, xy_b, cb, sb, len_b, wid_b):
    dx = xy_b[..., 0] - xy_a[..., 0]
    dy = xy_b[..., 1] - xy_a[..., 1]
    ha, wa = 0.5 * len_a, 0.5 * wid_a
    hb, wb = 0.5 * len_b, 0.5 * wid_b
    # Cosines between the four axes: a's heading/left against b's heading/left.
    cos_d = jnp.abs(ca * cb + sa * sb)  # |u_a . u_b| = |v_a . v_b|
    sin_d = jnp.abs(sa * cb - ca * sb)  # |u_a . v_b| = |v_a . u_b|
    # Projections of the centre offset on each axis, against the sum of the
    # projected half-extents; a strict inequality is a separating axis.
    sep_ua = jnp.abs(dx * ca + dy * sa) >= ha + hb * cos_d + wb * sin_d
    sep_va = jnp.abs(-dx * sa + dy * ca) >= wa + hb * sin_d + wb * cos_d
    sep_ub = jnp.abs(dx * cb + dy * sb) >= hb + ha * cos_d + wa * sin_d
    sep_vb = jnp.abs(-dx * sb + dy * cb) >= wb + ha * sin_d + wa * cos_d
    return ~(sep_ua | sep_va | sep_ub | sep_vb)


def pairwise_overlap(
    xy: jax.Array, yaw: jax.Array, length: jax.Array, width: jax.Array, valid: jax.Array,
    trig=None,
) -> jax.Array:
    """All-pairs box overlap among one scene's agents.

    Args:
      xy: (A, 2); yaw, length, width: (A,); valid: (A,) bool.
      trig: optional ``(cos(yaw), sin(yaw))``, materialised (see ``materialize``).
    Returns:
      (A, A) bool, symmetric, False on the diagonal and for invalid agents.
    """
    a = lambda x: x[:, None]
    b = lambda x: x[None, :]
    c, s = cos_sin(yaw) if trig is None else trig
    hit = _overlap_from_cos_sin(
        xy[:, None, :], a(c), a(s), a(length), a(width),
        xy[None, :, :], b(c), b(s), b(length), b(width),
    )
    n = xy.shape[0]
    return hit & a(valid) & b(valid) & ~jnp.eye(n, dtype=bool)


def overlap_against(
    xy: jax.Array, length: jax.Array, width: jax.Array, valid: jax.Array, trig,
    other_xy: jax.Array, other_length: jax.Array, other_width: jax.Array,
    other_valid: jax.Array, other_trig, self_index: jax.Array,
) -> jax.Array:
    """Box overlap of C boxes against the N boxes of a scene they belong to.

    Args:
      xy: (C, 2); length, width: (C,); valid: (C,) bool; trig: ``(cos, sin)`` of yaw (C,).
      other_*: the same for the N boxes of the scene.
      self_index: (C,) int32, each box's own index among the N (never its own partner).
    Returns:
      (C, N) bool; equal to the rows ``self_index`` of ``pairwise_overlap`` on the N.
    """
    a = lambda x: x[:, None]
    b = lambda x: x[None, :]
    c, s = trig
    oc, os_ = other_trig
    hit = _overlap_from_cos_sin(
        xy[:, None, :], a(c), a(s), a(length), a(width),
        other_xy[None, :, :], b(oc), b(os_), b(other_length), b(other_width),
    )
    n = other_xy.shape[0]
    return hit & a(valid) & b(other_valid) & (jnp.arange(n)[None, :] != a(self_index))


def segment_distance(p: jax.Array, a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Distance from points to segments, and the side of the segment's line.

    Args:
      p: (..., 2) query points; a, b: (..., 2) segment ends (broadcast).
    Returns:
      dist: (...,) Euclidean distance to the closed segment.
      cross: (...,) cross(b - a, p - a) / |b - a|: > 0 left of a->b, < 0 right
        (the signed distance to the segment's supporting line).
    """
    ab = b - a
    ap = p - a
    len2 = jnp.sum(ab * ab, axis=-1)
    safe_len2 = jnp.where(len2 > 0, len2, 1.0)
    t = jnp.clip(jnp.sum(ap * ab, axis=-1) / safe_len2, 0.0, 1.0)
    closest = a + t[..., None] * ab
    diff = p - closest
    dist = jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    cross = (ab[..., 0] * ap[..., 1] - ab[..., 1] * ap[..., 0]) / jnp.sqrt(safe_len2)
    return dist, cross


def signed_distance_to_edges(
    points: jax.Array, seg_start: jax.Array, seg_end: jax.Array, seg_valid: jax.Array
) -> jax.Array:
    """Signed distance from points to road edges: > 0 off-road, < 0 on-road.

    The magnitude is the distance to the nearest valid edge segment; the sign is the
    side of that segment (right = off-road). Where the nearest point is a vertex shared
    by two segments (a tie in distance), the segment on whose supporting line the point
    lies farthest decides: the segment whose normal is closest to the offset direction.
    That picks the correct side at both convex and reflex polyline corners.

    Args:
      points: (..., 2).
      seg_start, seg_end: (..., E, 2) candidate edge segments per point (broadcast).
      seg_valid: (..., E) bool.
    Returns:
      (...,) float32; ``NO_EDGE_DISTANCE`` (deeply on-road) where no segment is valid.
    """
    d = seg_end - seg_start
    length = jnp.sqrt(jnp.sum(d * d, axis=-1))
    u = d / jnp.where(length > 0, length, 1.0)[..., None]
    return signed_distance_to_segments(
        points, seg_start[..., 0], seg_start[..., 1], u[..., 0], u[..., 1],
        jnp.where(seg_valid, length, -1.0),
    )


def signed_distance_to_segments(
    points: jax.Array, ax: jax.Array, ay: jax.Array, ux: jax.Array, uy: jax.Array,
    length: jax.Array,
) -> jax.Array:
    """``signed_distance_to_edges`` on segments given as start, unit direction, length.

    This is the hot form (no divisions, one square root per point); a negative
    ``length`` marks an invalid segment.

    Args:
      points: (..., 2).
      ax, ay, ux, uy, length: (..., E) each, broadcast against ``points[..., None, 0]``.
    Returns:
      (...,) float32.
    """
    px = points[..., 0, None] - ax
    py = points[..., 1, None] - ay
    along = px * ux + py * uy
    cross = ux * py - uy * px  # > 0: left of the segment's line
    excess = along - jnp.clip(along, 0.0, jnp.maximum(length, 0.0))
    d2 = excess * excess + cross * cross
    d2 = jnp.where(length >= 0, d2, jnp.float32(1e30))
    d2min = jnp.min(d2, axis=-1, keepdims=True)
    tied = d2 <= d2min * (1.0 + _TIE_REL) + _TIE_ABS2
    # Among the tied segments the one farthest from its line decides the side; if
    # several are equally far, right of any of them is right. One integer max decides
    # both: the bits of |cross| (ordered as the non-negative floats are) shifted left,
    # with bit 0 set where cross < 0, so the maximum is odd iff a farthest tied segment
    # has the point on its right. (A float max then an any was two passes, 1.4x slower.)
    magnitude = jax.lax.bitcast_convert_type(jnp.abs(cross), jnp.uint32)
    key = (magnitude << 1) | (cross < 0).astype(jnp.uint32)
    right = (jnp.max(jnp.where(tied, key, jnp.uint32(0)), axis=-1) & 1) == 1
    dist = jnp.sqrt(d2min[..., 0])
    signed = jnp.where(right, dist, -dist)
    return jnp.where(d2min[..., 0] < 1e29, signed, NO_EDGE_DISTANCE).astype(jnp.float32)


def within_radius(xy: jax.Array, target: jax.Array, radius: float | jax.Array) -> jax.Array:
    """(..., 2), (..., 2) -> (...,) bool: ``|xy - target| <= radius``."""
    d = xy - target
    return jnp.sum(d * d, axis=-1) <= jnp.square(radius)


def to_local(xy: jax.Array, origin: jax.Array, yaw: jax.Array) -> jax.Array:
    """World points into the frame at ``origin`` with heading ``yaw`` (x forward, y left).

    Args:
      xy: (..., 2); origin: (..., 2); yaw: (...,) (broadcast against ``xy``).
    Returns:
      (..., 2).
    """
    c, s = jnp.cos(yaw), jnp.sin(yaw)
    d = xy - origin
    return jnp.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)

"""Per-scenario uniform grid over the road graph, built once, queried every step.

Each step needs, per agent, the nearest road points (observations) and the road-edge
segments that can be nearest to its box corners (off-road). Scanning all ``R`` road
points per agent per step is what makes other simulators slow on real maps (tens of
thousands of points). Instead, when a scenario enters the pool we lay a ``G x G`` grid
over its map and store, per cell:

- ``road``: the road *chunks* (runs of ``chunk_size`` consecutive road points) nearest
  to the cell centre, nearest first, ``M = road_per_cell`` points in all. An agent
  observes its cell's chunks, filtered by its own observation radius. Chunks, not single
  points, because a chunk is one contiguous run of point data per feature: gathering 20
  blocks of 10 points costs a tenth of gathering 200 scattered points, and gathers are
  what bound the step on a CPU. (Approximate k-nearest: selection is by distance to
  the cell centre, at chunk granularity.)
- ``edges``: every road-edge segment that can be the nearest edge segment of any point
  inside the cell: all segments within ``d0 + 2h`` of the centre, where ``d0`` is the
  centre's distance to the nearest edge and ``h`` the cell half-diagonal (for ``p`` in
  the cell, its nearest segment is within ``d0 + h`` of ``p``, hence ``d0 + 2h`` of the
  centre). The off-road test is therefore exact unless a cell has more than ``E`` such
  segments; those cells are counted in ``edge_overflow`` (then the nearest ``E`` are
  kept).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive import geometry
from jaxdrive.config import ConfigBase, ConfigError, check_int, check_range
from jaxdrive.types import Roadgraph, RoadType


class PointRow(enum.IntEnum):
    """Feature rows of ``RoadIndex.points`` and of ``road_block``'s output (world frame)."""

    X = 0
    Y = 1
    DIR_X = 2  # unit direction to the next point of the polyline
    DIR_Y = 3
    TYPE = 4  # ``RoadType`` as float; -1 marks padding


@dataclasses.dataclass(frozen=True)
class RoadIndexConfig(ConfigBase):
    """Grid size and per-cell list lengths.

    Attributes:
      grid_size: G, cells per side (the grid is square, fitted to the map's extent).
      road_per_cell: M, road points listed per cell (a multiple of ``chunk_size``), the
        most a road observation holds.
      chunk_size: S, consecutive road points per chunk.
      edges_per_cell: E, edge-segment candidates per cell for the off-road test.
      edge_merge_tolerance: metres; runs of road-edge segments are merged while every
        vertex stays within this of the merged line (off-road distances then differ
        from the original polyline's by at most twice this; 0 keeps every segment).
      margin: metres of grid beyond the outermost road point; a box corner outside the
        grid is off-road (when the map has road edges).
    """

    grid_size: int = 32
    road_per_cell: int = 200
    chunk_size: int = 10
    edges_per_cell: int = 32
    edge_merge_tolerance: float = 0.02
    margin: float = 10.0

    def __post_init__(self):
        check_int("grid_size", self.grid_size, 1, 1024)
        check_int("road_per_cell", self.road_per_cell, 1, 100_000)
        check_int("chunk_size", self.chunk_size, 1, 1024)
        if self.road_per_cell % self.chunk_size:
            raise ConfigError(
                f"config key 'road_per_cell' = {self.road_per_cell} must be a multiple of "
                f"'chunk_size' = {self.chunk_size}."
            )
        check_int("edges_per_cell", self.edges_per_cell, 1, 100_000)
        check_range("edge_merge_tolerance", self.edge_merge_tolerance, 0.0, 1.0)
        check_range("margin", self.margin, 0.0, None)


@struct.dataclass
class RoadIndex:
    """Grid lookup tables for one scenario (``C = G*G`` cells).

    Attributes:
      origin: (2,) float32, world position of the grid's lower-left corner.
      cell_size: () float32, metres.
      road: (C, K) int32, ids of the K = M / S chunks nearest each cell centre, nearest
        first; padded with the id of the trailing all-padding chunk.
      points: (5, R / S + 1, S) float32, road points per chunk, feature-major: rows
        ``PointRow`` (x, y, direction x, direction y, type); type -1 marks padding, and the last
        chunk is all padding. Feature-major so that a lookup yields contiguous rows
        per feature, which the observation's loops read with vector loads.
      edges: (C, 5, E) float32, candidate edge segments per cell as rows
        (start x, start y, unit direction x, unit direction y, length); length -1 marks
        padding. Stored by value, not by index: one contiguous row gather per query.
      has_edges: () bool, the map has at least one road-edge segment.
      edge_overflow: () int32, cells whose exact candidate set exceeded E.
    """

    origin: jax.Array
    cell_size: jax.Array
    road: jax.Array
    points: jax.Array
    edges: jax.Array
    has_edges: jax.Array
    edge_overflow: jax.Array

    @property
    def grid_size(self) -> int:
        """() int: G, grid cells per side."""
        return math.isqrt(self.road.shape[-2])

    @property
    def road_per_cell(self) -> int:
        """() int: M, road points listed per cell (chunks per cell x chunk size)."""
        return self.road.shape[-1] * self.points.shape[-1]


_CELL_BLOCK = 32  # grid cells per block of the edge-candidate search


def _cell_centres(origin: jax.Array, cell_size: jax.Array, g: int) -> jax.Array:
    ij = jnp.arange(g, dtype=jnp.float32) + 0.5
    cx, cy = jnp.meshgrid(ij, ij, indexing="ij")  # cell c = i * G + j, i along x
    return origin + cell_size * jnp.stack([cx.ravel(), cy.ravel()], axis=-1)


def edge_segment_mask(roadgraph: Roadgraph) -> jax.Array:
    """(R,) bool: point i starts a road-edge segment to point i+1."""
    return roadgraph.segment_mask() & (roadgraph.type == RoadType.ROAD_EDGE)


def merged_edge_segments(
    roadgraph: Roadgraph, tolerance: float
) -> tuple[jax.Array, jax.Array]:
    """Road-edge segments with runs of nearly collinear segments merged into one.

    Dense polylines (0.5-1 m spacing) would otherwise flood each grid cell's candidate
    list. A run starts at an anchor point ``a`` with direction ``u`` and continues while
    each next vertex lies within ``tolerance`` of the line through ``a`` along ``u``
    (and the polyline goes on in the same direction), so every original vertex is within
    ``2 * tolerance`` of its merged segment. ``tolerance = 0`` merges nothing.

    Returns:
      starts: (R,) bool, point i starts a merged edge segment.
      ends: (R, 2) float32, that segment's end point (meaningful where ``starts``).
    """
    xy = roadgraph.xy
    r = roadgraph.num_points
    seg_ok = edge_segment_mask(roadgraph)
    nxt = jnp.concatenate([xy[1:], xy[-1:]], axis=0)
    d = nxt - xy
    u = d / jnp.maximum(jnp.linalg.norm(d, axis=-1, keepdims=True), 1e-12)
    prev_ok = jnp.concatenate([jnp.zeros((1,), bool), seg_ok[:-1]])

    def body(carry, i):
        anchor, direction = carry
        off = nxt[i] - anchor
        lateral = jnp.abs(direction[0] * off[1] - direction[1] * off[0])
        cont = (prev_ok[i] & seg_ok[i] & (jnp.dot(direction, u[i]) > 0)
                & (lateral <= tolerance))
        anchor = jnp.where(cont, anchor, xy[i])
        direction = jnp.where(cont, direction, u[i])
        return (anchor, direction), cont

    _, continues = jax.lax.scan(body, (xy[0], u[0]), jnp.arange(r))
    # A run starting at j ends at the first point after j that does not continue it.
    stop = jnp.where(continues, r, jnp.arange(r))
    first_stop = jax.lax.cummin(stop, reverse=True)
    end_index = jnp.minimum(jnp.concatenate([first_stop[1:], jnp.array([r - 1])]), r - 1)
    return seg_ok & ~continues, xy[end_index]


def _grid_frame(
    xy: jax.Array, valid: jax.Array, g: int, margin: float, big: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Square G x G grid over the valid points (R, 2) plus ``margin``.

    Returns:
      origin: (2,) float32 lower-left corner; cell_size: () float32.
    """
    lo = jnp.min(jnp.where(valid[:, None], xy, big), axis=0)
    hi = jnp.max(jnp.where(valid[:, None], xy, -big), axis=0)
    any_valid = jnp.any(valid)
    lo = jnp.where(any_valid, lo, 0.0)
    hi = jnp.where(any_valid, hi, 0.0)
    extent = jnp.max(hi - lo) + 2.0 * margin
    cell_size = jnp.maximum(extent / g, 1e-3).astype(jnp.float32)
    origin = (0.5 * (lo + hi) - 0.5 * g * cell_size).astype(jnp.float32)
    return origin, cell_size


def _nearest_chunks(
    centres: jax.Array, xy: jax.Array, valid: jax.Array, size: int, k: int, big: jax.Array
) -> jax.Array:
    """(C, 2) centres, (R, 2) points -> (C, k) int32 ids of the chunks nearest each
    centre (a chunk's distance: its nearest valid point's); missing ones point at the
    trailing all-padding chunk, so lookups need no mask."""
    r = xy.shape[0]
    num_chunks = -(-r // size)
    pad = num_chunks * size - r
    d2 = (jnp.square(centres[:, 0:1] - xy[None, :, 0])
          + jnp.square(centres[:, 1:2] - xy[None, :, 1]))  # x/y split: vectorises on CPU
    d2 = jnp.where(valid[None, :], d2, big)
    d2 = jnp.pad(d2, ((0, 0), (0, pad)), constant_values=big)
    chunk_d2 = jnp.min(d2.reshape(d2.shape[0], num_chunks, size), axis=-1)
    neg, idx = jax.lax.top_k(-chunk_d2, k)
    return jnp.where(neg > -big, idx, num_chunks).astype(jnp.int32)


def _chunk_points(roadgraph: Roadgraph, size: int) -> jax.Array:
    """(R,) road points -> (len(PointRow), R / S + 1, S) float32 feature-major chunks in
    ``PointRow`` order (-1 padding, the last chunk all padding)."""
    xy, valid = roadgraph.xy, roadgraph.valid
    r = roadgraph.num_points
    num_chunks = -(-r // size)
    pad = num_chunks * size - r
    columns = {
        PointRow.X: xy[:, 0], PointRow.Y: xy[:, 1],
        PointRow.DIR_X: roadgraph.dir[:, 0], PointRow.DIR_Y: roadgraph.dir[:, 1],
        PointRow.TYPE: jnp.where(valid, roadgraph.type, -1).astype(jnp.float32),
    }
    packed = jnp.stack([columns[row] for row in PointRow], axis=-1)
    packed = jnp.pad(packed, ((0, pad + size), (0, 0)), constant_values=-1.0)
    points = packed.reshape(num_chunks + 1, size, len(PointRow)).transpose(2, 0, 1)
    return points.astype(jnp.float32)


class _Segments(NamedTuple):
    """Candidate segments a -> b as (R,) coordinate rows (x and y kept apart: (cells, R)
    loops over a trailing axis of size 2 do not vectorise on CPU)."""

    ax: jax.Array
    ay: jax.Array
    bx: jax.Array
    by: jax.Array
    abx: jax.Array
    aby: jax.Array
    safe_len2: jax.Array  # squared length, 1 for degenerate segments
    inv_len: jax.Array
    lox: jax.Array  # bounding box
    hix: jax.Array
    loy: jax.Array
    hiy: jax.Array


def _segments(xy: jax.Array, nxt: jax.Array) -> _Segments:
    """(R, 2) starts and (R, 2) ends -> ``_Segments``."""
    ax, ay, bx, by = xy[:, 0], xy[:, 1], nxt[:, 0], nxt[:, 1]
    abx, aby = bx - ax, by - ay
    len2 = abx * abx + aby * aby
    safe_len2 = jnp.where(len2 > 0, len2, 1.0)
    inv_len = 1.0 / jnp.sqrt(safe_len2)
    lox, hix = jnp.minimum(ax, bx), jnp.maximum(ax, bx)
    loy, hiy = jnp.minimum(ay, by), jnp.maximum(ay, by)
    return _Segments(ax, ay, bx, by, abx, aby, safe_len2, inv_len, lox, hix, loy, hiy)


def _to_square(cx, cy, qx, qy, half):
    """(c, 1) square centres of half-side ``half``, (R,) points -> (c, R) distances."""
    ex = jnp.maximum(jnp.abs(qx[None] - cx) - half, 0.0)
    ey = jnp.maximum(jnp.abs(qy[None] - cy) - half, 0.0)
    return jnp.sqrt(ex * ex + ey * ey)


def _corner_distances(cx, cy, half, s: _Segments):
    """Per segment, over the 4 corners of each (c, 1)-centred square: the max and min
    distance to the segment and the min and max side of its line (as
    ``geometry.segment_distance``). Each (c, R)."""
    max_dist = min_cross = max_cross = min_dist = None
    for sx, sy in ((-1.0, -1.0), (-1.0, 1.0), (1.0, -1.0), (1.0, 1.0)):
        px, py = cx + sx * half, cy + sy * half
        apx, apy = px - s.ax[None], py - s.ay[None]
        t = jnp.clip((apx * s.abx + apy * s.aby) / s.safe_len2, 0.0, 1.0)
        dx, dy = px - (s.ax + t * s.abx), py - (s.ay + t * s.aby)
        d = jnp.sqrt(dx * dx + dy * dy)
        cross = (s.abx * apy - s.aby * apx) * s.inv_len
        if max_dist is None:
            max_dist = min_dist = d
            min_cross = max_cross = cross
        else:
            max_dist, min_dist = jnp.maximum(max_dist, d), jnp.minimum(min_dist, d)
            min_cross = jnp.minimum(min_cross, cross)
            max_cross = jnp.maximum(max_cross, cross)
    return max_dist, min_dist, min_cross, max_cross


def _cell_block_candidates(block_centres, s: _Segments, seg_ok, half, e: int, big):
    """(c, 2) cell centres -> the nearest ``e`` candidate edge segments of each cell:
    (c, e) negated distances and (c, e) segment ids, and (c,) candidate counts."""
    cx, cy = block_centres[:, 0:1], block_centres[:, 1:2]  # (c, 1)
    # D, an upper bound on every cell point's nearest-edge distance: distance to a
    # segment is convex, so its maximum over the square is at a corner.
    max_dist, min_dist, min_cross, max_cross = _corner_distances(cx, cy, half, s)
    upper = jnp.min(jnp.where(seg_ok[None, :], max_dist, big), axis=1)
    # Exact segment-to-square distance: zero when the segment meets the square (its
    # bounding box overlaps and the corners straddle its line), else the nearest of
    # the ends' distances to the square and the corners' distances to the segment.
    boxes_meet = ((s.lox[None] <= cx + half) & (s.hix[None] >= cx - half)
                  & (s.loy[None] <= cy + half) & (s.hiy[None] >= cy - half))
    straddles = (min_cross <= 0) & (max_cross >= 0)
    outside = jnp.minimum(
        jnp.minimum(_to_square(cx, cy, s.ax, s.ay, half), _to_square(cx, cy, s.bx, s.by, half)),
        min_dist)
    dist = jnp.where(boxes_meet & straddles, 0.0, outside)
    # A segment can be some cell point's nearest only if it comes within D of the
    # cell. The 1e-3 m slack absorbs float rounding in the bound.
    cand = seg_ok[None, :] & (dist <= upper[:, None] + 1e-3)
    # Keep the nearest to the cell when a cell has more than E (counted as overflow).
    neg_e, idx_e = jax.lax.top_k(-jnp.where(cand, dist, big), e)
    return neg_e, idx_e, jnp.sum(cand, axis=1)


def _edge_rows(xy, nxt, neg_e, idx_e, big) -> jax.Array:
    """(C, e) candidates of each cell -> (C, 5, e) float32 segment rows (start x, start
    y, unit direction x, unit direction y, length; length -1 marks padding)."""
    seg = nxt - xy
    seg_len = jnp.sqrt(jnp.sum(seg * seg, axis=-1))
    unit = seg / jnp.where(seg_len > 0, seg_len, 1.0)[:, None]
    rows = jnp.stack([xy[:, 0], xy[:, 1], unit[:, 0], unit[:, 1], seg_len])  # (5, R)
    edges = rows[:, idx_e].transpose(1, 0, 2)  # (C, 5, E)
    return edges.at[:, 4].set(jnp.where(neg_e > -big, edges[:, 4], -1.0))


def build_road_index(roadgraph: Roadgraph, config: RoadIndexConfig) -> RoadIndex:
    """Build the grid for one scenario (pure; vmap or ``lax.map`` over a pool).

    Args:
      roadgraph: unbatched ``Roadgraph`` with R points.
      config: grid sizes.
    Returns:
      ``RoadIndex``.
    """
    g, e, size = config.grid_size, config.edges_per_cell, config.chunk_size
    r = roadgraph.num_points
    e = min(e, r)
    k = min(config.road_per_cell // size, -(-r // size))
    xy, valid = roadgraph.xy, roadgraph.valid
    big = jnp.float32(1e30)
    origin, cell_size = _grid_frame(xy, valid, g, config.margin, big)
    centres = _cell_centres(origin, cell_size, g)  # (C, 2)
    road = _nearest_chunks(centres, xy, valid, size, k, big)
    points = _chunk_points(roadgraph, size)

    # Edge segments that can be nearest to any point in the cell.
    seg_ok, nxt = merged_edge_segments(roadgraph, config.edge_merge_tolerance)
    half = 0.5 * cell_size
    segs = _segments(xy, nxt)
    # Blocks of cells keep the (cells, 4, R) temporaries cache-sized: one pass over all
    # cells at once is memory-bound and ~5x slower.
    block = math.gcd(g * g, _CELL_BLOCK)
    neg_e, idx_e, num_cand = jax.lax.map(
        lambda c: _cell_block_candidates(c, segs, seg_ok, half, e, big),
        centres.reshape(-1, block, 2))
    neg_e, idx_e = neg_e.reshape(g * g, e), idx_e.reshape(g * g, e)
    num_cand = num_cand.reshape(g * g)
    edges = _edge_rows(xy, nxt, neg_e, idx_e, big)
    overflow = jnp.sum(num_cand > e).astype(jnp.int32)
    return RoadIndex(
        origin=origin,
        cell_size=cell_size,
        road=road,
        points=points,
        edges=edges,
        has_edges=jnp.any(seg_ok),
        edge_overflow=overflow,
    )


def _at(array: jax.Array, scenario_id, *index):
    """``array[index]`` for one scenario, or ``array[scenario_id, index]`` for a pool."""
    return array[index] if scenario_id is None else array[(scenario_id, *index)]


def cell_of(
    index: RoadIndex, points: jax.Array, scenario_id: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Grid cell of each point.

    Args:
      index: a ``RoadIndex``; unbatched, or a pool's (leading axis N) with
        ``scenario_id`` () int32 choosing the scenario.
      points: (..., 2).
    Returns:
      cell: (...,) int32 flat cell id, clamped into the grid.
      inside: (...,) bool, the point lies within the grid.
    """
    g = index.grid_size
    origin = _at(index.origin, scenario_id)
    cell_size = _at(index.cell_size, scenario_id)
    ij = jnp.floor((points - origin) / cell_size).astype(jnp.int32)
    inside = jnp.all((ij >= 0) & (ij < g), axis=-1)
    ij = jnp.clip(ij, 0, g - 1)
    return ij[..., 0] * g + ij[..., 1], inside


def offroad_distance(
    index: RoadIndex, roadgraph: Roadgraph, points: jax.Array,
    scenario_id: jax.Array | None = None,
) -> jax.Array:
    """Signed distance of points to the road edges (> 0 off-road), via the grid.

    Points outside the grid get +inf when the map has road edges (nothing beyond the
    grid is road) and ``NO_EDGE_DISTANCE`` when it has none.

    Args:
      index, roadgraph: one scenario's, or a pool's with ``scenario_id`` (see ``cell_of``).
      points: (..., 2).
    Returns:
      (...,) float32.
    """
    del roadgraph  # segments are stored in the index by value
    cell, inside = cell_of(index, points, scenario_id)
    seg = _at(index.edges, scenario_id, cell)  # (..., 5, E)
    signed = geometry.signed_distance_to_segments(
        points, seg[..., 0, :], seg[..., 1, :], seg[..., 2, :], seg[..., 3, :], seg[..., 4, :]
    )
    has_edges = _at(index.has_edges, scenario_id)
    outside = jnp.where(has_edges, jnp.inf, geometry.NO_EDGE_DISTANCE)
    return jnp.where(inside, signed, outside).astype(jnp.float32)


def is_offroad(
    index: RoadIndex, roadgraph: Roadgraph, xy: jax.Array, yaw: jax.Array,
    length: jax.Array, width: jax.Array, scenario_id: jax.Array | None = None, trig=None,
) -> jax.Array:
    """(..., 2), (...,) x3 -> (...,) bool: any corner of the box is off-road.

    ``trig``: optional precomputed ``(cos(yaw), sin(yaw))``.
    """
    corners = geometry.box_corners(xy, yaw, length, width, trig)
    return jnp.any(offroad_distance(index, roadgraph, corners, scenario_id) > 0.0, axis=-1)


def road_block(
    index: RoadIndex, points: jax.Array, count: int, scenario_id: jax.Array | None = None
) -> jax.Array:
    """Road points listed for each query point's cell, feature-major per chunk.

    Args:
      index: see ``cell_of``.
      points: (..., 2).
      count: road points wanted; the first ``k = ceil(count / S)`` chunks are returned
        (at most the cell's list).
    Returns:
      (..., 5, k, S) float32 rows (``PointRow``: x, y, direction x, direction y, type)
      of the k chunks, world frame; type -1 marks padding.
    """
    size = index.points.shape[-1]
    k = min(-(-count // size), index.road.shape[-1])
    cell, _ = cell_of(index, points, scenario_id)
    chunks = _at(index.road, scenario_id, cell)[..., :k]  # (..., k)
    # One gather of (feature, chunk) rows straight into (..., 5, k, S): batch dims in
    # output order, so XLA emits it without a transpose.
    rows = len(PointRow)
    shape = chunks.shape[:-1] + (rows, k)
    idx = [jnp.broadcast_to(jnp.arange(rows, dtype=jnp.int32)[:, None], shape),
           jnp.broadcast_to(chunks[..., None, :], shape)]
    if scenario_id is not None:
        idx.insert(0, jnp.broadcast_to(jnp.asarray(scenario_id, jnp.int32), shape))
    n = len(idx)
    dims = jax.lax.GatherDimensionNumbers(
        offset_dims=(len(shape),), collapsed_slice_dims=tuple(range(n)),
        start_index_map=tuple(range(n)),
    )
    return jax.lax.gather(
        index.points, jnp.stack(idx, axis=-1), dims, (1,) * n + (size,),
        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )

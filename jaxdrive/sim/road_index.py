"""Per-scenario uniform grid over the road graph, built once, queried every step.

Each step needs, per agent, the nearest road points (observations) and the road-edge
segments that can be nearest to its box corners (off-road). Scanning all ``R`` road
points per agent per step is what makes other simulators slow on real maps (tens of
thousands of points). Instead, when a scenario enters the pool we lay a ``G x G`` grid
over its map and store, per cell:

- ``road``: the ``M`` road points nearest to the cell centre, nearest first. An agent
  observes its cell's list, filtered by its own observation radius. (Approximate
  k-nearest: a listed point is at most one cell half-diagonal "less near" than the true
  k-th nearest.)
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
import math

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.config import ConfigBase, check_int, check_range
from jaxdrive.sim import geometry
from jaxdrive.types import Roadgraph, RoadType


@dataclasses.dataclass(frozen=True)
class RoadIndexConfig(ConfigBase):
    """Grid size and per-cell list lengths.

    Attributes:
      grid_size: G, cells per side (the grid is square, fitted to the map's extent).
      road_per_cell: M, road points listed per cell, the most a road observation holds.
      edges_per_cell: E, edge-segment candidates per cell for the off-road test.
      margin: metres of grid beyond the outermost road point; a box corner outside the
        grid is off-road (when the map has road edges).
    """

    grid_size: int = 16
    road_per_cell: int = 200
    edges_per_cell: int = 32
    margin: float = 10.0

    def __post_init__(self):
        check_int("grid_size", self.grid_size, 1, 1024)
        check_int("road_per_cell", self.road_per_cell, 1, 100_000)
        check_int("edges_per_cell", self.edges_per_cell, 1, 100_000)
        check_range("margin", self.margin, 0.0, None)


@struct.dataclass
class RoadIndex:
    """Grid lookup tables for one scenario (``C = G*G`` cells).

    Attributes:
      origin: (2,) float32, world position of the grid's lower-left corner.
      cell_size: () float32, metres.
      road: (C, M) int32, road point indices nearest each cell centre, nearest first;
        -1 padded.
      edges: (C, E) int32, start-point indices of candidate edge segments; -1 padded.
      has_edges: () bool, the map has at least one road-edge segment.
      edge_overflow: () int32, cells whose exact candidate set exceeded E.
    """

    origin: jax.Array
    cell_size: jax.Array
    road: jax.Array
    edges: jax.Array
    has_edges: jax.Array
    edge_overflow: jax.Array

    @property
    def grid_size(self) -> int:
        return math.isqrt(self.road.shape[-2])


def _cell_centres(origin: jax.Array, cell_size: jax.Array, g: int) -> jax.Array:
    ij = jnp.arange(g, dtype=jnp.float32) + 0.5
    cx, cy = jnp.meshgrid(ij, ij, indexing="ij")  # cell c = i * G + j, i along x
    return origin + cell_size * jnp.stack([cx.ravel(), cy.ravel()], axis=-1)


def edge_segment_mask(roadgraph: Roadgraph) -> jax.Array:
    """(R,) bool: point i starts a road-edge segment to point i+1."""
    return roadgraph.segment_mask() & (roadgraph.type == RoadType.ROAD_EDGE)


def build_road_index(roadgraph: Roadgraph, config: RoadIndexConfig) -> RoadIndex:
    """Build the grid for one scenario (pure; vmap or ``lax.map`` over a pool).

    Args:
      roadgraph: unbatched ``Roadgraph`` with R points.
      config: grid sizes.
    Returns:
      ``RoadIndex``.
    """
    g, m, e = config.grid_size, config.road_per_cell, config.edges_per_cell
    r = roadgraph.num_points
    m, e = min(m, r), min(e, r)
    xy, valid = roadgraph.xy, roadgraph.valid
    big = jnp.float32(1e30)
    lo = jnp.min(jnp.where(valid[:, None], xy, big), axis=0)
    hi = jnp.max(jnp.where(valid[:, None], xy, -big), axis=0)
    any_valid = jnp.any(valid)
    lo = jnp.where(any_valid, lo, 0.0)
    hi = jnp.where(any_valid, hi, 0.0)
    extent = jnp.max(hi - lo) + 2.0 * config.margin
    cell_size = jnp.maximum(extent / g, 1e-3).astype(jnp.float32)
    origin = (0.5 * (lo + hi) - 0.5 * g * cell_size).astype(jnp.float32)
    centres = _cell_centres(origin, cell_size, g)  # (C, 2)

    # Road points nearest each centre.
    d2 = jnp.sum(jnp.square(centres[:, None, :] - xy[None, :, :]), axis=-1)
    d2 = jnp.where(valid[None, :], d2, big)
    neg, idx = jax.lax.top_k(-d2, m)
    road = jnp.where(neg > -big, idx, -1).astype(jnp.int32)

    # Edge segments that can be nearest to any point in the cell.
    seg_ok = edge_segment_mask(roadgraph)
    nxt = jnp.concatenate([xy[1:], xy[-1:]], axis=0)
    dist, _ = geometry.segment_distance(centres[:, None, :], xy[None, :, :], nxt[None, :, :])
    dist = jnp.where(seg_ok[None, :], dist, big)
    d0 = jnp.min(dist, axis=1, keepdims=True)
    half_diag = cell_size * jnp.float32(math.sqrt(0.5))
    # The 1e-3 m slack absorbs float rounding in the bound.
    cand = dist <= d0 + 2.0 * half_diag + 1e-3
    neg_e, idx_e = jax.lax.top_k(-jnp.where(cand, dist, big), e)
    edges = jnp.where(neg_e > -big, idx_e, -1).astype(jnp.int32)
    overflow = jnp.sum(jnp.sum(cand, axis=1) > e).astype(jnp.int32)
    return RoadIndex(
        origin=origin,
        cell_size=cell_size,
        road=road,
        edges=edges,
        has_edges=jnp.any(seg_ok),
        edge_overflow=overflow,
    )


def cell_of(index: RoadIndex, points: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Grid cell of each point.

    Args:
      index: unbatched ``RoadIndex``.
      points: (..., 2).
    Returns:
      cell: (...,) int32 flat cell id, clamped into the grid.
      inside: (...,) bool, the point lies within the grid.
    """
    g = index.grid_size
    ij = jnp.floor((points - index.origin) / index.cell_size).astype(jnp.int32)
    inside = jnp.all((ij >= 0) & (ij < g), axis=-1)
    ij = jnp.clip(ij, 0, g - 1)
    return ij[..., 0] * g + ij[..., 1], inside


def offroad_distance(
    index: RoadIndex, roadgraph: Roadgraph, points: jax.Array
) -> jax.Array:
    """Signed distance of points to the road edges (> 0 off-road), via the grid.

    Points outside the grid get +inf when the map has road edges (nothing beyond the
    grid is road) and ``NO_EDGE_DISTANCE`` when it has none.

    Args:
      index: unbatched ``RoadIndex``; roadgraph: the same scenario's ``Roadgraph``.
      points: (..., 2).
    Returns:
      (...,) float32.
    """
    cell, inside = cell_of(index, points)
    seg = index.edges[cell]  # (..., E)
    seg_valid = seg >= 0
    start = jnp.maximum(seg, 0)
    a = roadgraph.xy[start]
    b = roadgraph.xy[jnp.minimum(start + 1, roadgraph.num_points - 1)]
    signed = geometry.signed_distance_to_edges(points, a, b, seg_valid)
    outside = jnp.where(index.has_edges, jnp.inf, geometry.NO_EDGE_DISTANCE)
    return jnp.where(inside, signed, outside).astype(jnp.float32)


def is_offroad(
    index: RoadIndex, roadgraph: Roadgraph, xy: jax.Array, yaw: jax.Array,
    length: jax.Array, width: jax.Array,
) -> jax.Array:
    """(..., 2), (...,) x3 -> (...,) bool: any corner of the box is off-road."""
    corners = geometry.box_corners(xy, yaw, length, width)
    return jnp.any(offroad_distance(index, roadgraph, corners) > 0.0, axis=-1)

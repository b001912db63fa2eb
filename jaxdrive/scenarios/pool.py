"""Device-resident scenario pool: scenarios plus their road grids, gathered on reset."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from jaxdrive.config import ConfigError
from jaxdrive.scenarios import signals
from jaxdrive.scenarios.road_index import RoadIndex, RoadIndexConfig, build_road_index
from jaxdrive.types import Scenario


@struct.dataclass
class ScenarioPool:
    """N scenarios stacked on a leading axis, with their road grids.

    Attributes:
      scenarios: ``Scenario`` with leading axis N.
      road_index: ``RoadIndex`` with leading axis N.
      stop_dir: (N, TL, 2) float32, each traffic light's lane direction at its stop
        point (``jaxdrive.scenarios.signals.stop_directions``; zero without a lane).
    """

    scenarios: Scenario
    road_index: RoadIndex
    stop_dir: jax.Array

    @property
    def size(self) -> int:
        """() int: N, scenarios in the pool."""
        return self.scenarios.objects.xy.shape[0]


@functools.lru_cache(maxsize=16)
def _chunk_fn(config: RoadIndexConfig, batch_size: int):
    """Road grids and stop directions of one chunk of ``batch_size`` scenarios."""
    build = jax.vmap(functools.partial(build_road_index, config=config))
    stop_dir = jax.vmap(signals.stop_directions)
    return jax.jit(lambda rg, lights: (build(rg), stop_dir(lights, rg)))


@functools.partial(jax.jit, static_argnums=3)
def _take(roadgraph, lights, start, size: int):
    """Scenarios ``start .. start + size - 1`` of the stacked ones, the last one repeated
    past the end (padding of the last chunk)."""
    n = roadgraph.xy.shape[0]
    idx = jnp.minimum(start + jnp.arange(size, dtype=jnp.int32), n - 1)
    return jax.tree.map(lambda x: x[idx], (roadgraph, lights))


@functools.partial(jax.jit, static_argnums=1)
def _join(chunks, n: int):
    """The chunks' outputs concatenated along the scenario axis, padding dropped."""
    return jax.tree.map(lambda *xs: jnp.concatenate(xs)[:n], *chunks)


def make_pool(
    scenarios: Scenario, index_config: RoadIndexConfig | None = None, batch_size: int = 4
) -> ScenarioPool:
    """Build road grids for a batch of scenarios (leading axis N) and return the pool.

    The grids are built in chunks of ``batch_size`` scenarios so that the temporary
    (cells x road points) distance tables stay small for large maps. One compiled chunk
    program serves every N (the last chunk is padded); only the small programs that cut
    and join the chunks depend on N.
    """
    index_config = index_config or RoadIndexConfig()
    if scenarios.objects.xy.ndim != 4:
        raise ConfigError(
            "make_pool expects scenarios batched on a leading axis, e.g. objects.xy of shape "
            f"(N, A, T, 2); got {scenarios.objects.xy.shape}. Stack scenarios with "
            "jaxdrive.types.tree_stack or generate a batch."
        )
    n = scenarios.objects.xy.shape[0]
    b = max(1, batch_size)
    chunk = _chunk_fn(index_config, b)
    rg, lights = scenarios.roadgraph, scenarios.traffic_lights
    if n == 0:
        index, stop_dir = chunk(rg, lights)
    else:
        chunks = [chunk(*_take(rg, lights, jnp.int32(start), b)) for start in range(0, n, b)]
        index, stop_dir = _join(chunks, n)
    return ScenarioPool(scenarios=scenarios, road_index=index, stop_dir=stop_dir)

"""Device-resident scenario pool: scenarios plus their road grids, gathered on reset."""

from __future__ import annotations

import functools

import jax
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
def _build_fn(config: RoadIndexConfig, batch_size: int):
    build = functools.partial(build_road_index, config=config)
    return jax.jit(lambda rg: jax.lax.map(build, rg, batch_size=batch_size))


def make_pool(
    scenarios: Scenario, index_config: RoadIndexConfig | None = None, batch_size: int = 4
) -> ScenarioPool:
    """Build road grids for a batch of scenarios (leading axis N) and return the pool.

    The grids are built in chunks of ``batch_size`` scenarios so that the temporary
    (cells x road points) distance tables stay small for large maps.
    """
    index_config = index_config or RoadIndexConfig()
    if scenarios.objects.xy.ndim != 4:
        raise ConfigError(
            "make_pool expects scenarios batched on a leading axis, e.g. objects.xy of shape "
            f"(N, A, T, 2); got {scenarios.objects.xy.shape}. Stack scenarios with "
            "jaxdrive.types.tree_stack or generate a batch."
        )
    n = scenarios.objects.xy.shape[0]
    index = _build_fn(index_config, max(1, min(batch_size, n)))(scenarios.roadgraph)
    stop_dir = _stop_dir_fn()(scenarios.traffic_lights, scenarios.roadgraph)
    return ScenarioPool(scenarios=scenarios, road_index=index, stop_dir=stop_dir)


@functools.cache
def _stop_dir_fn():
    return jax.jit(jax.vmap(signals.stop_directions))

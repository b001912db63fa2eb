"""Real driving data: WOMD TFRecords and GPUDrive/PufferDrive JSON -> padded ``Scenario``.

Layers (host only, no JAX inside the readers):

- ``tfrecord``: TFRecord framing with masked CRC32C (reader and writer).
- ``womd_schema`` / ``womd``: the WOMD ``Scenario`` protobuf schema and its parser.
- ``json_scene``: the JSON scene reader.
- ``raw``: the neutral ``RawScene`` both readers produce.
- ``convert``: ``RawScene`` -> padded arrays + a report of everything left out.
- ``shards`` / ``load``: the ``.npz`` cache with ``manifest.json``; ``load_scenarios``.
- ``dataset``: seeded, host-split, prefetching stream of device batches.
- ``subsets``: behaviour-class subsets; ``checks``: sanity checks.
- ``augment``: ``mirror_scenario``, the scene reflected across its x axis.

CLI: ``python -m jaxdrive.data convert|inspect|subset`` (see ``docs/data.md``).
"""

from jaxdrive.data.augment import mirror_scenario
from jaxdrive.data.checks import check_scenarios, scenario_problems
from jaxdrive.data.convert import (
    ConvertConfig,
    arrays_to_scenario,
    convert_scene,
    real_data_config,
    scenario_to_arrays,
)
from jaxdrive.data.dataset import ScenarioDataset
from jaxdrive.data.json_scene import read_json_scene
from jaxdrive.data.load import convert_to_shards, load_scenarios
from jaxdrive.data.raw import RawScene, SceneError
from jaxdrive.data.tfrecord import TFRecordError, read_records, scan_records, write_records
from jaxdrive.data.womd import parse_scenario

__all__ = [
    "ConvertConfig", "RawScene", "SceneError", "ScenarioDataset", "TFRecordError",
    "arrays_to_scenario", "check_scenarios", "convert_scene", "convert_to_shards",
    "load_scenarios", "mirror_scenario", "parse_scenario", "read_json_scene", "read_records",
    "real_data_config", "scan_records", "scenario_problems", "scenario_to_arrays", "write_records",
]

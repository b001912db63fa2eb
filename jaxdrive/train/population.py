"""Train a population of partner policies with one command.

    python -m jaxdrive.train --config configs/adaptive_population_partner.yaml --population 4

A config whose ``population.size`` is N > 0 (``--population N`` sets it) trains N member
runs one after the other into one population directory, ``logging.output_dir/RUN_NAME``
when ``logging.run_name`` is set (a fixed path an ego config can name; it must not exist
yet), else ``logging.output_dir/pop-NAME-YYYYmmdd-HHMMSS``::

    POP_DIR/population.yaml   manifest: size, and per member its name, run_dir (relative)
                              and overrides; rewritten after each member finishes
    POP_DIR/population_config.yaml   the resolved config the members came from
    POP_DIR/member_0/ ...     ordinary run directories (config.yaml, checkpoints/, ...)

Member ``i`` trains ``jaxdrive.runs.config.member_config(config, i)``: the config with
its ``population.members[i]`` overrides and seeds offset by ``i``. ``train.co_players``
(and an evaluator's ``co_players``) accept the population directory: it stands for its
members, in manifest order (``jaxdrive.runs.config.expand_co_players``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from jaxdrive.config import ConfigError
from jaxdrive.files import OutputError, atomic_write_text
from jaxdrive.runs.config import POPULATION_MANIFEST, RunConfig, member_config
from jaxdrive.runs.load import save_config
from jaxdrive.train.run import new_run_dir, train


def write_manifest(pop_dir: Path, config: RunConfig, trained: int) -> None:
    """``pop_dir/population.yaml`` listing the first ``trained`` members (atomic)."""
    pop = config.population
    members = [{"name": f"member_{i}", "run_dir": f"member_{i}",
                "seed": member_config(config, i).train.seed, "overrides": pop.overrides(i)}
               for i in range(trained)]
    atomic_write_text(pop_dir / POPULATION_MANIFEST, yaml.safe_dump(
        {"size": pop.size, "members": members}, sort_keys=False))


def _population_dir(config: RunConfig, name: str) -> Path:
    if config.logging.run_name is None:
        return new_run_dir(config, f"pop-{name}")
    path = Path(config.logging.output_dir) / config.logging.run_name
    if path.exists():
        raise ConfigError(f"config key 'logging.run_name': the population directory {path} "
                          "exists already; remove it or set another logging.run_name.")
    try:
        path.mkdir(parents=True)
    except OSError as e:
        raise OutputError(f"cannot create the population directory {path}: "
                          f"{e.strerror or e}; set logging.output_dir to a writable "
                          "directory") from e
    return path


def train_population(config: RunConfig, name: str, quiet: bool = False,
                     pop_dir: Path | None = None) -> tuple[Path, list[dict]]:
    """Train every member of ``config.population`` (size > 0) in turn.

    Args:
      config: the population's run config.
      name: run-name prefix of a fresh population directory (``new_run_dir``).
      quiet: no console output from the member runs.
      pop_dir: an existing (empty) directory to use instead of a fresh one.
    Returns:
      ``(population directory, each member's last logged metrics)``.
    """
    if config.population.size < 1:
        raise ValueError("train_population needs population.size >= 1")
    if pop_dir is None:
        pop_dir = _population_dir(config, name)
    save_config(config, pop_dir / "population_config.yaml")
    write_manifest(pop_dir, config, 0)
    results = []
    for i in range(config.population.size):
        run_dir = pop_dir / f"member_{i}"
        run_dir.mkdir(exist_ok=False)
        if not quiet:
            print(f"population member {i + 1}/{config.population.size}: {run_dir} "
                  f"(overrides {config.population.overrides(i) or 'none'})", flush=True)
        results.append(train(member_config(config, i), run_dir, quiet=quiet))
        write_manifest(pop_dir, config, i + 1)
    return pop_dir, results

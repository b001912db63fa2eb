"""A run directory read back: its resolved config and its policy (``load_policy``).

Saved configs are read through ``read_run_config`` (training's ``--resume`` and
``load_policy`` alike), which upgrades configs of older runs: the flat dynamics layout,
and no ``env.observation.num_lights`` key meaning no light tokens (``num_lights = 0``).

Sits below both ``train`` (which writes run directories) and ``eval`` (which reads
them), so that evaluation never imports the trainer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jaxdrive.config import ConfigError, merge, read_yaml_file
from jaxdrive.env import Env
from jaxdrive.files import atomic_write_text
from jaxdrive.models.policy import Policy
from jaxdrive.runs.checkpoint import Checkpointer, CheckpointError, find_checkpoints
from jaxdrive.runs.config import RunConfig
from jaxdrive.sim.dynamics import migrate_flat_layout

_log = logging.getLogger(__name__)


def save_config(config: RunConfig, path: Path) -> None:
    """Write ``config`` (every key, defaults included) to ``path`` as YAML, atomically (a
    reader sees the old file or the new one)."""
    atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def read_run_config(run_dir: str | Path, overrides: dict | None = None) -> RunConfig:
    """The resolved ``config.yaml`` of a run directory (with ``overrides`` on top)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: '{run_dir}' is not a jaxdrive run "
                                "directory (it should hold config.yaml and checkpoints/).")
    data = read_yaml_file(str(path))  # ConfigError naming the file if damaged
    dynamics = (data.get("env") or {}).get("dynamics")
    if isinstance(dynamics, dict):  # runs saved before the per-model dynamics sections
        data["env"]["dynamics"] = migrate_flat_layout(dynamics)
    data = without_lights_if_absent(data)
    return RunConfig.from_dict(merge(data, overrides or {}))


def without_lights_if_absent(data: dict) -> dict:
    """A saved run config ``data`` with ``env.observation.num_lights = 0`` where the key is
    absent: runs saved before traffic-light observations have no light tokens, and their
    checkpoints no light parameters (the default, 4, would not match them)."""
    if "env.observation.num_lights" in _paths(data):  # nested or as a dotted path
        return data
    env = data.get("env")
    env = dict(env) if isinstance(env, dict) else {}
    obs = env.get("observation")
    obs = dict(obs) if isinstance(obs, dict) else {}
    return {**data, "env": {**env, "observation": {**obs, "num_lights": 0}}}


def _paths(data, prefix: str = "") -> set[str]:
    """Every key of a nested mapping as a dotted path (dotted keys as written)."""
    out = set()
    for k, v in (data.items() if isinstance(data, dict) else ()):
        path = f"{prefix}{k}"
        out.add(path)
        out |= _paths(v, path + ".")
    return out


@dataclass
class LoadedPolicy:
    """A trained policy rebuilt from a run directory."""

    policy: Policy
    params: object
    config: RunConfig
    step: int
    run_dir: Path


def load_policy(run_dir: str | Path, which: str = "best") -> LoadedPolicy:
    """Rebuild the policy of a run from its saved config and a checkpoint.

    Args:
      run_dir: a run directory (or its ``checkpoints/``).
      which: ``best`` (by validation goal rate; falls back to ``last`` when the run has
        no intact best checkpoint) or ``last``. The newest intact checkpoint is used;
        damaged or unfinished ones are skipped with a warning.

    Raises:
      FileNotFoundError: not a run directory, or no checkpoint.
      CheckpointError: no intact checkpoint (the message lists each and why).
    """
    ckpt_dir = find_checkpoints(run_dir)
    config = read_run_config(ckpt_dir.parent)
    policy = Policy.for_env(config.policy, Env(config.env))
    ckpt = Checkpointer(ckpt_dir)
    try:
        if which == "best":
            try:
                raw, meta = ckpt.restore_raw(which="best")
            except FileNotFoundError as e:  # CheckpointError included
                if isinstance(e, CheckpointError):
                    _log.warning("%s; loading the newest intact checkpoint of last/ instead", e)
                raw, meta = ckpt.restore_raw(which="last")
        else:
            raw, meta = ckpt.restore_raw(which=which)
    finally:
        ckpt.close()
    return LoadedPolicy(policy=policy, params=jax.tree.map(uncommitted, raw["params"]),
                        config=config, step=int(meta.get("step", 0)),
                        run_dir=ckpt_dir.parent)


def uncommitted(x):
    """A restored array (committed to this process's first device) as a fresh, uncommitted
    one with the same values, like the arrays a run computes: the programs that take it
    (a resumed step, a recording, an evaluation, a run started from it) then compile to the
    same program as for those, and hit XLA's persistent cache. PRNG keys stay keys;
    anything else passes through."""
    if not isinstance(x, jax.Array):
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(uncommitted(jax.random.key_data(x)),
                                        impl=jax.random.key_impl(x))
    return jnp.asarray(np.asarray(x))


def matching_params(fresh, loaded, key: str):
    """``loaded`` parameters as arrays of ``fresh``'s structure and dtypes; ``ConfigError``
    naming ``key`` and the first leaf whose path or shape differs."""
    f_leaves, treedef = jax.tree_util.tree_flatten_with_path(fresh)
    l_leaves, _ = jax.tree_util.tree_flatten_with_path(loaded)
    f_paths = [jax.tree_util.keystr(p, simple=True, separator="/") for p, _ in f_leaves]
    l_map = {jax.tree_util.keystr(p, simple=True, separator="/"): v for p, v in l_leaves}
    hint = ("the policy section and the observation sizes (env.observation, "
            "env.scenario.max_agents for the transformer's memory) must match that run's")
    for path, (_, ref) in zip(f_paths, f_leaves, strict=True):
        if path not in l_map:
            raise ConfigError(f"config key '{key}': that run's policy has no parameter "
                              f"'{path}'; {hint}.")
        if tuple(np.shape(l_map[path])) != tuple(ref.shape):
            raise ConfigError(f"config key '{key}': parameter '{path}' has shape "
                              f"{tuple(np.shape(l_map[path]))} there and {tuple(ref.shape)} "
                              f"here; {hint}.")
    extra = sorted(set(l_map) - set(f_paths))
    if extra:
        raise ConfigError(f"config key '{key}': that run's policy has parameter "
                          f"'{extra[0]}', which this one lacks; {hint}.")
    return treedef.unflatten([jnp.asarray(l_map[p], ref.dtype)
                              for p, (_, ref) in zip(f_paths, f_leaves, strict=True)])

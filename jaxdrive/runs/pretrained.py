"""Pretrained policies shipped with the package: ``jaxdrive.pretrained("quickstart")``.

Each lives in ``jaxdrive/runs/pretrained/NAME/`` as three small files: ``config.yaml``
(the run's resolved config), ``params.npz`` (the policy parameters, one array per
``/``-joined parameter path) and ``manifest.json`` (where they came from, the held-out
results, and each file's SHA-256, checked on every load). Plain NumPy and YAML, so a
newer orbax or flax reads them as well as the one that wrote them.

    python -m jaxdrive.runs.pretrained RUN_DIR NAME [--which last|best] [--results JSON]

exports a run's checkpoint as one (``--results``: a JSON object of held-out metrics to
record in the manifest, e.g. the run's last validation).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from jaxdrive.config import ConfigError, check_name, local_path_arg
from jaxdrive.env import Env
from jaxdrive.files import atomic_write_bytes, atomic_write_text
from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import LoadedPolicy, load_policy

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
FILES = ("config.yaml", "params.npz")


def available() -> list[str]:
    """Names of the shipped pretrained policies."""
    if not PRETRAINED_DIR.is_dir():
        return []
    return sorted(p.name for p in PRETRAINED_DIR.iterdir() if (p / "manifest.json").is_file())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(name: str) -> dict:
    """The manifest of pretrained policy ``name`` (source, step, results, checksums)."""
    if not isinstance(name, str) or name not in available():  # never a path
        raise ConfigError(f"no pretrained policy named {name!r}; available: "
                          f"{', '.join(available()) or 'none'}.")
    return json.loads((PRETRAINED_DIR / name / "manifest.json").read_text(encoding="utf-8"))


def pretrained(name: str = "quickstart") -> LoadedPolicy:
    """The shipped policy ``name`` as a ``LoadedPolicy`` (``.policy``, ``.params``,
    ``.config``, ``.step``), ready for ``jaxdrive.eval.run`` or a renderer.

    Raises:
      ConfigError: no such policy (the message lists the available ones).
      ValueError: a file's checksum differs from its manifest (a damaged install).
    """
    meta = manifest(name)
    folder = PRETRAINED_DIR / name
    data = {}
    for fname in FILES:
        raw = (folder / fname).read_bytes()
        if _sha256(raw) != meta["sha256"][fname]:
            raise ValueError(f"{folder / fname} does not match its SHA-256 in "
                             f"{folder / 'manifest.json'}: the install is damaged; "
                             "reinstall jaxdrive.")
        data[fname] = raw
    config = RunConfig.from_dict(yaml.safe_load(data["config.yaml"].decode("utf-8")))
    policy = Policy.for_env(config.policy, Env(config.env))
    with np.load(io.BytesIO(data["params.npz"])) as z:
        params = _nested({k: jnp.asarray(z[k]) for k in z.files})
    return LoadedPolicy(policy=policy, params=params, config=config,
                        step=int(meta["step"]), run_dir=folder)


def _flat(tree) -> dict[str, np.ndarray]:
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [getattr(k, "key", None) for k in path]
        if not all(isinstance(k, str) and "/" not in k for k in keys):
            raise ValueError(f"parameter path {path} is not a chain of dict keys")
        out["/".join(keys)] = np.asarray(leaf)
    return out


def _nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def export(run_dir: str | Path, name: str, which: str = "last", results: dict | None = None,
           root: Path = PRETRAINED_DIR) -> Path:
    """Write ``run_dir``'s ``which`` checkpoint as pretrained policy ``name`` under
    ``root``; returns its folder."""
    check_name("name", name)  # one directory under root, never outside it
    loaded = load_policy(run_dir, which=which)
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, **_flat(loaded.params))
    files = {"config.yaml": yaml.safe_dump(loaded.config.to_dict(), sort_keys=False)
             .encode("utf-8"), "params.npz": buf.getvalue()}
    for fname, raw in files.items():
        atomic_write_bytes(folder / fname, raw)
    meta = {"name": name, "source": Path(run_dir).name, "checkpoint": which,
            "step": loaded.step, "policy": loaded.config.policy.kind,
            "params": int(sum(np.size(x) for x in jax.tree.leaves(loaded.params))),
            "results": results or {},
            "sha256": {f: _sha256(raw) for f, raw in files.items()}}
    atomic_write_text(folder / "manifest.json", json.dumps(meta, indent=1) + "\n")
    return folder


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.runs.pretrained",
                                description="Export a run's checkpoint as a pretrained "
                                            "policy shipped with the package.")
    p.add_argument("run_dir", type=local_path_arg)
    p.add_argument("name", help="one directory name under jaxdrive/runs/pretrained/")
    p.add_argument("--which", choices=("last", "best"), default="last")
    p.add_argument("--results", help="a JSON object of held-out metrics for the manifest")
    a = p.parse_args(argv)
    try:
        results = json.loads(a.results) if a.results else None
        if results is not None and not isinstance(results, dict):
            raise ValueError(f"--results must be a JSON object, got {a.results!r}")
        folder = export(a.run_dir, a.name, a.which, results)
    except (ConfigError, OSError, ValueError) as e:  # JSONDecodeError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.runs.pretrained``; returns the exit code."""
    from jaxdrive.command import run_command

    return run_command(_main, "runs.pretrained", argv)


if __name__ == "__main__":
    raise SystemExit(main())

"""Evaluate a checkpoint on a suite and write the results JSON.

    python -m jaxdrive.eval --config configs/eval/default.yaml --checkpoint RUN_DIR
                            [--suite NAME] [--out FILE] [--which best|last]
    python -m jaxdrive.eval --config eval/default --checkpoint RUN_DIR ...
    python -m jaxdrive.eval ... --shard-id I --num-shards N     (one shard of the run)
    python -m jaxdrive.eval merge SHARD_FILES... --out FILE     (the serial run's results)

``--config``: a file with ``eval:`` sections (and ``suites:``), or a preset name
(``eval/default``: the package's copy of configs/eval/default.yaml); ``--suite``: a
suite or evaluator name (default: every enabled evaluator). ``--set SECTION.KEY=VALUE``
(repeatable) sets one key of one section of that file, as if written there (``KEY`` may
be dotted: ``--set realism.env.scenario.max_agents=128``, ``--set
realism.scenarios=[shards/]``). Videos and ``results.json`` go to a new timestamped
directory under ``--output-root`` (default ``eval_runs``); ``--out`` writes the results
JSON there instead (the timestamped directory is then made only for videos). Every
output path is checked before any evaluator runs. Exit code 0 when every evaluator
succeeded, 1 when some failed (their records hold the errors) or when the results could
not be written to their path (then they are saved next to it or in the system temp
directory, and the message says where), 2 on bad input or an unwritable output path.

Sharded evaluation (``jaxdrive.eval.shards``): ``--shard-id I --num-shards N`` plays only
the batches ``I, I + N, ...`` of every evaluator and writes a shard results file
(default ``results-shard-I-of-N.json`` in the output directory); ``merge`` checks that the
files are the N shards of one evaluation (same config, parameters, step) and writes the
results file the serial run writes. ``merge`` exits 2 when the files do not merge (the
message names them).

Multi-process evaluation (``jaxdrive.distributed``): started once per process with
``--coordinator-address HOST:PORT --num-processes P --process-id I`` (or the
``JAXDRIVE_COORDINATOR_ADDRESS`` / ``JAXDRIVE_NUM_PROCESSES`` / ``JAXDRIVE_PROCESS_ID``
environment variables, or under SLURM / a multi-host TPU slice), the processes join one
JAX job before any device is used and every evaluator splits each batch over every
device of every process (``jaxdrive.eval.evaluator``). Every process holds the whole
results; process 0 alone writes the results file and the videos, the others write
nothing (they print their evaluators' lines). ``--num-processes 1`` alone means one
process whatever the environment says (the training-time manager starts its children
so). Combined with ``--shard-id`` each shard is such a job. Exit code 2 also when the
job cannot be joined.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import yaml

from jaxdrive.command import add_debug_flag
from jaxdrive.config import (
    ConfigError,
    list_presets,
    load_yaml,
    local_path_arg,
    resolve_config_path,
    yaml_load,
)
from jaxdrive.distributed import (
    DistributedError,
    ProcessGroup,
    detect,
    initialize,
    watch_peers,
)
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.merge import merge_files
from jaxdrive.eval.runner import (
    SuiteResult,
    check_output_names,
    run_evaluators,
    timestamped_dir,
)
from jaxdrive.eval.shards import Shard, ShardError
from jaxdrive.eval.suite import select_suite
from jaxdrive.files import OutputError, check_writable, check_writable_file, write_or_fallback
from jaxdrive.runs.load import LoadedPolicy, load_policy

# What bad input raises while the checkpoint, the suite and the output paths are read.
INPUT_ERRORS = (ConfigError, OSError, ValueError, yaml.YAMLError)


def default_config(config: str | None, suite: str | None) -> str:
    """The eval config to read: ``config`` if given, else the preset ``eval/SUITE`` when
    ``suite`` names one (``--suite realism`` reads ``configs/eval/realism.yaml``), else
    ``eval/default``."""
    if config is not None:
        return config
    if suite is not None and f"eval/{suite}" in list_presets():
        return f"eval/{suite}"
    return "eval/default"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    p.add_argument("--config", default=None,
                   help="eval config YAML (eval: sections): a file or a preset name "
                        "(default: the preset eval/SUITE when --suite names one, e.g. "
                        "--suite realism, else eval/default)")
    p.add_argument("--checkpoint", type=local_path_arg, required=True, metavar="RUN_DIR",
                   help="training run directory")
    p.add_argument("--suite", default=None, help="suite or evaluator name")
    p.add_argument("--out", type=local_path_arg, default=None, metavar="FILE",
                   help="results JSON path")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="set one key of one eval section (repeatable; VALUE is YAML), e.g. "
                        "realism.scenarios=[/data/womd_shards]")
    p.add_argument("--which", default="best", choices=("best", "last"))
    p.add_argument("--output-root", type=local_path_arg, default="eval_runs")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--shard-id", type=int, default=None, metavar="I",
                   help="evaluate only shard I (0 <= I < N) of --num-shards N")
    p.add_argument("--num-shards", type=int, default=None, metavar="N",
                   help="number of shards the evaluation is split into")
    p.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                   help="multi-process job: process 0's coordination service")
    p.add_argument("--num-processes", type=int, default=None, metavar="P",
                   help="multi-process job: number of processes (1 alone: a single "
                        "process, whatever the environment says)")
    p.add_argument("--process-id", type=int, default=None, metavar="I",
                   help="multi-process job: this process's index (0 <= I < P)")
    return p


def _merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.eval merge",
                                description="Merge shard results files (--shard-id / "
                                            "--num-shards) into the serial run's results.")
    add_debug_flag(p)
    p.add_argument("files", nargs="+", metavar="FILE", help="shard results files")
    p.add_argument("--out", type=local_path_arg, required=True, metavar="FILE",
                   help="merged results JSON path")
    return p


def apply_section_overrides(data: dict, pairs: list[str]) -> dict:
    """``data`` (an eval config file's mapping) with each ``SECTION.KEY=VALUE`` of
    ``pairs`` written into ``data["eval"][SECTION]`` under the key ``KEY`` (kept dotted, as
    a file writes ``env.x: y``); the value is parsed as YAML. The input is not modified.

    Raises:
      ConfigError: naming the override, for a malformed pair, an unknown section (the
        message lists the file's sections) or a value that is not valid YAML.
    """
    raw = data.get("eval") or {}
    if not isinstance(raw, dict):
        raise ConfigError("config key 'eval' must be a mapping of evaluator sections, got "
                          f"{type(raw).__name__}.")
    sections = dict(raw)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name or ".." in name:
            raise ConfigError(f"--set {pair!r} must look like SECTION.KEY=VALUE, e.g. "
                              "realism.num_rollouts=32.")
        if section not in sections or not isinstance(sections[section], dict):
            raise ConfigError(f"--set {pair!r}: the eval config has no section "
                              f"'{section}'; its sections: {', '.join(sorted(sections))}.")
        try:
            value = yaml_load(raw)
        except (yaml.YAMLError, RecursionError) as e:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML ({e}).") from None
        sections[section] = {**sections[section], name: value}
    return {**data, "eval": sections}


def _shard(args) -> Shard | None:
    """The ``Shard`` the flags select, or None. Raises ShardError."""
    if args.shard_id is None and args.num_shards is None:
        return None
    if args.shard_id is None or args.num_shards is None:
        raise ShardError("--shard-id and --num-shards go together; give both.")
    return Shard(args.shard_id, args.num_shards)


def _process_group(args) -> ProcessGroup | None:
    """The job this process joins (``jaxdrive.distributed.detect``), None for one process.
    Raises DistributedError."""
    if (args.num_processes == 1 and args.coordinator_address is None
            and args.process_id is None):
        return None
    return detect(args.coordinator_address, args.num_processes, args.process_id)


def _load(run_dir: str, which: str) -> LoadedPolicy:
    """``load_policy``: every process restores the parameters onto its own first device
    (``Checkpointer.restore_raw`` does so whatever mesh saved them)."""
    return load_policy(run_dir, which=which)


def _checked(flag: str, path, check) -> Path:
    """``check(path)``, its OutputError prefixed with the flag and the path as given."""
    try:
        return check(path)
    except OutputError as e:
        raise OutputError(f"{flag} {path}: {e}") from None


def _outputs(args, evaluators, shard: Shard | None = None) -> tuple[Path, Path | None]:
    """(results file, output directory or None), checked before any evaluator runs.

    The timestamped directory is made only when something goes there: the results
    (no ``--out``) or videos. Raises OutputError / UnsafeNameError naming the path.
    """
    renders = any(ev.spec.render.enabled for ev in evaluators)
    out_file = _checked("--out", args.out, check_writable_file) if args.out else None
    if out_file is not None and not renders:
        return out_file, None
    root = Path(args.output_root).expanduser()
    check_output_names(evaluators, root / "eval")
    _checked("--output-root", root, check_writable)
    out_dir = timestamped_dir(root)
    name = ("results.json" if shard is None
            else f"results-shard-{shard.id}-of-{shard.num}.json")
    return out_file or out_dir / name, out_dir


def _report(result: SuiteResult, path: Path | None) -> int:
    """Write the results (atomically, or to a fallback with an error line), print one
    line per evaluator and the paths; returns the exit code. ``path`` None: write
    nothing (a process other than 0 of a multi-process job)."""
    written, problem = None, None
    if path is not None:
        try:
            written, problem = write_or_fallback(path, result.to_json())
        except OutputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for r in result.results:
        if r.status == "ok" and r.shard is not None:
            print(f"{r.name}: shard of {len(r.episodes)} episodes, "
                  f"{len(r.shard['indices'])} of {r.shard['num_batches']} batches "
                  f"({r.eval_seconds:.1f} s)")
        elif r.status == "ok":
            shown = ", ".join(f"{k} {v:.3f}" for k, v in list(r.metrics.items())[:4])
            print(f"{r.name}: {shown} ({r.eval_seconds:.1f} s)")
        else:
            print(f"{r.name}: FAILED: {r.error.splitlines()[0]}")
    for v in result.videos:
        print(v)
    if written is None:
        print(f"results: written by process 0 (this is process {jax.process_index()} of "
              f"{jax.process_count()})")
    else:
        print(f"results: {written}")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0 if result.status == "ok" else 1


def merge_main(argv: list[str]) -> int:
    """``python -m jaxdrive.eval merge FILES... --out FILE``; returns the exit code: 0, 1
    when a merged evaluator failed in a shard or the file went to a fallback, 2 when the
    files do not merge or ``--out`` cannot be written."""
    args = _merge_parser().parse_args(argv)
    try:
        path = _checked("--out", args.out, check_writable_file)
        result = merge_files(args.files)
    except (ShardError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _report(result, path)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.eval``; returns the exit code (see the module
    doc)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        shard = _shard(args)
        # Joins a multi-process job first thing, before anything touches a device.
        initialize(_process_group(args))
        watch_peers()
    except (ShardError, DistributedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    main_process = jax.process_index() == 0
    try:
        loaded = _load(args.checkpoint, args.which)
        data = load_yaml(resolve_config_path(default_config(args.config, args.suite)))
        data = apply_section_overrides(data, args.set)
        specs = select_suite(data, args.suite, loaded.config.env, loaded.config.procedural)
        evaluators = make_evaluators(specs)
        if main_process:
            path, out_dir = _outputs(args, evaluators, shard)
        else:  # the others write nothing, but refuse what process 0 refuses
            check_output_names(evaluators, Path(args.output_root).expanduser() / "eval")
            path, out_dir = None, None
    except INPUT_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = run_evaluators(evaluators, loaded.policy, loaded.params, out_dir=out_dir,
                            step=loaded.step, progress=main_process and not args.no_progress,
                            checkpoint=str(loaded.run_dir), shard=shard)
    return _report(result, path)

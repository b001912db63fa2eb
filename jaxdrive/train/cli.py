"""Train a policy with PPO.

    python -m jaxdrive.train --config configs/quickstart.yaml [--set key=value ...]
    python -m jaxdrive.train --config quickstart [--set key=value ...]
    python -m jaxdrive.train [--config FILE] --resume RUN_DIR [--set train.total_steps=N]
    python -m jaxdrive.train --config FILE --population N [--set key=value ...]

``--config`` is a file or a preset name (quickstart, selfplay_gpu, adaptive, ...: the
files of the repository's configs/, shipped with the package).

Prints the run directory; it holds config.yaml (resolved), metrics.jsonl and
checkpoints/. ``--set train.total_steps=N`` shortens (or, with --resume, extends) a run.
A resumed run uses the run directory's saved config.yaml (plus ``--set``, which is
written to config.yaml; the previous one is kept as config.prev.yaml) and the newest
intact checkpoint (damaged ones are named and skipped). A run directory is locked while a
run trains in it; ``--force-unlock`` takes over a lock whose holder is surely gone.
Ctrl-C or SIGTERM finishes the iteration, saves and exits; continue with ``--resume``.

``--population N`` (or ``population.size: N`` in the config) trains N partner runs one
after the other into one population directory (``pop-NAME-...``) with a manifest,
``population.yaml``; each member gets its ``population.members[i]`` overrides and seeds
offset by i (``jaxdrive.train.population``). Prints the population directory, which
``train.co_players`` and an evaluator's ``co_players`` accept.
Config sections: env, procedural, policy, train, validation, checkpoint, logging (see
``jaxdrive.runs.config``).

Multi-process jobs (a multi-GPU node with one process per GPU, SLURM, a TPU pod): every
process runs the same command. JAX joins them when the cluster runtime says so (SLURM,
Cloud TPU), or from ``--coordinator-address HOST:PORT --num-processes N --process-id I``
(or the ``JAXDRIVE_COORDINATOR_ADDRESS`` / ``JAXDRIVE_NUM_PROCESSES`` /
``JAXDRIVE_PROCESS_ID`` environment variables). Process 0 creates the run directory
(``logging.output_dir`` must be storage every process sees) and writes the metrics;
every process saves and restores its part of the checkpoints. See docs/scale.md.

Exit codes: 0 done (or stopped by Ctrl-C / SIGTERM after saving); 1 the run failed
(disk full, training diverged), its checkpoints saved before are intact; 2 bad input
(config, run directory, lock held, no intact checkpoint, too large for memory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

from jaxdrive.command import Stopped, add_debug_flag
from jaxdrive.config import ConfigError, int_arg, local_path_arg, parse_overrides
from jaxdrive.distributed import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_TIMEOUT_S,
    EXIT_PEER_LOST,
    DistributedError,
    await_peer_verdict,
    broadcast_text,
    detect,
    initialize,
    is_main_process,
    watch_peers,
)
from jaxdrive.files import OutputError, UnsafeNameError
from jaxdrive.runs.config import RunConfig, flat_items, load_run_config, member_config
from jaxdrive.runs.load import read_run_config
from jaxdrive.runs.lock import RunLockedError
from jaxdrive.train.population import train_population
from jaxdrive.train.run import (
    START_FILES,
    StoppedAtStartup,
    TrainingDiverged,
    has_saved_step,
    new_run_dir,
    remove_unused_run_dir,
    summary_lines,
    train,
)

INPUT_ERRORS = (ConfigError, FileNotFoundError, RunLockedError, UnsafeNameError,
                DistributedError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_flag(p)
    p.add_argument("--config", default=None,
                   help="YAML run config (may inherits: others): a file or a preset name "
                        "(quickstart, selfplay_gpu, ...)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.total_steps=2000000")
    p.add_argument("--resume", type=local_path_arg, default=None, metavar="RUN_DIR",
                   help="continue a run from its newest intact checkpoint (uses its "
                        "config.yaml)")
    p.add_argument("--run-dir", type=local_path_arg, default=None, metavar="DIR",
                   help="with --config: train in DIR, resuming the run there if DIR holds "
                        "one (a checkpoint) and starting it otherwise, so that a requeued "
                        "job can rerun the same command")
    p.add_argument("--population", type=int, default=None, metavar="N",
                   help="train N partner runs into one population directory (sets "
                        "population.size; per-member overrides: population.members)")
    p.add_argument("--force-unlock", action="store_true",
                   help="with --resume: take over the run directory's lock even if another "
                        "process holds it (only when that process is surely gone)")
    g = p.add_argument_group("multi-process jobs (every process runs the same command)")
    g.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                   help="process 0's address and a free port (default: from the cluster "
                        "runtime or JAXDRIVE_COORDINATOR_ADDRESS)")
    g.add_argument("--num-processes", type=int, default=None, metavar="N",
                   help="processes in the job")
    g.add_argument("--process-id", type=int, default=None, metavar="I",
                   help="this process, 0..N-1 (process 0 writes the run's files)")
    g.add_argument("--distributed-timeout", type=int_arg(1, 86_400),
                   default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="seconds to wait for the coordinator and every process to join "
                        f"(default {DEFAULT_TIMEOUT_S})")
    g.add_argument("--heartbeat-timeout", type=int_arg(1, 86_400),
                   default=DEFAULT_HEARTBEAT_S, metavar="S",
                   help="seconds a process (or the coordinator) may stay silent before "
                        f"every other process stops with exit code {EXIT_PEER_LOST} "
                        f"(default {DEFAULT_HEARTBEAT_S})")
    return p


def _inspect_run_dir(run_dir: Path) -> str:
    """What ``--run-dir`` holds: ``"resume"`` (a saved step), ``"fresh"`` (nothing, or
    only what a start that saved nothing left), else why it can be neither."""
    if has_saved_step(run_dir):
        return "resume"
    if run_dir.exists() and not run_dir.is_dir():
        return f"--run-dir {run_dir} is a file, not a directory"
    other = sorted(p.name for p in run_dir.iterdir() if p.name not in START_FILES) \
        if run_dir.is_dir() else []
    if other:
        return (f"--run-dir {run_dir} holds no checkpoint to resume but other files "
                f"({', '.join(other[:3])}): give an empty or new directory")
    return "fresh"


def _run_dir_verdict(run_dir: Path) -> str:
    """``_inspect_run_dir`` as process 0 sees it, on every process: a process that
    started later must not look itself, since process 0 may already be writing there
    (a temporary config file read as a stranger's file stopped such a job)."""
    verdict = _inspect_run_dir(run_dir) if is_main_process() else None
    return broadcast_text(verdict, max_bytes=16_384)


def _fresh_run_dir(config: RunConfig, args) -> Path:
    """The run directory of a new run: ``--run-dir`` as given (created; checked by
    ``_run_dir_verdict``), else a new timestamped one."""
    if args.run_dir is None:
        # Process 0 names and creates the run directory; the others use its name.
        made = str(new_run_dir(config, Path(args.config).stem)) if is_main_process() else None
        return Path(broadcast_text(made))
    run_dir = Path(args.run_dir)
    if is_main_process():
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create the run directory {run_dir}: "
                              f"{e.strerror or e}") from e
    return run_dir


def _setup(args) -> tuple[RunConfig, Path, bool]:
    """The config, the run directory and whether the run resumes, for the parsed
    arguments (a fresh run's directory is created)."""
    overrides = parse_overrides(args.overrides)
    resume = args.resume
    if args.run_dir is not None:
        verdict = _run_dir_verdict(Path(args.run_dir))
        if verdict == "resume":
            print(f"note: {args.run_dir} holds a run: resuming it (its config.yaml plus "
                  "--set)", flush=True)
            resume = args.run_dir
        elif verdict != "fresh":
            raise ConfigError(verdict)
    if not resume:
        config = load_run_config(args.config, overrides)
        return config, _fresh_run_dir(config, args), False
    run_dir = Path(resume)
    config = read_run_config(run_dir, overrides)
    _check_resume_overrides(read_run_config(run_dir), config, run_dir)
    if args.config and load_run_config(args.config, overrides) != config:
        print(f"note: --resume continues with {run_dir}/config.yaml (plus --set); "
              f"it differs from {args.config}, which is not used.", flush=True)
    if not (run_dir / "checkpoints").is_dir():
        raise FileNotFoundError(f"{run_dir}/checkpoints not found: the run saved no "
                                "checkpoint to resume from.")
    return config, run_dir, True


# Sections a resumed run keeps: its checkpoint's parameters were made for them (policy
# sizes, observation token counts, the action space).
RESUME_FIXED = ("policy", "env.observation", "env.dynamics")


def _check_resume_overrides(saved: RunConfig, config: RunConfig, run_dir: Path) -> None:
    """``ConfigError`` (before any set-up) when ``--set`` on ``--resume`` changes a key
    of ``RESUME_FIXED``: the checkpoint would not fit the changed model."""
    before, after = dict(flat_items(saved.to_dict())), dict(flat_items(config.to_dict()))
    changed = [k for k in after if k.startswith(tuple(s + "." for s in RESUME_FIXED))
               and before.get(k) != after[k]]
    if changed:
        k = changed[0]
        raise ConfigError(
            f"--resume keeps the run's model: {k} is {before.get(k)!r} in "
            f"{run_dir}/config.yaml and --set would make it {after[k]!r}, which its "
            f"checkpoint does not fit (changed: {', '.join(changed)}). Policy, observation "
            "and dynamics settings are fixed for a run; train a new run to change them.")


def _population_config(args) -> int | None:
    """Trains a population when ``--population`` or the config's ``population.size``
    asks for one (returns the exit code); None for an ordinary run."""
    if args.resume:
        return None
    try:
        overrides = parse_overrides(args.overrides)
        if args.population is not None:
            if args.population < 1:
                raise ConfigError(f"--population {args.population}: give N >= 1 members.")
            overrides["population.size"] = args.population
        config = load_run_config(args.config, overrides)
        if config.population.size == 0:
            return None
        if args.run_dir is not None:
            raise ConfigError("population.size > 0 trains a population directory; it "
                              "cannot take --run-dir")
        if jax.process_count() > 1:
            raise ConfigError("population.size > 0: train a population in one process "
                              "(members are trained one after the other).")
        pop_dir, results = train_population(config, Path(args.config).stem)
    except (*INPUT_ERRORS, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for i, metrics in enumerate(results):
        print(f"member_{i}: " + "; ".join(summary_lines(metrics, pop_dir / f"member_{i}",
                                                        member_config(config, i))))
    print(pop_dir)
    return 0


def _out_of_memory(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or (isinstance(e, jax.errors.JaxRuntimeError)
                                          and "RESOURCE_EXHAUSTED" in str(e))


def out_of_memory_message(e: BaseException, config: RunConfig) -> str:
    """What to lower when the run does not fit in memory (``e``: MemoryError or XLA's
    RESOURCE_EXHAUSTED)."""
    t = config.train
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return (f"out of memory ({first}): a run with train.num_envs={t.num_envs} does not fit "
            f"on this device; lower train.num_envs (e.g. --set "
            f"train.num_envs={max(1, t.num_envs // 4)}), or train.rollout_steps "
            f"({t.rollout_steps}) or the policy size")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.train``; returns the exit code (2 on bad
    input, 1 when the run failed)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.run_dir is not None and (args.resume or not args.config):
        p.error("--run-dir DIR goes with --config (it resumes the run in DIR if there is "
                "one); use --resume RUN_DIR alone to continue a run")
    if args.run_dir is not None and args.population is not None:
        p.error("--population trains a population directory; it cannot take --run-dir")
    if not args.config and not args.resume:
        p.error("give --config FILE or PRESET (e.g. configs/quickstart.yaml or quickstart) "
                "or --resume RUN_DIR")
    if args.population is not None and args.resume:
        p.error("--population trains fresh member runs; it cannot be combined with --resume")
    population = _population_config(args)
    if population is not None:
        return population
    try:
        group = detect(args.coordinator_address, args.num_processes, args.process_id)
        if group is not None:
            print(f"joining a multi-process job (settings from {group.source}; waiting up "
                  f"to {args.distributed_timeout} s for the coordinator and every process)",
                  flush=True)
        initialize(group, timeout_s=args.distributed_timeout,
                   heartbeat_s=args.heartbeat_timeout)
        watch_peers(args.heartbeat_timeout)
        config, run_dir, resume = _setup(args)
    except (*INPUT_ERRORS, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        metrics = train(config, run_dir, resume=resume,
                        force_unlock=args.force_unlock)
    except BaseException as e:
        if not isinstance(e, KeyboardInterrupt):
            await_peer_verdict()  # a lost peer is exit 75 with its own line, not a bug
        removed = not resume and is_main_process() and remove_unused_run_dir(run_dir)
        if removed and not isinstance(e, (StoppedAtStartup, KeyboardInterrupt)):
            print(f"note: removed {run_dir}: the run failed before saving anything",
                  file=sys.stderr)
        code = _failure(e, config, run_dir, removed)
        if code is None:
            raise  # a bug: keep its traceback
        return code
    if is_main_process():
        for line in summary_lines(metrics, run_dir, config):
            print(line)
    return 0


def _failure(e: BaseException, config: RunConfig, run_dir: Path,
             removed: bool = False) -> int | None:
    """Prints ``error: ...`` for a known failure (one line: ``stopped ...`` for a stop)
    and returns its exit code; None for anything else (re-raised: ``run_command`` names
    its traceback file). ``removed``: the unused run directory was removed."""
    if isinstance(e, (StoppedAtStartup, KeyboardInterrupt)):  # asked for: no "error:"
        if isinstance(e, StoppedAtStartup):
            message = str(e)
        elif isinstance(e, Stopped):  # between the set-up's and the loop's stop handlers
            message = f"stopped by {e}"
        else:
            message = "stopped at once (a second Ctrl-C or SIGTERM)"
        if removed:
            message += f"; removed the unused run directory {run_dir}"
        print(message, file=sys.stderr)
        return getattr(e, "exit_code", 130)
    if isinstance(e, INPUT_ERRORS):
        message, code = str(e), 2
    elif _out_of_memory(e):
        message, code = out_of_memory_message(e, config), 2
    elif isinstance(e, (OutputError, TrainingDiverged)):
        message, code = f"{e}", 1
        if (run_dir / "checkpoints").is_dir():
            message += f"; then continue with --resume {run_dir}"
    else:
        return None
    print(f"error: {message}", file=sys.stderr)
    return code

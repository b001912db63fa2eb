"""The training run: build everything from a ``RunConfig``, loop, log, checkpoint.

The host loop only dispatches the jitted ``PPO.train_step``, fetches its metrics (one
``device_get`` per iteration), and does I/O: the console progress bar, ``metrics.jsonl``,
wandb, validation every ``validation.every`` iterations and orbax checkpoints. Ctrl-C
finishes the running iteration, saves a checkpoint and exits cleanly (a second Ctrl-C
aborts at once); SIGTERM (what clusters send before killing a job) does the same.
``--resume RUN_DIR`` restores the newest intact checkpoint and continues with exactly the
numbers an uninterrupted run would produce (CPU).

Reliability: a run holds ``RUN_DIR/run.lock`` while it trains (a second process cannot
write into it); each iteration's loss metrics and an all-finite flag of the parameters
(computed inside the jitted step, fetched with the metrics) are checked, and a non-finite
one stops the run with ``TrainingDiverged`` before anything of that iteration is saved;
a failed write (disk full) raises one ``OutputError`` and leaves the checkpoints saved
before it intact.

Run directory layout::

    RUN_DIR/config.yaml      the resolved config (every key, defaults included)
    RUN_DIR/metrics.jsonl    one JSON object per logged iteration (in trial mode with
                             the iteration's trial counters, train/trials_*)
    RUN_DIR/checkpoints/     last/<iteration>/ and best/<iteration>/ (orbax)
    RUN_DIR/videos/train/VIEW/stepSTEP_envENV.mp4   with ``video.every`` > 0
    RUN_DIR/eval/stepSTEP.json, RUN_DIR/eval/NAME/...  with ``evaluation.suite_file``
"""

from __future__ import annotations

import collections
import datetime
import math
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.config import ConfigError
from jaxdrive.distributed import any_process, describe, is_main_process
from jaxdrive.env import Env, EnvParams, episode_steps
from jaxdrive.eval.evaluator import local_devices_only
from jaxdrive.eval.manager import EvalManager
from jaxdrive.eval.suite import load_suite_file
from jaxdrive.files import OutputError, atomic_write_text, safe_name
from jaxdrive.models.policy import Policy, param_count
from jaxdrive.parallel import gather_shares, replicated, to_global, to_host
from jaxdrive.render.record import Recorder, VideoConfig, policy_actor, record
from jaxdrive.render.video import VideoSink
from jaxdrive.runs.checkpoint import (
    BackgroundSaver,
    Checkpointer,
    host_snapshot,
    is_step_name,
)
from jaxdrive.runs.config import (
    CheckpointConfig,
    EvaluationConfig,
    LoggingConfig,
    RunConfig,
    expand_co_players,
)
from jaxdrive.runs.load import (
    load_policy,
    matching_params,
    read_run_config,
    save_config,
    uncommitted,
)
from jaxdrive.runs.lock import LOCK_FILE, RunLock
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.signals import StopRequest
from jaxdrive.telemetry.writers import ConsoleProgress, JsonlWriter, WandbWriter, Writers
from jaxdrive.train.placement import Placement, default_mesh, procedural_params
from jaxdrive.train.ppo import PPO
from jaxdrive.train.validation import make_validator

BEST_METRIC = "val/goal_rate"
PARAMS_FINITE = "guard/params_finite"  # 1.0 when every parameter and optimiser value is finite
GUARDED = ("loss/", "rollout/")  # metrics that are finite whenever training is healthy
CONSOLE_KEYS = ("sps_valid",  # trained agent-steps/s (``sps`` counts every agent slot)
                "train/goal_rate", "train/collision_rate", "train/offroad_rate",
                "val/goal_rate", "val/collision_rate", "val/offroad_rate",
                # trial mode only (absent otherwise): per completed episode, and steps
                "train/trials_goal_reached", "train/trial_mean_length")


def build_env(config: RunConfig, seed: int, num_scenes: int,
              mesh=None) -> tuple[Env, EnvParams]:
    """The env and a pool of ``num_scenes`` procedural scenes drawn with ``seed``
    (replicated over ``mesh`` when given; in a multi-process job each process generates
    its share: ``jaxdrive.train.placement.procedural_params``)."""
    env = Env(config.env)
    return env, procedural_params(config, env, seed, num_scenes, mesh)


class SceneStream:
    """Training pools from a converted dataset, prepared ahead by a background thread.

    Pool ``p`` (``pool_size`` scenes) serves iterations ``p * refresh_every + 1`` ...;
    at each swap every env restarts on the new pool. A run resumed after ``done``
    iterations starts the stream at pool ``done // refresh_every`` and restarts the
    envs when ``done`` falls on a swap, as the uninterrupted run did.
    """

    def __init__(self, config: RunConfig, env: Env, done: int, place=gather_shares):
        from jaxdrive.data import ScenarioDataset

        d = config.data
        self.refresh = d.refresh_every
        self.pool_index = done // self.refresh if self.refresh else 0
        self.dataset = ScenarioDataset(
            d.path, d.pool_size, seed=d.seed, subset=d.subset,
            scenario_config=config.env.scenario, skip_batches=self.pool_index,
            prefetch=1 if self.refresh else 0,
            transform=lambda s: make_pool(s, config.env.road_index),
            batch_key="data.pool_size")
        # Each process loads its own scenes (the dataset's per-process split); ``place``
        # (in the main thread) lays the shares out as one pool: by default gathered into
        # the whole pool on every host (``Placement.pool_params`` in a training run).
        self._to_params = lambda pool: place(env.make_params(pool))
        self._iter = iter(self.dataset)
        self.params = self._to_params(next(self._iter))

    def describe(self) -> str:
        """The scene source in words, for the run's announcement (pool size, dataset size,
        refresh interval)."""
        every = f", the next {self.dataset.batch_size} every {self.refresh} iterations"
        return (f"training pools of {self.dataset.batch_size} of the "
                f"{self.dataset.num_scenarios} scenes of {self.dataset.directory}"
                + (every if self.refresh else ""))

    @property
    def wait_seconds(self) -> float:
        """() float: seconds the run has spent waiting for prefetched pools."""
        return self.dataset.wait_seconds

    def swap_due(self, done: int) -> bool:
        """Whether the next pool replaces the current one after ``done`` iterations (a
        multiple of ``refresh_every``; never when refreshing is off)."""
        return bool(self.refresh) and done % self.refresh == 0

    def restart_due(self, done: int) -> bool:
        """``swap_due`` with ``done > 0``: a run resumed after ``done`` iterations restarts
        its envs on the current pool, as the uninterrupted run did at that swap."""
        return done > 0 and self.swap_due(done)

    def next_params(self) -> EnvParams:
        """Advance to the next pool and return its ``EnvParams`` (waits for the prefetch)."""
        self.params = self._to_params(next(self._iter))
        self.pool_index += 1
        return self.params

    def restart(self, restart_fn, state):
        """``restart_fn(state, params)`` on the current pool: every env restarted
        (``PPO.restart_envs`` jitted by ``Placement.jit_restart``; ``state`` donated)."""
        return restart_fn(state, self.params)

    def close(self) -> None:
        """Stop the dataset's background thread."""
        self.dataset.close()


def new_run_dir(config: RunConfig, name: str) -> Path:
    """``output_dir/NAME-YYYYmmdd-HHMMSS`` (a suffix keeps concurrent runs apart).

    Raises UnsafeNameError for a ``logging.run_name`` that is not a plain name (``/``,
    ``..``) and OutputError when the directory cannot be created."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    prefix = safe_name(config.logging.run_name or name, "logging.run_name")
    base = Path(config.logging.output_dir) / f"{prefix}-{stamp}"
    path, i = base, 1
    try:
        while path.exists():
            path, i = Path(f"{base}-{i}"), i + 1
        path.mkdir(parents=True)
    except OSError as e:
        raise OutputError(f"cannot create the run directory {path}: {e.strerror or e}; set "
                          "logging.output_dir to a writable directory") from e
    return path


class TrainingDiverged(RuntimeError):
    """A loss metric or a parameter became NaN or infinite; nothing of that iteration was
    saved."""


def _stop_flag() -> StopRequest:
    """The first Ctrl-C or SIGTERM asks the loop to save and stop; a second one aborts."""
    return StopRequest(lambda name: f"\n{name}: finishing this iteration, saving a "
                                    f"checkpoint ({name} again to abort)")


def _guarded(train_step):
    """``train_step`` that also returns ``PARAMS_FINITE`` among its metrics: a (L,) float32
    flag per inexact leaf of (parameters, optimiser state), 1.0 where every value is
    finite, computed on the device and fetched with the other metrics (no extra host round
    trip, and no need to read the state, which the next iteration may already own)."""
    def step(state, env_params):
        state, metrics = train_step(state, env_params)
        leaves = [x for x in jax.tree.leaves((state.params, state.opt_state))
                  if jnp.issubdtype(x.dtype, jnp.inexact)]
        finite = jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])
        return state, {**metrics, PARAMS_FINITE: finite.astype(jnp.float32)}

    return step


def guarded_leaf_names(state) -> list[str]:
    """Names of the leaves ``_guarded`` flags, in its order (parameters, then optimiser
    state; inexact leaves only)."""
    flat = jax.tree_util.tree_flatten_with_path((state.params, state.opt_state))[0]
    names = []
    for path, x in flat:
        if jnp.issubdtype(x.dtype, jnp.inexact):
            key = jax.tree_util.keystr(path[1:])
            names.append(("params" if path[0].idx == 0 else "opt_state") + key)
    return names


def check_finite(it: int, metrics: dict, flags=None, names=()) -> None:
    """Raises TrainingDiverged if iteration ``it`` produced a non-finite loss or rollout
    metric or parameter.

    Args:
      it: the iteration just run (1-based).
      metrics: its fetched metrics (host floats, ``PARAMS_FINITE`` popped).
      flags: its (L,) ``PARAMS_FINITE`` flags (None: not checked); names: the L leaf
        names (``guarded_leaf_names``).
    """
    bad_leaves = [] if flags is None else [
        names[i] if i < len(names) else f"leaf {i}" for i in np.flatnonzero(
            np.asarray(flags) != 1.0)]
    bad = [k for k in sorted(metrics) if k.startswith(GUARDED) and not math.isfinite(metrics[k])]
    if not bad_leaves and not bad:
        return
    what = [f"{', '.join(bad)} = {', '.join(str(metrics[k]) for k in bad)}"] if bad else []
    if bad_leaves:
        shown = ", ".join(bad_leaves[:5]) + (
            f" (and {len(bad_leaves) - 5} more)" if len(bad_leaves) > 5 else "")
        what.append(f"non-finite parameters or optimiser values: {shown}")
    raise TrainingDiverged(
        f"training diverged at iteration {it}: {'; '.join(what)}. Nothing of iteration {it} "
        "was saved; the checkpoints before it are intact. Check the training scenes for NaN "
        "values, or lower train.learning_rate")


def restore_train_state(ckpt: Checkpointer, target, step: int, log=print):
    """``ckpt.restore(target, step)`` for a ``TrainState``, also from checkpoints written
    before the KV cache became head-major (commit d61cecb: k, v (L, N, S, heads, hd),
    now (L, N, heads, S, hd)): those caches come back transposed, logged once. Any other
    mismatch raises ``restore``'s error."""
    try:
        return ckpt.restore(target, step=step)
    except ValueError as err:
        if "cache" not in str(err):
            raise
        swap = lambda c: c.replace(k=jnp.swapaxes(c.k, 2, 3), v=jnp.swapaxes(c.v, 2, 3))
        old = target.replace(cache=swap(target.cache),
                             co_caches=tuple(swap(c) for c in target.co_caches))
        try:
            state, meta = ckpt.restore(old, step=step)
        except ValueError:
            raise err from None
        log(f"checkpoint step {step} holds the KV cache in the layout before d61cecb "
            "(slot-major); converted to head-major")
        return state.replace(cache=swap(state.cache),
                             co_caches=tuple(swap(c) for c in state.co_caches)), meta


def _wandb_writer(config: RunConfig, run_dir: Path, resume_id: str | None):
    mode = config.logging.wandb
    if mode == "off":
        return None
    return WandbWriter(config.to_dict(), str(run_dir), project=config.logging.wandb_project,
                       mode=None if mode == "env" else mode, name=run_dir.name,
                       entity=config.logging.wandb_entity, resume_id=resume_id)


def train(config: RunConfig, run_dir: Path, resume: bool = False, quiet: bool = False,
          force_unlock: bool = False, stop_when=None) -> dict:
    """Train (or continue training) in ``run_dir``. Returns the last logged metrics.

    ``stop_when(metrics) -> bool``, if given, is asked after every validation (and every
    other iteration whose successor was not dispatched early) with the iteration's
    metrics, ``val/*`` included; True ends the run there as its last iteration (logged
    and saved), e.g. ``jaxdrive.bench learn``.

    ``run_dir`` must exist; a fresh run saves ``config.yaml`` there first. The run holds
    ``run_dir/run.lock`` throughout (``RunLockedError`` if another process holds it;
    ``force_unlock`` takes it over). A resumed run whose ``config`` differs from the saved
    ``config.yaml`` (``--set``) rewrites it, keeping the previous one as
    ``config.prev.yaml``.

    Raises:
      TrainingDiverged: a loss or parameter became non-finite (nothing of it saved).
      OutputError: a checkpoint or metrics write failed (e.g. disk full).
      CheckpointError: resuming, and no intact checkpoint is left.
    """
    run_dir = Path(run_dir)
    if not is_main_process():  # process 0 holds the lock for the whole job
        return _start(config, run_dir, resume, quiet, stop_when).loop()
    with RunLock(run_dir, force=force_unlock) as lock:
        if lock.note and not quiet:
            print(f"note: {lock.note}", flush=True)
        return _start(config, run_dir, resume, quiet, stop_when).loop()


class StoppedAtStartup(Exception):
    """Ctrl-C or SIGTERM arrived while the run was being set up (before its first
    iteration): nothing was trained or saved. ``exit_code``: 130 or 143."""

    def __init__(self, name: str, exit_code: int):
        super().__init__(f"stopped by {name} during set-up, before the first iteration: "
                         "nothing was trained")
        self.exit_code = exit_code


def _start(config, run_dir, resume, quiet, stop_when) -> _Run:
    """The set-up run (``_Run``), with Ctrl-C and SIGTERM recorded meanwhile: either one
    ends it once set up (``StoppedAtStartup``), its files closed."""
    with StopRequest() as startup:
        run = _Run(config, run_dir, resume, quiet, stop_when)
    if startup.requested:
        run._close(raise_errors=False)
        raise StoppedAtStartup(startup.name, startup.exit_code)
    return run


# What ``train`` writes into a run directory before its first save.
START_FILES = frozenset({"config.yaml", LOCK_FILE, "metrics.jsonl", "checkpoints"})


def has_saved_step(run_dir: Path) -> bool:
    """Whether ``run_dir/checkpoints`` holds a saved step (in ``last/`` or ``best/``)."""
    ckpt = Path(run_dir) / "checkpoints"
    return any(is_step_name(p.name) for w in ("last", "best") if (ckpt / w).is_dir()
               for p in (ckpt / w).iterdir())


def remove_unused_run_dir(run_dir: Path) -> bool:
    """Removes ``run_dir`` if a failed start left nothing in it but what ``train`` writes
    first (config, lock, an empty metrics file, checkpoints without a step); returns
    whether it did. Anything else in it (a checkpoint, a metrics line, videos, a file of
    the user's) keeps it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return False
    if any(p.name not in START_FILES for p in run_dir.iterdir()):
        return False
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:
        return False
    if has_saved_step(run_dir):
        return False
    shutil.rmtree(run_dir)
    return True


# What runs of one process share (a process that trains several runs of one config:
# resume after Ctrl-C, init_from, the tests, ``bench learn``): the env, the policy, the
# PPO, the jitted step and restart and the validator of an earlier run whose config
# differs at most in what none of them reads (outputs, checkpoints, videos, evaluations,
# init_from). Reusing the jitted step skips re-tracing and re-lowering it (2-4 s a run);
# the numbers are the same programs' (jax.jit's own cache). Single-device, single-process
# runs without co-players only; the last few configs are kept.
_BUILT: collections.OrderedDict = collections.OrderedDict()
_BUILT_MAX = 4


def _reuse_key(config: RunConfig) -> RunConfig | None:
    """``config`` without what a run's env, policy, PPO, step and validator do not
    read, or None when the run's parts are not shared (``_BUILT``)."""
    if config.train.co_players or jax.device_count() > 1 or jax.process_count() > 1:
        return None
    t = config.train
    # The run's length reaches the step through a decaying learning rate only.
    total = t.total_steps if t.lr_schedule != "constant" else 1
    key = config.replace(logging=LoggingConfig(), checkpoint=CheckpointConfig(),
                         video=VideoConfig(), evaluation=EvaluationConfig(),
                         train=t.replace(init_from=None, init_checkpoint="best",
                                         total_steps=total))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _shared_parts(config: RunConfig) -> dict | None:
    """The parts an earlier run of this process built for ``config`` (``_BUILT``): a dict
    to fill on the first run, None when not shared."""
    key = _reuse_key(config)
    if key is None:
        return None
    if key not in _BUILT:
        _BUILT[key] = {}
        while len(_BUILT) > _BUILT_MAX:
            _BUILT.popitem(last=False)
    _BUILT.move_to_end(key)
    return _BUILT[key]


class _Run:
    """One training run's host side: setup, the loop, and what runs between steps."""

    def __init__(self, config: RunConfig, run_dir: Path, resume: bool, quiet: bool,
                 stop_when=None):
        self.config, self.run_dir, self.resume, self.quiet = config, run_dir, resume, quiet
        self.stop_when, self.stopped_early = stop_when, False
        # Process 0 writes the shared outputs (config, metrics, console, wandb, videos,
        # evaluations); every process computes and takes part in checkpoints.
        self.main = is_main_process()
        quiet = quiet or not self.main
        self.log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
        # Inputs first: a missing co-player or a damaged checkpoint fails in seconds.
        self.co_players = [(p.policy, p.params) for p in
                           map(load_policy, expand_co_players(config.train.co_players))]
        if not resume and self.main:
            save_config(config, run_dir / "config.yaml")
        self.t0 = time.perf_counter()
        # Checkpoint files are written in a worker thread while the device runs the next
        # iterations: from host snapshots on one process; on several (whose arrays span
        # processes) every process starts its part in the loop (orbax's asynchronous
        # save, back once the arrays are on the host) and the thread finishes it.
        self.ckpt = Checkpointer(run_dir / "checkpoints", keep_last=config.checkpoint.keep_last,
                                 best_metric=BEST_METRIC,
                                 asynchronous=jax.process_count() > 1)
        self.saver = BackgroundSaver(self.ckpt)
        resume_meta = self._prepare_resume() if resume else None
        if resume_meta is not None and config.num_iterations < int(resume_meta["iteration"]):
            done = int(resume_meta["iteration"])
            raise ConfigError(
                f"train.total_steps={config.train.total_steps:,} is below the "
                f"{done * config.steps_per_iteration:,} agent-steps ({done} iterations) "
                f"{run_dir} has done; --resume extends a run: give a larger "
                "train.total_steps, or evaluate the run as it is (python -m jaxdrive.eval "
                f"--checkpoint {run_dir}).")
        self._build(resume_meta)
        self.start_it, wandb_id = 0, None
        if resume:
            state, meta = restore_train_state(self.ckpt, self.state,
                                              self.ckpt.latest_step(), self.log)
            # On a mesh the restored arrays already have the state's shardings.
            self.state = state if self.mesh is not None else jax.tree.map(uncommitted, state)
            self.start_it, wandb_id = int(meta["iteration"]), meta.get("wandb_id")
            self.log(f"resumed from iteration {self.start_it} "
                     f"({self.start_it * config.steps_per_iteration:,} agent-steps)")
        self.per_it = config.steps_per_iteration
        self.n_it = config.num_iterations
        if self.scenes is not None and self.scenes.restart_due(self.start_it):
            self.state = self.scenes.restart(self.restart_fn, self.state)
        self._announce()
        shared = self.shared if self.shared is not None else {}
        if "step" not in shared:
            shared["step"] = self.placement.jit_step(_guarded(self.ppo.train_step),
                                                     self.env_params)
        self.step_fn = shared["step"]
        self.wandb = _wandb_writer(config, run_dir, wandb_id) if self.main else None
        self.console = None if quiet else ConsoleProgress(
            self.n_it * self.per_it, self.start_it * self.per_it, keys=CONSOLE_KEYS)
        self.writers = Writers(JsonlWriter(run_dir / "metrics.jsonl",
                                           resume_step=self.start_it * self.per_it)
                               if self.main else None, self.console, self.wandb)
        self.saved_it = self.start_it if resume else -1
        # Validation of iteration i while i + 1 runs: on accelerators the two queue on the
        # device and the host never idles it; on CPU they share the cores and both slow
        # down (quickstart, validation every 2 iterations: 37-38 s -> 43-52 s), so not
        # there (docs/benchmarks.md).
        self.overlap_validation = jax.default_backend() != "cpu"
        self._build_extras()
        if resume and self.main:
            self._record_config()

    def _prepare_resume(self) -> dict:
        """The metadata of the newest intact checkpoint (CheckpointError listing each
        checkpoint and why if none is; nothing is changed then). Then cleans the
        checkpoints directory: stale temporary directories removed, damaged steps moved
        to ``checkpoints/damaged/``, an interrupted best re-copied; each printed as a
        note."""
        meta = self.ckpt.restore_metadata()
        notes = self.ckpt.recover()
        for note in notes:
            self.log(f"note: {note}")
        # Steps saved before checksums are read back by recover(): an unreadable newest
        # one is moved aside, and the run resumes from the newest step left.
        return self.ckpt.restore_metadata() if notes else meta

    def _record_config(self) -> None:
        """Writes the resumed run's config to config.yaml (atomically) when ``--set``
        changed it; the previous file is kept as config.prev.yaml."""
        path = self.run_dir / "config.yaml"
        if read_run_config(self.run_dir) == self.config:
            return
        prev = self.run_dir / "config.prev.yaml"
        atomic_write_text(prev, path.read_text(encoding="utf-8"))
        save_config(self.config, path)
        self.log(f"note: {path} now holds the new settings (--set); the previous config is "
                 f"{prev}")

    def _build(self, resume_meta: dict | None) -> None:
        """Env, scene source, validator, co-players, policy, PPO and its initial state."""
        config, t = self.config, self.config.train
        self.mesh = default_mesh()
        self.scenes = None
        self.shared = _shared_parts(config) if self.mesh is None else None
        shared = self.shared if self.shared is not None else {}
        if "ppo" not in shared:
            env = Env(config.env)
            policy = Policy.for_env(config.policy, env)
            ppo = PPO(config, env, policy, self.co_players, mesh=self.mesh,
                      trial_counters=True)
            shared.update(env=env, policy=policy, ppo=ppo, placement=Placement(ppo))
        self.env, self.policy = shared["env"], shared["policy"]
        self.ppo, self.placement = shared["ppo"], shared["placement"]
        if config.data.path:
            done = int(resume_meta["iteration"]) if resume_meta is not None else 0
            self.scenes = SceneStream(config, self.env, done,
                                      place=self.placement.pool_params)
            self.env_params = self.scenes.params
            self._note_rows_overflow()
        else:
            self.env_params = self.placement.pool_params(
                procedural_params(config, self.env, t.seed, t.num_scenes, gather=False))
        if "restart" not in shared:
            shared["restart"] = self.placement.jit_restart(self.ppo.restart_envs,
                                                           self.env_params)
        self.restart_fn = shared["restart"]
        # Validation runs in every process (an evaluator over all devices of the job);
        # videos and evaluations in process 0 only, on its own devices.
        if "validator" not in shared:
            shared["validator"] = make_validator(config) if config.validation.every else None
        self.validator = shared["validator"]
        if self.env.config.co_player_fraction > 0 and not self.co_players:
            self.log("note: env.co_player_fraction > 0 and no train.co_players: co-players "
                     "act with the learner's current parameters (never trained on).")
        self.state = self.placement.init(t.seed + 1, self.env_params)
        if t.init_from and resume_meta is None:
            self.state = self._start_from(self.state, t.init_from, t.init_checkpoint)

    def _start_from(self, state, run_dir: str, which: str):
        """``state`` with the policy parameters of another run (``train.init_from``) and
        an optimiser initialised on them."""
        loaded = load_policy(run_dir, which=which)
        params = matching_params(state.params, loaded.params, "train.init_from")
        opt_state = jax.jit(self.ppo.tx.init)(params)
        if self.mesh is not None:
            rep = replicated(self.mesh)
            params, opt_state = to_global((params, opt_state), rep)
        self.log(f"policy parameters from {loaded.run_dir} ({which} checkpoint, step "
                 f"{loaded.step:,}); optimiser and step count start afresh")
        return state.replace(params=params, opt_state=opt_state)

    def _note_rows_overflow(self) -> None:
        """With packed rows (``env.max_controlled``), say how many vehicles of the first
        pool find no row and replay their log instead of being trained."""
        rows = self.env.config.max_controlled
        if rows is None:
            return
        counts = to_host(self.env.controlled_per_scene(self.env_params))
        over = counts > rows
        if over.any():
            self.log(f"note: {int(over.sum())} of {counts.size} scenes of the first pool have "
                     f"more controlled vehicles (up to {int(counts.max())}) than "
                     f"env.max_controlled = {rows}: {int((counts - rows)[over].sum())} "
                     "vehicles replay their log untrained; raise env.max_controlled to "
                     "train them all.")

    def _announce(self) -> None:
        t = self.config.train
        scenes = (f"{t.num_scenes} procedural training scenes" if self.scenes is None
                  else self.scenes.describe())
        self.log(f"jaxdrive.train: {scenes}, {t.num_envs} envs x "
                 f"{self.env.config.describe_rows()}, policy {self.config.policy.kind} "
                 f"({param_count(self.state.params):,} params), {self.n_it} iterations of "
                 f"{self.per_it:,} agent-steps, backend {jax.default_backend()}; setup "
                 f"{time.perf_counter() - self.t0:.1f} s")
        if self.mesh is not None:
            self.log(f"data-parallel over {describe()}: {t.num_envs // self.mesh.size} "
                     f"envs per device, {self.ppo.shuffle_groups} shuffle group(s), "
                     f"{self._pool_words()}")
        self.log(f"run directory: {self.run_dir}")

    def _pool_words(self) -> str:
        """How the training pool lies on the mesh, for the start-up line."""
        k, d = self.ppo.pool_shards, self.mesh.size
        if k == 1:
            return "the scene pool whole on every device (train.pool_shards 1)"
        size = self.env_params.pool.size
        return (f"the scene pool in {k} shards ({size // d} of its {size} scenes per device; "
                "each block of envs draws from its own shard)")

    def _build_extras(self) -> None:
        """The video recorder and the evaluation manager, when configured."""
        config = self.config
        self.recorder = None
        self.evals = None
        if not self.main:
            return
        if config.video.every:
            self.recorder = Recorder(self.env, policy_actor(self.env, self.policy),
                                     config.video)
            _, self.video_params = build_env(config, config.validation.seed,
                                             config.video.num_envs)
        if config.evaluation.suite_file:
            specs = load_suite_file(config.evaluation.suite_file, config.evaluation.suite,
                                    base_env=config.env, base_procedural=config.procedural)
            self.evals = EvalManager(specs, self.policy, self.run_dir,
                                     suite_file=config.evaluation.suite_file, log=self.log,
                                     evaluation=config.evaluation)

    def host_params(self):
        """The learner's parameters for process-local work (validation, videos,
        evaluations): the state's own arrays on one device, a host copy of the
        replicated parameters on a mesh."""
        if self.mesh is None:
            return self.state.params
        return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), self.state.params)

    def save(self, it: int, metrics: dict, wait: bool = False) -> None:
        """Checkpoint iteration ``it`` (the current state): a host copy now (on several
        processes, every process its part), the files in the background while the next
        iterations run, unless ``wait`` (a reader needs the files now)."""
        if it == self.saved_it:
            return
        meta = {"iteration": it, "step": it * self.per_it, "config": self.config.to_dict(),
                "wandb_id": None if self.wandb is None else self.wandb.run_id}
        if BEST_METRIC in metrics:
            meta[BEST_METRIC] = metrics[BEST_METRIC]
        if wait:
            self.saver.wait()
            self.ckpt.save(it, self.state, meta)
        else:
            self.saver.submit(it, self.state if self.ckpt.asynchronous
                              else host_snapshot(self.state), meta)
        self.saved_it = it

    def run_video(self, it: int, metrics: dict) -> None:
        """Record the videos of iteration ``it`` and log them to wandb."""
        tv = time.perf_counter()
        frames = self.config.video.num_steps or episode_steps(self.env)
        ids = np.arange(self.config.video.num_envs, dtype=np.int32)
        with VideoSink(self.recorder, self.run_dir / "videos", "train",
                       it * self.per_it) as sink:
            record(self.recorder, self.host_params(), self.video_params, ids, frames, sink,
                   jax.random.key(it))
        metrics["time/video_s"] = time.perf_counter() - tv
        if self.wandb is not None:
            for (env_index, view), path in sink.paths.items():
                self.wandb.log_video(f"train/render/{view}/env{env_index}", path,
                                     it * self.per_it)

    def run_evals(self, it: int, metrics: dict, final: bool) -> None:
        """The evaluations due after iteration ``it`` (its checkpoint, when a subprocess
        evaluator needs one, is saved by ``_between_steps``)."""
        results, videos = self.evals.run(it, it * self.per_it, self.host_params(),
                                         final=final)
        metrics.update(results)
        if self.wandb is not None:
            for key, path in videos:
                self.wandb.log_video(key, path, it * self.per_it)

    def run_validation(self, metrics: dict, params=None) -> None:
        """Validate ``params`` (default the current state's) into ``metrics``."""
        tv = time.perf_counter()
        result = self.validator.run(self.policy,
                                    self.host_params() if params is None else params)
        if result.status != "ok":
            raise RuntimeError(f"validation failed: {result.error}")
        metrics.update({f"val/{k}": v for k, v in result.metrics.items()})
        metrics["time/validation_s"] = time.perf_counter() - tv

    def _validation_due(self, it: int, final: bool = False) -> bool:
        return self.validator is not None and (it % self.config.validation.every == 0
                                               or final)

    def _params_copy(self):
        """Iteration's parameters that outlive the state's donation to the next step: a
        device copy (one device) or the host copy (a mesh)."""
        if self.mesh is None:
            return jax.tree.map(jnp.copy, self.state.params)
        return self.host_params()

    def _between_steps(self, it: int, metrics: dict, final: bool, val_params=None) -> bool:
        """Validation (of ``val_params`` when the next iteration already owns the state),
        videos and evaluations due after iteration ``it``; whether any ran (the metrics
        are then logged whatever ``logging.every`` says)."""
        config = self.config
        val_due = self._validation_due(it, final)
        video_due = self.recorder is not None and (it % config.video.every == 0
                                                   or it == self.n_it)
        if val_due:
            self.run_validation(metrics, val_params)
        eval_due = self.evals is not None and (bool(self.evals.due(it, it == self.n_it))
                                               or self.evals.pending > 0)
        # A subprocess evaluator reads the checkpoint saved just before: every process
        # takes part in that save, so they all learn whether process 0 needs it.
        if any_process(eval_due and self.evals.needs_checkpoint(it, it == self.n_it)):
            self.save(it, metrics, wait=True)
        with local_devices_only():  # process 0 alone in a multi-process job
            if video_due:
                self.run_video(it, metrics)
            if eval_due:
                self.run_evals(it, metrics, final=it == self.n_it)
        return val_due or video_due or eval_due

    def _overlap_ok(self, it: int) -> bool:
        """Whether iteration ``it + 1`` may be dispatched before iteration ``it``'s metrics
        are read: nothing after ``it`` needs its state (the next step takes it over, the
        state being donated) and, in a multi-process job, ``it`` is not an iteration
        where the processes agree on a stop (``_stop_check_due``: every process must
        then have read its metrics and be at the same point)."""
        config = self.config
        if it >= self.n_it or (jax.process_count() > 1 and self._stop_check_due(it)):
            return False
        if self._validation_due(it) and (self.stop_when is not None
                                         or not self.overlap_validation):
            # ``stop_when`` may end the run at a validation: keep its state.
            return False
        if self.recorder is not None and it % config.video.every == 0:
            return False
        if self.evals is not None and (self.evals.due(it) or self.evals.pending > 0):
            return False
        if self._checkpoint_due(it):
            # Saved from the state before the next step takes it over; only the copy to
            # the host waits (the files are written in the background, ``save``).
            return False
        return not (self.scenes is not None and self.scenes.swap_due(it))

    def _checkpoint_due(self, it: int) -> bool:
        every = self.config.checkpoint.every
        return bool(every) and it % every == 0

    def _dispatch(self):
        """Start one training iteration (asynchronous): ``(state, metrics, time)``."""
        tic = time.perf_counter()
        state, metrics = self.step_fn(self.state, self.env_params)
        return state, metrics, tic

    def loop(self) -> dict:
        """Iterate until ``num_iterations``, Ctrl-C or SIGTERM; log, evaluate and checkpoint.

        The next iteration is dispatched before this one's metrics are read whenever
        nothing in between needs this iteration's state (``_overlap_ok``), so the device
        does not wait for the host's logging. Raises TrainingDiverged before logging or
        saving an iteration with a non-finite loss or parameter."""
        config, per_it = self.config, self.per_it
        last: dict = {}
        it = self.start_it
        window_steps, window_s, window_valid = 0, 0.0, 0.0
        compile_s = None
        pending = None  # iteration it + 1, dispatched
        leaf_names = guarded_leaf_names(self.state)
        read_at = 0.0  # when the previous iteration's metrics arrived
        try:
            with _stop_flag() as stop:
                while pending is not None or (it < self.n_it and not self.stopped_early
                                              and not self._stop_agreed(stop, it)):
                    if pending is None:
                        if self.scenes is not None and it > self.start_it and \
                                self.scenes.swap_due(it):
                            self.env_params = self.scenes.next_params()
                            self.state = self.scenes.restart(self.restart_fn, self.state)
                        pending = self._dispatch()
                    self.state, metrics, started = pending
                    pending = None
                    it += 1
                    self.saver.check()  # a failed background save stops the run
                    val_params = None
                    if not stop.requested and self._overlap_ok(it):
                        if self._validation_due(it):  # validated while the next one runs
                            val_params = self._params_copy()
                        pending = self._dispatch()
                    metrics = jax.device_get(metrics)
                    flags = metrics.pop(PARAMS_FINITE, None)
                    metrics = {k: float(v) for k, v in metrics.items()}
                    now = time.perf_counter()
                    dt, read_at = now - max(started, read_at), now
                    check_finite(it, metrics, flags, leaf_names)
                    if compile_s is None:
                        compile_s = dt
                        metrics["time/compile_s"] = dt
                    else:
                        window_steps += per_it
                        window_s += dt
                        window_valid += metrics["rollout/valid_steps"]
                    stopping = pending is None and self._stop_agreed(stop, it)
                    final = it == self.n_it or stopping
                    # A stop (Ctrl-C, SIGTERM) saves first and leaves: a last validation,
                    # video or evaluation (a fresh compile: minutes) would not fit a
                    # scheduler's grace period. A resumed run does them when due.
                    extra_due = (not stopping
                                 and self._between_steps(it, metrics, final, val_params))
                    # Only with no successor dispatched: that one would own the state.
                    if pending is None and self.stop_when is not None and \
                            self.stop_when(metrics) and not final:
                        final = self.stopped_early = True
                    if it % config.logging.every == 0 or final or extra_due:
                        if window_s > 0:
                            metrics["sps"] = window_steps / window_s
                            metrics["sps_valid"] = window_valid / window_s
                        else:  # only the first (compiling) iteration so far
                            metrics["sps"] = per_it / dt
                            metrics["sps_valid"] = metrics["rollout/valid_steps"] / dt
                        self._write(it, metrics)
                        window_steps, window_s, window_valid = 0, 0.0, 0.0
                        last = dict(metrics, step=it * per_it)
                    if final or self._checkpoint_due(it):
                        self.save(it, metrics)
                # Every process leaves the loop after the same iteration; a local request
                # not yet agreed on (a run that ended between two agreements) is agreed
                # on here, so that all of them save, or none.
                if self._stop_agreed(stop, it, force=True):
                    self.save(it, last, wait=True)  # written before "saved" is printed
                if stop.requested and self.console is not None:
                    self.console.message(
                        f"stopped at iteration {it}; checkpoint saved in "
                        f"{self.run_dir / 'checkpoints'}; continue with --resume {self.run_dir}")
        except BaseException:
            self._close(raise_errors=False)  # the error in flight is the one to report
            raise
        self._close(raise_errors=True)
        return last

    def _stop_check_due(self, it: int) -> bool:
        """Whether the processes of a multi-process job agree on a stop after iteration
        ``it``: every ``train.stop_check_every`` iterations and after the last."""
        return it % self.config.train.stop_check_every == 0 or it >= self.n_it

    def _stop_agreed(self, stop: StopRequest, it: int, force: bool = False) -> bool:
        """Whether a stop was requested here or, in a multi-process job, in any process
        (every process then stops after the same iteration). The processes agree after
        the iterations of ``_stop_check_due`` (or when ``force``d, which every process
        must do at the same point), once per iteration (one small collective); the
        loop's second question after the same iteration gets the same agreed answer in
        every process; between agreements the answer is no, in every process (a local
        request waits for the next agreement)."""
        if jax.process_count() == 1:
            return stop.requested
        if not (force or self._stop_check_due(it)):
            return False
        if getattr(self, "_agreed", (None, False))[0] != it:
            stop.requested = any_process(stop.requested)
            self._agreed = (it, stop.requested)
        return self._agreed[1]

    def _close(self, raise_errors: bool) -> None:
        """Closes the writers, the checkpointer and the scene stream, each even if another
        fails; re-raises the first failure if ``raise_errors``."""
        closers = [self.writers.close, self.ckpt.close]
        if getattr(self, "saver", None) is not None:  # the last save's files first
            closers.insert(0, lambda: self.saver.close(raise_errors))
        if self.scenes is not None:
            closers.append(self.scenes.close)
        first = None
        for close in closers:
            try:
                close()
            except Exception as e:
                first = first or e
        if first is not None and raise_errors:
            raise first

    def _write(self, it: int, metrics: dict) -> None:
        metrics["iteration"] = it
        metrics["devices"] = 1 if self.mesh is None else self.mesh.size
        metrics["processes"] = jax.process_count()
        if self.scenes is not None:
            metrics["data/pool_index"] = self.scenes.pool_index
            metrics["time/data_wait_s"] = self.scenes.wait_seconds
        metrics["time/elapsed_s"] = time.perf_counter() - self.t0
        self.writers.write(it * self.per_it, metrics)


def validation_scenes(config: RunConfig | None) -> str:
    """How the end-of-run line names the validation scenes: held out unless
    ``data.validation_path`` is the training data itself."""
    data = None if config is None else config.data
    if data is not None and data.validation_path is not None and data.path is not None and (
            Path(data.validation_path).resolve() == Path(data.path).resolve()):
        return "the training scenes (data.validation_path = data.path)"
    return "held-out scenes"


def summary_lines(metrics: dict, run_dir: Path, config: RunConfig | None = None) -> list[str]:
    """What the CLI prints at the end of a run (``config``: the run's, to name the
    validation scenes)."""
    lines = [f"finished: {metrics.get('step', 0):,} agent-steps, "
             f"{metrics.get('time/elapsed_s', float('nan')):.0f} s"]
    if "val/goal_rate" in metrics:
        lines.append(
            f"validation ({metrics['val/agent_episodes']:.0f} agent-episodes on "
            f"{validation_scenes(config)}): goal rate {metrics['val/goal_rate']:.3f}, "
            f"collision rate "
            f"{metrics['val/collision_rate']:.3f}, off-road rate "
            f"{metrics['val/offroad_rate']:.3f}")
    for k in sorted(metrics):
        if k.startswith("val/trial_") or k.startswith("val/ada_delta"):
            lines.append(f"  {k}: {metrics[k]:.3f}")
    if "sps" in metrics and math.isfinite(metrics["sps"]):
        lines.append(f"throughput: {metrics['sps']:,.0f} agent-steps/s "
                     f"({metrics.get('sps_valid', float('nan')):,.0f} trained steps/s)")
    lines.append(f"outputs: {run_dir}/config.yaml, metrics.jsonl, checkpoints/ "
                 f"(load with jaxdrive.train.load_policy('{run_dir}'))")
    return lines

"""The training run: build everything from a ``RunConfig``, loop, log, checkpoint.

The host loop only dispatches the jitted ``PPO.train_step``, fetches its metrics (one
``device_get`` per iteration), and does I/O: the console progress bar, ``metrics.jsonl``,
wandb, validation every ``validation.every`` iterations and orbax checkpoints. Ctrl-C
finishes the running iteration, saves a checkpoint and exits cleanly (a second Ctrl-C
aborts at once). ``--resume RUN_DIR`` restores the last checkpoint and continues with
exactly the numbers an uninterrupted run would produce (CPU).

Run directory layout::

    RUN_DIR/config.yaml      the resolved config (every key, defaults included)
    RUN_DIR/metrics.jsonl    one JSON object per logged iteration
    RUN_DIR/checkpoints/     last/<iteration>/ and best/<iteration>/ (orbax)
    RUN_DIR/videos/train/VIEW/stepSTEP_envENV.mp4   with ``video.every`` > 0
    RUN_DIR/eval/stepSTEP.json, RUN_DIR/eval/NAME/...  with ``evaluation.suite_file``
"""

from __future__ import annotations

import datetime
import math
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.env import Env, EnvParams, episode_steps
from jaxdrive.eval.manager import EvalManager
from jaxdrive.eval.suite import load_suite_file
from jaxdrive.models.policy import Policy, param_count
from jaxdrive.render.record import Recorder, policy_actor, record
from jaxdrive.render.video import VideoSink
from jaxdrive.runs.checkpoint import Checkpointer
from jaxdrive.runs.config import RunConfig
from jaxdrive.runs.load import load_policy, save_config
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch
from jaxdrive.telemetry.writers import ConsoleProgress, JsonlWriter, WandbWriter, Writers
from jaxdrive.train.ppo import PPO
from jaxdrive.train.validation import make_validator

BEST_METRIC = "val/goal_rate"
CONSOLE_KEYS = ("train/goal_rate", "train/collision_rate", "train/offroad_rate",
                "val/goal_rate", "val/collision_rate", "val/offroad_rate")


def build_env(config: RunConfig, seed: int, num_scenes: int) -> tuple[Env, EnvParams]:
    """The env and a pool of ``num_scenes`` procedural scenes drawn with ``seed``."""
    scenes = generate_batch(jax.random.key(seed), num_scenes, config.procedural,
                            config.env.scenario)
    env = Env(config.env)
    return env, env.make_params(make_pool(scenes, config.env.road_index))


class SceneStream:
    """Training pools from a converted dataset, prepared ahead by a background thread.

    Pool ``p`` (``pool_size`` scenes) serves iterations ``p * refresh_every + 1`` ...;
    at each swap every env restarts on the new pool. A run resumed after ``done``
    iterations starts the stream at pool ``done // refresh_every`` and restarts the
    envs when ``done`` falls on a swap, as the uninterrupted run did.
    """

    def __init__(self, config: RunConfig, env: Env, done: int):
        from jaxdrive.data import ScenarioDataset

        d = config.data
        self.refresh = d.refresh_every
        self.pool_index = done // self.refresh if self.refresh else 0
        self.dataset = ScenarioDataset(
            d.path, d.pool_size, seed=d.seed, subset=d.subset,
            scenario_config=config.env.scenario, skip_batches=self.pool_index,
            prefetch=1 if self.refresh else 0,
            transform=lambda s: env.make_params(make_pool(s, config.env.road_index)))
        self._iter = iter(self.dataset)
        self.params = next(self._iter)
        self._restart = jax.jit(lambda ppo_restart, s, p: ppo_restart(s, p),
                                static_argnums=0, donate_argnums=1)

    def describe(self) -> str:
        """The scene source in words, for the run's announcement (pool size, dataset size,
        refresh interval)."""
        every = f", next {self.dataset.batch_size} every {self.refresh} iterations"
        return (f"{self.dataset.batch_size} of {self.dataset.num_scenarios} "
                f"data" + (every if self.refresh else ""))

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
        self.params = next(self._iter)
        self.pool_index += 1
        return self.params

    def restart(self, ppo, state):
        """``state`` with every env restarted on the current pool (``PPO.restart_envs``,
        jitted; ``state`` is donated)."""
        return self._restart(ppo.restart_envs, state, self.params)

    def close(self) -> None:
        """Stop the dataset's background thread."""
        self.dataset.close()


def new_run_dir(config: RunConfig, name: str) -> Path:
    """``output_dir/NAME-YYYYmmdd-HHMMSS`` (a suffix keeps concurrent runs apart)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(config.logging.output_dir) / f"{config.logging.run_name or name}-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    path.mkdir(parents=True)
    return path


def _uncommitted(x):
    """A restored array as a fresh, uncommitted one like the arrays a run starts from, so
    the step compiles to the same program (and hits XLA's persistent cache)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_uncommitted(jax.random.key_data(x)),
                                        impl=jax.random.key_impl(x))
    return jnp.asarray(np.asarray(x))


class _StopFlag:
    """First Ctrl-C asks the loop to save and stop; a second one aborts."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        def handler(signum, frame):
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True
            print("\nCtrl-C: finishing this iteration, saving a checkpoint "
                  "(Ctrl-C again to abort)", flush=True)

        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: no handler, plain KeyboardInterrupt
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _wandb_writer(config: RunConfig, run_dir: Path, resume_id: str | None):
    mode = config.logging.wandb
    if mode == "off":
        return None
    return WandbWriter(config.to_dict(), str(run_dir), project=config.logging.wandb_project,
                       mode=None if mode == "env" else mode, name=run_dir.name,
                       entity=config.logging.wandb_entity, resume_id=resume_id)


def train(config: RunConfig, run_dir: Path, resume: bool = False, quiet: bool = False) -> dict:
    """Train (or continue training) in ``run_dir``. Returns the last logged metrics.

    ``run_dir`` must exist; a fresh run saves ``config.yaml`` there first.
    """
    return _Run(config, Path(run_dir), resume, quiet).loop()


class _Run:
    """One training run's host side: setup, the loop, and what runs between steps."""

    def __init__(self, config: RunConfig, run_dir: Path, resume: bool, quiet: bool):
        self.config, self.run_dir, self.resume, self.quiet = config, run_dir, resume, quiet
        self.log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
        if not resume:
            save_config(config, run_dir / "config.yaml")
        self.t0 = time.perf_counter()
        self.ckpt = Checkpointer(run_dir / "checkpoints", keep_last=config.checkpoint.keep_last,
                                 best_metric=BEST_METRIC)
        self._build()
        self.start_it, wandb_id = 0, None
        if resume:
            state, meta = self.ckpt.restore(self.state)
            self.state = jax.tree.map(_uncommitted, state)
            self.start_it, wandb_id = int(meta["iteration"]), meta.get("wandb_id")
            self.log(f"resumed from iteration {self.start_it} "
                     f"({self.start_it * config.steps_per_iteration:,} agent-steps)")
        self.per_it = config.steps_per_iteration
        self.n_it = config.num_iterations
        if self.scenes is not None and self.scenes.restart_due(self.start_it):
            self.state = self.scenes.restart(self.ppo, self.state)
        self._announce()
        self.step_fn = jax.jit(self.ppo.train_step, donate_argnums=0)
        self.wandb = _wandb_writer(config, run_dir, wandb_id)
        self.console = None if quiet else ConsoleProgress(
            self.n_it * self.per_it, self.start_it * self.per_it, keys=CONSOLE_KEYS)
        self.writers = Writers(JsonlWriter(run_dir / "metrics.jsonl",
                                           resume_step=self.start_it * self.per_it),
                               self.console, self.wandb)
        self.saved_it = self.start_it if resume else -1
        self._build_extras()

    def _build(self) -> None:
        """Env, scene source, validator, co-players, policy, PPO and its initial state."""
        config, t = self.config, self.config.train
        self.scenes = None
        if config.data.path:
            self.env = Env(config.env)
            done = (int(self.ckpt.restore_raw(which="last")[1]["iteration"]) if self.resume
                    else 0)
            self.scenes = SceneStream(config, self.env, done)
            self.env_params = self.scenes.params
        else:
            self.env, self.env_params = build_env(config, t.seed, t.num_scenes)
        self.validator = make_validator(config) if config.validation.every else None
        co_players = []
        for path in t.co_players:
            loaded = load_policy(path)
            co_players.append((loaded.policy, loaded.params))
        if self.env.config.co_player_fraction > 0 and not co_players:
            self.log("note: env.co_player_fraction > 0 and no train.co_players: co-players "
                     "act with the learner's current parameters (never trained on).")
        self.policy = Policy.for_env(config.policy, self.env)
        self.ppo = PPO(config, self.env, self.policy, co_players)
        self.state = self.ppo.init(jax.random.key(t.seed + 1), self.env_params)

    def _announce(self) -> None:
        t = self.config.train
        num_scenes = t.num_scenes if self.scenes is None else self.scenes.describe()
        self.log(f"jaxdrive.train: {num_scenes} training scenes, {t.num_envs} envs x "
                 f"{self.ppo.num_agents} agent slots, policy {self.config.policy.kind} "
                 f"({param_count(self.state.params):,} params), {self.n_it} iterations of "
                 f"{self.per_it:,} agent-steps, backend {jax.default_backend()}; setup "
                 f"{time.perf_counter() - self.t0:.1f} s")
        self.log(f"run directory: {self.run_dir}")

    def _build_extras(self) -> None:
        """The video recorder and the evaluation manager, when configured."""
        config = self.config
        self.recorder = None
        if config.video.every:
            self.recorder = Recorder(self.env, policy_actor(self.env, self.policy),
                                     config.video)
            _, self.video_params = build_env(config, config.validation.seed,
                                             config.video.num_envs)
        self.evals = None
        if config.evaluation.suite_file:
            specs = load_suite_file(config.evaluation.suite_file, config.evaluation.suite,
                                    base_env=config.env, base_procedural=config.procedural)
            self.evals = EvalManager(specs, self.policy, self.run_dir,
                                     suite_file=config.evaluation.suite_file, log=self.log)

    def save(self, it: int, metrics: dict) -> None:
        if it == self.saved_it:
            return
        meta = {"iteration": it, "step": it * self.per_it, "config": self.config.to_dict(),
                "wandb_id": None if self.wandb is None else self.wandb.run_id}
        if BEST_METRIC in metrics:
            meta[BEST_METRIC] = metrics[BEST_METRIC]
        self.ckpt.save(it, self.state, meta)
        self.saved_it = it

    def run_video(self, it: int, metrics: dict) -> None:
        """Record the videos of iteration ``it`` and log them to wandb."""
        tv = time.perf_counter()
        frames = self.config.video.num_steps or episode_steps(self.env)
        ids = np.arange(self.config.video.num_envs, dtype=np.int32)
        with VideoSink(self.recorder, self.run_dir / "videos", "train",
                       it * self.per_it) as sink:
            record(self.recorder, self.state.params, self.video_params, ids, frames, sink,
                   jax.random.key(it))
        metrics["time/video_s"] = time.perf_counter() - tv
        if self.wandb is not None:
            for (env_index, view), path in sink.paths.items():
                self.wandb.log_video(f"train/render/{view}/env{env_index}", path,
                                     it * self.per_it)

    def run_evals(self, it: int, metrics: dict, final: bool) -> None:
        if self.evals.needs_checkpoint(it, final):
            self.save(it, metrics)
        results, videos = self.evals.run(it, it * self.per_it, self.state.params,
                                         final=final)
        metrics.update(results)
        if self.wandb is not None:
            for key, path in videos:
                self.wandb.log_video(key, path, it * self.per_it)

    def run_validation(self, metrics: dict) -> None:
        tv = time.perf_counter()
        result = self.validator.run(self.policy, self.state.params)
        if result.status != "ok":
            raise RuntimeError(f"validation failed: {result.error}")
        metrics.update({f"val/{k}": v for k, v in result.metrics.items()})
        metrics["time/validation_s"] = time.perf_counter() - tv

    def _between_steps(self, it: int, metrics: dict, final: bool) -> bool:
        """Validation, videos and evaluations due after iteration ``it``; whether any ran
        (the metrics are then logged whatever ``logging.every`` says)."""
        config = self.config
        val_due = self.validator is not None and (it % config.validation.every == 0 or final)
        video_due = self.recorder is not None and (it % config.video.every == 0
                                                   or it == self.n_it)
        if val_due:
            self.run_validation(metrics)
        if video_due:
            self.run_video(it, metrics)
        eval_due = self.evals is not None and (bool(self.evals.due(it, it == self.n_it))
                                               or self.evals.pending > 0)
        if eval_due:
            self.run_evals(it, metrics, final=it == self.n_it)
        return val_due or video_due or eval_due

    def loop(self) -> dict:
        """Iterate until ``num_iterations`` or Ctrl-C; log, evaluate and checkpoint."""
        config, per_it = self.config, self.per_it
        last: dict = {}
        it = self.start_it
        window_steps, window_s, window_valid = 0, 0.0, 0.0
        compile_s = None
        try:
            with _StopFlag() as stop:
                while it < self.n_it and not stop.requested:
                    if self.scenes is not None and it > self.start_it and \
                            self.scenes.swap_due(it):
                        self.env_params = self.scenes.next_params()
                        self.state = self.scenes.restart(self.ppo, self.state)
                    tic = time.perf_counter()
                    self.state, metrics = self.step_fn(self.state, self.env_params)
                    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    dt = time.perf_counter() - tic
                    it += 1
                    if compile_s is None:
                        compile_s = dt
                        metrics["time/compile_s"] = dt
                    else:
                        window_steps += per_it
                        window_s += dt
                        window_valid += metrics["rollout/valid_steps"]
                    final = it == self.n_it or stop.requested
                    extra_due = self._between_steps(it, metrics, final)
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
                    ckpt_every = config.checkpoint.every
                    if final or (ckpt_every and it % ckpt_every == 0):
                        self.save(it, metrics)
                if stop.requested:
                    self.save(it, last)
                if stop.requested and self.console is not None:
                    self.console.message(
                        f"stopped at iteration {it}; checkpoint saved in "
                        f"{self.run_dir / 'checkpoints'}; continue with --resume {self.run_dir}")
        finally:
            self.writers.close()
            self.ckpt.close()
            if self.scenes is not None:
                self.scenes.close()
        return last

    def _write(self, it: int, metrics: dict) -> None:
        metrics["iteration"] = it
        if self.scenes is not None:
            metrics["data/pool_index"] = self.scenes.pool_index
            metrics["time/data_wait_s"] = self.scenes.wait_seconds
        metrics["time/elapsed_s"] = time.perf_counter() - self.t0
        self.writers.write(it * self.per_it, metrics)


def summary_lines(metrics: dict, run_dir: Path) -> list[str]:
    """What the CLI prints at the end of a run."""
    lines = [f"finished: {metrics.get('step', 0):,} agent-steps, "
             f"{metrics.get('time/elapsed_s', float('nan')):.0f} s"]
    if "val/goal_rate" in metrics:
        lines.append(
            f"validation ({metrics['val/agent_episodes']:.0f} agent-episodes on held-out "
            f"scenes): goal rate {metrics['val/goal_rate']:.3f}, collision rate "
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

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
        every = f", next {self.dataset.batch_size} every {self.refresh} iterations"
        return (f"{self.dataset.batch_size} of {self.dataset.num_scenarios} "
                f"data" + (every if self.refresh else ""))

    @property
    def wait_seconds(self) -> float:
        return self.dataset.wait_seconds

    def swap_due(self, done: int) -> bool:
        return bool(self.refresh) and done % self.refresh == 0

    def restart_due(self, done: int) -> bool:
        return done > 0 and self.swap_due(done)

    def next_params(self) -> EnvParams:
        self.params = next(self._iter)
        self.pool_index += 1
        return self.params

    def restart(self, ppo, state):
        return self._restart(ppo.restart_envs, state, self.params)

    def close(self) -> None:
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
    # Imported here so that build_env (benchmarks) does not need orbax.

    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    run_dir = Path(run_dir)
    if not resume:
        save_config(config, run_dir / "config.yaml")
    t = config.train
    t0 = time.perf_counter()
    ckpt = Checkpointer(run_dir / "checkpoints", keep_last=config.checkpoint.keep_last,
                        best_metric=BEST_METRIC)
    scenes = None
    if config.data.path:
        env = Env(config.env)
        done = int(ckpt.restore_raw(which="last")[1]["iteration"]) if resume else 0
        scenes = SceneStream(config, env, done)
        env_params = scenes.params
    else:
        env, env_params = build_env(config, t.seed, t.num_scenes)
    validator = make_validator(config) if config.validation.every else None
    co_players = []
    for path in t.co_players:
        loaded = load_policy(path)
        co_players.append((loaded.policy, loaded.params))
    if env.config.co_player_fraction > 0 and not co_players:
        log("note: env.co_player_fraction > 0 and no train.co_players: co-players act "
            "with the learner's current parameters (never trained on).")
    policy = Policy.for_env(config.policy, env)
    ppo = PPO(config, env, policy, co_players)
    state = ppo.init(jax.random.key(t.seed + 1), env_params)
    start_it, wandb_id = 0, None
    if resume:
        state, meta = ckpt.restore(state)
        state = jax.tree.map(_uncommitted, state)
        start_it, wandb_id = int(meta["iteration"]), meta.get("wandb_id")
        log(f"resumed from iteration {start_it} ({start_it * config.steps_per_iteration:,} "
            "agent-steps)")
    per_it = config.steps_per_iteration
    n_it = config.num_iterations
    if scenes is not None and scenes.restart_due(start_it):
        state = scenes.restart(ppo, state)
    num_scenes = t.num_scenes if scenes is None else scenes.describe()
    log(f"jaxdrive.train: {num_scenes} training scenes, {t.num_envs} envs x "
        f"{ppo.num_agents} agent slots, policy {config.policy.kind} "
        f"({param_count(state.params):,} params), {n_it} iterations of {per_it:,} "
        f"agent-steps, backend {jax.default_backend()}; setup {time.perf_counter() - t0:.1f} s")
    log(f"run directory: {run_dir}")

    step_fn = jax.jit(ppo.train_step, donate_argnums=0)
    wandb = _wandb_writer(config, run_dir, wandb_id)
    console = None if quiet else ConsoleProgress(n_it * per_it, start_it * per_it,
                                                 keys=CONSOLE_KEYS)
    writers = Writers(JsonlWriter(run_dir / "metrics.jsonl", resume_step=start_it * per_it),
                      console, wandb)
    last: dict = {}
    saved_it = start_it if resume else -1

    def save(it: int, metrics: dict) -> None:
        nonlocal saved_it
        if it == saved_it:
            return
        meta = {"iteration": it, "step": it * per_it, "config": config.to_dict(),
                "wandb_id": None if wandb is None else wandb.run_id}
        if BEST_METRIC in metrics:
            meta[BEST_METRIC] = metrics[BEST_METRIC]
        ckpt.save(it, state, meta)
        saved_it = it

    recorder = None
    if config.video.every:
        recorder = Recorder(env, policy_actor(env, policy), config.video)
        _, video_params = build_env(config, config.validation.seed, config.video.num_envs)

    def run_video(it: int, metrics: dict) -> None:
        """Record the videos of iteration ``it`` and log them to wandb."""
        tv = time.perf_counter()
        frames = config.video.num_steps or episode_steps(env)
        ids = np.arange(config.video.num_envs, dtype=np.int32)
        with VideoSink(recorder, run_dir / "videos", "train", it * per_it) as sink:
            record(recorder, state.params, video_params, ids, frames, sink,
                   jax.random.key(it))
        metrics["time/video_s"] = time.perf_counter() - tv
        if wandb is not None:
            for (env_index, view), path in sink.paths.items():
                wandb.log_video(f"train/render/{view}/env{env_index}", path, it * per_it)

    evals = None
    if config.evaluation.suite_file:
        from jaxdrive.eval.manager import EvalManager
        from jaxdrive.eval.suite import load_suite_file

        specs = load_suite_file(config.evaluation.suite_file, config.evaluation.suite,
                                base_env=config.env, base_procedural=config.procedural)
        evals = EvalManager(specs, policy, run_dir, suite_file=config.evaluation.suite_file,
                            log=log)

    def run_evals(it: int, metrics: dict, final: bool) -> None:
        if evals.needs_checkpoint(it, final):
            save(it, metrics)
        results, videos = evals.run(it, it * per_it, state.params, final=final)
        metrics.update(results)
        if wandb is not None:
            for key, path in videos:
                wandb.log_video(key, path, it * per_it)

    def run_validation(metrics: dict) -> None:
        tv = time.perf_counter()
        result = validator.run(policy, state.params)
        if result.status != "ok":
            raise RuntimeError(f"validation failed: {result.error}")
        metrics.update({f"val/{k}": v for k, v in result.metrics.items()})
        metrics["time/validation_s"] = time.perf_counter() - tv

    it = start_it
    window_steps, window_s, window_valid = 0, 0.0, 0.0
    compile_s = None
    try:
        with _StopFlag() as stop:
            while it < n_it and not stop.requested:
                if scenes is not None and it > start_it and scenes.swap_due(it):
                    env_params = scenes.next_params()
                    state = scenes.restart(ppo, state)
                tic = time.perf_counter()
                state, metrics = step_fn(state, env_params)
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
                final = it == n_it or stop.requested
                val_due = validator is not None and (it % config.validation.every == 0
                                                     or final)
                video_due = recorder is not None and (it % config.video.every == 0
                                                      or it == n_it)
                if val_due:
                    run_validation(metrics)
                if video_due:
                    run_video(it, metrics)
                eval_due = evals is not None and (bool(evals.due(it, it == n_it))
                                                  or evals.pending > 0)
                if eval_due:
                    run_evals(it, metrics, final=it == n_it)
                log_due = (it % config.logging.every == 0 or final or val_due or video_due
                           or eval_due)
                if log_due:
                    if window_s > 0:
                        metrics["sps"] = window_steps / window_s
                        metrics["sps_valid"] = window_valid / window_s
                    else:  # only the first (compiling) iteration so far
                        metrics["sps"] = per_it / dt
                        metrics["sps_valid"] = metrics["rollout/valid_steps"] / dt
                    metrics["iteration"] = it
                    if scenes is not None:
                        metrics["data/pool_index"] = scenes.pool_index
                        metrics["time/data_wait_s"] = scenes.wait_seconds
                    metrics["time/elapsed_s"] = time.perf_counter() - t0
                    writers.write(it * per_it, metrics)
                    window_steps, window_s, window_valid = 0, 0.0, 0.0
                    last = dict(metrics, step=it * per_it)
                ckpt_every = config.checkpoint.every
                if final or (ckpt_every and it % ckpt_every == 0):
                    save(it, metrics)
            if stop.requested:
                save(it, last)
            if stop.requested and console is not None:
                console.message(f"stopped at iteration {it}; checkpoint saved in "
                                f"{run_dir / 'checkpoints'}; continue with --resume {run_dir}")
    finally:
        writers.close()
        ckpt.close()
        if scenes is not None:
            scenes.close()
    return last


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

"""The ``Evaluator`` base: scenario batches through the jitted episode rollout, sharded
over the devices, reduced to an ``EvalResult``.

The loop lives here; subclasses override narrow hooks only. A type names its config
(``Config``, an ``EvaluatorConfig`` subclass with the type's own keys, read as
``self.config.KEY``) and may override two class-level hooks of the suite loader:
``resolve_env(env_overrides, config)`` (what the type writes into its env) and
``expand(spec)`` (the evaluators one section gives; default one). Then per run:

- ``env_config()``: the env the evaluator runs (``spec.env`` plus type overrides);
- ``scenario_ids(n)``: which of the ``n`` loaded scenarios to play;
- ``num_steps(env)``: rollout length (``spec.num_steps`` or one whole episode);
- ``actors(env, policy)``: named ``Actor`` s, each evaluated on every scenario (the
  first is the one rendered);
- ``num_rollouts()``: times each scenario is played (default once);
- ``should_stop(env)``: when an env's counted episode ends (default: the env's own end);
- ``step_hook(env)``: optional ``(hook, reduce)`` for extra on-device quantities;
- ``aggregate(rows, extras)``: metrics and per-scenario arrays from the fetched rows.

Every scenario is played exactly once: the ids are cut into batches of
``batch_size`` (rounded up to a multiple of the device count), the last batch
padded with masked rows (``run(shard=...)`` plays only a shard's batches, see
``jaxdrive.eval.shards``). Each batch is one call of a function compiled once per
evaluator and reused across calls (new parameters do not recompile).

Devices: one process splits each batch over its local devices (a 1-D ``scenarios``
mesh). In a multi-process job (``jax.process_count() > 1``, ``jaxdrive.distributed``)
the mesh spans every device of every process: every process runs every batch together,
each supplying the rows its own devices hold (cut from the whole batch of scenario ids,
which every process knows: ``process_rows``), and the fetched rows are gathered
(``process_allgather``) so that every process holds the whole result and reduces it
exactly as one process would. The parameters and the scene pool are replicated. Only
process 0 renders videos (on its first local device, alone). Each row's episode
depends on its scenario id, its place in the batch and the batch's key only, so
whenever the batch size is the same (a ``batch_size`` that is a multiple of the device
count) the episode records and counts equal the single-device run's exactly (float
terms computed per row may differ in the last bits: XLA compiles the per-device
program for fewer rows).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxdrive.agents.actors import Actor, policy_actor, with_partners
from jaxdrive.env import Env, EnvConfig, episode_steps
from jaxdrive.eval.rollout import (
    OUTCOMES,
    TRIAL_FIELDS,
    episode_spans,
    make_episode_rollout,
    outcome,
    reset_keys,
)
from jaxdrive.eval.shards import Shard
from jaxdrive.eval.spec import EvaluatorConfig, EvaluatorSpec, check_partners
from jaxdrive.files import UnsafeNameError, confined, safe_name
from jaxdrive.metrics.episode import rates as episode_rates
from jaxdrive.metrics.registry import Metric, episode_metrics
from jaxdrive.metrics.trials import TRIAL_COUNTERS, TrialTotals, episode_trial_scores
from jaxdrive.parallel import to_global
from jaxdrive.render.record import Recorder, VideoConfig, record, replay_actor
from jaxdrive.render.video import VideoSink
from jaxdrive.runs.config import expand_co_players
from jaxdrive.runs.load import load_policy
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch
from jaxdrive.sim.trials import TrialStats
from jaxdrive.types import Scenario


@dataclass
class EvalResult:
    """What one evaluator returns (plain Python data, JSON-ready via ``to_dict``).

    Attributes:
      name, type: the evaluator.
      status: ``ok`` or ``failed`` (then ``error`` holds the reason and traceback).
      metrics: name -> float.
      per_scenario: name -> list over scenarios (same order as ``scenario_ids``).
      episodes: one record per episode (actor, rollout, env index, batch, scenario id,
        start and end step, outcome, counts): each env's counted episode (start step 0;
        the metrics count these) and every later episode the env completed within the
        rollout (auto-reset to a pool scenario drawn by the env; not in the metrics).
      trials: in trial mode, one entry per completed episode of ``episodes`` (same keys
        as its record, less the counts) with its trials' outcomes: ``trial_score`` (share
        of ego agents that reached their goal in trial k), ``trial_length``,
        ``trial_timed_out``, ``trial_goal_reached`` (lists over the K trials).
      videos: paths of the rendered mp4s, env by env (each env's views together, in
        ``render.views`` order), the envs in rendered order.
      eval_seconds: wall time of the evaluation (compile included on the first call);
      compile_seconds: time spent compiling in this call.
      config: the resolved evaluator section.
      shard: in a shard's result only (``Evaluator.run(shard=...)``): the scenario ids,
        batch size, batch count, the shard's batch indices and each batch's rows
        (``jaxdrive.eval.shards``); None otherwise.
    """

    name: str
    type: str
    status: str = "ok"
    metrics: dict[str, float] = field(default_factory=dict)
    per_scenario: dict[str, list] = field(default_factory=dict)
    episodes: list[dict] = field(default_factory=list)
    trials: list[dict] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    eval_seconds: float = 0.0
    compile_seconds: float = 0.0
    error: str | None = None
    config: dict = field(default_factory=dict)
    shard: dict | None = None

    def to_dict(self) -> dict:
        """Every field by name, as a dict (``shard`` only in a shard's result, ``trials``
        only when there are any)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__
                if (k != "shard" or self.shard is not None) and (k != "trials" or self.trials)}

    def records(self) -> list[dict]:
        """The per-episode records with the evaluator's name (for a DataFrame)."""
        return [{"evaluator": self.name, **e} for e in self.episodes]


def trial_totals(rows: dict[str, np.ndarray]) -> TrialTotals:
    """``TrialTotals`` (on device, one compiled call) of the completed counted episodes
    of fetched ``EpisodeRecord`` rows (valid entries; ``finished`` selects)."""
    return _trial_totals(*(np.asarray(rows[f]) for f in (*TRIAL_FIELDS, "ego_agents",
                                                          "finished")))


@jax.jit
def _trial_totals(reached, length, timed_out, goal_reached, ego_agents, finished):
    stats = TrialStats(ego_reached=reached, co_reached=jnp.zeros_like(reached),
                       length=length, timed_out=timed_out, goal_reached=goal_reached,
                       num_ego=ego_agents.astype(jnp.int32),
                       num_co=jnp.zeros(reached.shape[:1], jnp.int32))
    return TrialTotals.zeros(reached.shape[1]).update(finished, stats)


def base_metrics(rows: dict[str, np.ndarray], metrics: tuple[Metric, ...],
                 trial_counters: bool = False) -> dict[str, float]:
    """Rates over ego agent-episodes of the played scenarios (``rows``: fetched
    ``EpisodeRecord`` rows of the valid entries), one per registered episode metric plus
    ``episode_return`` / ``episode_length``; in trial mode also ``trial_{k}_score``
    (pooled over the completed episodes) and ``ada_delta_trial_{k}_minus_0``, and with
    ``trial_counters`` ``trial_episodes`` and the ``TRIAL_COUNTERS``, all reduced by
    ``TrialTotals``."""
    ego = rows["ego_agents"]
    trials = {}
    if rows["trial_reached"].shape[1] > 1:
        totals = jax.device_get(jax.jit(TrialTotals.metrics)(trial_totals(rows)))
        names = [n for n in totals if n.startswith(("trial_", "ada_delta_"))
                 and n not in TRIAL_COUNTERS and n != "trial_episodes"]
        if trial_counters:
            names += ["trial_episodes", *TRIAL_COUNTERS]
        trials = {n: float(totals[n]) for n in names}
    n = float(np.sum(ego))
    return {**trials, **episode_rates(rows, n, metrics),
        "agent_episodes": n,
        "scenarios": float(len(ego)),
        "finished_rate": float(np.mean(rows["finished"])) if len(ego) else 0.0,
    }


def process_rows(batch: int, device_processes: list[int], process: int
                 ) -> list[tuple[int, int]]:
    """The rows ``[lo, hi)`` of a batch of ``batch`` rows that the devices of ``process``
    hold, on a ``scenarios`` mesh whose devices belong to ``device_processes`` (each
    device's process index, in mesh order; ``batch`` a multiple of their count): device
    k holds rows ``[k * batch / d, (k + 1) * batch / d)``. Adjacent ranges are joined."""
    d = len(device_processes)
    if batch % d:
        raise ValueError(f"a batch of {batch} rows does not split over {d} devices")
    per = batch // d
    out: list[tuple[int, int]] = []
    for k, p in enumerate(device_processes):
        if p != process:
            continue
        if out and out[-1][1] == k * per:
            out[-1] = (out[-1][0], (k + 1) * per)
        else:
            out.append((k * per, (k + 1) * per))
    return out


_LOCAL_ONLY = [False]


@contextlib.contextmanager
def local_devices_only():
    """Within: evaluators use this process's own devices even in a multi-process job
    (for what one process runs alone, e.g. a training job's evaluations and videos in
    process 0; an evaluator built within should also run within)."""
    before = _LOCAL_ONLY[0]
    _LOCAL_ONLY[0] = True
    try:
        yield
    finally:
        _LOCAL_ONLY[0] = before


def _multi_process() -> bool:
    return jax.process_count() > 1 and not _LOCAL_ONLY[0]


def _replicate(tree, sharding: NamedSharding):
    """``tree`` (host or local arrays, equal on every process) replicated over the
    devices of ``sharding`` 's mesh: unchanged on one device; ``device_put`` in one
    process (parameters restored from a checkpoint sit on one device, which a program
    over several refuses); global arrays in a multi-process job (those already global
    are kept)."""
    if sharding.mesh.size == 1:
        return tree
    if not _multi_process():
        return jax.device_put(tree, sharding)

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        return to_global(x, sharding)

    return jax.tree.map(one, tree)


def _fetch(tree):
    """The whole of ``tree`` as NumPy on this process: ``device_get`` in a single
    process; in a multi-process job every process's rows gathered (a collective every
    process joins)."""
    if not _multi_process():
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


class PoolCache:
    """Scenario pools built by evaluators, shared by evaluators of the same scenes (a
    suite usually plays one scenario set under several env settings). Owned by whoever
    runs a suite (``run_evaluators``, the training-time manager); bounded."""

    def __init__(self, max_pools: int = 4):
        self.max_pools = max_pools
        self._pools: dict = {}

    def get(self, key, build: Callable[[], Any]):
        """The pool stored under ``key``, built with ``build()`` on a miss (the oldest
        stored pools are dropped to stay within ``max_pools``)."""
        if key not in self._pools:
            while len(self._pools) >= self.max_pools:
                self._pools.pop(next(iter(self._pools)))
            self._pools[key] = build()
        return self._pools[key]


class Evaluator:
    """Base class (see the module doc). Construct with a resolved ``EvaluatorSpec``.

    Attributes:
      type_name: the ``type:`` that selects the class (``register_evaluator``).
      Config: the class of its config: ``EvaluatorConfig`` plus the type's own keys.
      spec: the resolved section; config: ``spec.config`` (typed).
    """

    type_name: ClassVar[str] = ""
    Config: ClassVar[type[EvaluatorConfig]] = EvaluatorConfig

    def __init__(self, spec: EvaluatorSpec, name: str | None = None):
        self.spec = spec
        self.config = spec.config
        self.name = name or spec.name
        self._setup: dict | None = None
        self._setup_key = None
        self._partners: list | None = None  # frozen co-player policies, loaded once
        # The scenario ids (WOMD ids) of the scenes last loaded from files, by pool index;
        # None for procedural scenes.
        self._scene_names: list[str] | None = None

    # ------------------------------------------------------------ resolution
    @classmethod
    def resolve_env(cls, env_overrides: Mapping[str, Any], config: EvaluatorConfig
                    ) -> Mapping[str, Any]:
        """The ``env`` overrides of a section of this type, before they merge onto the
        base env (default: as written).

        Args:
          env_overrides: the section's ``env`` mapping (clean settings included; may be
            malformed: the loader reports that).
          config: the section's other keys, checked (its ``env``, ``procedural`` and
            ``render`` are the defaults, not yet resolved).

        Raises:
          ConfigError: overrides that contradict the type's keys.
        """
        return env_overrides

    @classmethod
    def expand(cls, spec: EvaluatorSpec) -> list[Evaluator]:
        """The evaluators one resolved section of this type runs (default: one)."""
        return [cls(spec)]

    # ------------------------------------------------------------------ hooks
    def env_config(self) -> EnvConfig:
        """The ``EnvConfig`` the evaluator runs (default ``spec.env``)."""
        return self.spec.env

    def load_scenarios(self, env_config: EnvConfig) -> Scenario:
        """The evaluator's scenario set (batched, leading axis N); scenes from files also
        set their scenario ids (``_scene_names``)."""
        self._scene_names = None
        if self.spec.scenarios:
            from jaxdrive.data import load_scenarios

            scenes, report = load_scenarios(list(self.spec.scenarios), env_config.scenario)
            self._scene_names = list(report["scenario_ids"])
            return jax.tree.map(jnp.asarray, scenes)
        return generate_batch(jax.random.key(self.spec.seed), self.spec.num_scenarios,
                              self.spec.procedural, env_config.scenario)

    def _pool(self, env_config: EnvConfig, pools: PoolCache | None):
        """The scenario pool, shared through ``pools`` with other evaluators of the same
        scenes (with the scenes' ids, ``_scene_names``)."""

        def build():
            pool = make_pool(self.load_scenarios(env_config), env_config.road_index)
            return pool, self._scene_names

        if pools is None or type(self).load_scenarios is not Evaluator.load_scenarios:
            # A subclass choosing its own scenes (with side effects) builds its own.
            pool, self._scene_names = build()
            return pool
        key = (self.spec.scenarios, self.spec.procedural, self.spec.seed,
               self.spec.num_scenarios, env_config.scenario, env_config.road_index)
        pool, self._scene_names = pools.get(key, build)
        return pool

    def scenario_ids(self, num_available: int) -> np.ndarray:
        """Pool indices to play, each once (default: the first ``num_scenarios``)."""
        return np.arange(min(self.spec.num_scenarios, num_available), dtype=np.int32)

    def num_steps(self, env: Env) -> int:
        """Rollout length in env steps: ``spec.num_steps``, else one whole episode."""
        return self.spec.num_steps or episode_steps(env)

    def actors(self, env: Env, policy) -> dict[str, Actor]:
        """Named ``Actor`` s, each evaluated on every scenario; the first is rendered
        (default: the policy alone, as ``policy``)."""
        return {"policy": policy_actor(env, policy, deterministic=self.spec.deterministic)}

    def step_hook(self, env: Env):
        """Optional ``(hook, reduce)`` for extra on-device quantities (``StepHook`` and
        ``StepReduce`` of ``jaxdrive.eval.rollout``); default None."""
        return None

    def should_stop(self, env: Env):
        """``(state, timestep) -> (B,) bool`` ending each env's counted episode after a
        step, or None for the env's own episode end."""
        return None

    def num_rollouts(self) -> int:
        """Times each scenario is played (with different keys; default once)."""
        return 1

    def aggregate(self, rows: dict[str, dict[str, np.ndarray]], extras: dict[str, Any]
                  ) -> tuple[dict[str, float], dict[str, list]]:
        """Metrics and per-scenario lists from each actor's fetched rows."""
        r = rows[next(iter(rows))]
        names = [m.count for m in episode_metrics(self._setup["env"].metrics)]
        per = {k: r[k].tolist() for k in (*names, "ego_agents")}
        return self.base_metrics(r), per

    def base_metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        """``base_metrics`` of one actor's fetched rows under this evaluator's env (the
        trial counters when ``trial_counters`` is set)."""
        return base_metrics(rows, self._setup["env"].metrics,
                            trial_counters=bool(self.config.trial_counters))

    # ------------------------------------------------------------------ driver
    def _actors(self, env: Env, policy) -> dict[str, Actor]:
        """``actors`` with the co-player rows driven by the frozen partners of
        ``co_players`` (loaded once per evaluator; ``with_partners``)."""
        actors = self.actors(env, policy)
        if not self.spec.co_players:
            return actors
        if self._partners is None:
            check_partners(self.config)
            paths = expand_co_players(self.spec.co_players, key="co_players")
            self._partners = [(p.policy, p.params) for p in map(load_policy, paths)]
        return {name: with_partners(env, a, self._partners, self.spec.deterministic)
                for name, a in actors.items()}

    def _build(self, policy, pools: PoolCache | None = None) -> dict:
        """Env, pool, sharding and the jitted rollouts (once per policy object)."""
        key = id(policy)
        if self._setup is not None and self._setup_key == key:
            return self._setup
        env_config = self.env_config()
        env = Env(env_config)
        pool = self._pool(env_config, pools)
        env_params = env.make_params(pool)
        n = pool.size
        ids = self.scenario_ids(n)
        # Every device of every process in a multi-process job (``jax.devices()`` is
        # ordered by process); the local ones otherwise.
        devices = jax.devices() if _multi_process() else jax.local_devices()
        d = len(devices)
        batch = min(self.spec.batch_size, len(ids))
        batch = -(-batch // d) * d
        mesh = Mesh(np.array(devices), ("scenarios",))
        rows = NamedSharding(mesh, PartitionSpec("scenarios"))
        replicated = NamedSharding(mesh, PartitionSpec())
        local_env_params = None
        if _multi_process():
            if jax.process_index() == 0 and self.spec.render.enabled:
                local_env_params = env_params  # process 0 renders alone, on these
            env_params = to_global(env_params, replicated)
        else:
            env_params = jax.device_put(env_params, replicated)
        hook = self.step_hook(env)
        steps = self.num_steps(env)
        runs = {}
        # The rendered (first) actor's rollout also hands out the actions of the rows
        # its videos show, so that they replay exactly the recorded episodes.
        keep = min(self.spec.render.num_scenarios, batch) if self.spec.render.enabled else 0
        for n, (actor_name, actor) in enumerate(self._actors(env, policy).items()):
            fn = make_episode_rollout(env, actor, steps, *(hook or (None, None)),
                                      should_stop=self.should_stop(env),
                                      keep_actions=keep if n == 0 else 0)
            runs[actor_name] = jax.jit(fn)
        # Compiled once, at the first batch (ahead of time: its compile time is measured).
        compiled: dict = {}
        self._setup = dict(env=env, env_params=env_params, ids=ids, batch=batch,
                           pool_names=self._scene_names,
                           rows=rows, replicated=replicated, runs=runs, compiled=compiled,
                           steps=steps, local_env_params=local_env_params, keep=keep,
                           rendered=np.zeros((0,), np.int64), kept={})
        self._setup_key = key
        return self._setup

    def output_dir(self, out_dir: str | Path) -> Path:
        """``out_dir/NAME``, where this evaluator's files go (``NAME`` may be
        ``SECTION/CLASS``).

        Raises:
          UnsafeNameError: the name would leave ``out_dir`` (a part that is empty, ``.``
            or ``..``, an absolute path, a backslash, or a symlink out), whether it came
            through the suite loader or straight through the Python API.
        """
        try:
            parts = [safe_name(p, "name part") for p in self.name.split("/")]
            return confined(out_dir, *parts)
        except UnsafeNameError as e:
            raise UnsafeNameError(f"evaluator {self.name!r} cannot write under the output "
                                  f"directory {out_dir}: {e}; rename its section") from None

    def run(self, policy, params, out_dir: str | Path | None = None, step: int = 0,
            progress: Callable[[int, int], None] | None = None,
            pools: PoolCache | None = None, shard: Shard | None = None) -> EvalResult:
        """Evaluate ``params`` of ``policy``; never raises (a failure is a ``failed``
        result with the error). Videos go to ``out_dir/NAME/render/VIEW/`` when the
        spec's render section is enabled and ``out_dir`` is given. ``pools`` shares
        scenario pools with the other evaluators of a suite. ``shard``: play only that
        shard's batches (``Shard.batches``); the result then holds no metrics but the
        batches' rows for ``jaxdrive.eval.merge.merge_results`` (videos: shard 0 only)."""
        result = EvalResult(name=self.name, type=self.type_name,
                            config=dict(self.spec.resolved))
        t0 = time.perf_counter()
        try:
            if self.spec.render.enabled and out_dir is not None:
                self.output_dir(out_dir)  # an unsafe name fails before the rollouts
            self._evaluate(policy, params, result, out_dir, step, progress, pools, shard)
        except Exception as e:  # a failing evaluator must not stop the others
            result.status = "failed"
            result.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        result.eval_seconds = time.perf_counter() - t0
        return result

    def _evaluate(self, policy, params, result: EvalResult, out_dir, step, progress, pools,
                  shard: Shard | None = None):
        s = self._build(policy, pools)
        s["rendered"], s["kept"] = self.rendered_positions(step), {}
        total = self.num_batches() * self.num_rollouts()
        indices = range(total) if shard is None else shard.batches(total)
        fetched: dict[str, list] = {name: [] for name in s["runs"]}
        key = jax.random.key(self.spec.seed)
        placed = _replicate(params, s["replicated"])  # unchanged on one device
        done = 0
        for name in s["runs"]:
            for i in indices:
                fetched[name].append(self._run_batch(name, placed, i, key, result))
                done += 1
                if progress is not None:
                    progress(done, len(indices) * len(s["runs"]))
        if shard is None:
            self.finish(result, fetched)
        else:
            self._finish_shard(result, fetched, indices)
        if (self.spec.render.enabled and out_dir is not None
                and (shard is None or shard.id == 0) and jax.process_index() == 0):
            # Process 0 of a job renders alone: on its local parameters.
            result.videos = self._render(policy, params if _multi_process() else placed,
                                         out_dir, step)

    def rendered_positions(self, step: int) -> np.ndarray:
        """(n,) positions in ``scenario_ids`` of the scenarios the videos show (first
        rollout): the first ``render.num_scenarios`` or, with ``render.seed``, as many
        drawn with (seed, ``step``), so that each evaluation shows other scenes. Empty
        when rendering is off (after ``_build``)."""
        r = self.spec.render
        if not r.enabled:
            return np.zeros((0,), np.int64)
        total = len(self._setup["ids"])
        n = min(r.num_scenarios, total)
        if r.seed is None:
            return np.arange(n)
        rng = np.random.default_rng([int(r.seed), int(step)])
        return np.sort(rng.choice(total, size=n, replace=False))

    def num_batches(self) -> int:
        """Batches one rollout of the scenario set takes (after ``_build``)."""
        return -(-len(self._setup["ids"]) // self._setup["batch"])

    def _run_batch(self, name: str, params, i: int, key, result: EvalResult):
        """Batch ``i`` (over rollouts: rollout ``i // num_batches``) of actor ``name``:
        (its rows, padding included, as NumPy; its step-hook reduction or None)."""
        s = self._setup
        ids, batch = s["ids"], s["batch"]
        b = i % self.num_batches()
        chunk = ids[b * batch:(b + 1) * batch]
        valid = np.zeros((batch,), bool)
        valid[:len(chunk)] = True
        padded = np.zeros((batch,), np.int32)
        padded[:len(chunk)] = chunk
        if _multi_process():  # each process supplies the rows its devices hold
            args = (params, s["env_params"], to_global(padded, s["rows"]),
                    to_global(valid, s["rows"]),
                    to_global(jax.random.fold_in(key, i), s["replicated"]))
        else:
            args = (params, s["env_params"], jax.device_put(padded, s["rows"]),
                    jax.device_put(valid, s["rows"]), jax.random.fold_in(key, i))
        keep = s["keep"] if name == next(iter(s["runs"])) else 0
        shown = [int(j) for j in s["rendered"] if i < self.num_batches() and j // batch == b]
        if keep:  # the rows whose actions the videos replay (padded with row 0)
            rows = np.zeros((keep,), np.int32)
            rows[:len(shown)] = [j % batch for j in shown]
            args = args + (to_global(rows, s["replicated"]) if _multi_process()
                           else jax.device_put(rows, s["replicated"]),)
        if name not in s["compiled"]:
            tc = time.perf_counter()
            s["compiled"][name] = s["runs"][name].lower(*args).compile()
            result.compile_seconds += time.perf_counter() - tc
        out = _fetch(s["compiled"][name](*args))
        record, extra = out[:2]
        if keep and shown:
            keys = jax.random.key_data(reset_keys(jax.random.fold_in(key, i), batch)[0])
            for m, j in enumerate(shown):
                s["kept"][j] = (out[2][m], np.asarray(keys[j % batch]))
        return record.rows(), extra

    def finish(self, result: EvalResult, fetched: dict[str, list],
               rollouts: int | None = None) -> None:
        """Episodes, metrics and per-scenario lists of ``result`` from every batch of
        every actor, in batch order (``fetched``: actor -> [(rows, extra)]; the rows with
        padding and ``valid``). Needs ``_setup`` to hold ``env``, ``ids`` and ``batch``
        (``jaxdrive.eval.shards`` sets just these to merge shards); ``rollouts``: default
        ``num_rollouts()``."""
        rows, extras = {}, {}
        for name, batches in fetched.items():
            cat = {f: np.concatenate([b[0][f] for b in batches]) for f in batches[0][0]}
            valid = cat.pop("valid")
            rows[name] = {f: v[valid] for f, v in cat.items()}
            ex = [b[1] for b in batches]
            extras[name] = None if ex[0] is None else jax.tree.map(
                lambda *xs, valid=valid: np.concatenate(xs)[valid], *ex)
            result.episodes.extend(self._episodes(name, rows[name], trials=result.trials))
        ids = self._setup["ids"]
        rollouts = self.num_rollouts() if rollouts is None else rollouts
        result.metrics, result.per_scenario = self.aggregate(rows, extras)
        result.per_scenario["scenario_id"] = [int(i) for i in ids] * rollouts
        names = self._setup.get("pool_names")
        if names is not None:  # scenes from files: their own (WOMD) scenario ids
            result.per_scenario["scenario_name"] = [names[int(i)] for i in ids] * rollouts
        if rollouts > 1:
            result.per_scenario["rollout"] = [r for r in range(rollouts) for _ in ids]

    def _finish_shard(self, result: EvalResult, fetched: dict[str, list],
                      indices: range) -> None:
        """A shard's result: its episode records (numbered as in the serial run) and, for
        ``jaxdrive.eval.merge.merge_results``, every batch's rows; no metrics."""
        from jaxdrive.eval.shards import encode_tree

        s = self._setup
        nb, batch, per_rollout = self.num_batches(), s["batch"], len(s["ids"])
        actors = {}
        for name, batches in fetched.items():
            actors[name] = []
            for i, (rows, extra) in zip(indices, batches, strict=True):
                valid = rows["valid"]
                kept = {f: v[valid] for f, v in rows.items() if f != "valid"}
                r, b = divmod(i, nb)
                j = r * per_rollout + b * batch + np.flatnonzero(valid)
                result.episodes.extend(self._episodes(name, kept, j, trials=result.trials))
                actors[name].append({"index": i, "rows": encode_tree(rows),
                                     "extra": encode_tree(extra)})
        result.shard = {"ids": [int(i) for i in s["ids"]], "batch": batch,
                        "names": s.get("pool_names"),
                        "rollouts": self.num_rollouts(), "num_batches": nb * self.num_rollouts(),
                        "indices": list(indices), "actors": actors}

    def _episodes(self, actor_name: str, rows: dict[str, np.ndarray],
                  positions: np.ndarray | None = None,
                  trials: list[dict] | None = None) -> list[dict]:
        """Records of ``rows`` (valid rows only): each row's counted episode, then the
        later ones its env completed (``episode_spans``); ``positions``: each row's place
        among the serial run's valid rows of this actor (default 0, 1, ...). In trial
        mode, each completed episode's trial outcomes are appended to ``trials``."""
        out = []
        batch = self._setup["batch"]
        per_rollout = len(self._setup["ids"])
        counts = [m.count for m in episode_metrics(self._setup["env"].metrics)]
        trial_mode = self._setup["env"].trial_mode
        names = self._setup.get("pool_names")
        pending = []
        for n in range(len(rows["scenario_id"])):
            j = n if positions is None else int(positions[n])
            r, k = divmod(j, per_rollout)
            row = {f: v[n] for f, v in rows.items()}
            for span in episode_spans(row):
                py = {f: _python(v) for f, v in span.items()}
                head = {"actor": actor_name, "rollout": r, "env_index": k % batch,
                        "batch": k // batch, "scenario_id": py["scenario_id"],
                        **({} if names is None else
                           {"scenario_name": names[py["scenario_id"]]}),
                        "start_step": py["start_step"], "end_step": py["end_step"]}
                rec = {**head, "outcome": outcome(py), "ego_agents": py["ego_agents"],
                       **{c: py[c] for c in counts}, "return": py["return_sum"]}
                assert rec["outcome"] in OUTCOMES
                out.append(rec)
                if trial_mode and trials is not None and py["finished"]:
                    pending.append((head, py))
        if pending:
            scores = np.asarray(episode_trial_scores(
                np.array([p["trial_reached"] for _, p in pending], np.int32),
                np.array([p["ego_agents"] for _, p in pending], np.int32)))
            for (head, py), score in zip(pending, scores, strict=True):
                trials.append({**head, "ego_agents": py["ego_agents"],
                               "trial_score": score.tolist(),
                               **{f: py[f] for f in TRIAL_FIELDS if f != "trial_reached"}})
        return out

    def _render(self, policy, params, out_dir, step) -> list[str]:
        """Videos of the rendered rows: their recorded actions replayed from their reset
        keys (``replay_actor``), so each video shows exactly the episodes its env's
        records describe; at most the rollout's ``T + 1`` frames."""
        del policy, params  # the recorded actions drive the replay
        s = self._setup
        r = self.spec.render
        order = [int(j) for j in s["rendered"] if int(j) in s["kept"]]
        if not order:
            return []
        ids = s["ids"][order]
        env = s["env"]
        if s.get("recorder") is None or s["recorder"].config.num_envs != len(ids):
            video = VideoConfig(num_envs=len(ids), num_steps=r.steps, views=r.views,
                                width=r.width, height=r.height)
            s["recorder"] = Recorder(env, replay_actor(env), video)
        recorder = s["recorder"]
        frames = min(r.steps or episode_steps(env), s["steps"] + 1)
        actions = jnp.asarray(np.stack([s["kept"][j][0] for j in order]))
        keys = jax.random.wrap_key_data(jnp.asarray(np.stack([s["kept"][j][1]
                                                              for j in order])))
        # In a multi-process job process 0 renders alone, on its local copies.
        env_params = s["local_env_params"] if _multi_process() else s["env_params"]
        with VideoSink(recorder, self.output_dir(out_dir), "render", step,
                       env_indices=[int(i) for i in ids]) as sink:
            record(recorder, actions, env_params, ids, frames, sink,
                   jax.random.key(self.spec.seed), reset_keys=keys)
        return [str(sink.paths[(int(i), v)]) for i in ids for v in r.views]


def _python(value):
    """A NumPy scalar or array as a Python scalar or (nested) list."""
    a = np.asarray(value)
    return a.item() if a.ndim == 0 else a.tolist()

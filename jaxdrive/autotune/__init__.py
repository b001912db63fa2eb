"""Pick ``train.num_envs`` (and an eval ``batch_size``) for the devices at hand.

``python -m jaxdrive.autotune --config FILE`` (``jaxdrive.autotune.cli``):

1. ``probe_devices``: platform, device kind, device and process counts, and the memory
   budget per device: the accelerator's ``bytes_limit`` (``Device.memory_stats``), or on
   CPU (no memory stats) the host's available RAM (``MemAvailable`` of /proc/meminfo,
   else total RAM), which the report says.
2. ``tune_training``: for each candidate ``num_envs`` (doubling, multiples of the device
   count), the training step (``PPO.train_step`` placed by ``Placement``) is compiled
   ahead of time from abstract shapes, so nothing is allocated before its memory is
   known. Compiled memory per device = arguments + outputs - donated aliases +
   temporaries (``Compiled.memory_analysis``; None where the backend gives none). A
   candidate whose compiled memory exceeds ``fraction`` of the budget is not run and
   the sweep stops there (larger ones need more). Otherwise the state is built, one
   warm-up iteration runs, then ``repeats`` timed iterations (median). The sweep also
   stops when agent-steps/s improved by less than ``1.05x`` over the previous candidate
   twice in a row (the device is saturated).
3. ``recommend`` (the rule): among the candidates that ran and fit (compiled memory at
   most ``fraction`` = 80% of the budget, or unknown), the largest ``num_envs`` whose
   agent-steps/s is at least ``tolerance`` = 90% of the best measured. Larger batches
   of about the same speed are preferred: more samples per update at no cost in wall
   time per agent-step.

Only ``train.num_envs`` changes in the recommended command. ``train.minibatches`` is kept
(the same number of gradient steps per epoch, each on proportionally more rows;
candidates whose agent rows, or rows per shuffle group, it does not divide are skipped) and so is
``train.total_steps`` (agent-steps), so the run covers the same experience in fewer,
larger iterations.

``tune_eval`` does the same for the rollout of a ``multi_scenario`` evaluator on the
config's env (one batch of ``batch_size`` scenarios, one episode), recommended with the
same rule as a ``batch_size:`` for the suite file's sections.
"""

from __future__ import annotations

import os
import shlex
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jaxdrive.config import ConfigError
from jaxdrive.env import Env
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import RunConfig
from jaxdrive.train.placement import Placement, default_mesh, procedural_params
from jaxdrive.train.ppo import PPO
from jaxdrive.types import merge_rows

FRACTION = 0.8  # of the memory budget a recommended setting may use
TOLERANCE = 0.9  # of the best agent-steps/s a recommended setting must reach
PLATEAU_GAIN = 1.05  # a doubling that gains less than this ...
PLATEAU_PATIENCE = 2  # ... this many times in a row ends the sweep
MB = 2**20


def probe_devices() -> dict:
    """The devices of this job and the memory budget of one device.

    Returns:
      dict: platform, kind (device kind), count (all devices), local_count, processes,
      memory_bytes (budget per device, or None), memory_source (where it came from).
    """
    dev = jax.local_devices()[0]
    stats = None
    try:
        stats = dev.memory_stats()
    except Exception:  # some backends raise instead of returning None
        stats = None
    if stats and stats.get("bytes_limit"):
        memory, source = int(stats["bytes_limit"]), "device memory (bytes_limit)"
    else:
        memory, source = host_memory()
    return {"platform": jax.default_backend(), "kind": dev.device_kind,
            "count": jax.device_count(), "local_count": jax.local_device_count(),
            "processes": jax.process_count(), "memory_bytes": memory,
            "memory_source": source}


def host_memory() -> tuple[int | None, str]:
    """(bytes, source): the host RAM available now (/proc/meminfo MemAvailable), else the
    total RAM (``os.sysconf``), else (None, why)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "host RAM available (no device stats)"
    except OSError:
        pass
    try:
        return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                "host RAM total (no device stats)")
    except (ValueError, OSError, AttributeError):
        return None, "unknown (no device stats, no host RAM figure)"


def compiled_memory(compiled) -> tuple[int | None, str | None]:
    """(bytes per device, None) for a ``jax.stages.Compiled``: arguments + outputs -
    donated aliases + temporaries; (None, why) when the backend reports nothing."""
    try:
        m = compiled.memory_analysis()
    except Exception as e:  # not implemented on some backends
        return None, f"memory_analysis failed: {type(e).__name__}"
    if m is None:
        return None, "memory_analysis() returned None on this backend"
    total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes)
    return int(total), None


def env_candidates(config: RunConfig, devices: int, start: int | None = None,
                   max_envs: int | None = None) -> list[int]:
    """num_envs to try: ``start`` (default a quarter of the config's) rounded up to a
    multiple of ``devices``, doubled up to ``max_envs`` (default 8x the config's; the
    first candidate is always tried)."""
    n = config.train.num_envs
    return _doubling(start or n // 4, max_envs or 8 * n, devices)


def _doubling(start: int, stop: int, multiple: int) -> list[int]:
    """``start`` rounded up to a multiple of ``multiple``, doubled while <= ``stop`` (at
    least the first)."""
    v = -(-max(start, 1) // multiple) * multiple
    out = [v]
    while 2 * v <= stop:
        v *= 2
        out.append(v)
    return out


def _with_envs(config: RunConfig, num_envs: int) -> RunConfig:
    return config.replace(train=config.train.replace(num_envs=num_envs))


def _memory_fields(mem: int | None, why: str | None, budget: int | None,
                   fraction: float) -> dict:
    fits = None if mem is None or budget is None else mem <= fraction * budget
    return {"memory_bytes": mem, "memory_mb": None if mem is None else mem / MB,
            "memory_note": why, "fits": fits}


def tune_training(config: RunConfig, candidates: Sequence[int], repeats: int = 3,
                  budget: int | None = None, fraction: float = FRACTION,
                  log: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Compile and time the training step for each ``num_envs`` in ``candidates``.

    Args:
      config: the run config (its ``num_envs`` is replaced by each candidate).
      candidates: increasing num_envs (multiples of the device count).
      repeats: timed iterations after a warm-up one; the median is reported.
      budget: memory per device in bytes (None: unknown, nothing is skipped).
      fraction: a candidate above ``fraction * budget`` is not run and ends the sweep.
      log: progress lines.

    Returns:
      One record per candidate tried (see the module doc): num_envs, status ("ok",
      "skipped": config invalid, "too_large": over the budget fraction), compile_s,
      iteration_s, agent_steps_per_s, trained_steps_per_s, memory_bytes/memory_mb (None
      with memory_note when unknown), fits, and stop_reason on the last one when the
      sweep ended early.
    """
    mesh = default_mesh()
    t = config.train
    env = Env(config.env)
    pool = procedural_params(config, env, t.seed, t.num_scenes)
    policy = Policy.for_env(config.policy, env)
    records: list[dict] = []
    flat = 0
    for n in candidates:
        rec = {"num_envs": n, "agent_steps_per_iteration":
               n * config.env.num_rows * t.rollout_steps}
        records.append(rec)
        try:
            c = _with_envs(config, n)
            ppo = PPO(c, env, policy, mesh=mesh)  # checks the rows per shuffle group
        except ConfigError as e:
            rec.update(status="skipped", reason=str(e))
            log(f"num_envs={n}: skipped ({e})")
            continue
        placement = Placement(ppo)
        env_params = placement.env_params(pool)
        step = placement.jit_step(ppo.train_step, env_params, donate=True)
        tic = time.perf_counter()
        abstract = jax.eval_shape(ppo.init, jax.random.key(0), env_params)
        if mesh is not None:
            abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                      sharding=s),
                                    abstract, placement.shardings(env_params))
        compiled = step.lower(abstract, env_params).compile()
        rec["compile_s"] = time.perf_counter() - tic
        rec.update(_memory_fields(*compiled_memory(compiled), budget, fraction))
        if rec["fits"] is False:
            rec.update(status="too_large", stop_reason=(
                f"compiled memory {rec['memory_mb']:,.0f} MB > {fraction:.0%} of the "
                f"{budget / MB:,.0f} MB budget: not run; larger num_envs need more"))
            log(f"num_envs={n}: {rec['stop_reason']}")
            break
        state = placement.init(t.seed + 1, env_params)
        state, metrics = compiled(state, env_params)  # warm-up
        jax.device_get(metrics)
        times, valid = [], []
        for _ in range(repeats):
            tic = time.perf_counter()
            state, metrics = compiled(state, env_params)
            m = jax.device_get(metrics)
            times.append(time.perf_counter() - tic)
            valid.append(float(m["rollout/valid_steps"]))
        del state
        dt = statistics.median(times)
        rec.update(status="ok", iteration_s=dt, iteration_s_all=times,
                   agent_steps_per_s=rec["agent_steps_per_iteration"] / dt,
                   trained_steps_per_s=statistics.median(valid) / dt)
        log(f"num_envs={n}: compile {rec['compile_s']:.1f} s, iteration {dt:.3f} s, "
            f"{rec['agent_steps_per_s']:,.0f} agent-steps/s")
        flat = _plateau(records, flat)
        if flat >= PLATEAU_PATIENCE:
            rec["stop_reason"] = (f"agent-steps/s grew less than {PLATEAU_GAIN}x for "
                                  f"{PLATEAU_PATIENCE} doublings in a row")
            log(f"stopping: {rec['stop_reason']}")
            break
    return records


def _plateau(records: list[dict], flat: int) -> int:
    """Consecutive candidates (ending with the last record) that gained less than
    ``PLATEAU_GAIN`` in agent-steps/s over the previous measured one."""
    ok = [r for r in records if r.get("status") == "ok"]
    if len(ok) < 2:
        return 0
    gain = ok[-1]["agent_steps_per_s"] / ok[-2]["agent_steps_per_s"]
    return flat + 1 if gain < PLATEAU_GAIN else 0


def recommend(records: Sequence[dict], key: str = "num_envs", tolerance: float = TOLERANCE
              ) -> dict | None:
    """The rule of the module doc: among records with status "ok" and ``fits`` not
    False, the largest ``key`` whose agent-steps/s >= ``tolerance`` x the best.

    Returns:
      {key: value, "agent_steps_per_s", "best_" + key, "best_agent_steps_per_s",
      "reason"} or None when nothing ran and fit.
    """
    ok = [r for r in records if r.get("status") == "ok" and r.get("fits") is not False]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["agent_steps_per_s"])
    fast = [r for r in ok if r["agent_steps_per_s"] >= tolerance * best["agent_steps_per_s"]]
    pick = max(fast, key=lambda r: r[key])
    if pick.get("memory_mb") is None:
        memory = "compiled memory unknown"
    elif pick.get("fits"):
        memory = f"{pick['memory_mb']:,.1f} MB compiled memory, fits the budget"
    else:
        memory = f"{pick['memory_mb']:,.1f} MB compiled memory (budget unknown)"
    reason = (f"largest {key} within {1 - tolerance:.0%} of the best measured "
              f"agent-steps/s ({best['agent_steps_per_s']:,.0f} at {key}="
              f"{best[key]}): {pick['agent_steps_per_s']:,.0f} agent-steps/s, {memory}")
    return {key: pick[key], "agent_steps_per_s": pick["agent_steps_per_s"],
            "best_" + key: best[key], "best_agent_steps_per_s": best["agent_steps_per_s"],
            "memory_mb": pick.get("memory_mb"), "reason": reason}


def train_command(config_arg: str, overrides: Sequence[str], num_envs: int) -> str:
    """The paste-ready ``python -m jaxdrive.train`` line: the same config and ``--set``
    overrides (any ``train.num_envs`` among them replaced) plus
    ``--set train.num_envs=NUM_ENVS``."""
    sets = [o for o in overrides if o.split("=", 1)[0].strip() != "train.num_envs"]
    sets.append(f"train.num_envs={num_envs}")
    parts = ["python", "-m", "jaxdrive.train", "--config", config_arg]
    for s in sets:
        parts += ["--set", s]
    return shlex.join(parts)


def batch_candidates(start: int, max_batch: int, devices: int) -> list[int]:
    """Eval batch sizes: ``min(start, max_batch)`` rounded up to a multiple of the local
    device count (as the evaluators round them), doubled up to ``max_batch``."""
    return _doubling(min(start, max_batch), max_batch, devices)


def tune_eval(config: RunConfig, candidates: Sequence[int], repeats: int = 3,
              budget: int | None = None, fraction: float = FRACTION,
              log: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Compile and time one batch of a ``multi_scenario`` evaluator (the config's env
    and procedural scenes, one episode, a freshly initialised policy) for each
    ``batch_size`` in ``candidates``; records and stopping as ``tune_training`` (key
    ``batch_size``; agent-steps = batch x steps x agent slots)."""
    records: list[dict] = []
    flat = 0
    policy = params = None
    for b in candidates:
        section = {"type": "multi_scenario", "num_scenarios": b, "batch_size": b}
        specs = load_suite_specs({"eval": {"autotune": section}}, config.env,
                                 config.procedural)
        (ev,) = make_evaluators(specs.values())
        env = Env(ev.env_config())
        if policy is None:
            policy = Policy.for_env(config.policy, env)
        s = ev._build(policy)
        if params is None:
            _, ts = jax.jit(env.reset_batch, static_argnums=2)(s["env_params"],
                                                               jax.random.key(0), 1)
            obs = merge_rows(ts.obs)
            params = policy.init(jax.random.key(1), obs)
        name, run = next(iter(s["runs"].items()))
        batch = s["batch"]
        ids = np.resize(np.asarray(s["ids"], np.int32), (batch,))
        args = (params, s["env_params"], jax.device_put(ids, s["rows"]),
                jax.device_put(np.ones((batch,), bool), s["rows"]), jax.random.key(2))
        rec = {"batch_size": batch, "steps": s["steps"],
               "agent_steps_per_batch": batch * s["steps"] * env.num_rows}
        records.append(rec)
        tic = time.perf_counter()
        compiled = run.lower(*args).compile()
        rec["compile_s"] = time.perf_counter() - tic
        rec.update(_memory_fields(*compiled_memory(compiled), budget, fraction))
        if rec["fits"] is False:
            rec.update(status="too_large", stop_reason=(
                f"compiled memory {rec['memory_mb']:,.0f} MB > {fraction:.0%} of the "
                f"{budget / MB:,.0f} MB budget: not run"))
            log(f"eval batch_size={batch}: {rec['stop_reason']}")
            break
        jax.block_until_ready(compiled(*args))  # warm-up
        times = []
        for _ in range(repeats):
            tic = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - tic)
        dt = statistics.median(times)
        rec.update(status="ok", batch_s=dt, batch_s_all=times,
                   agent_steps_per_s=rec["agent_steps_per_batch"] / dt)
        log(f"eval batch_size={batch}: compile {rec['compile_s']:.1f} s, batch {dt:.3f} s, "
            f"{rec['agent_steps_per_s']:,.0f} agent-steps/s")
        flat = _plateau(records, flat)
        if flat >= PLATEAU_PATIENCE:
            rec["stop_reason"] = (f"agent-steps/s grew less than {PLATEAU_GAIN}x for "
                                  f"{PLATEAU_PATIENCE} doublings in a row")
            log(f"stopping: {rec['stop_reason']}")
            break
    return records


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def training_table(records: Sequence[dict]) -> str:
    """``tune_training`` records as a fixed-width text table."""
    head = (f"{'num_envs':>9}{'compile s':>11}{'iter s':>9}{'agent-steps/s':>15}"
            f"{'trained/s':>11}{'memory MB':>11}{'fits':>6}  status")
    rows = [head, "-" * len(head)]
    for r in records:
        fits = {None: "?", True: "yes", False: "no"}[r.get("fits")]
        rows.append(f"{r['num_envs']:>9}{_num(r.get('compile_s'), '.1f'):>11}"
                    f"{_num(r.get('iteration_s'), '.3f'):>9}"
                    f"{_num(r.get('agent_steps_per_s'), ',.0f'):>15}"
                    f"{_num(r.get('trained_steps_per_s'), ',.0f'):>11}"
                    f"{_num(r.get('memory_mb'), ',.1f'):>11}{fits:>6}  {r.get('status')}")
    return "\n".join(rows)


def eval_table(records: Sequence[dict]) -> str:
    """``tune_eval`` records as a fixed-width text table."""
    head = (f"{'batch':>9}{'compile s':>11}{'batch s':>9}{'agent-steps/s':>15}"
            f"{'memory MB':>11}{'fits':>6}  status")
    rows = [head, "-" * len(head)]
    for r in records:
        fits = {None: "?", True: "yes", False: "no"}[r.get("fits")]
        rows.append(f"{r['batch_size']:>9}{_num(r.get('compile_s'), '.1f'):>11}"
                    f"{_num(r.get('batch_s'), '.3f'):>9}"
                    f"{_num(r.get('agent_steps_per_s'), ',.0f'):>15}"
                    f"{_num(r.get('memory_mb'), ',.1f'):>11}{fits:>6}  {r.get('status')}")
    return "\n".join(rows)


def device_line(info: dict) -> str:
    """One line naming the devices and the memory budget."""
    mem = info["memory_bytes"]
    mem = "unknown" if mem is None else f"{mem / MB:,.0f} MB"
    return (f"devices: {info['count']} x {info['kind']} ({info['platform']}), "
            f"{info['processes']} process(es); memory budget per device {mem} "
            f"[{info['memory_source']}]")


__all__ = ["FRACTION", "TOLERANCE", "batch_candidates", "compiled_memory", "device_line",
           "env_candidates", "eval_table", "host_memory", "probe_devices", "recommend",
           "train_command", "training_table", "tune_eval", "tune_training"]

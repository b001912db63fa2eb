"""Policy throughput for ``python -m jaxdrive.bench policy``.

Times the two paths of a policy at the default observation sizes (63 partner, 200
road and 4 traffic-light tokens):

- step: a ``lax.scan`` of ``steps`` rollout steps of ``batch`` agents over distinct
  observations, the cache carried (donated) from step to step, as in a rollout;
- sequence: the training path on ``batch // seq_len`` segments of ``seq_len`` steps with
  a full cache as context, i.e. ``batch`` agent-steps per call (forward only).

Reports agent-steps/s (median of the timed calls), parameter count and XLA's FLOP
estimate per agent-step for each path.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.models.policy import Policy, PolicyConfig, param_count
from jaxdrive.types import (
    EGO_FEATURES,
    LIGHT_FEATURES,
    PARTNER_FEATURES,
    ROAD_FEATURES,
    LightFeature,
    Observation,
    PartnerFeature,
    RoadFeature,
)


def random_observation(key, lead, partners, road_obs, lights) -> Observation:
    """Observation with normal features and ~70% valid tokens of random types;
    ``partners``, ``road_obs`` and ``lights`` token slots (an env's ``num_partners``,
    ``num_road``, ``num_lights``)."""
    k = jax.random.split(key, 5)
    p_valid = (jax.random.uniform(k[1], lead + (partners,)) < 0.7).astype(jnp.float32)
    p_type = jax.random.randint(k[1], lead + (partners,), 1, 5).astype(jnp.float32)
    p = jax.random.normal(k[0], lead + (PARTNER_FEATURES, partners), jnp.float32)
    p = p.at[..., PartnerFeature.VALID, :].set(p_valid)
    p = p.at[..., PartnerFeature.TYPE, :].set(p_type)
    r_valid = (jax.random.uniform(k[3], lead + (road_obs,)) < 0.7).astype(jnp.float32)
    r_type = jax.random.randint(k[3], lead + (road_obs,), 1, 8).astype(jnp.float32)
    r = jax.random.normal(k[2], lead + (ROAD_FEATURES, road_obs), jnp.float32)
    r = r.at[..., RoadFeature.VALID, :].set(r_valid)
    r = r.at[..., RoadFeature.TYPE, :].set(r_type)
    kl = jax.random.split(jax.random.fold_in(key, 1), 2)
    g_valid = (jax.random.uniform(kl[1], lead + (lights,)) < 0.7).astype(jnp.float32)
    g_type = jax.random.randint(kl[1], lead + (lights,), 1, 4).astype(jnp.float32)
    g = jax.random.normal(kl[0], lead + (LIGHT_FEATURES, lights), jnp.float32)
    g = g.at[..., LightFeature.VALID, :].set(g_valid)
    g = g.at[..., LightFeature.TYPE, :].set(g_type)
    return Observation(ego=jax.random.normal(k[4], lead + (EGO_FEATURES,), jnp.float32),
                       partners=p, road=r, lights=g)


def _flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    return None if not cost or "flops" not in cost else float(cost["flops"])


def _time(fn, args, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return times


def bench_policy(kind: str, batch: int, partners: int = 63, road_obs: int = 200,
                 steps: int = 8, seq_len: int = 32, repeats: int = 5,
                 config: PolicyConfig | None = None, num_actions: int = 91,
                 lights: int = 4) -> dict:
    """Time one policy configuration (``lights``: traffic-light token slots); returns a
    JSON-ready record."""
    config = (config or PolicyConfig()).replace(kind=kind)
    policy = Policy(config, num_actions=num_actions)
    key = jax.random.key(0)
    obs = random_observation(key, (batch,), partners, road_obs, lights)
    params = jax.jit(policy.init)(key, obs)
    no = jnp.zeros((batch,), bool)

    def rollout(cache, obs_seq):
        # Fresh observations every step: with one fixed observation XLA would hoist the
        # encoder out of the loop.
        def body(cache, obs):
            out, cache = policy.step(params, cache, obs, no, no)
            return cache, out.value

        return jax.lax.scan(body, cache, obs_seq)

    step_fn = jax.jit(rollout, donate_argnums=0)
    # FLOPs from a single step: XLA's estimate counts a scan body once.
    step_compiled = jax.jit(policy.step).lower(params, policy.init_cache(batch), obs, no,
                                               no).compile()
    t0 = time.perf_counter()
    cache = policy.init_cache(batch)
    obs_seq = random_observation(jax.random.key(2), (steps, batch), partners, road_obs,
                                 lights)
    cache, _ = step_fn(cache, obs_seq)  # warm-up; its cache (slots in use) is reused below
    jax.block_until_ready(cache)
    step_compile_s = time.perf_counter() - t0
    step_times = []
    for _ in range(repeats):
        t = time.perf_counter()
        cache, v = step_fn(cache, obs_seq)
        jax.block_until_ready(v)
        step_times.append(time.perf_counter() - t)

    rows = max(1, batch // seq_len)
    seg = random_observation(jax.random.key(1), (rows, seq_len), partners, road_obs, lights)
    context = jax.tree.map(lambda x: x[:, :rows] if x.ndim == 5 else x[:rows], cache)
    masks = jnp.zeros((rows, seq_len), bool)
    seq_fn = jax.jit(policy.sequence)
    t0 = time.perf_counter()
    seq_compiled = seq_fn.lower(params, context, seg, masks, masks).compile()
    jax.block_until_ready(seq_fn(params, context, seg, masks, masks))
    seq_compile_s = time.perf_counter() - t0
    seq_times = _time(seq_fn, (params, context, seg, masks, masks), repeats)

    step_flops = _flops(step_compiled)
    seq_flops = _flops(seq_compiled)
    return {
        "policy": kind, "batch": batch, "partners": partners, "road_obs": road_obs,
        "lights": lights,
        "params": param_count(params), "config": config.to_dict(),
        "step_agent_steps_per_s": batch * steps / float(np.median(step_times)),
        "sequence_agent_steps_per_s": rows * seq_len / float(np.median(seq_times)),
        "seq_len": seq_len, "sequence_rows": rows, "steps_per_call": steps,
        "step_flops_per_agent_step": None if step_flops is None else step_flops / batch,
        "sequence_flops_per_agent_step": None if seq_flops is None
        else seq_flops / (rows * seq_len),
        "step_times_s": step_times, "sequence_times_s": seq_times,
        "step_compile_s": step_compile_s, "sequence_compile_s": seq_compile_s,
    }


def policy_table(records: list[dict]) -> str:
    """The ``bench_policy`` records as a fixed-width text table."""
    head = (f"{'policy':>11} {'batch':>6} {'params':>8} {'step agent-steps/s':>19} "
            f"{'seq agent-steps/s':>18} {'kFLOP/agent-step':>17}")
    rows = [head, "-" * len(head)]
    for r in records:
        fl = r["step_flops_per_agent_step"]
        rows.append(f"{r['policy']:>11} {r['batch']:>6} {r['params']:>8,} "
                    f"{r['step_agent_steps_per_s']:>19,.0f} "
                    f"{r['sequence_agent_steps_per_s']:>18,.0f} "
                    f"{'n/a' if fl is None else f'{fl / 1e3:,.0f}':>17}")
    return "\n".join(rows)

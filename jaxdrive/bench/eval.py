"""``python -m jaxdrive.bench eval``: time a ``multi_scenario`` or ``realism`` evaluation.

``multi_scenario`` (default): ``scenarios`` procedural scenes at the default sizes (64
agent slots, 4096 road points), each played for ``steps`` steps (``env.init_step`` 0, so
a 91-step log gives a 90-step episode) by a freshly initialised policy (``--policy
transformer`` by default) with every vehicle controlled, ``batch`` scenarios per
compiled call.

``realism`` (``--evaluator realism``): the WOSAC realism evaluator on the same scenes,
``rollouts`` stochastic rollouts of each from ``init_step`` 10 to the end of the log (80
steps), every object simulated, features and scores on device; ``batch`` scenarios
(``batch x rollouts`` environments) per compiled call.

The first evaluation compiles (reported as ``first_s`` with its ``compile_s``); the
median of ``repeats`` later evaluations is the figure, with new parameters each time to
show that they do not recompile.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxdrive.env import Env, EnvConfig
from jaxdrive.eval.evaluators import make_evaluators
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.models.policy import Policy, PolicyConfig
from jaxdrive.scenarios.procedural import ProceduralConfig
from jaxdrive.types import merge_rows


def bench_eval(scenarios: int, steps: int, batch: int, policy_kind: str, repeats: int,
               evaluator: str = "multi_scenario", rollouts: int = 32) -> dict:
    """One benchmark record (see the module doc); ``RuntimeError`` if the first evaluation
    fails."""
    if evaluator == "realism":
        env_config = EnvConfig(init_step=10)
        steps = env_config.num_episode_steps
        section = {"type": "realism", "num_scenarios": scenarios, "batch_size": batch,
                   "num_rollouts": rollouts}
    else:
        env_config = EnvConfig(init_step=0)
        rollouts = 1
        section = {"type": "multi_scenario", "num_scenarios": scenarios,
                   "batch_size": batch, "num_steps": steps}
    specs = load_suite_specs({"eval": {"bench": section}}, env_config, ProceduralConfig())
    (ev,) = make_evaluators(specs.values())
    env = Env(env_config)
    policy = Policy.for_env(PolicyConfig(kind=policy_kind), env)
    t0 = time.perf_counter()
    s = ev._build(policy)
    setup_s = time.perf_counter() - t0
    _, ts = jax.jit(env.reset_batch, static_argnums=2)(s["env_params"], jax.random.key(0), 1)
    obs = merge_rows(ts.obs)
    params = [policy.init(jax.random.key(1 + i), obs) for i in range(repeats + 1)]
    first = ev.run(policy, params[0])
    if first.status != "ok":
        raise RuntimeError(first.error)
    times = []
    for p in params[1:]:
        r = ev.run(policy, p)
        assert r.compile_seconds == 0.0, "evaluation recompiled for new parameters"
        times.append(r.eval_seconds)
    median = float(np.median(times))
    agent_steps = scenarios * rollouts * steps * env_config.scenario.max_agents
    return {
        "evaluator": evaluator, "rollouts": rollouts,
        "scenarios": scenarios, "steps": steps, "batch": batch, "policy": policy_kind,
        "agents": env_config.scenario.max_agents,
        "road_points": env_config.scenario.max_road_points,
        "seconds": median, "seconds_all": times, "first_s": first.eval_seconds,
        "compile_s": first.compile_seconds, "setup_s": setup_s,
        "agent_steps_per_s": agent_steps / median,
        "goal_rate_untrained": first.metrics.get("goal_rate"),
        "meta_metric_untrained": first.metrics.get("meta_metric"),
    }


def eval_table(records: list[dict]) -> str:
    """The ``bench_eval`` records as a fixed-width text table."""
    head = (f"{'evaluator':>14} {'scenarios':>9} {'rollouts':>8} {'steps':>5} {'batch':>5} "
            f"{'policy':>11} {'seconds':>8} {'agent-steps/s':>14} {'first s':>8} "
            f"{'compile s':>9}")
    rows = [head, "-" * len(head)]
    for r in records:
        rows.append(f"{r['evaluator']:>14} {r['scenarios']:>9} {r['rollouts']:>8} "
                    f"{r['steps']:>5} {r['batch']:>5} {r['policy']:>11} "
                    f"{r['seconds']:>8.1f} {r['agent_steps_per_s']:>14,.0f} "
                    f"{r['first_s']:>8.1f} {r['compile_s']:>9.1f}")
    return "\n".join(rows)

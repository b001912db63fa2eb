"""A data-parallel training case, run in a child process by tests/test_train_parallel.py.

    python tests/parallel_case.py DEVICES OUT.npz [DENSE_ROWS]

Sets ``--xla_force_host_platform_device_count=DEVICES`` before JAX starts, trains the
golden PPO configuration (transformer, trial mode, co-players, ``num_envs`` 8) for
three iterations on the ``data`` mesh over all devices (none for DEVICES=1: the plain
single-device program), both with ``train.shuffle_groups: 8``, and writes every
logged metric and the final parameters to OUT.npz, plus OUT.json: where the state's
arrays live and the collectives of the compiled programs (``collectives``).
``DENSE_ROWS`` (e.g. 0.5) sets ``train.dense_rows`` (default: the golden's ``off``).
"""

from __future__ import annotations

import json
import os
import re
import sys

NUM_ITERATIONS = 3
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute",
               "reduce-scatter")


def collectives(hlo: str) -> list[dict]:
    """Every collective of a compiled module's HLO text: its op, how many ``while``
    bodies enclose it (0 = once per call) and its operand shapes."""
    comps, calls, current = {}, {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
            comps[current], calls[current] = [], []
            continue
        if current is None:
            continue
        for kind, name in re.findall(r"(body|condition|to_apply|calls)=%?([\w.\-]+)", line):
            calls[current].append((name, kind == "body"))
        for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
            calls[current] += [(n.strip().lstrip("%"), False) for n in group.split(",")]
        for op in COLLECTIVES:
            if re.search(rf"\b{op}(-start)?\(", line):
                shapes = re.findall(r"[a-z]+\d*\[[\d,]*\]", line.split("=", 1)[1].split(op)[0])
                comps[current].append({"op": op, "shapes": shapes})
    entry = next(n for n in comps if re.search(rf"ENTRY %?{re.escape(n)}\b", hlo))
    depth = {entry: 0}
    stack = [entry]
    while stack:
        c = stack.pop()
        for name, is_body in calls.get(c, ()):
            d = depth[c] + int(is_body)
            if name in comps and depth.get(name, -1) < d:
                depth[name] = d
                stack.append(name)
    return [dict(item, loop_depth=depth.get(c, 0), computation=c)
            for c, items in comps.items() for item in items]


def build(train: dict, mesh):
    """The golden PPO configuration with ``train`` overrides on ``mesh`` (None: one
    device): ``(ppo, placement, env_params, state, step)``, the step jitted for the
    placement without donation. Imports JAX: set ``XLA_FLAGS`` first."""
    from golden_cases import PPO_BASE

    from jaxdrive.config import merge
    from jaxdrive.env import Env
    from jaxdrive.models.policy import Policy
    from jaxdrive.runs.config import RunConfig
    from jaxdrive.train.placement import Placement, procedural_params
    from jaxdrive.train.ppo import PPO

    config = RunConfig.from_dict(merge(PPO_BASE, {"train": train}))
    env = Env(config.env)
    ppo = PPO(config, env, Policy.for_env(config.policy, env), mesh=mesh)
    placement = Placement(ppo)
    env_params = placement.env_params(
        procedural_params(config, env, 0, config.train.num_scenes))
    state = placement.init(0, env_params)
    step = placement.jit_step(ppo.train_step, env_params, donate=False)
    return ppo, placement, env_params, state, step


def main() -> None:
    devices, out = int(sys.argv[1]), sys.argv[2]
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    import numpy as np

    from jaxdrive.parallel import rows_split
    from jaxdrive.train.placement import default_mesh

    # Eight shuffle groups and pool shards on both sides: what 8 devices do by default
    # (``auto``), so the single device draws the same minibatches and scenes.
    mesh = default_mesh()
    train = {"num_envs": 8, "num_scenes": 8, "shuffle_groups": 8, "pool_shards": 8}
    if len(sys.argv) > 3:
        train["dense_rows"] = float(sys.argv[3])
    ppo, placement, env_params, state, step = build(train, mesh)
    report = {"devices": jax.device_count(), "dense_groups": ppo.dense_groups,
              "rollout_capacities": list(ppo.rollout_capacities),
              "update_buffers": [list(b) for b in ppo.update_buffers]}
    pool = jax.tree.leaves(env_params.pool)
    report["pool_bytes"] = sum(x.nbytes for x in pool)
    report["pool_bytes_per_device"] = sum(
        x.addressable_shards[0].data.nbytes if hasattr(x, "addressable_shards") else x.nbytes
        for x in pool)
    if mesh is not None:
        sh = placement.shardings(env_params)
        def rollout_only(state, env_params):  # traced as train_step traces it
            with rows_split():
                return ppo._rollout(state, env_params)

        rollout = jax.jit(rollout_only,
                          in_shardings=(sh, ppo.env_param_shardings(env_params)))
        report["rollout_collectives"] = collectives(
            rollout.lower(state, env_params).compile().as_text())
        report["step_collectives"] = collectives(
            step.lower(state, env_params).compile().as_text())
        report["param_count"] = sum(x.size for x in jax.tree.leaves(state.params))
    values = {}
    for it in range(NUM_ITERATIONS):
        state, metrics = step(state, env_params)
        for k, v in jax.device_get(metrics).items():
            values[f"iter{it}/{k}"] = np.asarray(v)
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params)):
        values["params" + jax.tree_util.keystr(path)] = np.asarray(leaf)
    report["params_replicated"] = all(x.sharding.is_fully_replicated
                                      for x in jax.tree.leaves(state.params))
    report["opt_state_replicated"] = all(x.sharding.is_fully_replicated
                                         for x in jax.tree.leaves(state.opt_state))
    report["env_state_split"] = [len(x.sharding.device_set) for x in
                                 jax.tree.leaves(state.env_state)
                                 if not x.sharding.is_fully_replicated]
    report["env_state_leaves"] = len(jax.tree.leaves(state.env_state))
    np.savez(out, **values)
    with open(out[:-4] + ".json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()

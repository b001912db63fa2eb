"""Memory per device of docs/scale.md's example commands, from the compiled training step
(issue 39, items 1 and 7).

With ``train.shuffle_groups: auto`` each device's memory depends on its own envs, not on
the job (tests/test_train_parallel.py checks this on 8 fake devices), so one device
compiled at a command's envs per device shows what each device of that command holds.
The state and the batch come from the compiled program (``Compiled.memory_analysis``:
arguments + outputs + temporaries, with the state donated as in training); the scene
pool is counted at the command's ``train.num_scenes`` over its devices
(``train.pool_shards: auto`` splits it over them; the compile uses a few scenes and the
pool's bytes grow linearly with them).

Measured on the CPU backend: GPU and TPU compilers lay out temporaries differently, so
read the numbers as the size of the job per device, not to the last GB.

Usage: python experiments/pod_memory.py [--config configs/selfplay_gpu.yaml]
       [--case LABEL ENVS_PER_DEVICE DEVICE_GB ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import jax

from jaxdrive.env import Env
from jaxdrive.models.policy import Policy
from jaxdrive.runs.config import RunConfig, load_run_config
from jaxdrive.train.placement import procedural_params
from jaxdrive.train.ppo import PPO

GIB = 2**30
# docs/scale.md's commands: (label, envs per device, devices, device memory in GB).
CASES = (("one node, 8 x H100 80 GB, num_envs 4096", 512, 8, 80),
         ("SLURM, 4 nodes x 8 x H100 80 GB, num_envs 16384", 512, 32, 80),
         ("TPU v5e-256 (16 GB a chip), num_envs 65536", 256, 256, 16))
COMPILE_SCENES = 8


def tree_bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(config: RunConfig, envs: int) -> dict:
    """Compiled memory of one device's share: ``envs`` envs, the pool at full size
    (``pool_bytes``; ``total_bytes`` counts it whole)."""
    config = config.replace(train=config.train.replace(num_envs=envs))
    env = Env(config.env)
    params = procedural_params(config, env, 0, COMPILE_SCENES)
    ppo = PPO(config, env, Policy.for_env(config.policy, env))
    state = jax.eval_shape(ppo.init, jax.random.key(0), params)
    step = jax.jit(ppo.train_step, donate_argnums=0)
    m = step.lower(state, params).compile().memory_analysis()
    pool_small = tree_bytes(params)
    pool_full = pool_small / COMPILE_SCENES * config.train.num_scenes
    compiled = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes \
        - m.alias_size_in_bytes
    return {"envs_per_device": envs, "state_bytes": tree_bytes(state),
            "temp_bytes": int(m.temp_size_in_bytes), "pool_bytes": int(pool_full),
            "total_bytes": int(compiled - pool_small + pool_full)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/selfplay_gpu.yaml")
    p.add_argument("--case", nargs=4, action="append",
                   metavar=("LABEL", "ENVS_PER_DEVICE", "DEVICES", "GB"))
    p.add_argument("--json")
    a = p.parse_args()
    config = load_run_config(a.config)
    cases = ([(c[0], int(c[1]), int(c[2]), float(c[3])) for c in a.case] if a.case
             else CASES)
    rows, measured = [], {}
    for label, envs, devices, gb in cases:
        if envs not in measured:
            measured[envs] = measure(config, envs)
        r = dict(measured[envs], case=label, devices=devices, device_gb=gb)
        # One shard of the pool per device where the scenes split over them (auto).
        shards = devices if config.train.num_scenes % devices == 0 else 1
        whole = r["pool_bytes"]
        r["pool_bytes"] = int(whole / shards)
        r["total_bytes"] = int(r["total_bytes"] - whole + r["pool_bytes"])
        r["fits"] = r["total_bytes"] <= 0.9 * gb * 1e9
        rows.append(r)
    print(f"{'command':52s} {'envs/dev':>8s} {'state':>8s} {'temps':>8s} {'pool':>8s} "
          f"{'total':>8s} {'device':>7s} fits")
    for r in rows:
        print(f"{r['case']:52s} {r['envs_per_device']:8d} {r['state_bytes'] / GIB:7.1f}G "
              f"{r['temp_bytes'] / GIB:7.1f}G {r['pool_bytes'] / GIB:7.1f}G "
              f"{r['total_bytes'] / GIB:7.1f}G {r['device_gb']:6.0f}G {r['fits']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

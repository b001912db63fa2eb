"""Compiled memory per device of the training step at a fixed number of envs per device,
run in a child process by tests/test_train_parallel.py (issue 39, item 1).

    python tests/memory_case.py OUT.json [ENVS_PER_DEVICE] [SHUFFLE_GROUPS]

Starts 8 fake CPU devices and compiles the golden PPO configuration's ``train_step`` on
``data`` meshes of 1, 2, 4 and 8 of them with ``ENVS_PER_DEVICE`` envs each (default
4); writes, per device count, ``Compiled.memory_analysis()``'s sizes (per device: XLA
compiles one SPMD program per device) to OUT.json. ``SHUFFLE_GROUPS``: ``auto`` (the
default: one group per device) or a number (1: the whole batch on every device).
"""

from __future__ import annotations

import json
import os
import sys

DEVICE_COUNTS = (1, 2, 4, 8)


def main() -> None:
    out = sys.argv[1]
    per_device = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    groups = sys.argv[3] if len(sys.argv) > 3 else "auto"
    groups = groups if groups == "auto" else int(groups)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(DEVICE_COUNTS)}"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax
    from parallel_case import build

    from jaxdrive.parallel import data_mesh

    report = {}
    for n in DEVICE_COUNTS:
        ppo, _, env_params, state, step = build(
            {"num_envs": per_device * n, "shuffle_groups": groups},
            data_mesh(jax.devices()[:n]))
        compiled = step.lower(state, env_params).compile()
        m = compiled.memory_analysis()
        hlo = compiled.as_text()
        report[str(n)] = {
            "temp_bytes": int(m.temp_size_in_bytes),
            "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes),
            "all_gathers": hlo.count(" all-gather("),
            "shuffle_groups": ppo.shuffle_groups,
        }
        print(n, report[str(n)], flush=True)
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()

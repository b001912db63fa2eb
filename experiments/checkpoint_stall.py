"""How long a checkpoint holds up the training loop: a synchronous ``Checkpointer.save``
against the trainer's two background paths, ``host_snapshot`` + ``BackgroundSaver.submit``
(one process) and orbax's asynchronous save started by ``submit`` (how multi-process
jobs save: ``Checkpointer(asynchronous=True)``; here on one process, whose barriers are
no-ops), on the train state of a config (default the quickstart preset), interleaved
rounds.

    python experiments/checkpoint_stall.py --config configs/quickstart.yaml --rounds 7

The loop waits for the synchronous save's whole duration; with the background saver it
waits only for the host copy and the hand-over (the files are written while the next
iterations run). Prints a table (medians) and optionally writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax

from jaxdrive.config import resolve_config_path
from jaxdrive.models.policy import Policy
from jaxdrive.runs.checkpoint import BackgroundSaver, Checkpointer, host_snapshot
from jaxdrive.runs.config import load_run_config
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    config = load_run_config(resolve_config_path(args.config))
    env, env_params = build_env(config, config.train.seed, 8)
    ppo = PPO(config, env, Policy.for_env(config.policy, env))
    state = jax.block_until_ready(ppo.init(jax.random.key(0), env_params))
    leaves = jax.tree.leaves(state)
    size_mb = sum(getattr(x, "nbytes", 0) for x in leaves if hasattr(x, "nbytes")) / 1e6
    sync_s, background_s, written_s, async_s, async_written_s = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        sync = Checkpointer(Path(tmp) / "sync", keep_last=2)
        ckpt = Checkpointer(Path(tmp) / "background", keep_last=2)
        saver = BackgroundSaver(ckpt)
        async_saver = BackgroundSaver(Checkpointer(Path(tmp) / "asynchronous", keep_last=2,
                                                   asynchronous=True))
        for r in range(args.rounds):
            t0 = time.perf_counter()
            sync.save(r, state, {"round": r})
            sync_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            saver.submit(r, host_snapshot(state), {"round": r})
            background_s.append(time.perf_counter() - t0)
            saver.wait()
            written_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            async_saver.submit(r, state, {"round": r})
            async_s.append(time.perf_counter() - t0)
            async_saver.wait()
            async_written_s.append(time.perf_counter() - t0)
        saver.close()
        async_saver.close()
    result = {
        "config": args.config, "state_mb": size_mb, "rounds": args.rounds,
        "sync_save_s": sync_s, "background_stall_s": background_s,
        "background_written_s": written_s, "asynchronous_stall_s": async_s,
        "asynchronous_written_s": async_written_s, "jax": jax.__version__,
        "device": str(jax.devices()[0]),
    }
    med = statistics.median
    print(f"state {size_mb:.2f} MB ({args.config}), {args.rounds} rounds, medians:")
    print(f"  synchronous save (the loop waits for all of it): {med(sync_s) * 1e3:8.1f} ms")
    print(f"  background: the loop waits for                 {med(background_s) * 1e3:8.1f} ms")
    print(f"  background: files written after                {med(written_s) * 1e3:8.1f} ms")
    print(f"  asynchronous (multi-process path): loop waits  {med(async_s) * 1e3:8.1f} ms")
    print(f"  asynchronous: files written after              "
          f"{med(async_written_s) * 1e3:8.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

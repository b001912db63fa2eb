#!/usr/bin/env bash
# Issue 19's GPU marks in one call on a lent GPU machine (the device tool), e.g.
#   run(command="bash experiments/gpu_marks.sh", timeout_s=560)
# - env >= 100M agent-steps/s at 64 agents per scene (63 partners, 200 road points);
# - the transformer's step/sequence paths, per-head vs batched attention layout
#   (PolicyConfig.attention_heads, which lays out the encoder and the training
#   segments; the rollout's decoder step is one contraction over the head-major cache
#   either way): pick the layout per backend from these;
# - selfplay_gpu.yaml with the transformer: trained agent-steps/s (target >= 2M).
# Every step has its own time limit; JSON goes to $OUT (./gpu_marks without it).
# The machine has no network: the package runs from the tree (PYTHONPATH), on the
# machine's own jax.
set -uo pipefail
OUT=${OUT:-gpu_marks}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled
python -c "import jax, flax, optax; print('jax', jax.__version__, jax.devices())" \
  | tee "$OUT/versions.txt"
step() {  # step SECONDS NAME ARGS...: python -m jaxdrive.bench ARGS, time-limited
  local limit=$1 name=$2; shift 2
  echo "== $name (limit ${limit}s)"
  timeout "$limit" python -m jaxdrive.bench "$@" --json "$OUT/$name.json" \
    || echo "== $name failed or timed out"
}
step 120 env env --envs 4096 16384 --agents 64 --partners 63 --road-obs 200 --repeats 5
step 110 policy_per_head policy --batch 4096 65536 --repeats 5
step 110 policy_batched policy --batch 4096 65536 --repeats 5 --set attention_heads=batched
step 180 train_selfplay_gpu train --config selfplay_gpu --policy transformer --repeats 3

#!/usr/bin/env bash
# Issue 20's GPU preset in one call on a lent GPU machine (the device tool), e.g.
#   run(command="bash experiments/gpu_preset.sh 420", timeout_s=580)
# (bash experiments/gpu_preset.sh SECONDS [--set KEY=VALUE ...]: the --set go to train;
# EVAL_ARGS="--set heldout_1024.num_scenarios=16" goes to the evaluation.)
# Trains configs/selfplay_gpu.yaml for at most SECONDS (default 420; SIGTERM finishes
# the iteration, saves a checkpoint and exits), then scores the run's best checkpoint on
# the 1,024 held-out scenes of experiments/heldout_procedural_suite.yaml. The run
# directory (config.yaml, metrics.jsonl, checkpoints) and the scores go to $OUT
# (./gpu_preset without it); plot the validation curve with
#   python experiments/plot_learning_curves.py OUT/runs/selfplay_gpu-* --out curve.png
# The machine has no network: the package runs from the tree (PYTHONPATH), on the
# machine's own jax.
set -uo pipefail
LIMIT=${1:-420}
shift || true
OUT=${OUT:-gpu_preset}
mkdir -p "$OUT/runs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled
python -c "import jax, flax, optax; print('jax', jax.__version__, jax.devices())" \
  | tee "$OUT/versions.txt"
echo "== train selfplay_gpu (limit ${LIMIT}s)"
timeout --signal=TERM --kill-after=60 "$LIMIT" python -m jaxdrive.train \
  --config selfplay_gpu --set logging.output_dir="$OUT/runs" "$@" 2>&1 | tee "$OUT/train.log" \
  | grep -v "^train  step" || true
RUN=$(ls -d "$OUT"/runs/selfplay_gpu-* 2>/dev/null | tail -n 1)
if [ -z "$RUN" ]; then echo "== no run directory"; exit 1; fi
tail -n 3 "$RUN/metrics.jsonl" | cut -c1-400
echo "== held-out suite on $RUN"
timeout 120 python -m jaxdrive.eval --config experiments/heldout_procedural_suite.yaml \
  --checkpoint "$RUN" --out "$OUT/heldout.json" --no-progress ${EVAL_ARGS:-} 2>&1 | tail -n 20 \
  || echo "== held-out eval failed or timed out"

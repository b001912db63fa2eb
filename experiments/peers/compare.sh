#!/usr/bin/env bash
# compare.sh MODE ROUNDS OUTDIR -- interleaved A/B rounds (ABBA: odd rounds jaxdrive first, even
# rounds the peer first), then a ratio table (min / median / max over rounds).
#   core     jaxdrive vs PufferDrive, both pinned to one core ($CORE): real scenes and matched procedural scenes
#   machine  jaxdrive one process on all cores vs one PufferDrive process per core, summed
#   waymax   jaxdrive vs Waymax on the same procedural scene sizes, both unpinned
# Environment:
#   JAXDRIVE_PY      required: python of a venv with jaxdrive installed (pip install -e CHECKOUT)
#   JAXDRIVE_DIR     the jaxdrive checkout; default: three levels above JAXDRIVE_PY (CHECKOUT/.venv/bin/python)
#   SCENES           real JSON scene folders/files, space separated;
#                    default: $JAXDRIVE_DIR/../shared/data/womd_json*  (JSON folders only)
#   PUFFERDRIVE_DIR  core/machine: PufferDrive tree with the binding built by build_pufferdrive.sh
#   PUFFER_PY        python for puffer_bench.py (the one the binding was built for); default $JAXDRIVE_PY
#   WAYMAX_DIR, WAYMAX_PY   waymax: Waymax source tree and the python of its venv
#   RUN_SECONDS      timed seconds per run and scene set (default 10); WARMUP PufferDrive warm-up (2)
#   CORE             core mode's core (default 0); MACHINE_CORES machine mode's cores (default: all allowed)
#   JD_AGENTS JD_ENVS JD_ROAD_POINTS  jaxdrive batch (64, 16, 4096: bench env's 16 x 64); PD_AGENTS (1024)
#   JD_REAL_ROWS     jaxdrive agent rows per env on the real scenes (env.max_controlled; default 0:
#                    one row per slot); >= the most controlled agents of a scene
#   JD_REAL_ENVS     jaxdrive envs per step on the real scenes (default $JD_ENVS); with packed rows
#                    set it so that the batch holds about PD_AGENTS controlled agents, as the peer's does
#   WM_SCENES WM_AGENTS WM_ROAD_POINTS WM_STEPS WM_REPEATS  waymax sizes (8, 128, 20480, 2, 3)
#   JD_JAX_CACHE_DIR JAX compilation cache (default OUTDIR/jax_cache; set empty to disable)
set -euo pipefail
[ $# -eq 3 ] || { sed -n 2,23p "$0" >&2; exit 2; }
MODE=$1; ROUNDS=$2; OUT=$3
case "$MODE" in core|machine|waymax) ;; *) echo "MODE must be core, machine or waymax" >&2; exit 2 ;; esac
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
: "${JAXDRIVE_PY:?set JAXDRIVE_PY to the python of a jaxdrive venv}"
JAXDRIVE_DIR=${JAXDRIVE_DIR:-$(dirname "$(dirname "$(dirname "$JAXDRIVE_PY")")")}
if [ -z "${SCENES:-}" ]; then
  # The JSON folders of ../shared/data (not womd_json_train: training scenes, gzip-compressed).
  SCENES=""; for d in "$JAXDRIVE_DIR"/../shared/data/womd_json "$JAXDRIVE_DIR"/../shared/data/womd_json_legacy "$JAXDRIVE_DIR"/../shared/data/womd_json_traffic_lights; do [ -d "$d" ] && SCENES="$SCENES $d"; done
fi
read -ra SCENE_ARGS <<< "$SCENES"
PUFFER_PY=${PUFFER_PY:-$JAXDRIVE_PY}
RUN_SECONDS=${RUN_SECONDS:-10}; WARMUP=${WARMUP:-2}; CORE=${CORE:-0}
JD_REAL_ROWS=${JD_REAL_ROWS:-0}
JD_AGENTS=${JD_AGENTS:-64}; JD_ENVS=${JD_ENVS:-16}; JD_REAL_ENVS=${JD_REAL_ENVS:-$JD_ENVS}; JD_ROAD_POINTS=${JD_ROAD_POINTS:-4096}; PD_AGENTS=${PD_AGENTS:-1024}
WM_SCENES=${WM_SCENES:-8}; WM_AGENTS=${WM_AGENTS:-128}; WM_ROAD_POINTS=${WM_ROAD_POINTS:-20480}
WM_STEPS=${WM_STEPS:-2}; WM_REPEATS=${WM_REPEATS:-3}
export JD_JAX_CACHE_DIR=${JD_JAX_CACHE_DIR-$OUT/jax_cache}
if [ -z "${MACHINE_CORES:-}" ]; then
  MACHINE_CORES=$("$PUFFER_PY" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
fi
ALL_CORES=$(echo $MACHINE_CORES | tr ' ' ',')
P=$OUT/prep; R=$OUT/$MODE; mkdir -p "$P" "$R"
log() { echo "$(date +%T) $* | load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$R/log" >&2; }

# ---- preparation, once per OUTDIR (delete OUTDIR/prep to redo)
if [ "$MODE" != waymax ]; then
  : "${PUFFERDRIVE_DIR:?set PUFFERDRIVE_DIR (PufferDrive tree with the binding built)}"
  [ "${#SCENE_ARGS[@]}" -gt 0 ] || { echo "no real scenes: set SCENES or JAXDRIVE_DIR" >&2; exit 1; }
  if [ ! -f "$P/pd_real/maps.json" ]; then
    log "prep: real scenes -> PufferDrive maps (${SCENE_ARGS[*]})"
    "$PUFFER_PY" "$KIT/convert_maps.py" "$P/pd_real" "${SCENE_ARGS[@]}" 2> "$P/convert_real.log"
  fi
  if [ ! -f "$P/pd_proc/maps.json" ]; then
    log "prep: jaxdrive procedural scenes ${JD_AGENTS} agents x ${JD_ROAD_POINTS} points -> JSON -> PufferDrive maps"
    "$JAXDRIVE_PY" "$KIT/dump_procedural.py" "$JD_AGENTS" "$JD_ROAD_POINTS" 16 "$P/proc_json" 2> "$P/dump_procedural.log"
    "$PUFFER_PY" "$KIT/convert_maps.py" "$P/pd_proc" "$P/proc_json" 2> "$P/convert_proc.log"
  fi
  if [ ! -f "$P/jd_controlled.json" ]; then
    log "prep: jaxdrive controlled agents per scene (count_controlled.py)"
    "$JAXDRIVE_PY" "$KIT/count_controlled.py" "$P/jd_controlled.json" --procedural --scenario "${SCENE_ARGS[@]}" \
      --agents "$JD_AGENTS" --road-points "$JD_ROAD_POINTS" 2> "$P/count_controlled.log"
  fi
else
  : "${WAYMAX_DIR:?set WAYMAX_DIR}"; : "${WAYMAX_PY:?set WAYMAX_PY to the python of the Waymax venv}"
  NPZ=$P/waymax_${WM_AGENTS}x${WM_ROAD_POINTS}x${WM_SCENES}.npz
  if [ ! -f "$NPZ" ]; then
    log "prep: jaxdrive procedural scenes for Waymax ($WM_SCENES x $WM_AGENTS x $WM_ROAD_POINTS)"
    "$JAXDRIVE_PY" "$KIT/dump_npz.py" "$WM_AGENTS" "$WM_ROAD_POINTS" "$WM_SCENES" "$NPZ" > "$P/dump_npz.log" 2>&1
  fi
fi

# ---- one side of a round
run_jd() {  # round
  local pin=()
  case "$MODE" in
    core)    pin=(taskset -c "$CORE")
             args=(--scenes both --scenario "${SCENE_ARGS[@]}" --envs "$JD_ENVS" --real-envs "$JD_REAL_ENVS" --agents "$JD_AGENTS" --road-points "$JD_ROAD_POINTS" --real-rows "$JD_REAL_ROWS") ;;
    machine) pin=(taskset -c "$ALL_CORES")
             args=(--scenes both --scenario "${SCENE_ARGS[@]}" --envs "$JD_ENVS" --real-envs "$JD_REAL_ENVS" --agents "$JD_AGENTS" --road-points "$JD_ROAD_POINTS" --real-rows "$JD_REAL_ROWS") ;;
    waymax)  args=(--scenes procedural --envs "$WM_SCENES" --agents "$WM_AGENTS" --road-points "$WM_ROAD_POINTS" --steps "$WM_STEPS") ;;
  esac
  log "r$1 jaxdrive start"
  "${pin[@]}" "$JAXDRIVE_PY" "$KIT/jd_bench.py" "$R/r$1_jd.json" "${args[@]}" --seconds "$RUN_SECONDS" --label "r$1" > "$R/r$1_jd.log" 2>&1
  log "r$1 jaxdrive done"
}
run_peer() {  # round
  if [ "$MODE" = waymax ]; then
    log "r$1 waymax start"
    WAYMAX_DIR=$WAYMAX_DIR "$WAYMAX_PY" "$KIT/waymax_bench.py" "$NPZ" "$R/r$1_wm.json" "$WM_STEPS" "$WM_REPEATS" > "$R/r$1_wm.log" 2>&1
    log "r$1 waymax done"; return
  fi
  for m in real proc; do
    log "r$1 pufferdrive $m start"
    if [ "$MODE" = core ]; then cores=$CORE; else cores=$MACHINE_CORES; fi
    pids=()
    for c in $cores; do
      taskset -c "$c" "$PUFFER_PY" "$KIT/puffer_bench.py" "$P/pd_$m" "$RUN_SECONDS" "$R/r$1_pd_${m}_c$c.json" \
        --agents "$PD_AGENTS" --warmup "$WARMUP" --seed "$((1000 * $1 + c))" --label "r$1" > "$R/r$1_pd_${m}_c$c.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    log "r$1 pufferdrive $m done"
  done
}

for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run_jd "$r"; run_peer "$r"; else run_peer "$r"; run_jd "$r"; fi
done
log "all $ROUNDS rounds done"
python3 "$KIT/ratios.py" "$OUT" "$MODE" | tee "$R/ratios.txt"

#!/usr/bin/env bash
# The Fashion-MNIST trainer against the number of workers (docs/results/scaling.md): one run
# per (model, consistency, update rule, workers), one after the other, each writing its
# metrics (JSON lines) and log under OUT, and one line per run to OUT/runs.txt:
#   tag rc acc wall_s samples_per_s load1 nproc :: the trainer's arguments
# samples/s = epochs x 60,000 / the training seconds (the metrics' final record, time_s).
#
#   bench/scaling_experiment.sh OUT BINARY MODEL EPOCHS "WORKERS" "CONSISTENCIES" "RULES" [ARGS...]
#   e.g. bench/scaling_experiment.sh docs/results/scaling/mlp build/release/examples/fashion_mnist/fashion_mnist \
#          mlp 20 "1 16" "bsp ssp asp" "default sum mean staleness-aware" --servers 4
# CONSISTENCIES: bsp, ssp (SSP(3)), asp. RULES: default (the trainer's), or a --update-rule.
# PARALLEL=N runs N at a time (accuracy sweeps only: wall-clock figures need one at a time).
set -uo pipefail
out=$1 bin=$2 model=$3 epochs=$4 workers=$5 policies=$6 rules=$7
shift 7
mkdir -p "$out"
run_one() {
  local w=$1 p=$2 r=$3
  shift 3
  local tag="${model}_${p}_${r}_w${w}"
  local args=(--quiet --model "$model" --epochs "$epochs" --workers "$w" --metrics "$out/$tag.jsonl")
  case $p in
    ssp) args+=(--consistency ssp --staleness 3) ;;
    *) args+=(--consistency "$p") ;;
  esac
  [[ $r != default ]] && args+=(--update-rule "$r")
  args+=("$@")
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$bin" "${args[@]}" >"$out/$tag.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local acc secs sps
  acc=$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$out/$tag.log")
  secs=$(grep '"final":true' "$out/$tag.jsonl" 2>/dev/null | sed -n 's/.*"time_s":\([0-9.e+-]*\).*/\1/p')
  # A run that stopped early (diverged, failed) has no rate over its epochs.
  sps=$(awk -v e="$epochs" -v s="${secs:-0}" -v rc="$rc" \
    'BEGIN { if (s > 0 && rc == 0) printf "%.0f", e * 60000 / s; else print "-" }')
  printf '%s rc=%s acc=%s wall=%.1f samples_per_s=%s load=%s nproc=%s :: %s\n' "$tag" "$rc" \
    "${acc:--}" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$sps" "$(cut -d' ' -f1 /proc/loadavg)" "$(nproc)" \
    "${args[*]}" >>"$out/runs.txt"
}
jobs_running=0
for p in $policies; do
  for r in $rules; do
    for w in $workers; do
      run_one "$w" "$p" "$r" "$@" &
      jobs_running=$((jobs_running + 1))
      if ((jobs_running >= ${PARALLEL:-1})); then
        wait -n
        jobs_running=$((jobs_running - 1))
      fi
    done
  done
done
wait
cat "$out/runs.txt"

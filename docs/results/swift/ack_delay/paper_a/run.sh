#!/usr/bin/env bash
# Issue 34: paper A's two-kill schedule, replica-log at its fastest failure-free setting
# (apply-first, --replica-ack-delay 5) against adaptive checkpointing (the trainer's default
# CheckFreq-style interval), interleaved per seed, with a failure-free `none` control.
# The settings of bench/swift_experiment.py's main part (MLP, 25 epochs, lr 0.001, no decay,
# 2 shards, 4 workers, SSP(3), evaluation of the servers' model every 0.25 s, replica
# interval 10), and the kill times of its three-kill run (T = 30.0 s: kills at 0.14 T and
# 0.37 T = 4.2 s and 11.1 s, each restarted 0.15 T = 4.5 s later).
#   run.sh BINARY OUT_DIR [SEEDS]
set -euo pipefail
bin=${1:?usage: run.sh BINARY OUT_DIR [SEEDS]}
out=${2:?usage: run.sh BINARY OUT_DIR [SEEDS]}
seeds=${3:-1,2,3,4,5}
mkdir -p "$out"
common=(--model mlp --epochs 25 --lr 0.001 --decay-factor 1 --servers 2 --workers 4
        --consistency ssp --staleness 3 --eval-every 0.25 --quiet)
kills=(--kill-at "4.2,11.1" --downtime 4.5)
IFS=, read -r -a seed_list <<<"$seeds"
for seed in "${seed_list[@]}"; do
  for mode in none checkpoint replica-log-af; do
    tmp="$(mktemp -d)"
    case $mode in
      none) flags=(--recovery none --kill-at 1000000) ;;
      checkpoint) flags=(--recovery checkpoint --checkpoint-dir "$tmp/ckpt" "${kills[@]}") ;;
      replica-log-af) flags=(--recovery replica-log --replica-interval 10
                             --replica-ordering apply-first --replica-ack-delay 5 "${kills[@]}") ;;
    esac
    log="$out/$mode-seed$seed.log"
    {
      echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
      echo "# $bin ${common[*]} --seed $seed ${flags[*]}"
    } >"$log"
    "$bin" "${common[@]}" --seed "$seed" --metrics "$out/$mode-seed$seed.jsonl" "${flags[@]}" \
      >>"$log" 2>&1 || echo "# exit status $?" >>"$log"
    echo "# after: load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
    rm -rf "$tmp"
    echo "$mode seed $seed: $(grep '^final test accuracy' "$log" || echo 'no final line')"
  done
done

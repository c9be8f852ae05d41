#!/usr/bin/env bash
# Counts the messages a failure-free run sends under recovery none, replica-log apply-first and
# replica-log write-ahead: the sendmsg(2) and recvfrom(2) calls of the whole process (role all:
# every server and worker in it, over TCP loopback; asyncps sends one frame per sendmsg and
# reads a frame's header and payload with recvfrom), with `perf stat` tracepoints, beside the
# number of worker clocks (the final metrics record's clock x workers) and shards.
# Usage: measure.sh FASHION_MNIST_BINARY OUT_DIR   (needs perf with syscall tracepoints)
set -euo pipefail
bin="$1"
out="$2"
mkdir -p "$out"
events='syscalls:sys_enter_sendmsg,syscalls:sys_enter_recvfrom,context-switches,task-clock'
printf '# %s, load before: %s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  > "$out/summary.txt"
printf '%-8s %-12s %6s %10s %10s %8s %8s %8s %9s %7s\n' model mode clocks sendmsg recvfrom \
  send/wcs recv/wcs ctxsw cpu_s train_s >> "$out/summary.txt"
for model in mlp softmax; do
  epochs=5
  [[ $model == softmax ]] && epochs=10
  for mode in none apply-first write-ahead; do
    case $mode in
      none) rec=(--recovery none) ;;
      apply-first) rec=(--recovery replica-log --replica-ordering apply-first) ;;
      write-ahead) rec=(--recovery replica-log) ;;
    esac
    tag="$model-$mode"
    perf stat -e "$events" -x, -o "$out/$tag.perf" "$bin" --model $model --servers 2 --workers 4 \
      --consistency ssp --staleness 3 --epochs $epochs --seed 1 --quiet \
      --metrics "$out/$tag.jsonl" "${rec[@]}" > "$out/$tag.log" 2>&1
    clock="$(sed -n 's/.*"clock":\([0-9]*\).*"final":true.*/\1/p' "$out/$tag.jsonl")"
    wcs=$((clock * 4 * 2))  # worker clocks x shards
    get() { grep ",$1," "$out/$tag.perf" | cut -d, -f1; }
    send="$(get syscalls:sys_enter_sendmsg)"
    recv="$(get syscalls:sys_enter_recvfrom)"
    cs="$(get context-switches)"
    cpu="$(get task-clock)"
    train="$(sed -n 's/.*after \([0-9.]*\) s.*/\1/p' "$out/$tag.log")"
    printf '%-8s %-12s %6s %10s %10s %8.2f %8.2f %8s %9.1f %7s\n' $model $mode $clock "$send" "$recv" \
      "$(bc -l <<<"$send / $wcs")" "$(bc -l <<<"$recv / $wcs")" "$cs" "$(bc -l <<<"$cpu / 1000")" \
      "$train" >> "$out/summary.txt"
  done
done
printf '# load after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/summary.txt"
cat "$out/summary.txt"

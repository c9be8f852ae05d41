#!/bin/bash
# ASP in the simulation with the worker's push window (docs/results/scaling.md, "ASP in the
# simulation"): as asp_send_buffer.sh (MLP, 20 epochs, 4 shards, the trainer's defaults for each
# worker count, compute 1 ms per 64 samples of virtual time, the default 4 MiB send buffer),
# with worker_options::push_window at its default (2 clocks per server under ASP) or as
# WINDOWS lists ("default" or a number; 0: none, as before the window). Deterministic; the load
# changes the wall time only.
# SIM: a release build of bench/scaling_sim.cpp (cmake --preset release; target asyncps_scaling_sim).
SIM=${SIM:-build/release/bench/asyncps_scaling_sim}
OUT=${OUT:-asp_push_window.jsonl}
EPOCHS=${EPOCHS:-20}
uptime
for w in ${WORKERS:-1 16 64}; do
  for win in ${WINDOWS:-default}; do
    flag=()
    [[ "$win" != default ]] && flag=(--push-window "$win")
    /usr/bin/time -v prlimit --as=8589934592 "$SIM" --epochs "$EPOCHS" --rules default \
      --consistency asp --compute-ms 1.0 --workers "$w" "${flag[@]}" --out "$OUT" 2>&1 |
      grep -E '^\{|Command|Exit status|Elapsed|Maximum resident'
    uptime
  done
done

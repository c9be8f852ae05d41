#!/bin/bash
# ASP in the simulation with send-side flow control (docs/results/scaling.md, "ASP in the
# simulation"): MLP, 20 epochs, 4 shards, the trainer's defaults for each worker count (--rules
# default), compute 1 ms per 64 samples of virtual time, `--consistency asp`, the simulated
# transport's default send buffer (simulation_options::send_buffer_bytes, 4 MiB per connection
# and direction). Address space capped at 8 GiB (prlimit); /usr/bin/time -v reports the peak
# RSS. Deterministic; ran at nice 5 on the shared 2-core VM (the load changes the wall time only).
# SIM: a release build of bench/scaling_sim.cpp (cmake --preset release; target asyncps_scaling_sim).
SIM=${SIM:-build/release/bench/asyncps_scaling_sim}
OUT=${OUT:-asp_send_buffer.jsonl}
EPOCHS=${EPOCHS:-20}
uptime
for w in ${WORKERS:-1 16 64}; do
  /usr/bin/time -v prlimit --as=8589934592 nice -n 5 "$SIM" --epochs "$EPOCHS" --rules default \
    --consistency asp --compute-ms 1.0 --workers "$w" --out "$OUT" 2>&1 |
    grep -E '^\{|Command|Exit status|Elapsed|Maximum resident'
  uptime
done

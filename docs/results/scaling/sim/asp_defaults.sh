#!/bin/bash
# ASP in the simulation (docs/results/scaling.md, "ASP at 64 workers"): MLP, 20 epochs, 4 shards,
# the trainer's defaults for each worker count (--rules default: its update rule, batch and
# learning rate), compute 1 ms per 64 samples of virtual time, `--consistency asp` (reads never
# wait; every read refreshes the cache in the background). Deterministic; ran at nice 5 on the
# 2-core VM beside builds and fuzzers (the load changes the wall time only).
# SIM: a release build of bench/scaling_sim.cpp.
SIM=${SIM:-build/release/bench/asyncps_scaling_sim}
OUT=${OUT:-asp_defaults.jsonl}
for w in 1 16 64; do
  /usr/bin/time -f "wall %e s" nice -n 5 "$SIM" --epochs 20 --rules default --consistency asp \
    --compute-ms 1.0 --workers "$w" --out "$OUT"
done

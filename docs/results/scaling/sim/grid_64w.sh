#!/bin/bash
# The 64-worker sweep of docs/results/scaling.md ("The batch floor and the rate's cap at 64
# workers"): MLP, 20 epochs, 4 shards, `mean`, compute 1 ms per 64 samples of virtual time.
# Ran at nice 5 on the 2-core VM beside builds (the simulation is deterministic: the load
# changes its wall time only). SIM: a release build of bench/scaling_sim.cpp (442dcf9).
SIM=${SIM:-build/release/bench/asyncps_scaling_sim}
OUT=${OUT:-grid_64w.jsonl}
run() { /usr/bin/time -f "wall %e s" nice -n 5 "$SIM" --epochs 20 --rules mean --compute-ms 1.0 --out "$OUT" "$@"; }
run --workers 64 --batch 8 --lr 0.2 --staleness 3
for cfg in "4 0.4" "4 0.2" "2 0.2" "2 0.1" "8 0.1"; do
  set -- $cfg
  run --workers 64 --batch "$1" --lr "$2" --staleness 3
done
for st in 0 3; do
  run --workers 64 --batch 4 --lr 0.2 --staleness "$st"
  run --workers 32 --batch 4 --lr 0.2 --staleness "$st"
done

#!/bin/bash
# ASP in the simulation with a smaller send buffer than the default (docs/results/scaling.md,
# "ASP in the simulation"): as asp_send_buffer.sh (MLP, 20 epochs, 4 shards, --rules default,
# 1 ms per 64 samples, address space capped at 8 GiB), `--send-buffer BUFFER` per connection and
# direction instead of 4 MiB. Ran: BUFFER=262144 (256 KiB) WORKERS=16 -> asp_small_buffer.log;
# BUFFER=16384 (16 KiB, Linux's initial tcp_wmem before autotuning; below one ~100 KB push, so
# one message at a time) WORKERS=16 and WORKERS=64, each its own process ->
# asp_16k_w16.log, asp_16k_w64.log. Exploratory: it tests whether the pushes
# queued ahead of a worker's pull request (which waits behind them on the same connection) are
# what makes ASP's reads stale. Ran at nice 5 on the shared 2-core VM beside other jobs.
SIM=${SIM:-build/release/bench/asyncps_scaling_sim}
OUT=${OUT:-asp_small_buffer.jsonl}
uptime
for w in ${WORKERS:-16}; do
  /usr/bin/time -v prlimit --as=8589934592 nice -n 5 "$SIM" --epochs 20 --rules default \
    --consistency asp --compute-ms 1.0 --send-buffer "${BUFFER:-262144}" --workers "$w" \
    --out "$OUT" 2>&1 | grep -E '^\{|Command|Exit status|Elapsed|Maximum resident'
  uptime
done

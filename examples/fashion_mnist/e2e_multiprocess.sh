#!/usr/bin/env bash
# End-to-end: 2 server processes + 2 worker processes of fashion_mnist over TCP on loopback.
# Usage: e2e_multiprocess.sh /path/to/fashion_mnist
set -euo pipefail
bin="$1"
dir="$(mktemp -d)"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
# Every process of the run shares one secret (docs/security.md), read from this 0600 file.
(umask 077 && head -c 32 /dev/urandom >"$dir/secret")
export ASYNCPS_SECRET_FILE="$dir/secret"

common=(--servers 2 --workers 2 --model softmax --consistency ssp --staleness 2 --epochs 3 --quiet)
# Servers listen on kernel-chosen ports and print them.
ports=()
for s in 0 1; do
  "$bin" "${common[@]}" --role server --shard "$s" --listen 127.0.0.1:0 \
    --metrics "$dir/s$s.jsonl" >"$dir/s$s.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    # The log may not exist yet: the background shell opens it, not this one.
    port="$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/s$s.log" 2>/dev/null || true)"
    [[ -n "$port" ]] && break
    sleep 0.1
  done
  [[ -n "$port" ]] || { echo "e2e: server $s did not start"; cat "$dir/s$s.log"; exit 1; }
  ports+=("$port")
done
for w in 0 1; do
  "$bin" "${common[@]}" --role worker --worker-id "$w" --eval both --connect "127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}" \
    --metrics "$dir/w$w.jsonl" >"$dir/w$w.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
pids=()
cat "$dir"/w0.log
if [[ $status -ne 0 ]]; then
  echo "e2e: a process failed"; tail -n 5 "$dir"/*.log; exit 1
fi
acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/w0.log")"
echo "e2e: worker 0 final test accuracy $acc"
awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.80) }' || { echo "e2e: accuracy '$acc' < 0.80"; exit 1; }
grep -q '"test_accuracy"' "$dir/w0.jsonl"
# The evaluations read the servers' model (--eval both: as a reader over TCP with the run's
# secret) while both workers trained, and worker 0's view beside it.
servers_evals="$(grep -c '"eval_source":"servers"' "$dir/w0.jsonl" || true)"
echo "e2e: $servers_evals evaluations of worker 0 read the servers' model"
[[ "$servers_evals" -ge 3 ]] || { echo "e2e: fewer than 3 evaluations read the servers' model"; cat "$dir/w0.jsonl"; exit 1; }
grep -q '"worker_test_accuracy"' "$dir/w0.jsonl"

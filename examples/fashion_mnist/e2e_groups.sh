#!/usr/bin/env bash
# End-to-end: group servers as separate processes of fashion_mnist over TCP on loopback
# (--groups 2): 2 central server processes (--role server), 2 group server processes
# (--role group-server) and 4 worker processes, worker 3 slowed x4 (a straggler, grouped by
# speed with worker 2 in group 1). Checks that every process exits 0, that each group made
# all its central pushes, that the straggler ran all its clocks, and that the central model,
# read by worker 0 once every group's last push has reached the central servers, is well
# above chance (10 classes).
# Usage: e2e_groups.sh /path/to/fashion_mnist [KEEP_DIR]
#   KEEP_DIR: keep every process's log and metrics there (docs/deploy.md's measured run).
#   EPOCHS (environment): epochs of the run (default 2).
set -euo pipefail
bin="$1"
keep="${2:-}"
if [[ -n "$keep" ]]; then
  mkdir -p "$keep"
  dir="$(cd "$keep" && pwd)"
else
  dir="$(mktemp -d)"
fi
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  if [[ -n "$keep" ]]; then rm -f "$dir/secret"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
fail() { echo "e2e_groups: $*"; tail -n 5 "$dir"/*.log; exit 1; }
# Every process of the run shares one secret (docs/security.md), read from this 0600 file.
(umask 077 && head -c 32 /dev/urandom >"$dir/secret")
export ASYNCPS_SECRET_FILE="$dir/secret"

floor=0.70  # softmax reaches ~0.80 in 2 epochs; chance is 0.10
epochs="${EPOCHS:-2}"
# Every process gets the same run flags: the grouping (by speed, from --slow-worker and
# --slow-factor), the clocks (--epochs, --batch, --workers) and the pushes (--push-every).
common=(--model softmax --servers 2 --workers 4 --groups 2 --group-by speed --slow-worker 3
        --slow-factor 4 --push-every 2 --epochs "$epochs" --eval-every 1 --compute-threads 1 --quiet)
start="$(date +%s.%N)"
echo "e2e_groups: load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

# Waits for "listening on 127.0.0.1:PORT" in log $1 and prints PORT.
port_of() {
  local port=""
  for _ in $(seq 300); do
    # The log may not exist yet: the background shell opens it, not this one.
    port="$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$1" 2>/dev/null || true)"
    [[ -n "$port" ]] && break
    sleep 0.1
  done
  [[ -n "$port" ]] || fail "no port in $1"
  echo "$port"
}

central=()
for s in 0 1; do
  "$bin" "${common[@]}" --role server --shard "$s" --listen 127.0.0.1:0 \
    --metrics "$dir/c$s.jsonl" >"$dir/c$s.log" 2>&1 &
  pids+=($!)
  central+=("127.0.0.1:$(port_of "$dir/c$s.log")")
done
central_list="${central[0]},${central[1]}"
group=()
for g in 0 1; do
  "$bin" "${common[@]}" --role group-server --group "$g" --listen 127.0.0.1:0 \
    --central "$central_list" --metrics "$dir/g$g.jsonl" >"$dir/g$g.log" 2>&1 &
  pids+=($!)
  group+=("127.0.0.1:$(port_of "$dir/g$g.log")")
done
for w in 0 1 2 3; do
  g=$((w / 2))  # by speed: {0,1} and {2,3} (the straggler with the slowest of the rest)
  extra=()
  [[ $w -eq 0 ]] && extra=(--central "$central_list")  # worker 0 reports the central model
  "$bin" "${common[@]}" --role worker --worker-id "$w" --group "$g" --connect "${group[$g]}" \
    "${extra[@]}" --metrics "$dir/w$w.jsonl" >"$dir/w$w.log" 2>&1 &
  pids+=($!)
done
names=(c0 c1 g0 g1 w0 w1 w2 w3)
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "e2e_groups: process ${names[$i]} failed"
    status=1
  fi
done
pids=()
end="$(date +%s.%N)"
cat "$dir"/g0.log "$dir"/g1.log "$dir"/w3.log "$dir"/w0.log
[[ $status -eq 0 ]] || fail "a process exited non-zero"

# Each group server made every central push, and the central counters (read by worker 0) agree.
counters="$(sed -n 's/^central push counters by group: \(.*\)$/\1/p' "$dir/w0.log")"
[[ -n "$counters" ]] || fail "worker 0 printed no central push counters"
read -r -a counter <<<"$counters"
for g in 0 1; do
  line="$(grep "^group $g " "$dir/g$g.log")" || fail "no summary from group server $g"
  pushes="$(sed -n 's/.* \([0-9]*\) central pushes,.*/\1/p' <<<"$line")"
  [[ -n "$pushes" && "$pushes" -gt 0 && "$pushes" == "${counter[$g]}" ]] ||
    fail "group $g: $pushes pushes, central counter ${counter[$g]}"
done
grep -q '^group 1 {2,3}' "$dir/g1.log" || fail "the straggler (worker 3) is not in group 1"
# The straggler was slowed and still ran every clock.
grep -q 'slowed x4' "$dir/w3.log" || fail "worker 3 was not slowed"
clocks="$(sed -n 's/^worker 3 (group 1): \([0-9]*\) of \([0-9]*\) clocks.*/\1 \2/p' "$dir/w3.log")"
read -r done planned <<<"$clocks"
[[ -n "$done" && "$done" -gt 0 && "$done" == "$planned" ]] ||
  fail "the straggler ran '$done' of '$planned' clocks"
# The central servers stopped once worker 0 had read their final model.
for s in 0 1; do
  grep -q 'a reader read the final model; stopping' "$dir/c$s.log" ||
    fail "central server $s did not serve the final model to a reader"
done

acc="$(sed -n 's/^final test accuracy \([0-9.]*\) (loss [0-9.]*) of the central model.*/\1/p' "$dir/w0.log")"
[[ -n "$acc" ]] || fail "no final accuracy"
awk -v a="$acc" -v f="$floor" 'BEGIN { exit !(a + 0 >= f) }' || fail "final accuracy $acc < $floor"
grep -q '"eval_source":"central servers"' "$dir/w0.jsonl" || fail "no final record in the metrics"
echo "e2e_groups: ok, final central-model accuracy $acc >= $floor; wall $(awk -v a="$start" \
  -v b="$end" 'BEGIN { printf "%.1f", b - a }') s from the first process started to the last \
ended; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Several hosts on one machine: fashion_mnist's servers and workers in separate network
# namespaces joined through a bridge by veth links with a tbf rate limit (docs/multi-host.md).
#
#   basic      2 server hosts and 2 worker hosts over 1 Gbit/s links: a short softmax run ends
#              with a final accuracy line above a floor.
#   link-down  a host that disappears: recovery stateless, 2 server hosts and 2 worker hosts;
#              server 0's cable is pulled (its switch port set down) for $outage s mid-run and
#              plugged back. The run must complete, and training must have stalled for
#              about the outage (>= 90 % of it); the script reports what the workers saw.
#   chain-flap recovery chain (1 shard, 2 members on their own hosts, the chain master on a
#              third, 2 worker hosts): the head's cable pulled for 5 s and plugged back. The
#              master drops the silent head after its 1 s heartbeat timeout; when the cable is
#              back the old head learns it was removed, closes its workers' connections, and
#              they fail over to the new head. The run must complete with no push lost.
#   chain-gone the same, but the head's cable stays out. The run should complete on the other
#              member; today it does not (the workers never learn of the new head while their
#              connection to the old one stays silently open, and stop with errc::timeout
#              after worker_options::wait_timeout, 60 s): docs/multi-host.md. Not run by
#              ctest (DISABLED) until the workers detect a silent server.
#   worker-gone elastic workers (--elastic, recovery none), 1 server host and 2 worker hosts:
#              worker 1's cable is pulled for good mid-run. Its connection stays open and
#              silent; the server's TCP keepalive and user timeout (tcp_options::keepalive,
#              ~10 s) fail it, the worker leaves after its --grace, and worker 0 trains on to
#              the end.
#
# Every namespace, veth pair and qdisc is removed on exit (trap), also on failure. Exits 77
# (ctest's skip) with one line where namespaces cannot be made (not root, no CAP_NET_ADMIN, no
# iproute2, an unprivileged container).
# Usage: netns_e2e.sh /path/to/fashion_mnist basic|link-down|chain-flap|chain-gone|worker-gone
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$1"
mode="${2:-basic}"
data=/usr/share/datasets/fashion-mnist
# shellcheck source=netns_lib.sh
source "$here/netns_lib.sh"

[[ -x "$bin" ]] || { echo "netns_e2e: $bin is not an executable"; exit 1; }
[[ -e "$data/train-images-idx3-ubyte.gz" ]] ||
  { echo "SKIP: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"; exit 77; }
netns_require

dir="$(mktemp -d)"
pids=()
cleanup() {
  local rc=$?
  kill -KILL "${pids[@]}" 2>/dev/null || true
  netns_cleanup
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() {
  echo "netns_e2e($mode): $*"
  local f
  for f in "$dir"/*.log; do
    echo "---- $(basename "$f")"
    grep -v 'cannot connect' "$f" | tail -n 8 || true
  done
  exit 1
}
(umask 077 && head -c 32 /dev/urandom >"$dir/secret")
export ASYNCPS_SECRET_FILE="$dir/secret"
port=7000

# Waits until host $1 accepts TCP connections on $port (the server listens), at most 10 s.
wait_listening() {
  local i
  for i in $(seq 100); do
    netns_exec "$1" ss -Hltn "sport = :$port" 2>/dev/null | grep -q LISTEN && return 0
    sleep 0.1
  done
  fail "nothing listens on $1's port $port after 10 s"
}

# Waits for the worker processes (pids[] from index $1 on), at most $2 s each; sets status.
wait_workers() {
  local from="$1" limit="$2" i
  status=0
  for ((i = from; i < ${#pids[@]}; ++i)); do
    local waited=0
    while kill -0 "${pids[$i]}" 2>/dev/null; do
      (( waited++ < limit * 10 )) || fail "worker process ${pids[$i]} still runs after $limit s (hung?)"
      sleep 0.1
    done
    wait "${pids[$i]}" || status=1
  done
}

accuracy() { sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$1"; }

netns_switch
rate=1gbit
outage=0  # seconds a cable stays out (link-down, chain-flap)
common=(--model softmax --consistency ssp --staleness 2 --quiet --reconnect-timeout 60)

case "$mode" in
basic | link-down)
  for h in 0 1; do
    netns_host "s$h" "$h" "$rate"
    netns_host "w$h" "$((h + 2))" "$rate"
  done
  common+=(--servers 2 --workers 2)
  if [[ "$mode" == basic ]]; then
    common+=(--epochs 3)
  else
    common+=(--epochs 20 --recovery stateless)
  fi
  for s in 0 1; do
    netns_spawn "s$s" "$dir/s$s.log" "$bin" "${common[@]}" --role server --shard "$s" \
      --listen "$(netns_addr "s$s"):$port" --metrics /dev/null
    pids+=("$netns_pid")
  done
  for s in 0 1; do wait_listening "s$s"; done
  connect="$(netns_addr s0):$port,$(netns_addr s1):$port"
  first_worker=${#pids[@]}
  for w in 0 1; do
    netns_spawn "w$w" "$dir/w$w.log" "$bin" "${common[@]}" --role worker --worker-id "$w" \
      --connect "$connect" --metrics "$dir/w$w.jsonl"
    pids+=("$netns_pid")
  done
  if [[ "$mode" == link-down ]]; then
    # Pull server 0's cable once training runs (worker 0 wrote its first metrics line), and
    # plug it back $outage s later.
    outage="${NETNS_OUTAGE:-3}"
    for _ in $(seq 300); do
      [[ -s "$dir/w0.jsonl" ]] && break
      sleep 0.1
    done
    [[ -s "$dir/w0.jsonl" ]] || fail "worker 0 did not start training within 30 s"
    sleep 1
    netns_link s0 down
    down_at=$SECONDS
    echo "netns_e2e(link-down): server 0's link down"
    sleep "$outage"
    netns_link s0 up
    echo "netns_e2e(link-down): server 0's link up again after $((SECONDS - down_at)) s"
  fi
  wait_workers "$first_worker" 120
  ;;
chain-flap | chain-gone)
  # 1 shard, 2 members (hosts s0 = member 0, the first head, and s1), the chain master on host
  # m, 2 worker hosts.
  netns_host s0 0 "$rate"
  netns_host s1 1 "$rate"
  netns_host w0 2 "$rate"
  netns_host w1 3 "$rate"
  netns_host m 4 "$rate"
  common+=(--servers 1 --replicas 2 --workers 2 --epochs 20 --recovery chain)
  master="$(netns_addr m):$port"
  members="$(netns_addr s0):$port,$(netns_addr s1):$port"
  netns_spawn m "$dir/m.log" "$bin" "${common[@]}" --role master --listen "$master" \
    --metrics /dev/null
  pids+=("$netns_pid")
  wait_listening m
  for s in 0 1; do
    netns_spawn "s$s" "$dir/s$s.log" "$bin" "${common[@]}" --role server --shard 0 \
      --member "$s" --chain "$members" --master "$master" \
      --listen "$(netns_addr "s$s"):$port" --metrics /dev/null
    pids+=("$netns_pid")
  done
  for s in 0 1; do wait_listening "s$s"; done
  first_worker=${#pids[@]}
  for w in 0 1; do
    netns_spawn "w$w" "$dir/w$w.log" "$bin" "${common[@]}" --role worker --worker-id "$w" \
      --connect "$members" --metrics "$dir/w$w.jsonl"
    pids+=("$netns_pid")
  done
  for _ in $(seq 300); do
    [[ -s "$dir/w0.jsonl" ]] && break
    sleep 0.1
  done
  [[ -s "$dir/w0.jsonl" ]] || fail "worker 0 did not start training within 30 s"
  sleep 1
  netns_link s0 down
  if [[ "$mode" == chain-flap ]]; then
    outage="${NETNS_OUTAGE:-5}"
    echo "netns_e2e($mode): the head's (server 0.0's) link down for $outage s"
    sleep "$outage"
    netns_link s0 up
  else
    echo "netns_e2e($mode): the head's (server 0.0's) link down for good"
  fi
  wait_workers "$first_worker" 150
  ;;
worker-gone)
  netns_host s0 0 "$rate"
  netns_host w0 2 "$rate"
  netns_host w1 3 "$rate"
  common+=(--servers 1 --workers 2 --epochs 20 --elastic --grace 1)
  netns_spawn s0 "$dir/s0.log" "$bin" "${common[@]}" --role server --shard 0 \
    --listen "$(netns_addr s0):$port" --metrics /dev/null
  pids+=("$netns_pid")
  wait_listening s0
  first_worker=${#pids[@]}
  for w in 0 1; do
    netns_spawn "w$w" "$dir/w$w.log" "$bin" "${common[@]}" --role worker --worker-id "$w" \
      --connect "$(netns_addr s0):$port" --metrics "$dir/w$w.jsonl"
    pids+=("$netns_pid")
  done
  for _ in $(seq 300); do
    [[ -s "$dir/w0.jsonl" ]] && break
    sleep 0.1
  done
  [[ -s "$dir/w0.jsonl" ]] || fail "worker 0 did not start training within 30 s"
  sleep 1
  netns_link w1 down
  down_at=$SECONDS
  echo "netns_e2e($mode): worker 1's link down for good"
  for _ in $(seq 300); do
    grep -q 'worker 1 leaves' "$dir/s0.log" && break
    sleep 0.1
  done
  grep -q 'worker 1 leaves' "$dir/s0.log" || fail "worker 1 did not leave within 30 s"
  echo "netns_e2e($mode): the server let worker 1 go $((SECONDS - down_at)) s after its link went down"
  # Worker 0 alone: wait for it only (worker 1 is cut off; killed at the end).
  pids_w0=("${pids[@]:0:$((first_worker + 1))}")
  last=$(( ${#pids[@]} - 1 ))
  w1_pid="${pids[$last]}"
  pids=("${pids_w0[@]}")
  wait_workers "$first_worker" 150
  pids+=("$w1_pid")
  ;;
*)
  echo "netns_e2e: unknown mode '$mode' (basic, link-down, chain-flap, chain-gone, worker-gone)"
  exit 2
  ;;
esac

for f in "$dir"/*.log; do echo "---- $(basename "$f")"; grep -v 'cannot connect' "$f" || true; done
[[ $status -eq 0 ]] || fail "a worker failed"
acc="$(accuracy "$dir/w0.log")"
[[ -n "$acc" ]] || fail "worker 0 printed no final accuracy"
awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.78) }' || fail "final accuracy $acc < 0.78"
if [[ "$mode" != basic && "$mode" != worker-gone ]]; then
  # The stall the outage caused: the longest gap between worker 0's evaluations (one every
  # 0.25 epochs, about 0.15 s apart without a fault).
  gap="$(sed -n 's/.*"time_s":\([0-9.e+-]*\).*/\1/p' "$dir/w0.jsonl" |
         awk 'NR > 1 && $1 - p > g { g = $1 - p } { p = $1 } END { printf "%.2f", g }')"
  echo "netns_e2e($mode): longest gap between worker 0's evaluations: $gap s"
  # The outage must have stopped training for about its length (else the cable was not out;
  # a cable pulled and plugged back at once stalled training for 1.6 s here). chain-gone has
  # no end to its outage: nothing to check.
  awk -v g="$gap" -v o="$outage" 'BEGIN { exit !(g + 0 >= 0.9 * o) }' ||
    fail "a stall of $gap s for an outage of $outage s: the outage did not hit"
  grep -h '^recovery ' "$dir"/w*.log || true
  if [[ "$mode" == chain-* ]]; then
    # Strict chain replication loses no push, and the old head rejoined as the tail.
    for w in 0 1; do
      grep -q '^recovery chain-replication: .* 0 pushes lost' "$dir/w$w.log" ||
        fail "worker $w lost pushes: $(grep '^recovery' "$dir/w$w.log")"
    done
  fi
  if [[ "$mode" == chain-flap ]]; then
    grep -q 'server 0 joins as the tail' "$dir/m.log" || fail "the old head did not rejoin as the tail"
  fi
fi
echo "netns_e2e($mode): ok, worker 0 final test accuracy $acc"

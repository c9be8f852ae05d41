#!/usr/bin/env bash
# The cost of a link: push/pull throughput, clock time and the trainer's time per epoch between
# a server host and a worker host (two network namespaces joined through a bridge; see
# tests/netns/netns_lib.sh and docs/multi-host.md), over an unlimited veth, a 10 Gbit/s and a
# 1 Gbit/s tbf link, with and without a one-way delay added by asyncps_delay_proxy (this
# kernel has no netem). Every figure is printed with the 1-minute load average.
#
#   bash bench/netns_bench.sh BUILD_DIR            # the table of docs/multi-host.md
#   bash bench/netns_bench.sh BUILD_DIR --quick    # the ctest smoke: one link, short runs
#
# BUILD_DIR holds bench/asyncps_remote_bench, bench/asyncps_delay_proxy and (optional, for the
# epoch rows) examples/fashion_mnist/fashion_mnist. Needs root (network namespaces); exits 77
# with one line where they cannot be made. Rows (asyncps_remote_bench, one server process per
# row): a 4 KiB table at window 1 (one round trip per clock: latency), a 1 MiB table at
# window 1 and window 4 (throughput, pushes in flight). Epoch rows: fashion_mnist, 1 server
# host, 1 worker host, 1 epoch of the MLP (about 0.4 MB pushed and pulled per clock).
# Environment: RATES (default "none 10gbit 1gbit"), DELAYS_US (default "direct 0 250":
# "direct" connects the worker to the server, a number N goes through asyncps_delay_proxy with
# N us one way, so "0" is the proxy's own cost).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "$1" && pwd)"
quick=0
[[ "${2:-}" == --quick ]] && quick=1
rb="$build/bench/asyncps_remote_bench"
proxy="$build/bench/asyncps_delay_proxy"
fm="$build/examples/fashion_mnist/fashion_mnist"
for b in "$rb" "$proxy"; do
  [[ -x "$b" ]] || { echo "netns_bench: $b not built"; exit 1; }
done
# shellcheck source=../tests/netns/netns_lib.sh
source "$here/../tests/netns/netns_lib.sh"
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

if ((quick)); then
  rates="${RATES:-1gbit}"
  delays="${DELAYS_US:-direct 250}"
  clocks_small=200 clocks_big=60
else
  rates="${RATES:-none 10gbit 1gbit}"
  delays="${DELAYS_US:-direct 0 250}"
  clocks_small=4000 clocks_big=600
fi

(umask 077 && head -c 32 /dev/urandom >"$dir/secret")
netns_switch
netns_host s0 0 none
netns_host w0 1 none
server="$(netns_addr s0)"
port=7000 pport=7100
load() { cut -d' ' -f1 /proc/loadavg; }

# Waits until the server host listens on $port (at most 10 s); else shows process $1's log $2.
wait_listening() {
  local start=$SECONDS
  while ((SECONDS - start < 10)); do
    netns_exec s0 ss -Hltn "sport = :$port" | grep -q LISTEN && return 0
    kill -0 "$1" 2>/dev/null || break
    sleep 0.05
  done
  cat "$2"
  echo "netns_bench: the server did not listen within 10 s ($((SECONDS - start)) s)"
  exit 1
}

# Starts asyncps_remote_bench --serve on the server host, waits for its line; then the worker
# on the worker host, to $target (the server, or the delay proxy in front of it).
remote_row() {
  local rows="$1" window="$2" clocks="$3"
  netns_spawn s0 "$dir/srv.log" "$rb" --serve "$server:$port" --rows "$rows" \
    --secret-file "$dir/secret"
  local spid=$netns_pid
  wait_listening "$spid" "$dir/srv.log"
  local line
  if ! line="$(netns_exec w0 "$rb" --connect "$target" --rows "$rows" --window "$window" \
                 --clocks "$clocks" --reps 5 --secret-file "$dir/secret" 2>"$dir/wrk.err")"; then
    cat "$dir/wrk.err" "$dir/srv.log"
    kill -KILL "$spid" 2>/dev/null || true
    echo "netns_bench: the remote bench failed"
    exit 1
  fi
  wait "$spid" || true
  printf '%-7s %-6s  %s\n' "$rate" "$delay" "${line#remote_bench: }"
}

# fashion_mnist across the link: 1 server (server host), 1 worker (worker host), MLP, 1 epoch.
epoch_row() {
  [[ -x "$fm" ]] || return 0
  local common=(--model mlp --servers 1 --workers 1 --epochs 1 --quiet --metrics /dev/null
                --secret-file "$dir/secret")
  netns_spawn s0 "$dir/fm-s.log" "$fm" "${common[@]}" --role server --shard 0 \
    --listen "$server:$port"
  local spid=$netns_pid
  wait_listening "$spid" "$dir/fm-s.log"
  netns_exec w0 "$fm" "${common[@]}" --role worker --worker-id 0 --connect "$target" \
    >"$dir/fm-w.log" 2>&1 || { cat "$dir/fm-w.log"; echo "netns_bench: fashion_mnist failed"; exit 1; }
  wait "$spid" || true
  local secs
  secs="$(sed -n 's/^final test accuracy .* after \([0-9.]*\) s.*/\1/p' "$dir/fm-w.log")"
  printf '%-7s %-6s  fashion_mnist MLP, 1 server + 1 worker: %s s per epoch; load average %s\n' \
    "$rate" "$delay" "$secs" "$(load)"
}

echo "netns_bench: server host $server, worker host $(netns_addr w0); load average $(load)"
printf '%-7s %-6s  %s\n' link delay result
for rate in $rates; do
  netns_rate s0 "$rate"
  netns_rate w0 "$rate"
  for delay in $delays; do
    target="$server:$port"
    ppid_=""
    if [[ "$delay" != direct ]]; then
      # The proxy runs on the worker host: both directions of the link get `delay` one way.
      netns_spawn w0 "$dir/proxy.log" "$proxy" --listen "127.0.0.1:$pport" \
        --upstream "$server:$port" --delay-us "$delay"
      ppid_=$netns_pid
      pids+=("$ppid_")
      for _ in $(seq 100); do grep -q listening "$dir/proxy.log" && break; sleep 0.05; done
      grep -q listening "$dir/proxy.log" || { cat "$dir/proxy.log"; echo "netns_bench: no proxy"; exit 1; }
      target="127.0.0.1:$pport"
    fi
    remote_row 1 1 "$clocks_small"
    remote_row 256 1 "$clocks_big"
    remote_row 256 4 "$clocks_big"
    ((quick)) || epoch_row
    if [[ -n "$ppid_" ]]; then kill "$ppid_" 2>/dev/null || true; wait "$ppid_" 2>/dev/null || true; fi
  done
done

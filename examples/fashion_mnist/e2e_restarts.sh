#!/usr/bin/env bash
# End-to-end: processes of a run that are restarted, stopped or killed from outside (issue 32's
# loose ends). Usage: e2e_restarts.sh /path/to/fashion_mnist MODE
#   worker          1 server and 2 worker processes, SSP(3): worker 1 is killed with SIGKILL
#                   and started again; it rejoins where the server has its clock and stops at
#                   the job's last clock with exit status 0 (it ran 4 clocks past the end and
#                   timed out, exit status 1, when it trained a full run from where it joined)
#   asp-rejoin      ASP, recovery stateless: worker 1 runs more than 1024 clocks ahead of
#                   worker 0 (worker 0 stopped with SIGSTOP), the server is killed and
#                   restarted, worker 0 rejoins first and trains, then worker 1 rejoins; ASP
#                   bounds no clock, so its hello is taken (a server instantiated with a
#                   compile-time bound of 0 refused it as 'staleness 0', and worker 1 failed)
#   trainer-killed  role all with --kill-at (replica-log): once a server was killed and
#                   restarted, the trainer itself is killed with SIGKILL; none of its server
#                   processes stays behind, and it leaves no file in $TMPDIR (the secret and
#                   the rebuild reports live in memory, not in temporary files)
set -euo pipefail
bin="$1"
mode="$2"
dir="$(mktemp -d)"
pids=()
cleanup() {
  if ((${#pids[@]})); then kill -9 "${pids[@]}" 2>/dev/null || true; fi
  # Whatever still runs with this test's data path (a trainer's server processes).
  leftovers | xargs -r kill -9 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
# Every process's command line names $dir/data (a link to the data set): how this test finds
# its processes, and only its own.
data="${FASHION_MNIST_DATA:-/usr/share/datasets/fashion-mnist}"
ln -s "$data" "$dir/data"
mkdir "$dir/tmp"

fail() {
  echo "e2e_restarts $mode: $*"
  for f in "$dir"/*.log; do
    [[ -e "$f" ]] || continue
    echo "---- $(basename "$f")"
    tail -n 15 "$f"
  done
  exit 1
}

# The pids of live processes (zombies excluded) whose command line names $dir/data (the path
# reaches awk through its environment: on its command line, awk would list itself).
leftovers() {
  ps -eo pid=,stat=,args= | D="$dir/data" awk 'index($0, ENVIRON["D"]) && $2 !~ /^Z/ { print $1 }'
}

# The last clock in the progress lines of log $1 (0 when none yet).
last_clock() {
  local c
  c="$(sed -n 's/^epoch .* clock *\([0-9]*\) .*/\1/p' "$1" 2>/dev/null | tail -1 || true)"
  echo "${c:-0}"
}

# Waits up to $2 tenths of a second for command $1 (a string for eval) to succeed.
wait_for() {
  local i
  for ((i = 0; i < $2; ++i)); do
    eval "$1" && return 0
    sleep 0.1
  done
  return 1
}

# A free port on 127.0.0.1 (the kernel picks one, then it is released).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts server 0 of `common` on 127.0.0.1:$1, logging to $dir/$2.log; sets server_pid.
start_server() {
  "$bin" "${common[@]}" --role server --shard 0 --listen "127.0.0.1:$1" --metrics /dev/null \
    >"$dir/$2.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  wait_for "grep -q 'listening on' '$dir/$2.log' 2>/dev/null" 100 || fail "server ($2) did not start"
}

case "$mode" in
  worker)
    (umask 077 && head -c 32 /dev/urandom >"$dir/secret")
    export ASYNCPS_SECRET_FILE="$dir/secret"
    common=(--data "$dir/data" --servers 1 --workers 2 --model softmax --consistency ssp
            --staleness 3 --epochs 20)
    port="$(free_port)"
    start_server "$port" server
    for w in 0 1; do
      "$bin" "${common[@]}" --role worker --worker-id "$w" --connect "127.0.0.1:$port" \
        --metrics "$dir/w$w.jsonl" >"$dir/w${w}.log" 2>&1 &
      pids+=($!)
    done
    w1="${pids[2]}"
    # Worker 1 dies mid-run; worker 0 waits for it (SSP), so the restarted worker 1 rejoins
    # a running job.
    wait_for "(( \$(last_clock '$dir/w0.log') >= 300 ))" 600 || fail "training did not start"
    kill -9 "$w1"
    wait "$w1" 2>/dev/null || true
    "$bin" "${common[@]}" --role worker --worker-id 1 --connect "127.0.0.1:$port" \
      --metrics "$dir/w1b.jsonl" >"$dir/w1b.log" 2>&1 &
    w1b=$!
    wait "${pids[1]}" || fail "worker 0 failed"
    set +e
    wait "$w1b"
    rc=$?
    set -e
    [[ $rc -eq 0 ]] || fail "the restarted worker 1 exited with status $rc"
    wait "$server_pid" || fail "the server failed"
    pids=()
    final="$(grep '"final":true' "$dir/w1b.jsonl")" || fail "no final record of worker 1"
    clock="$(sed -n 's/.*"clock":\([0-9]*\).*/\1/p' <<<"$final")"
    planned="$(sed -n 's/.*"clocks_planned":\([0-9]*\).*/\1/p' <<<"$final")"
    [[ -n "$clock" && "$clock" == "$planned" ]] ||
      fail "the restarted worker ended at clock '$clock' of '$planned'"
    grep -q '^final test accuracy' "$dir/w1b.log" || fail "the restarted worker printed no accuracy"
    ! grep -q 'no fresh rows' "$dir/w1b.log" || fail "the restarted worker waited past the end"
    echo "e2e_restarts worker: ok, the restarted worker 1 ended at clock $clock of $planned"
    ;;
  asp-rejoin)
    (umask 077 && head -c 32 /dev/urandom >"$dir/secret")
    export ASYNCPS_SECRET_FILE="$dir/secret"
    common=(--data "$dir/data" --servers 1 --workers 2 --model softmax --consistency asp
            --epochs 40 --recovery stateless --reconnect-timeout 60)
    port="$(free_port)"
    start_server "$port" server
    for w in 0 1; do
      "$bin" "${common[@]}" --role worker --worker-id "$w" --connect "127.0.0.1:$port" \
        --metrics /dev/null >"$dir/w$w.log" 2>&1 &
      pids+=($!)
    done
    w0="${pids[1]}" w1="${pids[2]}"
    wait_for "(( \$(last_clock '$dir/w0.log') >= 50 ))" 600 || fail "training did not start"
    # Worker 0 stands still while worker 1 trains on (ASP waits for no one).
    kill -STOP "$w0"
    c0="$(last_clock "$dir/w0.log")"
    wait_for "(( \$(last_clock '$dir/w1.log') >= $c0 + 1500 ))" 600 ||
      fail "worker 1 did not get 1500 clocks ahead of worker 0 (at $c0)"
    kill -STOP "$w1"
    c1="$(last_clock "$dir/w1.log")"
    # The server dies and comes back without state; worker 0 rejoins it first and trains.
    kill -9 "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    start_server "$port" server2
    kill -CONT "$w0"
    wait_for "grep -q 'worker 0 rejoins' '$dir/server2.log' 2>/dev/null" 300 ||
      fail "worker 0 did not rejoin the restarted server"
    wait_for "(( \$(last_clock '$dir/w0.log') >= $c0 + 20 ))" 300 ||
      fail "worker 0 did not train after rejoining"
    # Worker 1 rejoins over 1024 clocks ahead of worker 0.
    kill -CONT "$w1"
    wait "$w0" || fail "worker 0 failed"
    wait "$w1" || fail "worker 1 failed after rejoining (it was at clock $c1, worker 0 at $c0)"
    wait "$server_pid" || fail "the restarted server failed"
    pids=()
    ! grep -q 'bad_clock\|clock out of range\|staleness 0' "$dir"/*.log ||
      fail "a hello was bounded by a staleness the run does not have"
    grep -q 'worker 1 rejoins' "$dir/server2.log" || fail "worker 1 did not rejoin"
    grep -q '^final test accuracy' "$dir/w1.log" || fail "worker 1 printed no final accuracy"
    echo "e2e_restarts asp-rejoin: ok, worker 1 rejoined at clock >= $c1 with worker 0 at $c0"
    ;;
  trainer-killed)
    # Role all makes its own secret (no file given): the case that wrote it to $TMPDIR.
    unset ASYNCPS_SECRET_FILE
    export TMPDIR="$dir/tmp"
    "$bin" --data "$dir/data" --model softmax --epochs 40 --servers 2 --workers 4 \
      --consistency ssp --staleness 3 --recovery replica-log --replica-interval 10 \
      --kill-at 1 --downtime 0.3 --reconnect-timeout 60 --quiet --metrics /dev/null \
      >"$dir/trainer.log" 2>&1 &
    trainer=$!
    pids+=("$trainer")
    # The restarted server is forked by the kill schedule's thread, the first ones by the main
    # thread: both kinds run when the trainer is killed.
    wait_for "grep -q '^\[fault\] restarted server 0' '$dir/trainer.log' 2>/dev/null" 600 ||
      fail "the trainer did not kill and restart server 0"
    children="$(pgrep -P "$trainer" | tr '\n' ' ')"
    [[ "$(wc -w <<<"$children")" -eq 2 ]] || fail "2 server processes expected, found: $children"
    kill -9 "$trainer"
    wait "$trainer" 2>/dev/null || true
    pids=()
    wait_for "[[ -z \"\$(leftovers)\" ]]" 100 ||
      fail "server processes outlived the killed trainer: $(leftovers | tr '\n' ' ')"
    left="$(find "$dir/tmp" -mindepth 1 | tr '\n' ' ')"
    [[ -z "$left" ]] || fail "the killed trainer left files behind: $left"
    echo "e2e_restarts trainer-killed: ok, server processes $children ended with the trainer," \
      "no temporary file left"
    ;;
  *)
    echo "e2e_restarts: unknown mode '$mode'" >&2
    exit 2
    ;;
esac

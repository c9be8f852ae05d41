#!/usr/bin/env bash
# End-to-end: fashion_mnist started the way cluster launchers start it, each process finding
# its role, rank and the servers from the environment and the rendezvous alone (no --role,
# --listen or --connect), and elastic workers that die, rejoin and join late.
# Usage: e2e_launch.sh /path/to/fashion_mnist MODE
#   mpirun    `mpirun -np 6`: 2 servers + 4 workers (Open MPI's variables; skipped, exit 77,
#             without mpirun)
#   torchrun  6 processes with torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
#   slurm     6 processes with srun's SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST, ...
#   dmlc      a scheduler, 2 servers and 4 workers with ps-lite's DMLC_* variables (the
#             rendezvous assigns shard and worker ids)
#   elastic   1 server, workers 0 and 1 (capacity 3, --min-workers 2, --grace 1): worker 1 is
#             killed with SIGKILL, worker 0 trains on, worker 1 is restarted and rejoins, and
#             worker 2 joins the running job
set -euo pipefail
bin="$1"
mode="$2"
dir="$(mktemp -d)"
pids=()
cleanup() {
  if ((${#pids[@]})); then kill -9 "${pids[@]}" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
(umask 077 && head -c 32 /dev/urandom >"$dir/secret")
export ASYNCPS_SECRET_FILE="$dir/secret"
common=(--model softmax --consistency ssp --staleness 2 --epochs 3)

fail() {
  echo "e2e_launch $mode: $*"
  for f in "$dir"/*.log; do
    [[ -e "$f" ]] || continue
    echo "---- $(basename "$f")"
    tail -n 15 "$f"
  done
  exit 1
}

# A free port for the rendezvous: the kernel picks one, then it is released.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_all() {
  local status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  pids=()
  return $status
}

# Worker 0's final accuracy in log $1 must reach the floor.
check_accuracy() {
  local acc
  acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$1" | tail -1)"
  echo "e2e_launch $mode: final test accuracy ${acc:-none}"
  awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.78) }' || fail "accuracy '${acc:-none}' < 0.78"
}

# Runs 6 ranks of a rank launcher whose variables `rank_env R` prints for rank R.
run_ranks() {
  for r in 0 1 2 3 4 5; do
    # shellcheck disable=SC2046
    env $(rank_env "$r") "$bin" "${common[@]}" --metrics "$dir/m$r.jsonl" >"$dir/r$r.log" 2>&1 &
    pids+=($!)
  done
  wait_all || fail "a rank failed"
  for r in 0 1 2 3 4 5; do
    grep -q "^fashion_mnist: $1 rank $r of 6: " "$dir/r$r.log" || fail "rank $r did not say who it is"
  done
  grep -q "rank 0 of 6: server 0 of 2 servers" "$dir/r0.log" || fail "rank 0 is not server 0"
  grep -q "rank 2 of 6: worker 0 of 4 workers" "$dir/r2.log" || fail "rank 2 is not worker 0"
  check_accuracy "$dir/r2.log"
}

case "$mode" in
  mpirun)
    command -v mpirun >/dev/null || { echo "skipped: mpirun not installed (openmpi-bin)"; exit 77; }
    root=()
    [[ "$(id -u)" -eq 0 ]] && root=(--allow-run-as-root)
    # Nothing but the job itself: mpirun's environment gives every rank its role.
    mpirun "${root[@]}" --oversubscribe -np 6 --output-filename "$dir/out" \
      "$bin" "${common[@]}" --metrics "$dir/m.jsonl" >"$dir/mpirun.log" 2>&1 ||
      { cat "$dir/mpirun.log"; find "$dir/out" -type f -exec tail -n 15 {} +; fail "mpirun failed"; }
    for r in 0 1 2 3 4 5; do
      f="$(find "$dir/out" -path "*rank.$r/stdout" | head -1)"
      [[ -n "$f" ]] || f="$(find "$dir/out" -path "*rank.0$r/stdout" | head -1)"
      cp "$f" "$dir/r$r.log"
      grep -q "^fashion_mnist: open-mpi rank $r of 6: " "$dir/r$r.log" ||
        fail "rank $r did not say who it is"
    done
    grep -q "rank 0 of 6: server 0 of 2 servers" "$dir/r0.log" || fail "rank 0 is not server 0"
    check_accuracy "$dir/r2.log"
    ;;
  torchrun)
    port="$(free_port)"
    rank_env() { echo "RANK=$1 WORLD_SIZE=6 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"; }
    run_ranks torchrun
    ;;
  slurm)
    port="$(free_port)"
    # The port Slurm's job id would give is not known to be free here: ASYNCPS_RENDEZVOUS.
    rank_env() {
      echo "SLURM_PROCID=$1 SLURM_NTASKS=6 SLURM_JOB_ID=$$ SLURM_STEP_ID=0 SLURM_STEP_NODELIST=localhost ASYNCPS_RENDEZVOUS=127.0.0.1:$port"
    }
    run_ranks slurm
    ;;
  dmlc)
    port="$(free_port)"
    dmlc=(DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=4 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="$port")
    env "${dmlc[@]}" DMLC_ROLE=scheduler "$bin" "${common[@]}" >"$dir/scheduler.log" 2>&1 &
    scheduler=$!
    for s in 0 1; do
      env "${dmlc[@]}" DMLC_ROLE=server "$bin" "${common[@]}" --metrics /dev/null \
        >"$dir/s$s.log" 2>&1 &
      pids+=($!)
    done
    for w in 0 1 2 3; do
      env "${dmlc[@]}" DMLC_ROLE=worker "$bin" "${common[@]}" --metrics "$dir/w$w.jsonl" \
        >"$dir/w$w.log" 2>&1 &
      pids+=($!)
    done
    wait_all || fail "a server or worker failed"
    kill -TERM "$scheduler"
    wait "$scheduler" || fail "the scheduler failed"
    grep -h "^fashion_mnist: dmlc: " "$dir"/*.log
    # The rendezvous handed out shards 0 and 1 and worker ids 0..3, once each.
    for s in 0 1; do
      [[ "$(grep -l "^server $s of 2 listening" "$dir"/s*.log | wc -l)" -eq 1 ]] ||
        fail "shard $s was not assigned exactly once"
    done
    for w in 0 1 2 3; do
      [[ "$(grep -l "worker id $w from the rendezvous" "$dir"/w*.log | wc -l)" -eq 1 ]] ||
        fail "worker id $w was not assigned exactly once"
    done
    check_accuracy "$(grep -l "worker id 0 from the rendezvous" "$dir"/w*.log)"
    ;;
  elastic)
    port="$(free_port)"
    el=(--elastic --workers 3 --min-workers 2 --grace 1 --servers 1 --rendezvous "127.0.0.1:$port"
        --model softmax --consistency ssp --staleness 2 --epochs 8 --slow-worker 0 --slow-factor 20)
    "$bin" "${el[@]}" --role scheduler >"$dir/scheduler.log" 2>&1 &
    scheduler=$!
    "$bin" "${el[@]}" --role server --shard 0 --metrics /dev/null >"$dir/server.log" 2>&1 &
    pids+=($!)
    "$bin" "${el[@]}" --role worker --worker-id 0 --metrics "$dir/w0.jsonl" >"$dir/w0.log" 2>&1 &
    pids+=($!)
    "$bin" "${el[@]}" --role worker --worker-id 1 --metrics /dev/null >"$dir/w1a.log" 2>&1 &
    w1=$!
    # Kill worker 1 once training runs (worker 0 past clock 300), with SIGKILL.
    for _ in $(seq 600); do
      # The log may not exist yet: the background shell opens it, not this one.
      clock="$(sed -n 's/.*clock *\([0-9]*\) .*/\1/p' "$dir/w0.log" 2>/dev/null | tail -1 || true)"
      [[ -n "$clock" && "$clock" -ge 300 ]] && break
      sleep 0.1
    done
    [[ -n "$clock" && "$clock" -ge 300 ]] || fail "training did not start"
    kill -9 "$w1"
    wait "$w1" 2>/dev/null || true
    for _ in $(seq 100); do
      grep -q "worker 1 leaves" "$dir/server.log" && break
      sleep 0.1
    done
    grep -q "worker 1 leaves" "$dir/server.log" || fail "worker 1 did not leave after its grace"
    clock_then="$(sed -n 's/.*clock *\([0-9]*\) .*/\1/p' "$dir/w0.log" | tail -1)"
    sleep 2
    clock_now="$(sed -n 's/.*clock *\([0-9]*\) .*/\1/p' "$dir/w0.log" | tail -1)"
    ((clock_now > clock_then)) || fail "worker 0 stopped training without worker 1"
    # Worker 1 comes back in its place; worker 2 joins the running job.
    "$bin" "${el[@]}" --role worker --worker-id 1 --metrics /dev/null >"$dir/w1b.log" 2>&1 &
    pids+=($!)
    "$bin" "${el[@]}" --role worker --worker-id 2 --metrics /dev/null >"$dir/w2.log" 2>&1 &
    pids+=($!)
    wait_all || fail "a process failed"
    kill -TERM "$scheduler"
    wait "$scheduler" || fail "the scheduler failed"
    grep "joins\|leaves" "$dir/server.log" || true
    [[ "$(grep -c "worker 1 joins" "$dir/server.log")" -ge 2 ]] || fail "worker 1 did not rejoin"
    grep -q "worker 2 joins" "$dir/server.log" || fail "worker 2 did not join"
    check_accuracy "$dir/w0.log"
    ;;
  *)
    echo "e2e_launch: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
echo "e2e_launch $mode: passed"

#!/usr/bin/env bash
# End-to-end fault test: fashion_mnist runs 2 server processes, and kills server 0 with SIGKILL
# mid-training, restarting it after a downtime. Checks what the recovery policy promises.
# Under chain replication every shard has 2 servers and the head of shard 0 is killed.
# replica-log-20: recovery replica-log with server 0 killed 20 times in one run, and its final
# accuracy compared with a failure-free run of the same configuration.
# chain-loss: strict chain replication where the whole chain of shard 0 dies (the second kill
# lands before the restarted head has rejoined): the run must stop with shard_lost, count the
# pushes lost and exit non-zero, never train on from a restarted server's initial values.
# replica-log-apply-first: recovery replica-log with `--replica-ordering apply-first` and
# `--replica-ack-delay 5` (the orders ride on the clocks' acks over TCP, held back up to 5 ms so
# one ack carries several clocks): the rebuild is exactly-once (bit-exact or reported
# reordered), and no worker reconnects but for the kill.
# Usage: e2e_recovery.sh /path/to/fashion_mnist
#          none|checkpoint|stateless|chain|chain-relaxed|chain-loss|replica-log|replica-log-20|
#          replica-log-apply-first
set -euo pipefail
bin="$1"
policy="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "e2e_recovery($policy): $*"; exit 1; }
# The metrics' final record ($final): field $1.
field() { sed -n "s/.*\"$1\":\([a-z0-9]*\).*/\1/p" <<<"$final"; }
# The recovery summary ($summary): the number before the words $1 (empty if none).
num() { sed -n "s/.* \([0-9]*\) $1.*/\1/p" <<<"$summary"; }
# replica-log: reads the summary line of log $1 into rebuilds, missing, incomplete, reconnects,
# lost and twice (pushes missing from, or applied twice to, the final shard states), each
# checked to be a number (an empty one would pass an arithmetic test).
replica_log_counters() {
  summary="$(grep '^recovery replica-log:' "$1")" || fail "no recovery summary in $(basename "$1")"
  rebuilds="$(num rebuilds)"
  missing="$(num 'positions missing')"
  incomplete="$(num incomplete)"
  reconnects="$(num reconnects)"
  lost="$(num 'pushes lost')"
  twice="$(num 'applied twice')"
  local v
  for v in "$rebuilds" "$missing" "$incomplete" "$reconnects" "$lost" "$twice"; do
    [[ "$v" =~ ^[0-9]+$ ]] || fail "cannot read the summary: $summary"
  done
}

if [[ "$policy" == replica-log-20 ]]; then
  # 20 kills of server 0, one every $gap s from $first s (counted from worker 0's first clock),
  # each restarted $downtime s later. A restarted server listens about 0.4 s after its start (it
  # loads the data) and the workers retry every 0.5 s at most, so the shard serves again 0.7 s
  # (at most about 1.1 s) after a kill and trains until the next one. 130 epochs took 52-55 s
  # without failures and 59-60 s with the kills on the quiet 2-core VM (2026-11-30; the
  # softmax model's clocks are small, so replica-log's order, commit and ack per clock and
  # shard take a large share: docs/results/swift.md, "The extra messages, counted"): the last
  # kill, at 29.5 s, leaves training to do.
  kills=20 first=1.0 gap=1.5 downtime=0.2 epochs=130
  kill_at="$(awk -v n=$kills -v f=$first -v g=$gap \
    'BEGIN { for (i = 0; i < n; ++i) printf "%s%.1f", (i ? "," : ""), f + i * g }')"
  args=(--model softmax --epochs $epochs --servers 2 --workers 4 --consistency ssp --staleness 3
        --recovery replica-log --replica-interval 10 --downtime $downtime
        --reconnect-timeout 60 --quiet)
  # The failure-free run has the same process layout: a --kill-at after the end runs the
  # servers as child processes as well, and kills none.
  declare -A kill_flag=([kill]="$kill_at" [ref]=1000000) secs=() acc=()
  for r in kill ref; do
    start=$SECONDS
    set +e
    timeout 200 "$bin" "${args[@]}" --kill-at "${kill_flag[$r]}" --metrics "$dir/$r.jsonl" \
      >"$dir/$r.log" 2>&1
    rc=$?
    set -e
    secs[$r]=$((SECONDS - start))
    echo "---- $r run (--kill-at ${kill_flag[$r]}): exit status $rc after ${secs[$r]} s"
    grep -v 'cannot connect to server' "$dir/$r.log" || true
    (( rc != 124 )) || fail "$r run: no exit within 200 s (hung?)"
    [[ $rc -eq 0 ]] || fail "$r run: exit status $rc"
    final="$(grep '"final":true' "$dir/$r.jsonl")" || fail "$r run: no final record in the metrics"
    [[ "$(field failed)" == false ]] || fail "$r run: the final record says the run failed: $final"
    # The server processes linger for the final read: the accuracy is the servers' model.
    [[ "$final" == *'"eval_source":"servers"'* ]] ||
      fail "$r run: the final accuracy is not the servers' model: $final"
    clock="$(field clock)"
    planned="$(field clocks_planned)"
    [[ -n "$clock" && "$clock" == "$planned" ]] ||
      fail "$r run: the final record says clock $clock of $planned: $final"
    replica_log_counters "$dir/$r.log"
    # A position without a log entry in an exact rebuild is an order lost with the killed
    # connection (not applied; the push is resent): allowed. Pushes lost or applied twice are
    # checked against the final shard states below.
    (( incomplete == 0 )) || fail "$r run: $incomplete incomplete rebuilds"
    (( lost == 0 && twice == 0 )) || fail "$r run: $lost pushes lost, $twice applied twice"
    ! grep -q 'NOT exact' "$dir/$r.log" || fail "$r run: a rebuild was not exact"
    acc[$r]="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/$r.log")"
    [[ -n "${acc[$r]}" ]] || fail "$r run: no final accuracy"
  done
  # The failure-free run: no fault, no rebuild, no reconnect.
  ! grep -q '^\[fault\]' "$dir/ref.log" || fail "the failure-free run had a fault"
  replica_log_counters "$dir/ref.log"
  (( rebuilds == 0 && reconnects == 0 )) ||
    fail "the failure-free run: $rebuilds rebuilds, $reconnects reconnects"
  # The run with kills: every kill and restart happened, and every rebuild was exact.
  replica_log_counters "$dir/kill.log"
  killed="$(grep -c '^\[fault\] killed server 0 (SIGKILL)' "$dir/kill.log" || true)"
  restarted="$(grep -c '^\[fault\] restarted server 0' "$dir/kill.log" || true)"
  (( killed == kills )) || fail "$killed kills of $kills (did training end before the last one?)"
  (( restarted == kills )) || fail "$restarted restarts of $kills"
  exact="$(grep -c 'rebuilt from .* (exact' "$dir/kill.log" || true)"
  (( rebuilds == exact )) || fail "$rebuilds rebuilds reported, $exact exact rebuilds logged"
  # A kill before the workers are back (or during a rebuild) is a fault like any other, and
  # the next server rebuilds; but a run where few kills hit a serving shard tests little.
  (( rebuilds >= kills / 2 )) || fail "only $rebuilds of $kills restarted servers rebuilt"
  (( reconnects >= 4 * rebuilds )) ||
    fail "$reconnects reconnects for $rebuilds rebuilds (every worker should reconnect each time)"
  awk -v a="${acc[kill]}" -v b="${acc[ref]}" \
    'BEGIN { d = a - b; exit !(d <= 0.005 && d >= -0.005) }' ||
    fail "final accuracy ${acc[kill]} with $kills kills and ${acc[ref]} without:" \
      "more than 0.5 points apart"
  echo "e2e_recovery($policy): ok, $killed kills, $restarted restarts, $rebuilds exact" \
    "rebuilds, $reconnects reconnects, $missing positions missing, $incomplete incomplete," \
    "$lost pushes lost, $twice applied twice; final accuracy ${acc[kill]} with the kills" \
    "(${secs[kill]} s), ${acc[ref]} without (${secs[ref]} s)"
  exit 0
fi

if [[ "$policy" == chain-loss ]]; then
  # Kill 1 (1.0 s) hits member 0, the head; it restarts 1.0 s later, and kill 2 hits member 1
  # at once, while the restarted process still loads its data (about 0.4 s) and has not
  # registered: no server that held shard 0's state is alive. 40 epochs take about 6 s without
  # a failure; the run must stop about 1.5 s after its first clock instead.
  args=(--model softmax --epochs 40 --servers 2 --workers 4 --consistency ssp --staleness 3
        --recovery chain --replicas 2 --kill-at 1.0,1.1 --downtime 1.0 --reconnect-timeout 60
        --metrics "$dir/m.jsonl" --quiet)
  set +e
  timeout 120 "$bin" "${args[@]}" >"$dir/out.log" 2>&1
  rc=$?
  set -e
  grep -v 'cannot connect to server' "$dir/out.log" || true
  (( rc != 124 )) || fail "no exit within 120 s (hung?)"
  grep -q '^\[fault\] killed server 0\.0 (SIGKILL)' "$dir/out.log" || fail "member 0 was not killed"
  grep -q '^\[fault\] killed server 0\.1 (SIGKILL)' "$dir/out.log" || fail "member 1 was not killed"
  ! grep -q "serving from this server's own state" "$dir/out.log" ||
    fail "a restarted server served its initial state"
  grep -q 'shard 0 is lost: every server of its chain that held its state failed' "$dir/out.log" ||
    fail "no server said that shard 0 is lost"
  [[ $rc -ne 0 ]] || fail "exit status 0 after losing every server of shard 0"
  grep -q 'worker [0-9]*: every server that held this shard.s state failed' "$dir/out.log" ||
    fail "no worker stopped with shard_lost"
  grep -q '^fashion_mnist: a shard was lost' "$dir/out.log" || fail "no 'a shard was lost' message"
  final="$(grep '"final":true' "$dir/m.jsonl")" || fail "no final record in the metrics"
  [[ "$(field failed)" == true ]] || fail "the final record does not say the run failed: $final"
  clock="$(field clock)"
  planned="$(field clocks_planned)"
  [[ -n "$clock" && -n "$planned" ]] && (( clock < planned )) ||
    fail "the final record claims clock $clock of $planned: $final"
  summary="$(grep '^recovery chain-replication:' "$dir/out.log")" || fail "no recovery summary"
  lost="$(num 'pushes lost')"
  acked="$(sed -n 's/.* pushes lost (\([0-9]*\) acknowledged).*/\1/p' <<<"$summary")"
  [[ "$lost" =~ ^[0-9]+$ && "$acked" =~ ^[0-9]+$ ]] || fail "cannot read the summary: $summary"
  # Every worker pushed to shard 0 for over a second before the loss, and the tail had
  # acknowledged all but the last window of each (max_unacked, 64).
  (( lost > 0 && acked > 0 && acked <= lost && lost - acked <= 4 * 64 )) ||
    fail "$lost pushes lost, $acked acknowledged: $summary"
  echo "e2e_recovery($policy): ok, exit status $rc at clock $clock of $planned;" \
    "$lost pushes lost ($acked acknowledged)"
  exit 0
fi

every=400  # checkpoint interval in clocks; chain-relaxed: pushes between copies
args=(--model softmax --epochs 40 --servers 2 --workers 4 --consistency ssp --staleness 3
      --recovery "$policy" --kill-at 3.5 --downtime 1.5 --reconnect-timeout 60
      --checkpoint-dir "$dir/ckpt" --checkpoint-every "$every" --metrics "$dir/m.jsonl" --quiet)
[[ "$policy" == chain* ]] && args+=(--replicas 2 --replicate-every "$every")
[[ "$policy" == replica-log ]] && args+=(--replica-interval 10)
if [[ "$policy" == replica-log-apply-first ]]; then
  args=("${args[@]/#replica-log-apply-first/replica-log}")
  args+=(--replica-interval 10 --replica-ordering apply-first --replica-ack-delay 5)
fi
set +e
"$bin" "${args[@]}" >"$dir/out.log" 2>&1
rc=$?
set -e
cat "$dir/out.log"

grep -Eq '^\[fault\] killed server 0(\.0)? \(SIGKILL\)' "$dir/out.log" || fail "the server was not killed"
# The metrics' final record: the clock every worker reached, of the clocks planned, and whether
# the run failed.
final="$(grep '"final":true' "$dir/m.jsonl")" || fail "no final record in the metrics"
clock="$(field clock)"
planned="$(field clocks_planned)"
[[ -n "$clock" && -n "$planned" ]] || fail "final record without clock/clocks_planned: $final"
if [[ "$policy" == none ]]; then
  # A lost server ends the run with a clear error, not a hang, and the metrics say so.
  [[ $rc -ne 0 ]] || fail "exit status 0 after losing a server"
  grep -q 'parameter server lost' "$dir/out.log" || fail "no 'parameter server lost' error"
  ! grep -q '^final test accuracy' "$dir/out.log" || fail "a failed run printed a final accuracy"
  grep -q '^test accuracy when the run failed' "$dir/out.log" || fail "no accuracy at the failure"
  [[ "$(field failed)" == true ]] || fail "the final record does not say the run failed: $final"
  (( clock < planned )) || fail "the final record claims clock $clock of $planned: $final"
  echo "e2e_recovery(none): ok, the run ended with 'parameter server lost' (exit status $rc)" \
    "at clock $clock of $planned"
  exit 0
fi
[[ "$(field failed)" == false ]] || fail "the final record says the run failed: $final"
(( clock == planned )) || fail "the final record says clock $clock of $planned: $final"
grep -q '^\[fault\] restarted server 0' "$dir/out.log" || fail "the server was not restarted"
name="$policy"
[[ "$policy" == replica-log-apply-first ]] && name=replica-log
[[ "$policy" == chain ]] && name=chain-replication
[[ "$policy" == chain-relaxed ]] && name=chain-replication-relaxed

[[ $rc -eq 0 ]] || fail "exit status $rc"
if [[ "$policy" == replica-log-apply-first ]]; then
  # Applied on arrival, each clock's order on its ack: the rebuild applied every push once
  # (bit-exact, or reported reordered when an order was lost with the connection), and each
  # worker reconnected to the killed shard only (a worker that refused the ack would reconnect
  # again and again).
  replica_log_counters "$dir/out.log"
  (( rebuilds >= 1 )) || fail "$rebuilds rebuilds: the restarted server did not rebuild"
  grep -Eq 'rebuilt from .* \((exact|exactly once, not bit-exact)' "$dir/out.log" ||
    fail "no rebuild logged"
  ! grep -q 'NOT exact' "$dir/out.log" || fail "a rebuild was not exact"
  (( incomplete == 0 )) || fail "$incomplete incomplete rebuilds"
  (( lost == 0 && twice == 0 )) || fail "$lost pushes lost, $twice applied twice"
  (( reconnects >= 4 && reconnects <= 8 )) ||
    fail "$reconnects reconnects (every worker should have reconnected once or twice)"
  ! grep -q 'lost server 1' "$dir/out.log" || fail "a worker lost server 1, which was not killed"
  acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/out.log")"
  awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.80) }' || fail "final accuracy '$acc' < 0.80"
  echo "e2e_recovery($policy): ok, $rebuilds rebuilds, $reconnects reconnects, $lost pushes" \
    "lost, $twice applied twice, accuracy $acc"
  exit 0
fi
if [[ "$policy" == replica-log ]]; then
  # The restarted shard rebuilt bit-exactly from the workers' replica and logs.
  replica_log_counters "$dir/out.log"
  (( rebuilds >= 1 )) || fail "$rebuilds rebuilds: the restarted server did not rebuild"
  grep -q 'rebuilt from .* (exact' "$dir/out.log" || fail "no exact rebuild logged"
  ! grep -q 'NOT exact' "$dir/out.log" || fail "a rebuild was not exact"
  (( incomplete == 0 )) || fail "$incomplete incomplete rebuilds"
  (( lost == 0 && twice == 0 )) || fail "$lost pushes lost, $twice applied twice"
  (( reconnects >= 4 )) || fail "$reconnects reconnects (every worker should have reconnected)"
  acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/out.log")"
  awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.80) }' || fail "final accuracy '$acc' < 0.80"
  echo "e2e_recovery($policy): ok, $rebuilds rebuilds, $missing positions missing," \
    "$incomplete incomplete, $reconnects reconnects, $lost pushes lost, $twice applied twice," \
    "accuracy $acc"
  exit 0
fi
summary="$(grep "^recovery $name:" "$dir/out.log")" || fail "no recovery summary"
reconnects="$(num reconnects)"
lost="$(num 'pushes lost')"
local_clocks="$(num 'shard-clocks trained')"
(( reconnects >= 4 )) || fail "$reconnects reconnects (every worker should have reconnected)"

if [[ "$policy" == checkpoint ]]; then
  grep -q 'restored from .*shard-0-clock-' "$dir/out.log" || fail "server 0 restored no checkpoint"
  # The workers' count must equal the restarted server's: the sum, over the workers it saw
  # rejoin, of the clocks it moved each one up ("rejoins at clock C (this shard had it at H)").
  seen=0
  while read -r c h; do seen=$((seen + c - h)); done < <(
    sed -n 's/^asyncps server 0: worker [0-9]* rejoins at clock \([0-9]*\) (this shard had it at \([0-9]*\))$/\1 \2/p' \
      "$dir/out.log")
  (( lost == seen )) || fail "the workers counted $lost pushes lost, the server's rejoins $seen"
  # At most one interval (plus the clocks a worker may be ahead, s = 3) per worker is lost; when
  # the kill interrupted a persist, the restore is one interval older (two intervals then).
  intervals=1
  grep -q 'removed unfinished checkpoint .*(a persist was interrupted)' "$dir/out.log" && intervals=2
  bound=$((4 * (intervals * every + 4)))
  (( lost > 0 && lost <= bound )) ||
    fail "$lost pushes lost, bound $bound ($intervals checkpoint interval(s) per worker)"
  (( local_clocks == 0 )) || fail "workers trained locally under checkpoint"
elif [[ "$policy" == chain ]]; then
  # Strict chain replication: the backup took over with every acknowledged push.
  grep -q 'joins as the tail' "$dir/out.log" || fail "the restarted server did not rejoin the chain"
  (( lost == 0 )) || fail "$lost pushes lost under strict chain replication"
  (( local_clocks == 0 )) || fail "workers trained locally under chain replication"
elif [[ "$policy" == chain-relaxed ]]; then
  grep -q 'joins as the tail' "$dir/out.log" || fail "the restarted server did not rejoin the chain"
  # At most the pushes since the last copy (plus one clock in flight per worker) are lost.
  (( lost <= every + 4 * 4 )) || fail "$lost pushes lost, bound $((every + 16))"
else
  grep -q 'rebuilt table 0 from the replica of worker' "$dir/out.log" ||
    fail "the restarted server did not rebuild its state from a replica"
  (( local_clocks > 0 )) || fail "workers did not train on during the outage"
  (( lost == 0 )) || fail "$lost pushes counted lost"
fi
acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/out.log")"
awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.80) }' || fail "final accuracy '$acc' < 0.80"
echo "e2e_recovery($policy): ok, $reconnects reconnects, $lost pushes lost, $local_clocks local clocks, accuracy $acc"

#!/usr/bin/env bash
# End-to-end fault test: fashion_mnist runs 2 server processes, and kills server 0 with SIGKILL
# mid-training, restarting it after a downtime. Checks what the recovery policy promises.
# Under chain replication every shard has 2 servers and the head of shard 0 is killed.
# Usage: e2e_recovery.sh /path/to/fashion_mnist none|checkpoint|stateless|chain|chain-relaxed
set -euo pipefail
bin="$1"
policy="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

every=400  # checkpoint interval in clocks; chain-relaxed: pushes between copies
args=(--model softmax --epochs 40 --servers 2 --workers 4 --consistency ssp --staleness 3
      --recovery "$policy" --kill-at 3.5 --downtime 1.5 --reconnect-timeout 60
      --checkpoint-dir "$dir/ckpt" --checkpoint-every "$every" --metrics "$dir/m.jsonl" --quiet)
[[ "$policy" == chain* ]] && args+=(--replicas 2 --replicate-every "$every")
set +e
"$bin" "${args[@]}" >"$dir/out.log" 2>&1
rc=$?
set -e
cat "$dir/out.log"
fail() { echo "e2e_recovery($policy): $*"; exit 1; }

grep -Eq '^\[fault\] killed server 0(\.0)? \(SIGKILL\)' "$dir/out.log" || fail "the server was not killed"
# The metrics' final record: the clock every worker reached, of the clocks planned, and whether
# the run failed.
final="$(grep '"final":true' "$dir/m.jsonl")" || fail "no final record in the metrics"
field() { sed -n "s/.*\"$1\":\([a-z0-9]*\).*/\1/p" <<<"$final"; }
clock="$(field clock)"
planned="$(field clocks_planned)"
[[ -n "$clock" && -n "$planned" ]] || fail "final record without clock/clocks_planned: $final"
if [[ "$policy" == none ]]; then
  # A lost server ends the run with a clear error, not a hang, and the metrics say so.
  [[ $rc -ne 0 ]] || fail "exit status 0 after losing a server"
  grep -q 'parameter server lost' "$dir/out.log" || fail "no 'parameter server lost' error"
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
[[ "$policy" == chain ]] && name=chain-replication
[[ "$policy" == chain-relaxed ]] && name=chain-replication-relaxed

[[ $rc -eq 0 ]] || fail "exit status $rc"
summary="$(grep "^recovery $name:" "$dir/out.log")" || fail "no recovery summary"
num() { sed -n "s/.* \([0-9]*\) $1.*/\1/p" <<<"$summary"; }
reconnects="$(num reconnects)"
lost="$(num 'pushes lost')"
local_clocks="$(num 'shard-clocks trained')"
(( reconnects >= 4 )) || fail "$reconnects reconnects (every worker should have reconnected)"

if [[ "$policy" == checkpoint ]]; then
  grep -q 'restored from .*shard-0-clock-' "$dir/out.log" || fail "server 0 restored no checkpoint"
  # At most one interval (plus the clocks a worker may be ahead, s = 3) per worker is lost.
  (( lost > 0 && lost <= 4 * (every + 4) )) || fail "$lost pushes lost, bound $((4 * (every + 4)))"
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

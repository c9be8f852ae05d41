#!/usr/bin/env bash
# End-to-end fault test: fashion_mnist runs 2 server processes, and kills server 0 with SIGKILL
# mid-training, restarting it after a downtime. Checks what the recovery policy promises.
# Usage: e2e_recovery.sh /path/to/fashion_mnist none|checkpoint|stateless
set -euo pipefail
bin="$1"
policy="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

every=400  # checkpoint interval in clocks
args=(--model softmax --epochs 40 --servers 2 --workers 4 --consistency ssp --staleness 3
      --recovery "$policy" --kill-at 3.5 --downtime 1.5 --reconnect-timeout 60
      --checkpoint-dir "$dir/ckpt" --checkpoint-every "$every" --metrics "$dir/m.jsonl" --quiet)
set +e
"$bin" "${args[@]}" >"$dir/out.log" 2>&1
rc=$?
set -e
cat "$dir/out.log"
fail() { echo "e2e_recovery($policy): $*"; exit 1; }

grep -q '^\[fault\] killed server 0 (SIGKILL)' "$dir/out.log" || fail "the server was not killed"
if [[ "$policy" == none ]]; then
  # A lost server ends the run with a clear error, not a hang.
  [[ $rc -ne 0 ]] || fail "exit status 0 after losing a server"
  grep -q 'parameter server lost' "$dir/out.log" || fail "no 'parameter server lost' error"
  echo "e2e_recovery(none): ok, the run ended with 'parameter server lost' (exit status $rc)"
  exit 0
fi
grep -q '^\[fault\] restarted server 0' "$dir/out.log" || fail "the server was not restarted"

[[ $rc -eq 0 ]] || fail "exit status $rc"
summary="$(grep "^recovery $policy:" "$dir/out.log")" || fail "no recovery summary"
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
else
  grep -q 'rebuilt table 0 from the replica of worker' "$dir/out.log" ||
    fail "the restarted server did not rebuild its state from a replica"
  (( local_clocks > 0 )) || fail "workers did not train on during the outage"
  (( lost == 0 )) || fail "$lost pushes counted lost"
fi
acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/out.log")"
awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.80) }' || fail "final accuracy '$acc' < 0.80"
echo "e2e_recovery($policy): ok, $reconnects reconnects, $lost pushes lost, $local_clocks local clocks, accuracy $acc"

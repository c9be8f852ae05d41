#!/usr/bin/env bash
# End-to-end: 16 workers (MLP, 4 server shards, one process over loopback TCP) with the
# trainer's defaults converge above an accuracy floor (the default update rule for more than
# 4 workers is staleness-aware); the same run with every push at the full step (--update-rule
# sum) diverges, and the trainer stops it with exit status 3 and an error naming the
# learning rate, the worker count and the rule (docs/results/scaling.md).
# Usage: e2e_many_workers.sh /path/to/fashion_mnist
set -euo pipefail
bin="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "e2e_many_workers: $*"; exit 1; }

# 5 epochs of 16 workers measured 0.8300 and 0.8329 (2 runs, 2 cores, 7-9 s each); 1 worker
# 0.8688: the gap is docs/results/scaling.md's (large global batch, stale pushes).
floor=0.80
args=(--model mlp --servers 4 --workers 16 --epochs 5 --quiet --metrics "$dir/m.jsonl")
set +e
"$bin" "${args[@]}" >"$dir/default.log" 2>&1
rc=$?
set -e
cat "$dir/default.log"
[[ $rc -eq 0 ]] || fail "default rule: exit status $rc"
grep -q 'update rule staleness-aware' "$dir/default.log" || fail "the default rule is not staleness-aware"
acc="$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$dir/default.log")"
[[ -n "$acc" ]] || fail "no final accuracy"
awk -v a="$acc" -v f="$floor" 'BEGIN { exit !(a + 0 >= f) }' || fail "final accuracy $acc < $floor"

set +e
"$bin" "${args[@]}" --update-rule sum >"$dir/sum.log" 2>&1
rc=$?
set -e
cat "$dir/sum.log"
[[ $rc -eq 3 ]] || fail "--update-rule sum: exit status $rc, expected 3 (diverged)"
grep -q 'training diverged at epoch .* with learning rate 0.1, 16 workers and update rule sum' \
  "$dir/sum.log" || fail "no divergence error naming the settings"
if grep -q '^final test accuracy' "$dir/sum.log"; then fail "a diverged run printed a final accuracy"; fi
echo "e2e_many_workers: ok, 16 workers $acc >= $floor; the sum rule stopped as diverged"

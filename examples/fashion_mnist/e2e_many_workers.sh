#!/usr/bin/env bash
# End-to-end: 16 workers (MLP, 4 server shards, one process over loopback TCP) with the
# trainer's defaults (the mean update rule, a global batch of 128: 8 samples per worker, the
# learning rate scaled with it) train to within 1 point of 1 worker's test accuracy after the
# same epochs; the same 16 workers with 64 samples each and every push at the full step
# (--update-rule sum) diverge, and the trainer stops the run with exit status 3 and an error
# naming the learning rate, the worker count and the rule (docs/results/scaling.md).
# Usage: e2e_many_workers.sh /path/to/fashion_mnist
set -euo pipefail
bin="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "e2e_many_workers: $*"; exit 1; }
final_accuracy() { sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$1"; }

epochs=3
common=(--model mlp --servers 4 --epochs "$epochs" --quiet)
run() {  # run NAME ARGS...: the trainer's log in $dir/NAME.log, its exit status in $rc
  local name="$1"
  shift
  set +e
  "$bin" "${common[@]}" --metrics "$dir/$name.jsonl" "$@" >"$dir/$name.log" 2>&1
  rc=$?
  set -e
  cat "$dir/$name.log"
}

run one --workers 1
[[ $rc -eq 0 ]] || fail "1 worker: exit status $rc"
acc1="$(final_accuracy "$dir/one.log")"
[[ -n "$acc1" ]] || fail "1 worker: no final accuracy"

run many --workers 16
[[ $rc -eq 0 ]] || fail "16 workers: exit status $rc"
grep -q '16 workers, .* clocks of 8 per worker), update rule mean' "$dir/many.log" ||
  fail "16 workers: the defaults are not 8 samples per worker and the mean rule"
acc16="$(final_accuracy "$dir/many.log")"
[[ -n "$acc16" ]] || fail "16 workers: no final accuracy"
# Within 1 point of 1 worker, and above an absolute floor (1 worker reaches 0.86-0.87 after 3
# epochs), so that two broken runs cannot pass together.
awk -v a="$acc16" -v b="$acc1" 'BEGIN { exit !(a + 0 >= b - 0.01 && a + 0 >= 0.83) }' ||
  fail "16 workers reached $acc16, 1 worker $acc1: not within 1 point (or below 0.83)"

run sum --workers 16 --batch 64 --update-rule sum
[[ $rc -eq 3 ]] || fail "--update-rule sum: exit status $rc, expected 3 (diverged)"
grep -q 'training diverged at epoch .* with learning rate 0.1, 16 workers and update rule sum' \
  "$dir/sum.log" || fail "no divergence error naming the settings"
if grep -q '^final test accuracy' "$dir/sum.log"; then fail "a diverged run printed a final accuracy"; fi
echo "e2e_many_workers: ok, 16 workers $acc16 against 1 worker $acc1 after $epochs epochs;" \
  "the sum rule stopped as diverged"

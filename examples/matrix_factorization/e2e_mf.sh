#!/usr/bin/env bash
# End-to-end: mf_trainer (2 server shards and 2 workers in one process over loopback TCP) on a
# small synthetic matrix (500 x 500, rank 5, 20,000 ratings), under BSP, SSP(2), ESSP(2) and
# ASP. Each run must exit 0, print a progress line per evaluation of the servers' model, and
# end with a test RMSE below half the initial one (about 0.98 -> 0.16-0.20 in 10 epochs).
# Mode bad-flags: bad command lines exit with status 2 and one line naming the flag; --help
# exits 0.
# Usage: e2e_mf.sh /path/to/mf_trainer train|bad-flags
set -euo pipefail
bin="$1"
mode="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "e2e_mf($mode): $*"; exit 1; }

if [[ "$mode" == bad-flags ]]; then
  # expect STATUS REGEX ARGS...: the exit status and what stderr (one line) must match.
  expect() {
    local want="$1" regex="$2"
    shift 2
    set +e
    "$bin" "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    set -e
    [[ $rc -eq $want ]] || fail "$*: exit status $rc, expected $want; stderr: $(cat "$dir/err")"
    if [[ $want -ne 0 ]]; then
      [[ "$(wc -l <"$dir/err")" -eq 1 ]] || fail "$*: stderr is not one line: $(cat "$dir/err")"
      grep -Eq -e "$regex" "$dir/err" || fail "$*: stderr '$(cat "$dir/err")' does not match '$regex'"
    else
      grep -Eq -e "$regex" "$dir/out" || fail "$*: stdout does not match '$regex'"
    fi
    echo "ok: $* -> $rc"
  }
  expect 2 '^mf_trainer: --consistency: strong not in \{bsp,ssp,essp,asp\} \(see --help\)$' \
    --consistency strong
  expect 2 '^mf_trainer: --workers: .*0.*range' --workers 0
  expect 2 '^mf_trainer: --lr: ' --lr abc
  expect 2 '^mf_trainer: .*--bogus' --bogus
  expect 2 '^mf_trainer: --(clocks excludes --epochs|epochs excludes --clocks)' --clocks 10 --epochs 2
  expect 2 '^mf_trainer: --ratings must be <= --users x --items$' --users 5 --items 5 --ratings 26
  expect 2 '^mf_trainer: --staleness needs --consistency ssp or essp$' --consistency asp --staleness 2
  expect 2 '^mf_trainer: --servers must be <= --users' --users 3 --items 100 --ratings 10 --servers 4
  expect 0 '--staleness' --help
  echo "e2e_mf(bad-flags): ok"
  exit 0
fi
[[ "$mode" == train ]] || fail "unknown mode"

small=(--users 500 --items 500 --rank 5 --ratings 20000 --servers 2 --workers 2 --epochs 10)
for consistency in bsp "ssp --staleness 2" "essp --staleness 2" asp; do
  # shellcheck disable=SC2206  # "ssp --staleness 2" splits into three words on purpose
  policy=(--consistency $consistency)
  set +e
  "$bin" "${small[@]}" "${policy[@]}" --metrics "$dir/m.jsonl" >"$dir/out.log" 2>&1
  rc=$?
  set -e
  cat "$dir/out.log"
  [[ $rc -eq 0 ]] || fail "$consistency: exit status $rc"
  line="$(grep '^final test rmse ' "$dir/out.log")" || fail "$consistency: no final line"
  final="$(sed -n 's/^final test rmse \([0-9.]*\) .*/\1/p' <<<"$line")"
  initial="$(sed -n 's/.*initial test \([0-9.]*\)).*/\1/p' <<<"$line")"
  [[ -n "$final" && -n "$initial" ]] || fail "$consistency: cannot parse '$line'"
  # The initial line (clock 0) is the servers' random model: RMSE near the ratings' spread, 1.
  awk -v i="$initial" 'BEGIN { exit !(i + 0 > 0.8) }' || fail "$consistency: initial test rmse $initial"
  awk -v f="$final" -v i="$initial" 'BEGIN { exit !(f + 0 < 0.5 * i) }' ||
    fail "$consistency: final test rmse $final is not below half the initial $initial"
  # A progress line per evaluation (clock 0 and every tenth of the run), each in the metrics.
  evals="$(grep -c '^clock .* train rmse [0-9.]* *test rmse [0-9.]*' "$dir/out.log")"
  [[ "$evals" -ge 6 ]] || fail "$consistency: $evals progress lines, expected at least 6"
  [[ "$(grep -c '"test_rmse"' "$dir/m.jsonl")" -ge 6 ]] || fail "$consistency: metrics lines"
  grep -q '"final":true' "$dir/m.jsonl" || fail "$consistency: no final record in the metrics"
  # Sparse traffic: every pull was keyed (the model is a sparse_read_source).
  grep -Eq '^traffic: [0-9]+ gradients, ([0-9]+) pulls \(\1 keyed\)' "$dir/out.log" ||
    fail "$consistency: not every pull was keyed"
  echo "e2e_mf($consistency): ok, test rmse $initial -> $final"
done
echo "e2e_mf(train): ok"

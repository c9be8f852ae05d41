#!/usr/bin/env bash
# The README's timing figures, measured: clones this repository's HEAD into a fresh directory
# and runs the README's first command (`bash .ci/quickstart`, a short run of --epochs E) and,
# with --tests, its second (`bash .ci/test`), timing each from a fresh clone. Prints one
# markdown line per command with the commit, the machine (cores, memory) and the load average
# before and after, for the README's "On a 2-core machine ..." paragraph. Run it on a quiet
# machine (nothing else building or training).
#
#   bench/readme_timings.sh [--tests] [--epochs E]     (default E = 20, the quick start's own)
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tests=0
epochs=20
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tests) tests=1 ;;
    --epochs) epochs="$2"; shift ;;
    *) echo "readme_timings: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
git clone -q "$src" "$dir/asyncps"
cd "$dir/asyncps"
commit="$(git rev-parse --short HEAD)"
machine="$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
load() { cut -d' ' -f1 /proc/loadavg; }

# Quick start: seconds to the trainer's first line (the build is done and training starts),
# and to its end; the quick start's own line gives the build's share.
load0="$(load)"
t0="$(date +%s.%N)"
first=""
while IFS= read -r line; do
  printf '%s\n' "$line"
  if [[ -z "$first" && "$line" == fashion_mnist:* ]]; then first="$(date +%s.%N)"; fi
done < <(bash .ci/quickstart --epochs "$epochs" --metrics /dev/null 2>&1)
t1="$(date +%s.%N)"
awk -v a="$t0" -v b="${first:-$t1}" -v c="$t1" -v e="$epochs" -v m="$machine" -v l0="$load0" \
  -v l1="$(load)" -v k="$commit" 'BEGIN {
    printf "| quick start (--epochs %s) | %.0f s to the first training line, %.0f s in all | %s | load %s -> %s | %s |\n",
      e, b - a, c - a, m, l0, l1, k }'

if [[ $tests -eq 1 ]]; then
  load0="$(load)"
  t0="$(date +%s.%N)"
  bash .ci/test
  t1="$(date +%s.%N)"
  awk -v a="$t0" -v c="$t1" -v m="$machine" -v l0="$load0" -v l1="$(load)" -v k="$commit" 'BEGIN {
      printf "| test suite (.ci/test) | %.1f min | %s | load %s -> %s | %s |\n", (c - a) / 60, m, l0, l1, k }'
fi

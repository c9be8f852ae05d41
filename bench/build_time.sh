#!/bin/bash
# Measures what one translation unit costs to compile: wall time and peak memory ("Maximum
# resident set size" of /usr/bin/time -v) under g++ -O2, g++ -O0 and clang++-14 -O2, with the
# load average before and after each run (docs/build_time.md). Compiles one file at a time, so
# it uses one core; on a shared machine, run it when `uptime` shows a load below ~1.2 and say
# what it was.
#
#   bench/build_time.sh [file.cpp ...]   (default: examples/tutorial/1_quick_start.cpp)
#   MODES="gcc-O2 clang-O2" bench/build_time.sh file.cpp
#   EXTRA_FLAGS=-DASYNCPS_SEPARATE_COMPILATION bench/build_time.sh   (separate compilation; the
#     one-off cost of the library: EXTRA_FLAGS=... bench/build_time.sh src/asyncps_compiled.cpp)
#
# Prints one line per (file, mode): wall seconds, CPU seconds (user + system: less sensitive to
# other processes than wall time), MB, load before -> after (1-minute average).
set -euo pipefail
cd "$(dirname "$0")/.."

files=("$@")
[[ ${#files[@]} -eq 0 ]] && files=(examples/tutorial/1_quick_start.cpp)
modes=(${MODES:-gcc-O2 gcc-O0 clang-O2})
common=(-std=c++20 -Iinclude -isystem /usr/include/eigen3 -DASIO_STANDALONE -DASIO_NO_DEPRECATED
  ${EXTRA_FLAGS:-})
clang_defs=(-DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

load() { cut -d' ' -f1 /proc/loadavg; }

echo "# $(uname -n), nproc $(nproc), $(g++ --version | head -1), $(clang++-14 --version | head -1)"
echo "# EXTRA_FLAGS: ${EXTRA_FLAGS:-(none)}"
printf '%-44s %-9s %8s %8s %6s  %s\n' file mode wall_s cpu_s MB "load before -> after"
for f in "${files[@]}"; do
  for mode in "${modes[@]}"; do
    case $mode in
      gcc-O2) cmd=(g++ "${common[@]}" -O2) ;;
      gcc-O0) cmd=(g++ "${common[@]}" -O0) ;;
      clang-O2) cmd=(clang++-14 "${common[@]}" "${clang_defs[@]}" -O2) ;;
      clang-O0) cmd=(clang++-14 "${common[@]}" "${clang_defs[@]}" -O0) ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    before=$(load)
    /usr/bin/time -v -o "$out/time" "${cmd[@]}" -c "$f" -o "$out/x.o"
    after=$(load)
    secs=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$out/time" |
      awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.1f", s }')
    cpu=$(sed -n 's/.*\(User\|System\) time (seconds): //p' "$out/time" |
      awk '{ s += $1 } END { printf "%.1f", s }')
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out/time")
    printf '%-44s %-9s %8s %8s %6d  %s -> %s\n' "$f" "$mode" "$secs" "$cpu" $((kb / 1024)) \
      "$before" "$after"
  done
done

#!/usr/bin/env bash
# Issue 31, before and after: runs two release builds' benchmarks interleaved and prints the
# figures the issue's server and worker changes aim at.
#
#   bench/compare_31.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [ROUNDS] [OUT_DIR]
#
# Each build dir holds bench/asyncps_bench and bench/asyncps_end_to_end (release preset:
# `cmake --build DIR -j1 --target asyncps_bench asyncps_end_to_end`). Per round (default 3),
# both builds run in turn, the order alternating between rounds (before first in odd rounds),
# so a slow drift of the machine's load affects both alike:
#   - asyncps_bench, 4 MiB over TCP and in-process, window 1, protocol and worker APIs: the
#     push, pull and push+pull protocol rows, the BSP clock through basic_worker, each against
#     the raw-socket baseline of the same run;
#   - asyncps_end_to_end, 1 worker, BSP, single / in-process / tcp: the parameter server's
#     overhead per MLP step (+us/clock against single).
# Raw output (stdout tables, stderr progress, JSON) goes to OUT_DIR (default
# compare_31_<date>); at the end a summary prints each figure's median over the rounds and
# every round's value, per build. Takes about 4 minutes per round. Run it on a quiet machine.
set -euo pipefail

before=${1:?usage: compare_31.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [ROUNDS] [OUT_DIR]}
after=${2:?usage: compare_31.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [ROUNDS] [OUT_DIR]}
rounds=${3:-3}
out=${4:-compare_31_$(date +%Y%m%d_%H%M%S)}

for dir in "$before" "$after"; do
  for exe in asyncps_bench asyncps_end_to_end; do
    if [[ ! -x "$dir/bench/$exe" ]]; then
      echo "compare_31.sh: $dir/bench/$exe not found (build it with the release preset)" >&2
      exit 2
    fi
  done
done
mkdir -p "$out"
echo "compare_31.sh: before=$before after=$after rounds=$rounds out=$out"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

run_one() {  # run_one NAME DIR ROUND
  local name=$1 dir=$2 r=$3
  echo "== round $r: $name ($dir) =="
  "$dir/bench/asyncps_bench" --size 4194304 --transport tcp,in-process --api protocol,worker \
    --windows 1 \
    --json "$out/bench_${name}_$r.json" >"$out/bench_${name}_$r.txt" 2>"$out/bench_${name}_$r.err"
  grep -E '^(api|raw|protocol|worker) ' "$out/bench_${name}_$r.txt" || cat "$out/bench_${name}_$r.txt"
  "$dir/bench/asyncps_end_to_end" --workers 1 --consistency bsp --modes single,in-process,tcp \
    --json "$out/e2e_${name}_$r.json" >"$out/e2e_${name}_$r.txt" 2>"$out/e2e_${name}_$r.err"
  grep -E '^\| (mode|single|in-process|tcp) ' "$out/e2e_${name}_$r.txt" || cat "$out/e2e_${name}_$r.txt"
}

for r in $(seq 1 "$rounds"); do
  if ((r % 2 == 1)); then
    run_one before "$before" "$r"
    run_one after "$after" "$r"
  else
    run_one after "$after" "$r"
    run_one before "$before" "$r"
  fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
size = 4194304
figures = {}  # name -> build -> [value per round]
def add(name, build, v):
    figures.setdefault(name, {}).setdefault(build, []).append(v)
for build in ("before", "after"):
    for r in range(1, rounds + 1):
        with open(f"{out}/bench_{build}_{r}.json") as f:
            for row in json.load(f)["rows"]:
                if row["size"] != size or row["window"] != 1 or row.get("workers", 1) != 1:
                    continue
                api = row.get("api", "protocol")
                if api not in ("protocol", "worker"):
                    continue
                name = f"4 MiB {row['transport']} {api} {row['op']} window 1 ({row['unit']})"
                add(name, build, row["median"])
                if row.get("ratio_to_raw", 0) > 0:
                    add(name + " vs raw", build, row["ratio_to_raw"])
        with open(f"{out}/e2e_{build}_{r}.json") as f:
            for row in json.load(f)["rows"]:
                if not row.get("ok"):
                    continue
                base = f"MLP step, {row['mode']}, 1 worker bsp"
                add(base + ": ms/clock median", build, row["clock_ms_median"])
                if "overhead_us" in row:
                    add(base + ": +us/clock vs single", build, row["overhead_us"])
                if row.get("ratio_to_single"):
                    add(base + ": ratio to single", build, row["ratio_to_single"])
print("\n| figure | before: median (rounds) | after: median (rounds) |")
print("|---|---|---|")
for name, by in figures.items():
    cells = []
    for build in ("before", "after"):
        v = by.get(build, [])
        cells.append(f"{statistics.median(v):.3f} ({', '.join(f'{x:.3f}' for x in v)})" if v else "-")
    print(f"| {name} | {cells[0]} | {cells[1]} |")
EOF

#!/bin/sh
# Socket buffer sizes for 4 MiB frames (docs/performance.md, "Socket buffers"): ROUNDS rounds of
# asyncps_bench, transport tcp at each --socket-buffer size, the size order rotated every round
# (A B C .., B C .. A, ..), each round against its own raw baseline; `uptime` before and after
# each round. Then summary.py prints medians over the rounds of each figure's ratio to raw.
#   run.sh BUILD_DIR OUT_DIR [ROUNDS]
# FLAG=--receive-wakeup SIZES="0 262144 ..." run.sh ...: the same for another list flag.
set -eu
build=$1
out=$2
rounds=${3:-5}
flag=${FLAG:---socket-buffer}
sizes=${SIZES:-0 262144 1048576 4194304 8388608}
mkdir -p "$out"
{ uname -r; nproc; for f in wmem_max rmem_max; do echo "net.core.$f $(cat /proc/sys/net/core/$f)"; done
  for f in tcp_wmem tcp_rmem; do echo "net.ipv4.$f $(cat /proc/sys/net/ipv4/$f)"; done; } > "$out/machine.txt"
r=1
while [ "$r" -le "$rounds" ]; do
  list=$(echo $sizes | tr ' ' ',')
  echo "round $r: uptime before: $(uptime)" | tee -a "$out/uptime.txt"
  "$build/bench/asyncps_bench" --api worker,protocol --transport tcp --size 4194304 \
    --windows 1,16 --workers 1 --reps 3 --seconds 0.2 "$flag" "$list" \
    --json "$out/round$r.json" > "$out/round$r.txt" 2> "$out/round$r.err"
  echo "round $r: uptime after: $(uptime)" | tee -a "$out/uptime.txt"
  # rotate: the first size goes last
  first=${sizes%% *}
  sizes="${sizes#* } $first"
  r=$((r + 1))
done

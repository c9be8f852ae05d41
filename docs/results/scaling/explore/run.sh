#!/bin/bash
# usage: run.sh tag args...
tag=$1; shift
B=${FM_BIN:-build/release/examples/fashion_mnist/fashion_mnist}
start=$(date +%s.%N)
$B --quiet --metrics docs/results/scaling/explore/$tag.jsonl "$@" > docs/results/scaling/explore/$tag.log 2>&1
rc=$?
end=$(date +%s.%N)
acc=$(sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' docs/results/scaling/explore/$tag.log)
echo "$tag rc=$rc acc=$acc wall=$(echo "$end-$start"|bc) load=$(cut -d' ' -f1 /proc/loadavg) :: $*" | tee -a docs/results/scaling/explore/results.txt

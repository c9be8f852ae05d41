#!/bin/bash
# The runs of docs/results/scaling.md meant for a larger machine (16 cores): throughput rows
# (one run at a time, quiet), then accuracy rows (3 at a time), all under /tmp/scaling, then a
# tarball in $OUT (or the current directory).
#   bench/scaling_runs.sh [BINARY] [DATA_DIR]
set -u
W=/tmp/scaling; mkdir -p $W
B=${1:-$PWD/build/release/examples/fashion_mnist/fashion_mnist}
D=${2:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-$PWD}
{ nproc; uname -a; cat /proc/loadavg; lscpu | head -20; } > $W/machine.txt 2>&1
# Throughput: MLP, SSP(3), default rule, 2 epochs, 4 shards.
bash bench/scaling_experiment.sh $W/mlp_tput $B mlp 2 "1 2 4 8 16" "ssp" "default" --servers 4 --data $D
# The same with 1 I/O thread and 2 compute threads (the trainer's old defaults).
bash bench/scaling_experiment.sh $W/mlp_tput_old_threads $B mlp 2 "1 4 16" "ssp" "default" --servers 4 --data $D --io-threads 2 --compute-threads 2
# CNN throughput, half an epoch.
bash bench/scaling_experiment.sh $W/cnn_tput $B cnn 0.5 "1 2 4 8 16" "ssp" "default" --servers 4 --data $D
cat /proc/loadavg >> $W/machine.txt
# Accuracy: MLP 20 epochs, 1/4/16 workers, BSP/SSP(3)/ASP, default rule and the others at 16.
PARALLEL=3 bash bench/scaling_experiment.sh $W/mlp_acc $B mlp 20 "1 4 16" "bsp ssp asp" "default" --servers 4 --data $D
PARALLEL=3 bash bench/scaling_experiment.sh $W/mlp_acc_rules $B mlp 20 "16" "bsp ssp asp" "sum mean" --servers 4 --data $D
tar czf $OUT/scaling_device.tgz -C /tmp scaling
cat $W/*/runs.txt

#!/bin/bash
# The push window's cost over TCP on the 2-core VM: 16 workers, ASP, MLP, 5 epochs, 4 shards,
# role all; the default window (2 clocks per server) against none (--push-window 0), two
# interleaved rounds. Prints each run's final accuracy line and the load average.
# BIN: a release build of examples/fashion_mnist (cmake --preset release).
BIN=${BIN:-build/release/examples/fashion_mnist/fashion_mnist}
for round in 1 2; do
  for win in default 0; do
    flag=()
    [[ $win != default ]] && flag=(--push-window "$win")
    echo "round $round window $win load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$BIN" --quiet --model mlp --epochs 5 --workers 16 --servers 4 --consistency asp \
      "${flag[@]}" --metrics /dev/null 2>&1 | grep -E '^final test accuracy|diverged|error'
  done
done

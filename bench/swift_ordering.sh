#!/usr/bin/env bash
# Issue 34, failure-free cost of replica-log's ordering: the Fashion-MNIST trainer without a
# kill under `--recovery none`, `replica-log` (write-ahead: a push is applied once its worker
# logged its position, one round trip) and `replica-log --replica-ordering apply-first`
# (applied on arrival), and apply-first with `--replica-ack-delay 5` (acks, with their
# positions, held back up to 5 ms: one ack for several clocks), interleaved per seed so a drift
# of the machine's load hits them all.
#
#   [MODES="none apply-first ..."] [MODEL=softmax] bench/swift_ordering.sh BINARY [SEEDS]
#     [EPOCHS] [OUT_DIR]
#
# MODES: which of none, write-ahead, apply-first, apply-first-ack-delay to run (default all;
# none is always run, the baseline). MODEL: the trainer's --model (default mlp).
# BINARY: a release build of examples/fashion_mnist (every policy compiled in). Defaults:
# seeds 1-5, 3 epochs, MLP, 2 shards, 4 workers, SSP(3), role all (servers and workers in one
# process over TCP loopback). Per run: the trainer's log (its "final test accuracy ... after
# S s" line: S is the training time from the end of data loading) and the load average before
# and after, in OUT_DIR (default swift_ordering_<date>); at the end one line per run and the
# mean ratio of each replica-log mode's time to none's over the seeds, with a 95% interval
# (Student t over the per-seed ratios), for the training time and for the process's CPU time
# (user + system, from /usr/bin/time, less sensitive to scheduling noise than wall time on a
# loaded machine). Needs /usr/bin/time (Debian package `time`: apt-get install time). Run it on
# a quiet machine.
set -euo pipefail

[[ -x /usr/bin/time ]] || {
  echo "swift_ordering.sh: /usr/bin/time not found (Debian package 'time': apt-get install time)" >&2
  exit 1
}

bin=${1:?usage: swift_ordering.sh BINARY [SEEDS] [EPOCHS] [OUT_DIR]}
seeds=${2:-1,2,3,4,5}
epochs=${3:-3}
out=${4:-swift_ordering_$(date +%Y%m%d_%H%M%S)}
mkdir -p "$out"

common=(--model "${MODEL:-mlp}" --servers 2 --workers 4 --consistency ssp --staleness 3 --epochs "$epochs")
declare -A flags=(
  [none]="--recovery none"
  [write-ahead]="--recovery replica-log"
  [apply-first]="--recovery replica-log --replica-ordering apply-first"
  [apply-first-ack-delay]="--recovery replica-log --replica-ordering apply-first --replica-ack-delay 5"
)
read -r -a order <<<"${MODES:-none write-ahead apply-first apply-first-ack-delay}"
[[ " ${order[*]} " == *" none "* ]] || order=(none "${order[@]}")
for mode in "${order[@]}"; do
  [[ -n "${flags[$mode]+x}" ]] || {
    echo "swift_ordering.sh: unknown mode '$mode' in MODES" >&2
    exit 2
  }
done

IFS=, read -r -a seed_list <<<"$seeds"
for seed in "${seed_list[@]}"; do
  for mode in "${order[@]}"; do
    log="$out/$mode-seed$seed.log"
    {
      echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
      # shellcheck disable=SC2086
      echo "# $bin ${common[*]} --seed $seed ${flags[$mode]}"
    } >"$log"
    # shellcheck disable=SC2086
    /usr/bin/time -f "# cpu: user %U s, system %S s, wall %e s" -a -o "$log" \
      "$bin" "${common[@]}" --seed "$seed" ${flags[$mode]} --metrics /dev/null >>"$log" 2>&1 || {
      echo "swift_ordering.sh: $mode seed $seed failed (see $log)" >&2
      exit 1
    }
    echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
    secs=$(sed -n 's/^final test accuracy \([0-9.]*\) .* after \([0-9.]*\) s.*/\1 \2/p' "$log")
    echo "$mode seed $seed: accuracy, seconds = $secs" | tee -a "$out/summary.txt"
  done
done

python3 - "$out" "${order[*]}" "${seed_list[@]}" <<'EOF' | tee -a "$out/summary.txt"
import math, re, statistics, sys
out, modes, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
def secs(mode, seed):
    text = open(f"{out}/{mode}-seed{seed}.log").read()
    return float(re.search(r"^final test accuracy [0-9.]+ .* after ([0-9.]+) s", text, re.M).group(1))
def cpu(mode, seed):
    text = open(f"{out}/{mode}-seed{seed}.log").read()
    m = re.search(r"^# cpu: user ([0-9.]+) s, system ([0-9.]+) s", text, re.M)
    return float(m.group(1)) + float(m.group(2)) if m else None
def summary(what, mode, f):
    r = [f(mode, s) / f("none", s) for s in seeds]
    m = statistics.mean(r)
    half = t95.get(len(r) - 1, 2.0) * statistics.stdev(r) / math.sqrt(len(r)) if len(r) > 1 else float("nan")
    print(f"{mode} / none, {what}: mean {m:.3f}, 95% interval [{m - half:.3f}, {m + half:.3f}] "
          f"over {len(r)} seeds; per seed {', '.join(f'{x:.3f}' for x in r)}")
for mode in [m for m in modes if m != "none"]:
    summary("training time", mode, secs)
    if all(cpu(mo, s) is not None for mo in ("none", mode) for s in seeds):
        summary("CPU time (user + system, whole process)", mode, cpu)
EOF

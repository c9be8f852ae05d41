#!/usr/bin/env python3
"""Derives the figures of docs/results/swift.md's section "Three kills, 5 seeds, wire version 6"
from the runs in this folder (*.jsonl):

    python3 docs/results/swift/three_kills/derive.py

Standard library only. The runs are parsed with the parsers and metrics of
bench/swift_experiment.py and bench/recovery_experiment.py (the definitions table.md was made
with). Intervals: mean [95% confidence interval], t over the seeds (n = 5, t = 2.776), on
per-seed values paired by seed (swift_experiment.fmt_ci). Accuracy: the servers' model (each
run's final evaluation reads it); an evaluation while a shard cannot be read falls back to
worker 0's view (eval_source "worker"), counted below. These runs stay under 80% test
accuracy, so times to accuracy are to 75%.
"""
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "bench"))
import recovery_experiment as rx  # noqa: E402
import swift_experiment as sx  # noqa: E402

SCHED = "3 kills"
NAN = float("nan")


def lst(xs, f="{:.2f}"):
    return "[" + ", ".join(f.format(x) for x in xs) + "]"


runs = [sx.parse(p) for p in sorted(HERE.glob("*.jsonl"))]
runs = [r for r in runs if r["policy"]]
ctrl = [r for r in runs if r["policy"] == "none" and r["schedule"] == "no kill"]
T = statistics.mean(r["duration"] for r in ctrl)
curves = {r["seed"]: ([e[0] for e in r["evals"]], [e[1] for e in r["evals"]]) for r in ctrl}
t_ref = min(r["duration"] for r in runs if not r["died"])
for r in runs:
    r["m"] = rx.run_metrics(r, T, [0.75, 0.8], 0.2, curves.get(r["seed"], ([], [])), 1.0, 2, 2,
                            t_ref)
    r["k"] = sx.kill_metrics(r, T)
seeds = sorted({r["seed"] for r in runs})
by = {(r["policy"], r["seed"]): r for r in runs}


def fallbacks(r):
    """Evaluations of the run that read worker 0's view instead of the servers' model."""
    return sum('"eval_source":"worker"' in line for line in open(r["path"]))


sources = sorted({r["final"]["eval_source"] for r in runs if r["final"]})
print(f"T = {T:.2f} s (none, no kill, {len(ctrl)} runs); seeds {seeds}; runs {len(runs)}; "
      f"every run exit 0: {all(r.get('rc') == 0 for r in runs)}; final evaluations' "
      f"eval_source {sources}")
print(f"kill fractions {sx.SCHEDULES[SCHED]} of T; load before each run "
      f"{min(r['loadavg_before'] for r in runs):.2f}-{max(r['loadavg_before'] for r in runs):.2f}")

policies = ["none"] + sx.KILL_POLICIES
for p in policies:
    rs = [by[(p, s)] for s in seeds]
    summ = [r["summary"] or {} for r in rs]
    print(f"\n## {p}")
    print(f"  duration per seed {lst([r['duration'] for r in rs], '{:.1f}')}")
    print(f"  final accuracy per seed {lst([r['m']['final'] for r in rs], '{:.4f}')}")
    print(f"  time to 75% per seed {lst([r['m'].get('t0.75', NAN) for r in rs], '{:.1f}')}")
    print(f"  evaluations of worker 0's view (a shard unreadable) per seed "
          f"{[fallbacks(r) for r in rs]}")
    print(f"  pushes lost per seed {[s.get('lost_pushes') for s in summ]}; applied twice "
          f"{[s.get('pushes_applied_twice') for s in summ]}")
    if p == "none":
        continue
    for i in range(len(sx.SCHEDULES[SCHED])):
        print(f"  kill {i + 1}: kill -> serving {lst([r['k']['serving'][i] for r in rs])}; "
              f"kill -> full rate {lst([r['k']['full_rate'][i] for r in rs])}")
    if p == "replica-log":
        exact = [x for r in rs for x in r["k"]["exact"]]
        print(f"  rebuilds exact {sum(x is True for x in exact)} of {len(exact)}; rebuild s "
              f"{lst([x for r in rs for x in r['k']['rebuild']], '{:.3f}')}; entries "
              f"{lst([x for r in rs for x in r['k']['entries']], '{:.0f}')}")
        print(f"  log max / worker KB {lst([s['max_log_bytes'] / 1024 for s in summ], '{:.0f}')}")
    if p == "checkpoint":
        for i in range(len(sx.SCHEDULES[SCHED])):
            print(f"  rolled back at kill {i + 1} (clocks) "
                  f"{lst([r['m'].get(f'rollback{i + 1}', NAN) for r in rs], '{:.0f}')}")
    if p == "stateless":
        print(f"  trained locally (shard-clocks) {[s.get('local_clocks') for s in summ]}")

print("\n## paired by seed, against replica-log")
rl = {s: by[("replica-log", s)] for s in seeds}
for p in policies:
    if p == "replica-log":
        continue
    o = {s: by[(p, s)] for s in seeds}
    dur = [o[s]["duration"] / rl[s]["duration"] for s in seeds]
    t75 = [rl[s]["m"].get("t0.75", NAN) - o[s]["m"].get("t0.75", NAN) for s in seeds]
    acc = [100 * (rl[s]["m"]["final"] - o[s]["m"]["final"]) for s in seeds]
    print(f"{p:11s} duration / replica-log's {sx.fmt_ci(dur, '{:.3f}')} per seed "
          f"{lst(dur, '{:.3f}')}; time to 75%, replica-log minus {p} "
          f"{sx.fmt_ci(t75, '{:+.1f}')} s; final accuracy, replica-log minus {p} "
          f"{sx.fmt_ci(acc, '{:+.2f}')} points")

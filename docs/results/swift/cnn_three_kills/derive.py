#!/usr/bin/env python3
"""Paper B's "faster through failures" and "no loss of accuracy" claims under three kills, read
off the runs in this folder (paper A's setting: the CNN, 2 shards, 4 workers, SSP(3), 5 seeds,
the servers' model evaluated; server shard 0 killed at 0.14 T, 0.37 T and 0.6 T), replica-log
("swift (replica-log/10)") beside checkpointing (adaptive and every 100 clocks) and a no-kill
control.

    python3 docs/results/swift/cnn_three_kills/derive.py

Standard library only. Runs are parsed, and the per-run metrics computed, with
bench/recovery_experiment.py's functions and the settings of docs/results/recovery/table.md
(as docs/results/recovery/derive.py does). Comparisons are paired by seed; intervals are 95%,
mean +- t(0.975, n-1) * sd / sqrt(n) over the per-seed values (n = 5, t = 2.776).
"""
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE
sys.path.insert(0, str(HERE.parents[3] / "bench"))
import recovery_experiment as rx  # noqa: E402
import swift_experiment as sx  # noqa: E402

NAN = float("nan")
RL = "swift (replica-log/10)"
OTHERS = ["checkpoint/adaptive", "checkpoint/100"]
CTRL = rx.CONTROL


def fci(xs, f="{:.3f}"):
    """mean [95% interval] (n=...) over the seeds: swift_experiment.fmt_ci's t interval."""
    vals = [x for x in xs if x == x]
    return f"{sx.fmt_ci(vals, f)} (n={len(vals)})"


def lst(xs, f="{:.3f}"):
    return "[" + ", ".join(f.format(x) for x in xs) + "]"


allruns = [rx.parse_run(p) for p in sorted(RUNS.glob("*.jsonl"))]
seeds = sorted({r["seed"] for r in allruns})
for k in (3,):
    runs = [r for r in allruns if not r["kills_scheduled"] or r["schedule"] == k]
    ctrl = [r for r in runs if r["config"] == CTRL]
    T = statistics.mean(r["duration"] for r in ctrl if not r["died"])
    t_ref = min(r["duration"] for r in runs if not r["died"])
    cbs = {r["seed"]: ([e[0] for e in r["evals"]], [e[1] for e in r["evals"]]) for r in ctrl}
    per = {}
    for r in runs:
        m = rx.run_metrics(r, T, [0.75, 0.8, 0.85], 0.2, cbs[r["seed"]], 1.0, 4, 2, t_ref)
        per.setdefault(r["config"], {})[r["seed"]] = (r, m)

    def run(cfg, key):
        return [per[cfg][s][0][key] for s in seeds]

    def met(cfg, key):
        return [per[cfg][s][1].get(key, NAN) for s in seeds]

    def acc(cfg):
        return [per[cfg][s][0]["final"]["test_accuracy"] for s in seeds]

    print(f"\n######## {k} kills (T = {T:.2f} s), seeds {seeds}")
    for c in [CTRL, RL] + OTHERS:
        assert all(not d for d in run(c, "died")), c
        print(f"{c:24s} duration {lst(run(c, 'duration'), '{:.2f}')} s; final accuracy "
              f"(servers' model) {lst(acc(c))}; eval_source "
              f"{sorted({per[c][s][0]['final'].get('eval_source') for s in seeds})}")
    print("pushes lost per run:",
          {c: [per[c][s][0]["summary"].get("lost_pushes") for s in seeds] for c in [RL] + OTHERS})
    for o in OTHERS:
        ratio = [a / b for a, b in zip(run(o, "duration"), run(RL, "duration"))]
        print(f"duration {o} / replica-log (paper B's speedup if > 1): per seed "
              f"{lst(ratio)}; {fci(ratio)}")
        d80 = [a - b for a, b in zip(met(RL, "t0.8"), met(o, "t0.8"))]
        print(f"time to 80% replica-log - {o} (s): per seed {lst(d80, '{:+.1f}')}; "
              f"{fci(d80, '{:+.1f}')}")
        dacc = [(a - b) * 100 for a, b in zip(acc(RL), acc(o))]
        print(f"final accuracy replica-log - {o} (pts): {fci(dacc, '{:+.2f}')}")
    dctl = [(a - b) * 100 for a, b in zip(acc(RL), acc(CTRL))]
    print(f"final accuracy replica-log - control (pts): {fci(dctl, '{:+.2f}')}")
    rd = [a / b for a, b in zip(run(RL, "duration"), run(CTRL, "duration"))]
    print(f"duration replica-log / control: {fci(rd)}")
    cd = [a / b for a, b in zip(run(CTRL, "duration"), run(RL, "duration"))]
    print(f"duration control / replica-log: per seed {lst(cd)}; {fci(cd)}")

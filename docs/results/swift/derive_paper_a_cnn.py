#!/usr/bin/env python3
"""Paper B's "faster through failures" and "no loss of accuracy" claims, read off the runs of
docs/results/recovery/ (paper A's experiment: the CNN, 2 shards, 4 workers, SSP(3), paper A's
kill schedule 0.14 T and 0.37 T, 5 seeds, the servers' model evaluated), which include
replica-log ("swift (replica-log/10)") beside checkpointing. No run is added here.

    python3 docs/results/swift/derive_paper_a_cnn.py

Standard library only. Runs are parsed, and the per-run metrics computed, with
bench/recovery_experiment.py's functions and the settings of docs/results/recovery/table.md
(as docs/results/recovery/derive.py does). Comparisons are paired by seed; intervals are 95%,
mean +- t(0.975, n-1) * sd / sqrt(n) over the per-seed values (n = 5, t = 2.776).
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "recovery"
sys.path.insert(0, str(HERE.parents[2] / "bench"))
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


def derive(runs_dir, schedules, with_control_ratio=False):
    """Prints the comparisons for each kill schedule in `schedules` (1, 2 or 3 kills) from the
    runs in `runs_dir` (bench/recovery_experiment.py's JSONL files); `with_control_ratio` adds
    the control's duration over replica-log's."""
    allruns = [rx.parse_run(p) for p in sorted(Path(runs_dir).glob("*.jsonl"))]
    seeds = sorted({r["seed"] for r in allruns})
    for k in schedules:
        T, _, per = rx.per_seed_metrics(allruns, k)

        def run(cfg, key):
            return [per[cfg][s][0][key] for s in seeds]

        def met(cfg, key):
            return [per[cfg][s][1].get(key, NAN) for s in seeds]

        def acc(cfg):
            return [per[cfg][s][0]["final"]["test_accuracy"] for s in seeds]

        print(f"\n######## {k} kill{'s' if k > 1 else ''} (T = {T:.2f} s), seeds {seeds}")
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
        if with_control_ratio:
            cd = [a / b for a, b in zip(run(CTRL, "duration"), run(RL, "duration"))]
            print(f"duration control / replica-log: per seed {lst(cd)}; {fci(cd)}")


if __name__ == "__main__":
    derive(RUNS, (1, 2))

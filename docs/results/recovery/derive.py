#!/usr/bin/env python3
"""Re-derives the numbers docs/results/recovery.md states in its prose and verdicts from the
raw runs in this folder (*.jsonl), per seed and with 95% confidence intervals.

    python3 docs/results/recovery/derive.py

Standard library only. The runs are parsed, and the per-run metrics (acc after recovery, time
to a threshold, gradients by t_ref) computed, with the functions of
bench/recovery_experiment.py, with the settings table.md was made with (thresholds 0.75, 0.8,
0.85; post-recovery window 0.2 T; 4 tables x 2 servers; each run against its own seed's
control). Everything after that (pairing by seed, differences, ratios, intervals) is here.
Intervals: mean +- t(0.975, n-1) * sd / sqrt(n) over the per-seed values (n = 5, t = 2.776,
unless a threshold was not reached in some seed; n is printed).
"""
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "bench"))
import recovery_experiment as rx  # noqa: E402

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}
NAN = float("nan")


def ci(xs):
    xs = [x for x in xs if x == x]
    n = len(xs)
    if n == 0:
        return NAN, NAN, NAN, 0
    m = statistics.mean(xs)
    if n < 2:
        return m, NAN, NAN, n
    h = T975[n - 1] * statistics.stdev(xs) / math.sqrt(n)
    return m, m - h, m + h, n


def fci(xs, f="{:.3f}"):
    m, lo, hi, n = ci(xs)
    return f"{f.format(m)} [{f.format(lo)}, {f.format(hi)}] (n={n})"


def lst(xs, f="{:.3f}"):
    return "[" + ", ".join(f.format(x) for x in xs) + "]"


allruns = [rx.parse_run(p) for p in sorted(HERE.glob("*.jsonl"))]
CTRL = rx.CONTROL
SL = ["stateless/sum", "stateless/lr-scaled"]
CK = ["checkpoint/100", "checkpoint/adaptive"]
CH = ["chain/strict", "chain-relaxed/400"]
RL = "swift (replica-log/10)"
res = {}
for k in (1, 2):
    res[k] = rx.per_seed_metrics(allruns, k)
seeds = sorted({r["seed"] for r in allruns})


def vals(k, cfg, key):
    per = res[k][2]
    return [per[cfg][s][1].get(key, NAN) for s in seeds]


for k in (1, 2):
    T, t_ref, per = res[k]
    print(f"\n######## {k} kill{'s' if k == 2 else ''}: T = {T:.2f} s, t_ref = {t_ref:.1f} s")
    for i in range(1, k + 1):
        b = [x for c in per if c not in (CTRL,) for x in vals(k, c, f"before{i}") if x == x]
        print(f"accuracy at kill {i} (last evaluation before it), all kill runs: mean "
              f"{statistics.mean(b):.3f}, range {min(b):.3f}-{max(b):.3f} (n={len(b)})")
    for i in range(1, k + 1):
        print(f"-- acc after recovery {i} (mean of the runs):")
        for c in SL + CK + CH + [RL]:
            print(f"   {c:24s} {lst(vals(k, c, f'post{i}'))} mean "
                  f"{statistics.mean(vals(k, c, f'post{i}')):.3f}; vs control pts "
                  f"{fci([x * 100 for x in vals(k, c, f'postgap{i}')], '{:+.1f}')}")
        leads = {(a, b): [x - y for x, y in zip(vals(k, a, f"post{i}"), vals(k, b, f"post{i}"))]
                 for a in SL for b in CK}
        for (a, b), d in leads.items():
            print(f"   lead {a} - {b} (pts, paired by seed): "
                  f"{fci([x * 100 for x in d], '{:+.1f}')}")
    for thr in (0.75, 0.8):
        print(f"-- time to {thr:.0%} (s), per seed:")
        for c in [CTRL] + SL + CK + CH + [RL]:
            print(f"   {c:24s} {lst(vals(k, c, f't{thr}'), '{:.1f}')} mean "
                  f"{statistics.mean(x for x in vals(k, c, f't{thr}') if x == x):.1f}")
        for a in CK + [RL]:
            for b in SL + CH:
                d = [x - y for x, y in zip(vals(k, a, f"t{thr}"), vals(k, b, f"t{thr}"))]
                print(f"   {a} - {b}: {fci(d, '{:+.1f}')}")
    print("-- gradients by t_ref (worker 0's clock x 4):")
    for c in [CTRL] + SL + CK + CH + [RL]:
        print(f"   {c:24s} {lst(vals(k, c, 'grads_at_ref'), '{:.0f}')} mean "
              f"{statistics.mean(vals(k, c, 'grads_at_ref')):.0f}")
    for a in SL:
        for b in CK:
            ra = [x / y for x, y in zip(vals(k, a, "grads_at_ref"), vals(k, b, "grads_at_ref"))]
            mr = statistics.mean(vals(k, a, "grads_at_ref")) / statistics.mean(
                vals(k, b, "grads_at_ref"))
            print(f"   {a} / {b}: ratio of means {mr:.3f}; per seed {fci(ra)}")
    print("-- final accuracy per seed:")
    for c in [CTRL] + SL + CK + CH + [RL]:
        print(f"   {c:24s} {lst(vals(k, c, 'final'))}")

print("\nFailure-free overhead table: no JSONL in this folder has a run without --kill-at "
      "(every file's command):",
      sorted({("--kill-at" in r["cmd"]) for r in allruns}))

#!/usr/bin/env python3
"""Re-derives the D3 and D4 verdicts of docs/results/consistency.md, and the 1 Gbit/s check,
from the raw runs in this folder (runs.jsonl: the main grid; vap/1gbit.jsonl).

    python3 docs/results/consistency/derive.py

Standard library only; self-contained (the JSON lines hold each run's final RMSE, simulated
seconds and its loss series). "Time to 0.3" is, as in bench/consistency_experiment.py, the
first sample of the series (`time`, simulated seconds) whose training RMSE is <= 0.3.
Intervals: 95%, t-distribution over the 5 seeds (n = 5, t = 2.776), paired by seed.

D3 (ESSP faster per second than SSP): per cell and s, the paired difference SSP(s) - ESSP(s)
of the time to 0.3.
D4 (ESSP more robust to s than SSP): per cell and seed, the spread (max - min) of the final
training RMSE over s = 1, 3, 7, 15, for SSP and for ESSP; then the paired difference of the
spreads, SSP minus ESSP. "Clearly" below means that interval excludes 0.
"""
import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def ci(xs):
    n = len(xs)
    m = statistics.mean(xs)
    h = T975[n - 1] * statistics.stdev(xs) / math.sqrt(n) if n > 1 else float("nan")
    return m, m - h, m + h, n


def fci(xs, f="{:.3f}"):
    m, lo, hi, n = ci(xs)
    return f"{f.format(m)} [{f.format(lo)}, {f.format(hi)}] (n={n})", lo > 0 or hi < 0


def reach(run, target=0.3):
    s = run["series"]
    return next((t for t, y in zip(s["time"], s["rmse"]) if y is not None and y <= target), None)


runs = [json.loads(l) for l in open(HERE / "runs.jsonl") if l.strip()]
by = {}
for r in runs:
    by.setdefault((r["profile"], r["batch_percent"], r["label"]), {})[r["seed"]] = r
cells = sorted({(r["profile"], r["batch_percent"]) for r in runs})
S = [1, 3, 7, 15]

print("## D3: simulated seconds to train RMSE 0.3, SSP(s) - ESSP(s), paired by seed")
d3_clear = d3_pos = 0
for prof, b in cells:
    seeds = sorted(by[(prof, b, "BSP")])
    for s in S:
        ssp, essp = by[(prof, b, f"SSP({s})")], by[(prof, b, f"ESSP({s})")]
        d = [reach(ssp[k]) - reach(essp[k]) for k in seeds]
        txt, clear = fci(d)
        d3_pos += statistics.mean(d) > 0
        d3_clear += clear and statistics.mean(d) > 0
        print(f"  {prof:5s} {b:2d}% s={s:2d}: SSP {statistics.mean(reach(ssp[k]) for k in seeds):.2f} "
              f"ESSP {statistics.mean(reach(essp[k]) for k in seeds):.2f}  diff {txt}"
              f"{'  excludes 0' if clear else ''}")
print(f"  ESSP ahead in the mean in {d3_pos} of 16 pairs; interval excludes 0 in {d3_clear}")

print("\n## D4: spread of the final train RMSE over s = 1, 3, 7, 15 (per seed), SSP - ESSP")
d4_clear = 0
for prof, b in cells:
    seeds = sorted(by[(prof, b, "BSP")])
    sp = {}
    for fam in ("SSP", "ESSP"):
        sp[fam] = [max(by[(prof, b, f"{fam}({s})")][k]["final_train_rmse"] for s in S)
                   - min(by[(prof, b, f"{fam}({s})")][k]["final_train_rmse"] for s in S)
                   for k in seeds]
        means = [statistics.mean(by[(prof, b, f"{fam}({s})")][k]["final_train_rmse"]
                                 for k in seeds) for s in S]
        sp[fam + "_of_means"] = max(means) - min(means)
    txt, clear = fci([a - e for a, e in zip(sp["SSP"], sp["ESSP"])], "{:.4f}")
    d4_clear += clear
    print(f"  {prof:5s} {b:2d}%: spread of the means SSP {sp['SSP_of_means']:.4f} ESSP "
          f"{sp['ESSP_of_means']:.4f}; per seed SSP {[round(x, 4) for x in sp['SSP']]} "
          f"ESSP {[round(x, 4) for x in sp['ESSP']]}; SSP - ESSP {txt}"
          f"{'  excludes 0' if clear else ''}")
print(f"  ESSP clearly more robust (interval excludes 0) in {d4_clear} of {len(cells)} cells")

print("\n## 1 Gbit/s links at the VAP sweep's settings (vap/1gbit.jsonl; uniform, seed 1)")
for r in (json.loads(l) for l in open(HERE / "vap" / "1gbit.jsonl") if l.strip()):
    t = reach(r)
    print(f"  {r['label']:18s} run {r['sim_seconds']:.3f} s, to 0.3: "
          f"{'not reached' if t is None else f'{t:.3f} s'}, final train RMSE "
          f"{r['final_train_rmse']:.4f}, link {r['link_bytes_per_second'] * 8 / 1e9:g} Gbit/s")

#!/usr/bin/env python3
"""Re-derives the claim marks (✓) of docs/results/stragglers.md from the raw runs
(stragglers/runs.jsonl) with 95% confidence intervals over the seeds.

    python3 docs/results/stragglers/derive.py

Standard library only; self-contained. The per-run numbers use the page's definitions (as in
bench/straggler_experiment.py): time to target = the first crossing of the sampled curve,
interpolated linearly, divided by the no-delay BSP run of the same seed; quality lost =
accuracy points (MLP) or % RMSE increase (MF) against that run's final value.

A cell's ✓ on the page means: every seed reached the target, mean time ratio <= 1.20 and mean
loss <= 2.5. Here each such cell is also checked with 95% intervals (t-distribution over the
5 seeds, n = 5, t = 2.776): "interval" = the upper bounds of both intervals meet the claim,
"mean only" = the means do but an upper bound does not.
"""
import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}
TARGETS = {"mlp": (0.85, 0.80), "mf": (0.36, 0.40)}


def ci(xs):
    n = len(xs)
    m = statistics.mean(xs)
    h = T975[n - 1] * statistics.stdev(xs) / math.sqrt(n) if n > 1 else float("nan")
    return m, m - h, m + h


def better(model, a, b):
    return a >= b if model == "mlp" else a <= b


def time_to(run, target):
    t, m = run["series"]["time"], run["series"]["metric"]
    for i, (ti, mi) in enumerate(zip(t, m)):
        if mi is not None and better(run["model"], mi, target):
            if i == 0 or m[i - 1] is None or m[i] == m[i - 1]:
                return ti
            f = (target - m[i - 1]) / (m[i] - m[i - 1])
            return t[i - 1] + f * (ti - t[i - 1])
    return None


def loss_vs(model, x, base):
    return (base - x) * 100.0 if model == "mlp" else (x / base - 1.0) * 100.0


runs = [json.loads(l) for l in open(HERE / "runs.jsonl") if l.strip()]
for model in ("mlp", "mf"):
    sw = {(r["config"], r["delay"], r["seed"]): r for r in runs
          if r["model"] == model and r["kind"] == "sweep"}
    configs = list(dict.fromkeys(k[0] for k in sw))
    delays = sorted({k[1] for k in sw})
    seeds = sorted({k[2] for k in sw})
    base = {s: sw[("BSP", 1.0, s)] for s in seeds}
    for target in TARGETS[model]:
        print(f"\n## {model.upper()}, target {target} (n = {len(seeds)} seeds)")
        n_mean = n_int = 0
        for cfg in configs:
            for d in delays:
                rs = [sw[(cfg, d, s)] for s in seeds]
                tt = [time_to(r, target) for r in rs]
                t0 = [time_to(base[s], target) for s in seeds]
                loss = [loss_vs(model, r["final_metric"], base[s]["final_metric"])
                        for r, s in zip(rs, seeds)]
                tot = [r["sim_seconds"] / base[s]["sim_seconds"] for r, s in zip(rs, seeds)]
                if any(t is None for t in tt):
                    reached = sum(t is not None for t in tt)
                    print(f"  {cfg:20s} f={d:g}: {reached}/{len(seeds)} reached")
                    continue
                ratio = [a / b for a, b in zip(tt, t0)]
                m, lo, hi = ci(ratio)
                lm, llo, lhi = ci(loss)
                tm, tlo, thi = ci(tot)
                mark = m <= 1.20 and lm <= 2.5
                strict = hi <= 1.20 and lhi <= 2.5
                n_mean += mark
                n_int += strict
                tag = ("✓ interval" if strict else "✓ mean only") if mark else ""
                print(f"  {cfg:20s} f={d:g}: time {m:.2f} [{lo:.2f}, {hi:.2f}] (seeds "
                      f"{min(ratio):.2f}-{max(ratio):.2f}); loss {lm:+.2f} [{llo:+.2f}, {lhi:+.2f}]; "
                      f"time to N {tm:.2f} [{tlo:.2f}, {thi:.2f}]  {tag}")
        print(f"  cells marked on the means: {n_mean}; of them meeting the claim on the "
              f"intervals' upper bounds: {n_int}")

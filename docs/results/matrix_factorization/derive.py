#!/usr/bin/env python3
"""Re-derives the numbers of docs/results/matrix_factorization.md from the raw output in this
folder: {bsp,ssp,essp,asp}.log / .jsonl and sweep/*.log / *.jsonl.

    python3 docs/results/matrix_factorization/derive.py

Standard library only. Each run is one seed (the trainer's default, 1); nothing here is an
average, so no intervals are given.

The observed-staleness histograms in the logs were recorded by the library at commit cebf914,
which counted one sample per cache part read per clock (a part = one shard's slice of one
table): 4 workers x 1000 clocks x 2 shards x 2 tables = 16,000 samples. The library now counts
one sample per row read (commit f8c933d); this script checks the totals.
"""
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
POL = {"bsp": "BSP", "ssp": "SSP(3)", "essp": "ESSP(3)", "asp": "ASP"}
res = {}
for p in POL:
    log = (HERE / f"{p}.log").read_text()
    m = {}
    m["final"] = re.search(r"final test rmse ([0-9.]+) \(train ([0-9.]+); initial test ([0-9.]+)\) "
                           r"after ([0-9.]+) s", log).groups()
    m["wall"] = re.search(r"wall ([0-9.]+) s", log).group(1)
    t = re.search(r"traffic: (\d+) gradients, (\d+) pulls \((\d+) keyed\), ([0-9.]+) MB received "
                  r"and ([0-9.]+) MB sent", log).groups()
    m["traffic"] = t
    hist = re.search(r"observed staleness \(clocks:reads\): (.*)", log).group(1)
    h = {k: int(v) for k, v in (x.split(":") for x in hist.split())}
    m["hist"] = h
    m["load"] = re.search(r"loadavg before: ([0-9.]+).*after: ([0-9.]+)", log).groups()
    m["curve"] = [json.loads(l) for l in open(HERE / f"{p}.jsonl") if l.strip()]
    res[p] = m
    print(f"{POL[p]:8s} final test {m['final'][0]} train {m['final'][1]} (initial {m['final'][2]}), "
          f"training {m['final'][3]} s, wall {m['wall']} s, gradients {t[0]}, pulls {t[1]} "
          f"(keyed {t[2]}), MB in/out {t[3]}/{t[4]}; staleness samples {sum(h.values())}; "
          f"load before/after {m['load'][0]}/{m['load'][1]}")
    print("         curve (clock: train/test): " + ", ".join(
        f"{d['clock']}: {d['train_rmse']:.4f}/{d['test_rmse']:.4f}" for d in m["curve"]
        if "clock" in d and "train_rmse" in d and not d.get("final")))

b = {p: float(res[p]["traffic"][3]) for p in POL}
print(f"\nESSP bytes received / BSP {b['essp'] / b['bsp']:.2f}x, / SSP {b['essp'] / b['ssp']:.2f}x; "
      f"ESSP pulls / 16,000 = {int(res['essp']['traffic'][1]) / 16000:.1%}")
ah = res["asp"]["hist"]
print(f"ASP reads at 31+: {ah.get('31+', 0)} of {sum(ah.values())} = "
      f"{ah.get('31+', 0) / sum(ah.values()):.1%}; 1-30: {sum(v for k, v in ah.items() if k not in ('0', '31+'))}")
c200 = {p: next(d for d in res[p]["curve"] if d.get("clock") == 200)["test_rmse"] for p in POL}
print(f"test RMSE at clock 200: {c200}")
print(f"ASP final test - BSP final test: {float(res['asp']['final'][0]) - float(res['bsp']['final'][0]):.4f}")
print(f"ratings per user / item in the training set: {108000 / 2000:g}")

print("\n## sweep (SSP(3), one run each)")
for p in sorted((HERE / "sweep").glob("*.log")):
    log = p.read_text()
    f = re.search(r"final test rmse ([0-9.]+) \(train ([0-9.]+)", log)
    err = [l for l in log.splitlines() if "non-finite" in l or "diverg" in l or "error" in l.lower()]
    print(f"{p.stem:10s} " + (f"final test {f.group(1)} train {f.group(2)}" if f else
                              "no final line; " + " | ".join(err[:2])))
l20 = re.search(r"final test rmse ([0-9.]+)", (HERE / "sweep" / "l2_0.log").read_text()).group(1)
print(f"default minus --l2 0: {float(res['ssp']['final'][0]) - float(l20):.4f}")

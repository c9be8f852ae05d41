#!/usr/bin/env python3
"""Medians over the rounds of run.sh: each figure's ratio to the raw baseline of its round, and
that ratio relative to the default (transport `tcp`) of the same round.
   summary.py OUT_DIR [OUT_DIR ...]   (the rounds of every directory together)"""
import glob, json, statistics, sys

rounds = sorted(p for d in sys.argv[1:] for p in glob.glob(d + "/round*.json"))
ratio, rel, value = {}, {}, {}
for path in rounds:
    rows = json.load(open(path))["rows"]
    base = {(r["api"], r["op"], r["window"]): r["ratio_to_raw"] for r in rows if r["transport"] == "tcp"}
    for r in rows:
        if r["api"] == "raw":
            continue
        k = (r["api"], r["op"], r["window"], r["transport"])
        ratio.setdefault(k, []).append(r["ratio_to_raw"])
        value.setdefault(k, []).append(r["median"])
        b = base.get(k[:3])
        if b:
            rel.setdefault(k, []).append(r["ratio_to_raw"] / b)
order = ["tcp", "tcp-sb256K", "tcp-sb1M", "tcp-sb4M", "tcp-sb8M", "tcp-wk256K", "tcp-wk1M",
         "tcp-wk2M", "tcp-wk0"]
print(f"{len(rounds)} rounds; per figure: median value, median ratio to raw [min..max], "
      "median of (ratio / default's ratio in the same round)")
print(f"{'api':8} {'op':10} {'win':>3} {'transport':11} {'median':>9} {'vs raw':>7} "
      f"{'range':>13} {'vs default':>10}")
for k in sorted(ratio, key=lambda k: (k[0], k[1], k[2], order.index(k[3]) if k[3] in order else 9)):
    v = ratio[k]
    print(f"{k[0]:8} {k[1]:10} {k[2]:>3} {k[3]:11} {statistics.median(value[k]):9.1f} "
          f"{statistics.median(v):6.2f}x {min(v):5.2f}..{max(v):5.2f}x "
          f"{statistics.median(rel.get(k, [float('nan')])):9.2f}x")

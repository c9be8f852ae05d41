#!/usr/bin/env python3
"""Re-derives the CNN figures of docs/results/fashion_mnist.md from the metrics files in this
folder (cnn_*.jsonl), the only raw data the page has.

    python3 docs/results/fashion_mnist/derive.py

Standard library only. Per file: the final test accuracy (the `final` line), the evaluation
at the first evaluation at or after epochs 2, 4 and 8, the training time (the final line's
time_s), the time per epoch, where each evaluation read its parameters (eval_source), and
the evaluations at epochs 32 and 36. Then the mean over the three 40-epoch seeds of the
defaults with a 95% t-interval (n = 3, t = 4.303).

The softmax / MLP table and the table of earlier CNN runs (before the hidden layer) have no
metrics files in the repository; this script cannot check them.
"""
import json
import math
import statistics
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
finals = {}
for p in sorted(HERE.glob("cnn_*.jsonl")):
    lines = [json.loads(l) for l in open(p) if l.strip()]
    evals = [d for d in lines if not d.get("final")]
    final = next(d for d in lines if d.get("final"))
    epochs = final["clock"] / (9375 / 40)

    def at(e):
        x = next((d for d in evals if d["epoch"] >= e - 1e-9), None)
        return f"{x['test_accuracy']:.4f} (epoch {x['epoch']:.2f})" if x else "-"

    src = Counter(d.get("eval_source", "none") for d in evals)
    finals[p.name] = final["test_accuracy"]
    print(f"{p.name}: final {final['test_accuracy']:.4f} ({final.get('eval_source')}), "
          f"{epochs:g} epochs, time {final['time_s']:.1f} s = {final['time_s'] / epochs:.1f} s/epoch; "
          f"epoch 2/4/8: {at(2)} / {at(4)} / {at(8)}; epoch 32/36: {at(32)} / {at(36)}; "
          f"eval sources {dict(src)}")
seeds = [finals[n] for n in ("cnn_hidden128_40ep.jsonl", "cnn_hidden128_40ep_seed2.jsonl",
                             "cnn_hidden128_40ep_seed3.jsonl")]
m = statistics.mean(seeds)
h = 4.303 * statistics.stdev(seeds) / math.sqrt(3)
print(f"defaults, 40 epochs, seeds 1-3: {seeds}; mean {m:.4f}, 95% interval "
      f"[{m - h:.4f}, {m + h:.4f}] (n=3); range {min(seeds):.4f}-{max(seeds):.4f}")

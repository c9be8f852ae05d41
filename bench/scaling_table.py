#!/usr/bin/env python3
"""The tables of docs/results/scaling.md from bench/scaling_experiment.sh's folders.

For each run of each folder given (its runs.txt and metrics JSON lines): the final test
accuracy of the servers' model, and the first evaluation that reached the target accuracy
(0.85 for the MLP and softmax, 0.88 for the CNN): its epoch, the samples trained by then
(epoch x 60,000) and the seconds.

    python3 bench/scaling_table.py docs/results/scaling/mlp_acc [more folders...]
"""
import json
import os
import re
import sys

TARGET = {"mlp": 0.85, "softmax": 0.85, "cnn": 0.88}


def runs(folder):
    with open(os.path.join(folder, "runs.txt")) as f:
        for line in f:
            tag = line.split()[0]
            fields = dict(re.findall(r"(\w+)=(\S+)", line.split(" :: ")[0]))
            model = re.search(r"--model (\w+)", line).group(1)
            yield tag, model, fields


def reached(path, target):
    """(epoch, seconds) of the first evaluation at or above target, or None."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if j.get("final") or j.get("summary") or "test_accuracy" not in j:
                continue
            if j["test_accuracy"] >= target:
                return j["epoch"], j["time_s"]
    return None


def main():
    print("| run | rc | final accuracy | target | epoch reached | samples | seconds | load |")
    print("|---|---|---|---|---|---|---|---|")
    for folder in sys.argv[1:]:
        for tag, model, f in runs(folder):
            target = TARGET.get(model, 0.85)
            r = reached(os.path.join(folder, tag + ".jsonl"), target)
            when = ("%.2f" % r[0], "{:,}".format(int(r[0] * 60000)), "%.1f" % r[1]) if r else ("-",) * 3
            print("| %s | %s | %s | %.2f | %s | %s | %s | %s |" % (
                tag, f.get("rc", "?"), f.get("acc", "-"), target, *when, f.get("load", "-")))


if __name__ == "__main__":
    main()

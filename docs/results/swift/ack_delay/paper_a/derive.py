#!/usr/bin/env python3
"""Issue 34, paper A's two kills: per seed, the training time and final accuracy (the servers'
model) of each mode from run.sh's logs, then checkpoint's time over replica-log's and the
accuracy difference, paired by seed, with 95% Student-t intervals.
  derive.py [DIR]   (default: this file's directory)"""
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[4] / "bench"))
import swift_experiment as sx  # noqa: E402  (fmt_ci: mean [95% t interval])

FINAL = re.compile(r"^final test accuracy ([0-9.]+) \(loss [0-9.]+\) after ([0-9.]+) s")
SUMMARY = re.compile(r"^recovery (\S+): (.*)$")


def main():
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    runs = {}
    for log in sorted(d.glob("*-seed*.log")):
        mode, seed = re.match(r"(.*)-seed(\d+)\.log$", log.name).groups()
        acc = secs = None
        summary = ""
        for line in log.read_text().splitlines():
            if m := FINAL.match(line):
                acc, secs = float(m.group(1)), float(m.group(2))
            if m := SUMMARY.match(line):
                summary = m.group(2)
        runs.setdefault(int(seed), {})[mode] = (acc, secs, summary)
    for seed in sorted(runs):
        for mode, (acc, secs, summary) in sorted(runs[seed].items()):
            print(f"seed {seed} {mode}: accuracy {acc}, {secs} s; {summary[:150]}")
    seeds = [s for s in sorted(runs) if all(
        m in runs[s] and runs[s][m][1] is not None for m in ("none", "checkpoint", "replica-log-af"))]
    ratio = [runs[s]["checkpoint"][1] / runs[s]["replica-log-af"][1] for s in seeds]
    rl_none = [runs[s]["replica-log-af"][1] / runs[s]["none"][1] for s in seeds]
    ck_none = [runs[s]["checkpoint"][1] / runs[s]["none"][1] for s in seeds]
    dacc = [100 * (runs[s]["replica-log-af"][0] - runs[s]["checkpoint"][0]) for s in seeds]
    def fmt(name, xs, f="{:.3f}"):
        print(f"{name}: mean {sx.fmt_ci(xs, f)} over {len(xs)} seeds; per seed "
              + ", ".join(f.format(x) for x in xs))
    fmt("checkpoint time / replica-log (apply-first, ack_delay 5) time", ratio)
    fmt("replica-log (apply-first, ack_delay 5) time / none", rl_none)
    fmt("checkpoint time / none", ck_none)
    fmt("final accuracy, replica-log minus checkpoint (points)", dacc, "{:+.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Re-derives every number that docs/results/swift.md states in its prose from the raw runs
in this folder (*.jsonl), per run and with 95% confidence intervals over the seeds.

    python3 docs/results/swift/derive.py

Standard library only. The runs are parsed with the parsers of bench/swift_experiment.py and
bench/recovery_experiment.py (the same definitions table.md was made with: kill -> serving,
restart -> serving, rebuild, kill -> full rate, rolled back); everything after the parse
(per-seed pairing, ratios, intervals) is here. Intervals: mean +- t(0.975, n-1) * sd / sqrt(n)
over the n seeds (n = 3 here, t = 4.303), on per-seed values, paired by seed where a
comparison is paired.

Accuracy in these runs is worker 0's evaluation of its own cached parameters (the metrics
lines carry no eval_source; the trainer had no --eval servers yet), not the servers' model.
"""
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "bench"))
import recovery_experiment as rx  # noqa: E402
import swift_experiment as sx  # noqa: E402

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 14: 2.145, 19: 2.093}
NAN = float("nan")


def ci(xs):
    xs = [x for x in xs if x == x]
    n = len(xs)
    m = statistics.mean(xs)
    if n < 2:
        return m, NAN, NAN, n
    h = T975[n - 1] * statistics.stdev(xs) / math.sqrt(n)
    return m, m - h, m + h, n


def fci(xs, f="{:.3f}"):
    m, lo, hi, n = ci(xs)
    return f"{f.format(m)} [{f.format(lo)}, {f.format(hi)}] (n={n})"


def lst(xs, f="{:.2f}"):
    return "[" + ", ".join(f.format(x) for x in xs) + "]"


runs = [sx.parse(p) for p in sorted(HERE.glob("*.jsonl"))]
runs = [r for r in runs if r["policy"]]
main = [r for r in runs if r["part"] == "main"]
ctrl = [r for r in main if r["policy"] == "none" and r["schedule"] == "no kill"]
T = statistics.mean(r["duration"] for r in ctrl)
ctrl_curve = {r["seed"]: ([e[0] for e in r["evals"]], [e[1] for e in r["evals"]]) for r in ctrl}
t_ref = min(r["duration"] for r in runs if not r["died"])
for r in runs:
    r["m"] = rx.run_metrics(r, T, [0.75, 0.8], 0.2, ctrl_curve.get(r["seed"], ([], [])), 1.0,
                            2, 2, t_ref)
    r["k"] = sx.kill_metrics(r, T)
    r["tpc"] = r["duration"] / r["final"]["clock"]


def get(policy, sched, part="main"):
    rs = [r for r in runs if r["part"] == part and r["policy"] == policy
          and r["schedule"] == sched]
    return {r["seed"]: r for r in rs}


seeds = sorted({r["seed"] for r in main})
print(f"T = {T:.2f} s (none, no kill, {len(ctrl)} runs); seeds {seeds}; "
      f"every run exit 0: {all(r.get('rc') == 0 for r in runs)}; runs: {len(runs)}")
model = sx.model_bytes(type("A", (), {"model": "mlp", "hidden": 128})())
print(f"model bytes {model}, shard {model // 2}")
print(f"eval_source in any metrics line: "
      f"{any('eval_source' in l for p in HERE.glob('*.jsonl') for l in open(p))}")

print("\n## Failure-free (no kill)")
none = get("none", "no kill")
ff = {}
for p in sx.POLICIES:
    g = get(p, "no kill")
    ff[p] = g
    d = [g[s]["duration"] for s in seeds]
    ratio = [g[s]["tpc"] / none[s]["tpc"] for s in seeds]
    print(f"{p:12s} duration {lst(d, '{:.1f}')} mean {fci(d, '{:.1f}')}; "
          f"time/clock vs none per seed {lst(ratio, '{:.3f}')} -> {fci(ratio)}")
rl, ck = ff["replica-log"], ff["checkpoint"]
r_vs_c = [rl[s]["tpc"] / ck[s]["tpc"] for s in seeds]
print(f"replica-log over checkpoint time/clock per seed {lst(r_vs_c, '{:.3f}')} -> "
      f"{fci(r_vs_c)}; slower in {sum(x > 1 for x in r_vs_c)} of {len(seeds)} seeds")
ch = ff["chain"]
r_vs_ch = [rl[s]["tpc"] / ch[s]["tpc"] for s in seeds]
print(f"replica-log over chain time/clock per seed {lst(r_vs_ch, '{:.3f}')} -> {fci(r_vs_ch)}")
logkb = [rl[s]["summary"]["max_log_bytes"] / 1024 for s in seeds]
repkb = [rl[s]["summary"]["max_replica_bytes"] / 1024 for s in seeds]
print(f"replica-log log max/worker KB {lst(logkb, '{:.0f}')}, replica max KB "
      f"{lst(repkb, '{:.0f}')}; (log+replica)/model "
      f"{lst([(a + b) * 1024 / model for a, b in zip(logkb, repkb)], '{:.1f}')}, "
      f"(log+replica)/shard {lst([(a + b) * 1024 / (model / 2) for a, b in zip(logkb, repkb)], '{:.1f}')}, "
      f"log/model {lst([a * 1024 / model for a in logkb], '{:.1f}')}")
for p in sx.POLICIES:
    print(f"  {p:12s} final acc {lst([ff[p][s]['m']['final'] for s in seeds], '{:.4f}')}; "
          f"t80 {lst([ff[p][s]['m']['t0.8'] for s in seeds], '{:.1f}')}")

for sched, nk in (("1 kill", 1), ("2 kills", 2)):
    print(f"\n## {sched}")
    for p in sx.KILL_POLICIES:
        g = get(p, sched)
        print(f"{p}:")
        for key in ("serving", "from_restart", "full_rate", "rebuild", "entries"):
            for i in range(nk):
                v = [g[s]["k"][key][i] if i < len(g[s]["k"][key]) else NAN for s in seeds]
                if all(x != x for x in v):
                    continue
                print(f"  {key}[{i + 1}] per seed {lst(v, '{:.3f}')}")
        if p == "checkpoint":
            for i in range(nk):
                print(f"  rollback[{i + 1}] per seed "
                      f"{lst([g[s]['m'][f'rollback{i + 1}'] for s in seeds], '{:.1f}')}")
        lost = [g[s]["summary"].get("lost_pushes", NAN) for s in seeds]
        twice = [g[s]["summary"].get("pushes_applied_twice", NAN) for s in seeds]
        print(f"  pushes lost per seed {lst(lost, '{:.0f}')}, applied twice {lst(twice, '{:.0f}')}")
        fin = [g[s]["m"]["final"] for s in seeds]
        print(f"  final acc per seed {lst(fin, '{:.4f}')}")
        d = [g[s]["duration"] for s in seeds]
        vs_none = [g[s]["duration"] - none[s]["duration"] for s in seeds]
        vs_own = [g[s]["duration"] - ff[p][s]["duration"] for s in seeds]
        print(f"  duration {lst(d, '{:.1f}')}; minus none control {fci(vs_none, '{:+.1f}')}; "
              f"minus own no-kill run {lst(vs_own, '{:+.1f}')} -> {fci(vs_own, '{:+.1f}')}")
    rlk, ckk = get("replica-log", sched), get("checkpoint", sched)
    own_diff = [(rlk[s]["duration"] - rl[s]["duration"]) - (ckk[s]["duration"] - ck[s]["duration"])
                for s in seeds]
    print(f"outage cost (own no-kill control) replica-log minus checkpoint per seed "
          f"{lst(own_diff, '{:+.1f}')} -> {fci(own_diff, '{:+.1f}')}")
    for p in ("checkpoint", "chain", "stateless"):
        o = get(p, sched)
        dr = [o[s]["duration"] / rlk[s]["duration"] for s in seeds]
        tr = [o[s]["m"]["t0.8"] / rlk[s]["m"]["t0.8"] for s in seeds]
        print(f"{p} over replica-log, paired by seed: duration {lst(dr, '{:.2f}')} -> "
              f"{fci(dr, '{:.2f}')}; time to 80% {lst(tr, '{:.2f}')} -> {fci(tr, '{:.2f}')}; "
              f"ratio of means duration "
              f"{statistics.mean(o[s]['duration'] for s in seeds) / statistics.mean(rlk[s]['duration'] for s in seeds):.2f}")
    fr_rl = [x for s in seeds for x in rlk[s]["k"]["full_rate"]]
    fr_ck = [x for s in seeds for x in ckk[s]["k"]["full_rate"]]
    print(f"full rate, all kills: replica-log {lst(fr_rl)}; checkpoint {lst(fr_ck)}")

print("\n## checkpoint, pushes lost and clocks rolled back, every kill run")
cl = [get("checkpoint", s)[x] for s in ("1 kill", "2 kills") for x in seeds]
print("pushes lost per run", lst([r["summary"]["lost_pushes"] for r in cl], "{:.0f}"))
print("rolled back per kill", lst([r["m"][f"rollback{i + 1}"] for r in cl
                                   for i in range(len(r["kills"]))], "{:.1f}"))
rlkill = [r for r in runs if r["policy"] == "replica-log" and r["schedule"] != "no kill"]
print(f"replica-log kill runs {len(rlkill)}, kills {sum(len(r['kills']) for r in rlkill)}, "
      f"pushes lost {sum(r['summary']['lost_pushes'] for r in rlkill)}, applied twice "
      f"{sum(r['summary']['pushes_applied_twice'] for r in rlkill)}, rebuilds exact "
      f"{sum(x is True for r in rlkill for x in r['k']['exact'])}")
main_rl = [r for r in rlkill if r["part"] == "main"]
print(f"main-part replica-log rebuild (s) range "
      f"{min(x for r in main_rl for x in r['k']['rebuild']):.4f}-"
      f"{max(x for r in main_rl for x in r['k']['rebuild']):.4f}; entries range "
      f"{min(x for r in main_rl for x in r['k']['entries'])}-"
      f"{max(x for r in main_rl for x in r['k']['entries'])}")

print("\n## interval sweep (seed 1; 10 = main part)")
for r in sorted([r for r in runs if r["policy"] == "replica-log" and r["schedule"] == "1 kill"
                 and r["workers"] == 4 and r["seed"] == 1], key=lambda r: r["interval"]):
    s = r["summary"]
    print(f"interval {r['interval']:4d}: log max {s['max_log_bytes'] / 1024:.0f} KB = "
          f"{s['max_log_bytes'] / model:.1f}x model = {s['max_log_bytes'] / (model / 2):.1f}x shard; "
          f"rebuild {r['k']['rebuild'][0]:.4f} s, entries {r['k']['entries'][0]}, "
          f"restart->serving {r['k']['from_restart'][0]:.2f}, full rate {r['k']['full_rate'][0]:.2f}")

print("\n## restart -> listening again (the restarted process's start-up), every main kill run")
lis = [l - s for r in main if r["kills"] for s, l in zip(r["restarts"], r["listening"])]
print(f"{len(lis)} restarts: {min(lis):.2f}-{max(lis):.2f} s (mean {statistics.mean(lis):.2f})")

rl1 = get("replica-log", "1 kill")
print("replica-log 1-kill log max KB per seed",
      lst([rl1[s]["summary"]["max_log_bytes"] / 1024 for s in seeds], "{:.0f}"))

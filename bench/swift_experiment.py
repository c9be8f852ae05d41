#!/usr/bin/env python3
"""Paper B's comparison (SWIFT, "Expedited Failure Recovery") on Fashion-MNIST (issue 13).

Runs the `fashion_mnist` trainer (MLP, 2 servers + 4 workers, SSP(3), servers as child
processes) and SIGKILLs server shard 0, to compare SWIFT-style recovery (`--recovery
replica-log`: rebuild from a worker's state replica plus the workers' logs) with checkpointing
(`--recovery checkpoint`, the adaptive CheckFreq-style interval), strict chain replication
(`--recovery chain --replicas 2`) and the stateless server (`--recovery stateless --merge
lr-scaled`). Three parts (--only picks a subset):

  main      no-kill controls of none, replica-log, checkpoint, chain and stateless (failure-free
            time per clock against none), then every policy but none under the kill
            schedules: one kill at 0.5 T and two kills at 0.3 T and 0.6 T by default, each with
            a downtime of 0.15 T (T: the mean duration of the none control); over --seeds.
            --schedules picks them (also "3 kills": 0.14, 0.37 and 0.6 T); without "no kill"
            in it, only none's control runs failure-free.
  interval  replica-log with --replica-interval 1, 5, 20, 100, 500 (--intervals; the main
            part's runs give 10), one kill at 0.5 T, over --sweep-seeds (default: the first
            of --seeds): log memory against recovery time.
  spread    replica-log with --workers 1, 2, 8 (--spread-workers; the interval part's run at
            --spread-interval gives 4), one kill at 0.5 T, over --sweep-seeds: recovery time
            and entries replayed against the number of workers the replay is spread over.
            With several sweep seeds the sweep tables give mean [95% confidence interval]
            (Student's t over the seeds) instead of mean +- std.

It writes one raw JSONL file per run (recovery_experiment.py's run_one: the command, every
stdout/stderr line with its arrival time, the metrics lines, exit status, load averages),
table.md, and accuracy.png (when the main part has kill runs), interval.png and spread.png
into --out (default build/experiments/swift). It never deletes or replaces files of an
earlier run, nor writes under docs/, unless --overwrite says so (a run then deletes the *.jsonl
files of the parts it runs, and only those). Standard library only, plus matplotlib for the
plots (see experiment_common.py); --no-plot skips them. Not used by CI.

    python3 bench/swift_experiment.py --bin /tmp/build/examples/fashion_mnist/fashion_mnist
    python3 bench/swift_experiment.py --analyze-only          # tables + plots from the JSONL
    python3 bench/swift_experiment.py --quick --bin ...       # smoke test: 2 epochs, 1 seed

Time bases, as in recovery_experiment.py: every time is on the trainer's metrics clock
(`time_s`, from the end of data loading), converted from line arrival times through the
trainer's banner line. Definitions (per kill, per run; then mean +- std over runs):

  serving again   kill -> the shard answers workers again: replica-log, the restarted server's
                  `rebuilt from ...` line; the others, the first `rejoined server 0` line of a
                  worker (checkpoint restores before it listens; stateless rebuilds from the
                  first rejoining worker's replica; chain fails over to the backup). Lines that
                  arrive up to 0.2 s before the `[fault] killed` line count (the supervisor
                  prints that line after kill() and waitpid(), the workers may log first).
  full rate       kill -> the first evaluation of worker 0 at or after the kill from which its
                  clock rate over the next W = 0.05 T (up to the first evaluation at least W
                  later) is >= 90% of its rate over [kill - 0.1 T, kill). Resolution: one
                  evaluation interval (0.25 epoch, about 0.3 s); an evaluation inside a stall
                  starts a window that holds the stall, so the first window that qualifies
                  starts after it.
  rebuild         replica-log only: `rebuilding from` -> `rebuilt from` (first hello of a
                  worker that holds a log -> serving), on the server.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import experiment_common as common  # noqa: E402
import recovery_experiment as rx  # noqa: E402

PROG = "bench/swift_experiment.py"
DEFAULT_OUT = common.default_out("swift")
PARTS = ("main", "interval", "spread")
POLICIES = {  # name -> trainer flags (replica-log's interval is added per run)
    "none": ["--recovery", "none"],
    "replica-log": ["--recovery", "replica-log"],
    "checkpoint": ["--recovery", "checkpoint"],
    "chain": ["--recovery", "chain", "--replicas", "2"],
    "stateless": ["--recovery", "stateless", "--merge", "lr-scaled"],
}
KILL_POLICIES = ["replica-log", "checkpoint", "chain", "stateless"]
# Kill times as fractions of T. "3 kills" extends paper A's schedule (0.14 T and 0.37 T, as
# recovery_experiment.py uses) by a third kill; --schedules picks which ones a run makes.
SCHEDULES = {"1 kill": [0.5], "2 kills": [0.3, 0.6], "3 kills": [0.14, 0.37, 0.6]}
COLORS = {"none": "black", "replica-log": "tab:blue", "checkpoint": "tab:orange",
          "chain": "tab:olive", "stateless": "tab:green"}
NAN = float("nan")
EARLY = 0.2  # s: lines caused by a kill may arrive this much before its [fault] line

REBUILDING_RE = re.compile(r"asyncps server 0: rebuilding from")
REBUILT_RE = re.compile(r"asyncps server 0: rebuilt from .* and (\d+) logged entries to position")
MISSING_RE = re.compile(r"(\d+) positions")


# ------------------------------------------------------------------------------------------
# The run plan


def policy_flags(policy, interval):
    flags = list(POLICIES[policy])
    if policy == "replica-log":
        flags += ["--replica-interval", str(interval)]
    return flags


def run_name(part, policy, schedule, interval, workers):
    """The run's configuration name (its JSONL file is <slug>-seed<seed>.jsonl)."""
    what = policy if policy != "replica-log" or part == "main" else f"{policy}/{interval}"
    if part == "spread":
        what += f", {workers} workers"
    return f"{part}: {what} ({schedule})"


def plan(args, parts, seeds, sweep_seeds):
    """The runs to do, in order: dicts with name, part, policy, schedule, interval, workers,
    seed. Main: seeds outer, the none control first in each seed (the first one sets the kill
    schedule), then the other controls and the kill runs interleaved. The sweeps: sweep seeds
    outer (so a stopped run leaves whole seeds), one kill; points that another part measures
    for the same seed are not run twice."""
    runs = []

    def add(part, policy, schedule, seed, interval=None, workers=4):
        interval = interval if interval is not None else args.main_interval
        runs.append({"name": run_name(part, policy, schedule, interval, workers), "part": part,
                     "policy": policy, "schedule": schedule, "seed": seed,
                     "interval": interval if policy == "replica-log" else None,
                     "workers": workers})

    if "main" in parts:
        for seed in seeds:
            for p in POLICIES:
                if p == "none" or "no kill" in args.schedules:
                    add("main", p, "no kill", seed)
            for sched in args.schedules:
                if sched == "no kill":
                    continue
                for p in KILL_POLICIES:
                    add("main", p, sched, seed)
    for s in sweep_seeds:
        in_main = "main" in parts and s in seeds
        if "interval" in parts:
            for k in args.intervals:
                if not (in_main and k == args.main_interval):
                    add("interval", "replica-log", "1 kill", s, interval=k)
        if "spread" in parts:
            for n in args.spread_workers:
                if n == 4 and ("interval" in parts and args.spread_interval in args.intervals):
                    continue
                if n == 4 and in_main and args.spread_interval == args.main_interval:
                    continue
                add("spread", "replica-log", "1 kill", s, interval=args.spread_interval,
                    workers=n)
    return runs


# ------------------------------------------------------------------------------------------
# Parsing one run (on top of recovery_experiment.parse_run)


def parse(path):
    r = rx.parse_run(path)
    recs = [json.loads(l) for l in open(path) if l.strip()]
    run = recs[0]
    for k in ("part", "policy", "schedule", "interval", "workers"):
        r[k] = run.get(k)
    r["kill_fractions"] = run.get("kill_fractions", [])
    r["downtime_s"] = run.get("downtime", 0)
    r["loadavg_after"] = NAN
    r["checkpoint_bytes"] = NAN
    b = r["banner"]
    rebuilding, rebuilt, rejoins = [], [], []
    for e in recs:
        if e["type"] == "stderr":
            line = e["line"]
            if REBUILDING_RE.search(line):
                rebuilding.append(e["t"] - b)
            m = REBUILT_RE.search(line)
            if m:
                missing = MISSING_RE.search(line.split("logged entries", 1)[1])
                rebuilt.append({"t": e["t"] - b, "entries": int(m.group(1)),
                                "exact": "(exact" in line,
                                "missing": int(missing.group(1)) if missing else 0})
            if "rejoined server 0" in line:
                rejoins.append(e["t"] - b)
        elif e["type"] == "exit":
            r["loadavg_after"] = e["loadavg_after"][0]
            r["checkpoint_bytes"] = e.get("checkpoint_bytes", NAN)
    r["rebuilding_at"] = rebuilding
    r["rebuilt_list"] = rebuilt
    r["rejoins_all"] = rejoins
    return r


def first_after(times, t0, t1=math.inf):
    return next((x for x in times if t0 <= x < t1), NAN)


def full_rate_at(r, k, T, upto):
    """Seconds from the kill at `k` until worker 0 is back at >= 90% of its pre-kill clock rate
    (see the module docstring); nan when that does not happen before `upto`."""
    pts = [(e[0], e[2]) for e in r["evals"]]
    if r["final"] and not r["died"]:
        pts.append((r["final"]["time_s"], r["final"]["clock"]))
    before = [(t, c) for t, c in pts if k - 0.1 * T <= t < k]
    if len(before) < 2 or before[-1][0] <= before[0][0]:
        return NAN
    ref = (before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
    w = 0.05 * T
    after = [(t, c) for t, c in pts if t >= k]
    for i, (t, c) in enumerate(after):
        if t >= upto:
            break
        j = next((j for j in range(i + 1, len(after)) if after[j][0] >= t + w), None)
        if j is None:
            break
        if (after[j][1] - c) / (after[j][0] - t) >= 0.9 * ref:
            return t - k
    return NAN


def kill_metrics(r, T):
    """Per-kill recovery figures of one run: lists indexed by kill."""
    out = {"serving": [], "from_restart": [], "full_rate": [], "rebuild": [], "entries": [],
           "exact": [], "missing": []}
    kills = r["kills"]
    for i, k in enumerate(kills):
        nxt = kills[i + 1] if i + 1 < len(kills) else math.inf
        rs = r["restarts"][i] if i < len(r["restarts"]) else NAN
        if r["policy"] == "replica-log":
            # The rebuild of this kill's restarted process (after its restart, before the
            # next kill).
            start = first_after(r["rebuilding_at"], rs, nxt) if rs == rs else NAN
            done = next((x for x in r["rebuilt_list"] if rs == rs and rs <= x["t"] < nxt), None)
            serving = done["t"] if done else NAN
            out["rebuild"].append(serving - start)
            out["entries"].append(done["entries"] if done else NAN)
            out["exact"].append(done["exact"] if done else None)
            out["missing"].append(done["missing"] if done else NAN)
        else:
            serving = first_after(r["rejoins_all"], k - EARLY, nxt)
        out["serving"].append(max(serving - k, 0.0) if serving == serving else NAN)
        out["from_restart"].append(serving - rs if r["policy"] != "chain" else NAN)
        out["full_rate"].append(full_rate_at(r, k, T, nxt))
    return out


def model_bytes(args):
    """Bytes of the model's parameters (float32), from the trainer's layout (models.hpp)."""
    if args.model == "mlp":
        return 4 * (args.hidden * 785 + 10 * (args.hidden + 1))
    return 4 * 10 * 785


# ------------------------------------------------------------------------------------------
# Analysis


def fmt(values, f="{:.2f}", scale=1.0, n=None):
    return rx.ms([v for v in values if v is not None], f, scale, n)


# Student's t at 0.975 by degrees of freedom (n - 1), for 95% confidence intervals.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}


def fmt_ci(values, f="{:.2f}"):
    """mean [95% interval] over the values (the seeds), t-based; a single value alone."""
    vals = [v for v in values if v is not None and v == v]
    if not vals:
        return "—"
    m = statistics.mean(vals)
    if len(vals) < 2 or len(vals) - 1 not in T975:
        return fmt(vals, f)
    h = T975[len(vals) - 1] * statistics.stdev(vals) / math.sqrt(len(vals))
    return f"{f.format(m)} [{f.format(m - h)}, {f.format(m + h)}]"


def per_kill(ms_list, key, i, f="{:.2f}", form=fmt):
    """Kill `i`'s `key` over the runs' kill metrics, formatted by `form` (fmt or fmt_ci)."""
    return form([m[key][i] if i < len(m[key]) else NAN for m in ms_list], f)


def analyse(out_dir, args):
    runs = [parse(p) for p in sorted(out_dir.glob("*.jsonl"))]
    runs = [r for r in runs if r["policy"]]  # files of this script only
    if not runs:
        sys.exit(f"{PROG}: no runs in {out_dir}")
    main = [r for r in runs if r["part"] == "main"]
    ctrl = [r for r in main if r["policy"] == "none" and r["schedule"] == "no kill"]
    alive = [r["duration"] for r in ctrl if not r["died"]]
    T = statistics.mean(alive) if alive else statistics.mean(
        r["duration"] for r in runs if r["duration"] == r["duration"])
    thresholds = [float(x) for x in args.thresholds.split(",")]
    tables = 2 if args.model == "mlp" else 1
    ctrl_by_seed = {r["seed"]: ([e[0] for e in r["evals"]], [e[1] for e in r["evals"]])
                    for r in ctrl}
    ok_durations = [r["duration"] for r in runs if not r["died"]]
    t_ref = min(ok_durations) if ok_durations else NAN
    for r in runs:
        r["m"] = rx.run_metrics(r, T, thresholds, 0.2, ctrl_by_seed.get(r["seed"], ([], [])),
                                1.0, tables, 2, t_ref)
        r["k"] = kill_metrics(r, T)
        clocks = r["final"]["clock"] if r["final"] and not r["died"] else NAN
        r["tpc"] = r["duration"] / clocks if clocks and clocks == clocks else NAN
    none_tpc = {r["seed"]: r["tpc"] for r in ctrl}
    out = []
    seeds = sorted({r["seed"] for r in main}) or sorted({r["seed"] for r in runs})
    out.append(f"Run length T (none, no kill; mean of {len(alive)} runs): {T:.1f} s; seeds "
               f"{','.join(map(str, seeds))}; model {args.model}, {args.epochs:g} epochs.")
    kill_runs = [r for r in runs if r["kills"]]
    for sched, fr in SCHEDULES.items():
        ks = [r for r in kill_runs if r["schedule"] == sched and r["part"] == "main"]
        for i in range(len(fr)):
            kt = [r["kills"][i] for r in ks if len(r["kills"]) > i]
            rt = [r["restarts"][i] for r in ks if len(r["restarts"]) > i]
            if kt:
                out.append(f"{sched}, kill {i + 1} (metrics time base): killed at "
                           f"{min(kt):.1f}-{max(kt):.1f} s, restarted at "
                           + (f"{min(rt):.1f}-{max(rt):.1f} s" if rt else "—")
                           + f" ({fr[i]:g} T and {fr[i]:g} T + downtime in supervisor time).")
    lb = [r["loadavg_before"] for r in runs]
    la = [r["loadavg_after"] for r in runs if r["loadavg_after"] == r["loadavg_after"]]
    fc = [r["foreign_cores"] for r in runs if r.get("foreign_cores") is not None]
    out.append(f"1-min load average before / after each run: {min(lb):.1f}-{max(lb):.1f} / "
               + (f"{min(la):.1f}-{max(la):.1f}" if la else "—")
               + (f"; other load during the runs {min(fc):.2f}-{max(fc):.2f} cores of 2 (mean "
                  f"{statistics.mean(fc):.2f})." if fc else "."))
    out.append("")

    def group(pred):
        return [r for r in runs if pred(r)]

    def col(rs, key, f="{:.2f}", scale=1.0, form=None):
        vals = [r["m"].get(key, NAN) for r in rs]
        return form(vals, f) if form else fmt(vals, f, scale, len(rs))

    def summ(rs, key, f="{:.0f}", form=fmt):
        return form([(r["summary"] or {}).get(key, NAN) for r in rs], f)

    def summ_kb(rs, key):
        return fmt([(r["summary"] or {}).get(key, NAN) for r in rs], "{:.0f}", 1 / 1024)

    # ---- failure-free ----
    mb = model_bytes(args)
    out.append("### Failure-free (no kill)")
    out.append("")
    hdr = ["policy", "runs ok", "duration (s)", "time per clock (ms)", "vs none",
           "time to " + " / ".join(f"{t:.0%}" for t in thresholds) + " (s)", "final acc",
           "log max / worker (KB)", "replica max / worker (KB)", "extra memory",
           "load before / after"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for p in POLICIES:
        rs = group(lambda r: r["part"] == "main" and r["policy"] == p
                   and r["schedule"] == "no kill")
        if not rs:
            continue
        ratio = [r["tpc"] / none_tpc[r["seed"]] for r in rs if r["seed"] in none_tpc]
        extra = {"none": "—",
                 "replica-log": "log + replica on the workers (columns before)",
                 "checkpoint": "disk: " + fmt([r["checkpoint_bytes"] for r in rs], "{:.0f}",
                                              1 / 1024) + " KB of files at the end",
                 "chain": f"a full shard copy per backup: {mb / 2 / 1024:.0f} KB per backup "
                          f"node, {mb / 1024:.0f} KB in all (computed)",
                 "stateless": "none measured (workers' caches exist anyway)"}[p]
        out.append("| " + " | ".join([
            p, f"{sum(not r['died'] for r in rs)}/{len(rs)}", col(rs, "duration", "{:.1f}"),
            fmt([r["tpc"] for r in rs], "{:.2f}", 1000),
            fmt(ratio, "{:.3f}") if p != "none" else "1",
            " / ".join(col(rs, f"t{t}", "{:.1f}") for t in thresholds), col(rs, "final", "{:.3f}"),
            summ_kb(rs, "max_log_bytes"), summ_kb(rs, "max_replica_bytes"),
            extra, fmt([r["loadavg_before"] for r in rs], "{:.1f}") + " / "
            + fmt([r["loadavg_after"] for r in rs], "{:.1f}")]) + " |")
    out.append("")
    out.append(f"Model: {mb} bytes of float32 parameters ({mb // 2} per shard).")
    out.append("")

    # ---- with kills ----
    for sched, fr in SCHEDULES.items():
        if not any(r["part"] == "main" and r["schedule"] == sched for r in runs):
            continue
        nk = len(fr)
        out.append(f"### {sched} (at " + ", ".join(f"{f:g} T" for f in fr)
                   + f", downtime {args.downtime_fraction:g} T)")
        out.append("")
        sl = " / ".join(f"{i + 1}" for i in range(nk))
        hdr = ["policy", "runs ok", f"kill -> serving (s) [{sl}]",
               f"restart -> serving (s) [{sl}]", f"kill -> full rate (s) [{sl}]",
               f"rebuild (s) [{sl}]", f"replayed (entries) [{sl}]",
               f"rolled back (clocks) [{sl}]", "pushes lost", "applied twice",
               "trained locally (shard-clocks)",
               "time to " + " / ".join(f"{t:.0%}" for t in thresholds) + " (s)",
               "final acc", "duration (s)", "vs control (s)", "load before / after"]
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        ctrl_dur = {r["seed"]: r["duration"] for r in ctrl if not r["died"]}
        for p in KILL_POLICIES:
            rs = group(lambda r: r["part"] == "main" and r["policy"] == p
                       and r["schedule"] == sched)
            if not rs:
                continue
            ks = [r["k"] for r in rs]

            def multi(key, f="{:.2f}"):
                cells = [per_kill(ks, key, i, f) for i in range(nk)]
                return " / ".join(cells)

            rl = p == "replica-log"
            out.append("| " + " | ".join([
                p, f"{sum(not r['died'] for r in rs)}/{len(rs)}", multi("serving"),
                multi("from_restart") if p != "chain" else "—", multi("full_rate"),
                multi("rebuild", "{:.3f}") if rl else "—", multi("entries", "{:.0f}") if rl else "—",
                " / ".join(col(rs, f"rollback{i + 1}", "{:.0f}") for i in range(nk))
                if p == "checkpoint" else "—",
                summ(rs, "lost_pushes"), summ(rs, "pushes_applied_twice") if rl else "—",
                summ(rs, "local_clocks") if p == "stateless" else "—",
                " / ".join(col(rs, f"t{t}", "{:.1f}") for t in thresholds),
                col(rs, "final", "{:.3f}"), col(rs, "duration", "{:.1f}"),
                fmt([r["duration"] - ctrl_dur[r["seed"]] for r in rs
                     if r["seed"] in ctrl_dur and not r["died"]], "{:+.1f}"),
                fmt([r["loadavg_before"] for r in rs], "{:.1f}") + " / "
                + fmt([r["loadavg_after"] for r in rs], "{:.1f}")]) + " |")
        out.append("")
        inexact = [(r["config"], r["seed"]) for r in rs_all_replica(runs, sched)
                   if any(x is False for x in r["k"]["exact"])]
        if inexact:
            out.append(f"Inexact rebuilds ({sched}): {inexact}")
            out.append("")

    # ---- against paper B ----
    out.append("### Against paper B (ratios of means; > 1: replica-log is faster)")
    out.append("")
    out.append("The last column: the other policy's duration over replica-log's, per seed (the "
               "same seed's runs paired), mean [95% confidence interval] over the seeds.")
    out.append("")
    hdr = ["schedule", "vs"] + [f"time to {t:.0%}" for t in thresholds] + [
        "duration", "duration, paired per seed"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for sched in list(SCHEDULES) + ["no kill"]:
        base = group(lambda r: r["part"] == "main" and r["policy"] == "replica-log"
                     and r["schedule"] == sched)
        for p in ["checkpoint", "chain", "stateless"]:
            other = group(lambda r: r["part"] == "main" and r["policy"] == p
                          and r["schedule"] == sched)
            if not base or not other:
                continue

            def ratio(key):
                a = [r["m"].get(key, NAN) for r in other]
                b = [r["m"].get(key, NAN) for r in base]
                a, b = [x for x in a if x == x], [x for x in b if x == x]
                if not a or not b:
                    return "—"
                return f"{statistics.mean(a) / statistics.mean(b):.2f}x"

            mine = {r["seed"]: r["duration"] for r in base if not r["died"]}
            paired = [r["duration"] / mine[r["seed"]] for r in other
                      if not r["died"] and r["seed"] in mine]
            out.append("| " + " | ".join([sched, p] + [ratio(f"t{t}") for t in thresholds]
                                         + [ratio("duration"), fmt_ci(paired, "{:.3f}")
                                            + f" (n={len(paired)})"]) + " |")
    out.append("")

    # ---- sweeps ----
    def sweep_table(title, key_name, rs_by_key):
        # Several seeds per point: mean [95% interval]; one: the value (mean +- std otherwise).
        seeded = any(len({r["seed"] for r in rs}) > 1 for rs in rs_by_key.values())
        f_ = fmt_ci if seeded else fmt

        out.append(f"### {title}")
        out.append("")
        if seeded:
            out.append("Each cell: mean [95% confidence interval] over the runs (seeds) of the "
                       "point.")
            out.append("")
        hdr = [key_name, "runs", "kill at (fraction of the run)", "log max / worker (KB)",
               "replica max / worker (KB)", "replicas stored", "kill -> serving (s)",
               "restart -> serving (s)", "rebuild (s)", "kill -> full rate (s)",
               "replayed (entries)", "resent per worker (entries)", "missing", "pushes lost",
               "applied twice", "duration (s)", "final acc", "load before / after"]
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for key in sorted(rs_by_key):
            rs = rs_by_key[key]
            ks = [r["k"] for r in rs]
            sm = [r["summary"] for r in rs if r["summary"]]
            out.append("| " + " | ".join([
                str(key), str(len(rs)),
                f_([r["kills"][0] / r["duration"] for r in rs if r["kills"]], "{:.2f}"),
                f_([s["max_log_bytes"] / 1024 for s in sm], "{:.0f}"),
                f_([s["max_replica_bytes"] / 1024 for s in sm], "{:.0f}"),
                f_([s["replicas_stored"] for s in sm], "{:.0f}"),
                per_kill(ks, "serving", 0, form=f_), per_kill(ks, "from_restart", 0, form=f_),
                per_kill(ks, "rebuild", 0, "{:.3f}", f_), per_kill(ks, "full_rate", 0, form=f_),
                per_kill(ks, "entries", 0, "{:.0f}", f_),
                f_([s["entries_resent"] / s["workers"] for s in sm], "{:.1f}"),
                per_kill(ks, "missing", 0, "{:.0f}", f_), summ(rs, "lost_pushes", form=f_),
                summ(rs, "pushes_applied_twice", form=f_),
                col(rs, "duration", "{:.1f}", form=f_), col(rs, "final", "{:.3f}", form=f_),
                fmt([r["loadavg_before"] for r in rs], "{:.1f}") + " / "
                + fmt([r["loadavg_after"] for r in rs], "{:.1f}")]) + " |")
        out.append("")

    one_kill_rl = [r for r in runs if r["policy"] == "replica-log" and r["schedule"] == "1 kill"]
    by_interval, by_workers = {}, {}
    for r in one_kill_rl:
        if r["workers"] == 4:
            by_interval.setdefault(r["interval"], []).append(r)
        if r["interval"] == args.spread_interval:
            by_workers.setdefault(r["workers"], []).append(r)
    if len(by_interval) > 1:
        sweep_table("Replica interval (replica-log, 4 workers, 1 kill)", "--replica-interval",
                    by_interval)
    if len(by_workers) > 1:
        sweep_table(f"Replay spread (replica-log/{args.spread_interval}, 1 kill)", "workers",
                    by_workers)

    # ---- every run ----
    out.append("### Every run")
    out.append("")
    out.append("| run | seed | rc | duration (s) | kills at (s) | restarts at (s) | "
               "load before / after | other load (cores) |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in runs:
        out.append(f"| {r['config']} | {r['seed']} | {r.get('rc')} | {r['duration']:.1f} | "
                   + ", ".join(f"{k:.1f}" for k in r["kills"]) + " | "
                   + ", ".join(f"{k:.1f}" for k in r["restarts"])
                   + f" | {r['loadavg_before']:.2f} / {r['loadavg_after']:.2f} | "
                   f"{r.get('foreign_cores')} |")
    text = "\n".join(out)
    print(text)
    (out_dir / "table.md").write_text(text + "\n")
    if not args.no_plot:
        plot(out_dir, runs, T, by_interval, by_workers, args)
    return text


def rs_all_replica(runs, sched):
    return [r for r in runs if r["policy"] == "replica-log" and r["schedule"] == sched]


# ------------------------------------------------------------------------------------------
# Plots


def plot(out_dir, runs, T, by_interval, by_workers, args):
    plt = common.require_matplotlib(PROG)
    main = [r for r in runs if r["part"] == "main"]
    # One accuracy panel per kill schedule in the runs (none: no accuracy.png, e.g. the sweeps
    # with their one `none` control).
    present = [sc for sc in SCHEDULES if any(r["schedule"] == sc for r in main)]
    if present:
        end = max(r["duration"] for r in main if r["duration"] == r["duration"])
        step = max(end / 400, 0.02)
        grid = [i * step for i in range(int(end / step) + 2)]
        fig, axes = plt.subplots(len(present), 1, figsize=(12, 5 * len(present)), sharex=True,
                                 squeeze=False)
        axes = [a[0] for a in axes]
        for ax, sched in zip(axes, present):
            lo = 1.0
            # The controls of none and replica-log (dashed), and every policy's kill runs.
            curves = [("none", "no kill", "--"), ("replica-log", "no kill", "--")]
            curves += [(p, sched, "-") for p in KILL_POLICIES]
            for p, sc, style in curves:
                rs = [r for r in main if r["policy"] == p and r["schedule"] == sc]
                if not rs:
                    continue
                ys = rx.mean_curve(rs, grid)
                lo = min([lo] + [y for g, y in zip(grid, ys) if y == y and g > 0.15 * T])
                ax.plot(grid, ys, ls=style, color=COLORS[p], lw=1.4,
                        label=f"{p} ({sc}, {len(rs)} runs)")
            ks = [r for r in main if r["schedule"] == sched and r["kills"]]
            for i in range(len(SCHEDULES[sched])):
                kt = [r["kills"][i] for r in ks if len(r["kills"]) > i]
                rt = [r["restarts"][i] for r in ks if len(r["restarts"]) > i]
                if kt and rt:
                    ax.axvspan(statistics.mean(kt), statistics.mean(rt), color="red", alpha=0.12,
                               label="server 0 down (mean)" if i == 0 else None)
                sv = [r["kills"][i] + r["k"]["serving"][i] for r in ks
                      if r["policy"] == "replica-log" and len(r["k"]["serving"]) > i
                      and r["k"]["serving"][i] == r["k"]["serving"][i]]
                if sv:
                    ax.axvline(statistics.mean(sv), color=COLORS["replica-log"], ls=":",
                               label="replica-log serving again (mean)" if i == 0 else None)
            ax.set_title(f"Fashion-MNIST {args.model}, 2 servers + 4 workers, SSP(3): {sched}, "
                         f"mean over seeds")
            ax.set_ylabel("test accuracy (the runs' --eval source)")
            ax.set_ylim(max(0.0, lo - 0.02), None)
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right", fontsize=8, ncol=2)
        axes[-1].set_xlabel("seconds since training start (metrics time base)")
        fig.tight_layout()
        fig.savefig(out_dir / "accuracy.png", dpi=110)
        plt.close(fig)
        print(f"plot: {out_dir / 'accuracy.png'}", file=sys.stderr)
    if len(by_interval) > 1:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for key, label, marker in (("serving", "kill -> serving", "o"),
                                   ("from_restart", "restart -> serving", "s"),
                                   ("full_rate", "kill -> full rate", "^")):
            xs, ys, names = [], [], []
            for k in sorted(by_interval):
                rs = by_interval[k]
                logs = [r["summary"]["max_log_bytes"] / 1e6 for r in rs if r["summary"]]
                vals = [r["k"][key][0] for r in rs if r["k"][key] and r["k"][key][0] == r["k"][key][0]]
                if logs and vals:
                    xs.append(statistics.mean(logs))
                    ys.append(statistics.mean(vals))
                    names.append(k)
            ax.plot(xs, ys, marker=marker, label=label)
            if key == "serving":
                for x, y, n in zip(xs, ys, names):
                    ax.annotate(f"interval {n}", (x, y), textcoords="offset points",
                                xytext=(4, 4), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("max bytes of log per worker (MB, log scale)")
        ax.set_ylabel("seconds")
        ax.set_title("replica-log: log memory against recovery time (1 kill, 4 workers)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "interval.png", dpi=110)
        plt.close(fig)
        print(f"plot: {out_dir / 'interval.png'}", file=sys.stderr)
    if len(by_workers) > 1:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        ns = sorted(by_workers)

        def mean_of(rs, key):
            v = [r["k"][key][0] for r in rs if r["k"][key] and r["k"][key][0] == r["k"][key][0]]
            return statistics.mean(v) if v else NAN

        for key, label, marker in (("serving", "kill -> serving", "o"),
                                   ("from_restart", "restart -> serving", "s"),
                                   ("rebuild", "rebuild (first hello -> serving)", "v"),
                                   ("full_rate", "kill -> full rate", "^")):
            ax.plot(ns, [mean_of(by_workers[n], key) for n in ns], marker=marker, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("workers (the replay is spread over them)")
        ax.set_ylabel("seconds")
        ax2 = ax.twinx()
        ax2.plot(ns, [mean_of(by_workers[n], "entries") for n in ns], color="0.4", ls="--",
                 marker="x", label="entries replayed (right axis)")
        ax2.set_ylabel("entries replayed")
        ax.set_title(f"replica-log/{args.spread_interval}: recovery against workers (1 kill)")
        ax.grid(alpha=0.3)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "spread.png", dpi=110)
        plt.close(fig)
        print(f"plot: {out_dir / 'spread.png'}", file=sys.stderr)


# ------------------------------------------------------------------------------------------


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=common.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(rx.DEFAULT_BIN), help="the fashion_mnist binary")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help="directory for JSONL, PNG, table; " + common.out_help("swift"))
    ap.add_argument("--overwrite", action="store_true",
                    help=common.overwrite_help() + " (a run deletes the *.jsonl of the parts it "
                    "runs first)")
    ap.add_argument("--no-plot", action="store_true", help="no PNG (no matplotlib)")
    ap.add_argument("--seeds", default="1,2,3", help="the main part's seeds")
    ap.add_argument("--sweep-seeds", default=None,
                    help="the interval and spread sweeps' seeds (default: the first of --seeds)")
    ap.add_argument("--schedules", default="no kill,1 kill,2 kills",
                    help="the main part's schedules, of: no kill, " + ", ".join(SCHEDULES)
                    + " (none's failure-free control always runs)")
    ap.add_argument("--only", default=",".join(PARTS),
                    help="comma-separated subset of the parts: " + ", ".join(PARTS))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 2 epochs, seed 1, intervals 1,100, spread over 1,2 workers "
                    "(explicit flags still win)")
    ap.add_argument("--model", default="mlp", choices=["mlp", "softmax"])
    ap.add_argument("--hidden", type=int, default=128, help="the trainer's MLP hidden width")
    ap.add_argument("--epochs", type=float, default=None, help="default 25 (--quick: 2)")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--staleness", type=int, default=3)
    ap.add_argument("--eval-every", type=float, default=None,
                    help="epochs between evaluations (default 0.25; --quick: 0.05)")
    ap.add_argument("--main-interval", type=int, default=10,
                    help="--replica-interval of the main part (the trainer's default)")
    ap.add_argument("--intervals", default=None, help="interval sweep (default 1,5,20,100,500)")
    ap.add_argument("--spread-workers", default=None, help="spread sweep (default 1,2,4,8)")
    ap.add_argument("--spread-interval", type=int, default=100,
                    help="--replica-interval of the spread sweep (long enough to replay a "
                    "noticeable log)")
    ap.add_argument("--downtime-fraction", type=float, default=0.15)
    ap.add_argument("--thresholds", default="0.75,0.8")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run")
    ap.add_argument("--analyze-only", action="store_true")
    args = ap.parse_args()
    if args.epochs is None:
        args.epochs = 2 if args.quick else 25
    if args.eval_every is None:
        args.eval_every = 0.05 if args.quick else 0.25  # enough evaluations for the rates
    if args.quick and args.seeds == "1,2,3":
        args.seeds = "1"
    args.intervals = ints(args.intervals or ("1,100" if args.quick else "1,5,20,100,500"))
    args.spread_workers = ints(args.spread_workers or ("1,2,4" if args.quick else "1,2,4,8"))
    args.schedules = [x.strip() for x in args.schedules.split(",") if x.strip()]
    for sc in args.schedules:
        if sc != "no kill" and sc not in SCHEDULES:
            sys.exit(f"{PROG}: unknown schedule {sc!r} (--schedules takes no kill, "
                     f"{', '.join(SCHEDULES)})")
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    for p in parts:
        if p not in PARTS:
            sys.exit(f"{PROG}: unknown part {p!r} (--only takes {', '.join(PARTS)})")

    if not args.no_plot:
        common.require_matplotlib(PROG)  # before the runs, not after
    out_dir = Path(args.out)
    if args.analyze_only:
        common.check_out(PROG, out_dir, args.overwrite, [])
        analyse(out_dir, args)
        return
    seeds = ints(args.seeds)
    sweep_seeds = ints(args.sweep_seeds) if args.sweep_seeds else seeds[:1]
    todo = plan(args, parts, seeds, sweep_seeds)
    mine = [p for p in sorted(out_dir.glob("*.jsonl"))
            if any(p.name.startswith(rx.slug(f"{part}:")) for part in parts)]
    common.check_out(PROG, out_dir, args.overwrite, mine)
    binary = Path(args.bin).resolve()
    if not binary.exists():
        sys.exit(f"{PROG}: no trainer at {binary}; build the fashion_mnist target or pass --bin")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in mine:  # only with --overwrite (check_out above)
        old.unlink()
    started = time.monotonic()

    def log(msg):
        print(f"[{time.monotonic() - started:7.1f} s] {msg}", file=sys.stderr, flush=True)

    # The kill schedule: from the none controls already in --out, else from the first run
    # (the none control of the first seed; run first when the main part runs).
    def schedule_T():
        ctrl = [parse(p) for p in out_dir.glob(rx.slug("main: none (no kill)") + "-seed*.jsonl")]
        ctrl = [r for r in ctrl if not r["died"]]
        return statistics.mean(r["duration"] for r in ctrl) if ctrl else None

    T = schedule_T()
    if T is None and "main" not in parts:
        todo.insert(0, {"name": run_name("main", "none", "no kill", None, 4), "part": "main",
                        "policy": "none", "schedule": "no kill", "seed": seeds[0],
                        "interval": None, "workers": 4})
    per_run = 35.0 * args.epochs / 25 + 2  # s, the 2-core VM (T about 25-32 s, data loading)
    log(f"{len(todo)} runs planned ({', '.join(parts)}), about {len(todo) * per_run / 60:.0f} "
        f"minutes at about {per_run:.0f} s per run (updated after the first run)")
    for n, run in enumerate(todo):
        kills = run["schedule"] not in ("no kill",)
        kill_at, downtime, fractions = [], 0.0, []
        if kills:
            if T is None:
                T = schedule_T()
            fractions = SCHEDULES[run["schedule"]]
            kill_at = [round(f * T, 2) for f in fractions]
            downtime = round(args.downtime_fraction * T, 2)
        flags = policy_flags(run["policy"], run["interval"])
        rec = {k: run[k] for k in ("part", "policy", "schedule", "interval", "workers")}
        rec["kill_fractions"] = fractions
        t_run = time.monotonic()
        p = rx.run_one(binary, run["name"], flags, kills, run["seed"], args, kill_at, downtime,
                       out_dir, args.timeout, workers=run["workers"], record=rec)
        r = parse(p)
        if n == 0:
            per_run = time.monotonic() - t_run
            log(f"first run took {per_run:.0f} s: about {(len(todo) - 1) * per_run * 1.1 / 60:.0f}"
                f" minutes to go (kill runs take longer)")
        log(f"{run['name']} seed {run['seed']}: rc {r.get('rc')}, {r['duration']:.1f} s, kills "
            f"at {[round(k, 1) for k in r['kills']]}, restarts "
            f"{[round(k, 1) for k in r['restarts']]}, load {r['loadavg_before']:.2f} -> "
            f"{r['loadavg_after']:.2f}")
    log("done; analysing")
    analyse(out_dir, args)


if __name__ == "__main__":
    main()

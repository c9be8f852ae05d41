#!/usr/bin/env python3
"""Paper A's kill-the-server experiment ("Training Through Failure") on Fashion-MNIST.

Runs the `fashion_mnist` trainer (2 servers + 4 workers, servers as child processes; by default
the CNN, 3 epochs, SSP(3)) under a no-kill control and under the paper's two schedules, one and
two SIGKILLs of server shard 0 (at 14% and 37% of the control's run length, each down for 9.3%
of it: paper A's 30 s and 80 s, 20 s down, of about 215 s), for each recovery policy, SWIFT's
replica-log included, over 5 seeds. Every accuracy is the servers' model (the trainer's
`--eval servers`), read as a reader. Then it computes, per schedule and configuration (mean +-
std over seeds):

  * the accuracy drop at each failure (last accuracy before the kill minus the minimum between
    the kill and the end of the post-recovery window),
  * the mean accuracy in the window after each recovery, and its gap to the no-kill control,
  * the time to reach given test accuracies, the final accuracy,
  * gradients processed (and those lost by a checkpoint restore), worker busy fraction,
  * cost under reserved pricing (nodes x wall time x rate) and per-use pricing (worker busy
    time x rate), and useful gradients per cost unit.

It writes one raw JSONL file per run, a plot of test accuracy against time and a markdown
table into --out, by default build/experiments/recovery. It never deletes or replaces files of
an earlier run, nor writes under docs/ (the committed results, docs/results/recovery), unless
--overwrite says so. Standard library only, plus matplotlib for the plot: when it is missing
the script installs it before running anything, through `bash .ci/deps python3-matplotlib`
(Debian's package), and re-runs itself with /usr/bin/python3; --no-plot skips the plot instead.
Not used by CI.

    python3 bench/recovery_experiment.py --bin build/release/examples/fashion_mnist/fashion_mnist
    python3 bench/recovery_experiment.py --analyze-only --out docs/results/recovery --overwrite
        # re-analyse the committed JSONL files (rewrites their table.md and plots)

Time bases. The trainer's metrics (`time_s`) start when its monitor is created, after the
training data is loaded; the supervisor's `[fault]` times start at worker 0's first clock (at
process start in the trainer the results in docs/results/recovery.md were measured with). This script
timestamps every stdout/stderr line on arrival (time.monotonic) and converts fault times to the
metrics time base as (arrival of the fault line) - (arrival of the trainer's banner line, which
is printed right after the monitor is created). The banner follows the monitor's start by the
construction of 4 workers (milliseconds), so the conversion is good to a few milliseconds plus
pipe latency. The measured data-loading offset (banner - launch) is recorded per run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import experiment_common as common  # noqa: E402

REPO = common.REPO
DEFAULT_OUT = common.default_out("recovery")
DEFAULT_BIN = REPO / "build" / "release" / "examples" / "fashion_mnist" / "fashion_mnist"

# name -> (trainer flags, kills?). The control schedules a kill far beyond the end of the run,
# so its servers run as child processes exactly as in the kill runs, but are never killed.
# Intervals are about 10% of the default run (paper A checkpoints and replicates every 100
# updates, about 10% of its run): 100 server clocks = 400 gradients = 400 pushes to a shard.
CONFIGS = {
    "control (no kill)": (["--recovery", "none"], False),
    "none": (["--recovery", "none"], True),
    "checkpoint/100": (["--recovery", "checkpoint", "--checkpoint-every", "100"], True),
    "checkpoint/adaptive": (["--recovery", "checkpoint"], True),
    "stateless/sum": (["--recovery", "stateless", "--merge", "sum"], True),
    "stateless/lr-scaled": (["--recovery", "stateless", "--merge", "lr-scaled"], True),
    "stateless/mean": (["--recovery", "stateless", "--merge", "mean"], True),
    "stateless/staleness-aware": (["--recovery", "stateless", "--merge", "staleness-aware"], True),
    "chain/strict": (["--recovery", "chain", "--replicas", "2"], True),
    "chain-relaxed/400": (
        ["--recovery", "chain-relaxed", "--replicas", "2", "--replicate-every", "400"], True),
    "swift (replica-log/10)": (["--recovery", "replica-log", "--replica-interval", "10"], True),
}
# What a run without --configs runs (the published table): one of each policy.
DEFAULT_CONFIGS = ["control (no kill)", "none", "checkpoint/100", "checkpoint/adaptive",
                   "stateless/sum", "stateless/lr-scaled", "chain/strict", "chain-relaxed/400",
                   "swift (replica-log/10)"]
CONTROL = "control (no kill)"
COLORS = {
    "control (no kill)": "black",
    "none": "saddlebrown",
    "checkpoint/100": "tab:red",
    "checkpoint/adaptive": "tab:orange",
    "stateless/sum": "tab:blue",
    "stateless/mean": "tab:cyan",
    "stateless/lr-scaled": "tab:green",
    "stateless/staleness-aware": "tab:purple",
    "chain/strict": "tab:olive",
    "chain-relaxed/400": "tab:pink",
    "swift (replica-log/10)": "tab:gray",
}
# Tables per model (a gradient is tables x servers pushes).
TABLES = {"softmax": 1, "mlp": 2, "cnn": 4}
NEVER_KILL = 100000.0  # seconds: a kill that never fires (servers still run as processes)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ------------------------------------------------------------------------------------------
# Running


def cpu_busy_seconds():
    """Busy CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_one(binary, name, flags, kills, seed, args, kill_at, downtime, out_dir, timeout,
            workers=4, record=None):
    """Runs the trainer once with the trainer flags `flags` (the recovery policy's) on top of the
    common settings in `args` (model, epochs, lr, staleness, eval_every) and `workers` workers;
    `kills`: whether it kills (at `kill_at`, supervisor time, with `downtime`) or schedules a kill
    that never fires. `record`: extra fields for the run's first JSONL line. Writes
    out_dir/<slug of name>-seed<seed>.jsonl; returns its path. The exit record holds
    `checkpoint_bytes`, the size of the checkpoint directory at the end (--recovery checkpoint)."""
    tmp = Path(tempfile.mkdtemp(prefix="asyncps-recovery-"))
    metrics = tmp / "metrics.jsonl"
    cmd = [str(binary), "--model", args.model, "--epochs", str(args.epochs), "--lr", str(args.lr),
           "--decay-factor", "1", "--servers", "2", "--workers", str(workers),
           "--consistency", "ssp", "--staleness", str(args.staleness),
           "--eval-every", str(args.eval_every), "--seed", str(seed), "--quiet",
           "--metrics", str(metrics), *flags]
    if "checkpoint" in flags:
        cmd += ["--checkpoint-dir", str(tmp / "ckpt")]
    if kills:
        cmd += ["--kill-at", ",".join(f"{t:.2f}" for t in kill_at), "--downtime", f"{downtime:.2f}"]
    else:
        cmd += ["--kill-at", f"{NEVER_KILL:.0f}"]
    events = []
    lock = threading.Lock()
    load_before = os.getloadavg()
    busy0 = cpu_busy_seconds()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1, start_new_session=True, cwd=tmp)

    def pump(stream, kind):
        for line in stream:
            t = time.monotonic() - t0
            line = line.rstrip("\n")
            if line.strip():
                with lock:
                    events.append({"type": kind, "t": round(t, 4), "line": line})

    threads = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
    for th in threads:
        th.start()
    timed_out = False
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() > deadline and not timed_out:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its server children (our group)
        time.sleep(0.05)
    t_exit = time.monotonic() - t0
    busy = cpu_busy_seconds() - busy0
    rc = os.waitstatus_to_exitcode(status)
    proc.returncode = rc
    # CPU time of the trainer and of its server processes (it waits for them): what is left of
    # the machine's busy time is other load (the other engineer's build, this script).
    own_cpu = usage.ru_utime + usage.ru_stime
    for th in threads:
        th.join(timeout=5)
    records = [{"type": "run", "config": name, "seed": seed, "cmd": cmd, "kills": kills,
                "kill_at_supervisor": kill_at if kills else [], "downtime": downtime if kills else 0,
                "unix_start": time.time() - t_exit, "loadavg_before": load_before,
                **(record or {})}]
    records += sorted(events, key=lambda e: e["t"])
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            if line.strip():
                records.append({"type": "metric", "data": json.loads(line)})
    records.append({"type": "exit", "rc": rc, "t": round(t_exit, 4), "timed_out": timed_out,
                    "loadavg_after": os.getloadavg(), "cpu_s": round(own_cpu, 3),
                    "machine_busy_s": round(busy, 3),
                    "foreign_cores": round((busy - own_cpu) / t_exit, 3) if t_exit > 0 else None,
                    "checkpoint_bytes": sum(f.stat().st_size for f in (tmp / "ckpt").rglob("*")
                                            if f.is_file())})
    shutil.rmtree(tmp, ignore_errors=True)
    sched = f"-{len(kill_at)}kill" if kills else ""
    path = out_dir / f"{slug(name)}{sched}-seed{seed}.jsonl"
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return path


# ------------------------------------------------------------------------------------------
# Parsing one run

KILL_RE = re.compile(r"\[fault\] killed server (\d+)(?:\.\d+)? \(SIGKILL\) at ([0-9.]+) s")
RESTART_RE = re.compile(r"\[fault\] restarted server (\d+)(?:\.\d+)? at ([0-9.]+) s")
LISTEN_RE = re.compile(r"^server (\d+)(?:\.\d+)? of \d+ listening")
RESTORED_RE = re.compile(r"restored from .*\(server clock (\d+)\)")
FRESH_RE = re.compile(r"server 0: asyncps checkpoint \(shard 0\): no checkpoint of this shard")
REJOINS_RE = re.compile(r"server 0: worker \d+ rejoins at clock (\d+)")


def parse_run(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    run = recs[0]
    r = {"config": run["config"], "seed": run["seed"], "cmd": run["cmd"], "path": str(path),
         "kills_scheduled": run["kills"], "loadavg_before": run["loadavg_before"][0],
         "schedule": len(run["kill_at_supervisor"])}
    banner = None
    kills, restarts, listens, sup_origin = [], [], [], []
    rejoins, restored, rejoin_clocks = [], [], []
    for e in recs:
        if e["type"] == "stdout":
            line = e["line"]
            if banner is None and "role all" in line and line.startswith("fashion_mnist:"):
                banner = e["t"]
            m = KILL_RE.search(line)
            if m:
                kills.append(e["t"])
                sup_origin.append(e["t"] - float(m.group(2)))
            m = RESTART_RE.search(line)
            if m:
                restarts.append(e["t"])
                sup_origin.append(e["t"] - float(m.group(2)))
            m = LISTEN_RE.search(line)
            if m and m.group(1) == "0":
                listens.append(e["t"])
        elif e["type"] == "stderr" and "rejoined server 0" in e["line"]:
            rejoins.append(e["t"])
        if e["type"] in ("stdout", "stderr"):
            m = RESTORED_RE.search(e["line"])
            if m:
                restored.append((e["t"], int(m.group(1))))
            if FRESH_RE.search(e["line"]):
                restored.append((e["t"], 0))  # no checkpoint yet: shard 0 starts from scratch
            m = REJOINS_RE.search(e["line"])
            if m:
                rejoin_clocks.append((e["t"], int(m.group(1))))
        elif e["type"] == "exit":
            r["rc"] = e["rc"]
            r["timed_out"] = e["timed_out"]
            r["wall_total"] = e["t"]
            r["foreign_cores"] = e.get("foreign_cores")
            r["cpu_s"] = e.get("cpu_s")
    evals, final, summary = [], None, None
    for e in recs:
        if e["type"] != "metric":
            continue
        d = e["data"]
        if d.get("summary"):
            summary = d
        elif d.get("final"):
            final = d
        elif d.get("eval_source", "servers") == "servers":
            # The servers' model (runs from before --eval servers have no eval_source and
            # read worker 0's view); an evaluation the servers did not answer (a shard down)
            # is worker 0's view and is left out of the curves.
            evals.append((d["time_s"], d["test_accuracy"], d["clock"]))
    r["banner"] = banner if banner is not None else float("nan")
    b = r["banner"]
    r["load_offset"] = b  # launch -> metrics origin (data loading in all three processes)
    r["supervisor_origin"] = statistics.mean(sup_origin) if sup_origin else float("nan")
    r["kills"] = [k - b for k in kills]
    r["restarts"] = [k - b for k in restarts]
    # The restarted server listens once it has loaded the data; workers rejoin after that.
    # (nan when the restarted process was killed again before it listened)
    bounds = r["kills"][1:] + [float("inf")]
    r["listening"] = [next((x - b for x in listens if rs + b < x < nk + b), float("nan"))
                      for rs, nk in zip(r["restarts"], bounds)]
    # The first rejoin after each kill: after the restart for checkpoint and stateless (the
    # shard has no other server), within milliseconds for chain replication (the backup).
    r["rejoined"] = [next((x - b for x in rejoins if x > k), float("nan"))
                     for k in kills[:len(r["restarts"])]]
    # Checkpoint: clocks rolled back at each restart = the workers' clocks when they rejoin
    # minus the restored checkpoint's clock (0 when there was no checkpoint yet), both taken
    # between that restart and the next kill.
    r["rollback"] = []
    for rs, nk in zip(restarts, kills[1:] + [float("inf")]):
        got = next((c for t, c in restored if rs < t < nk), None)
        cl = [c for t, c in rejoin_clocks if rs < t < nk][:4]
        r["rollback"].append(statistics.mean(cl) - got if got is not None and cl
                             else float("nan"))
    r["evals"] = evals
    r["final"] = final
    r["summary"] = summary
    # The trainer's final record says when a run failed (and the clock it reached).
    r["died"] = r.get("rc", 1) != 0 or bool(final and final.get("failed"))
    r["duration"] = final["time_s"] if final else float("nan")
    return r


# ------------------------------------------------------------------------------------------
# Metrics


def interp(xs, ys, x):
    if not xs or x < xs[0] or x > xs[-1]:
        return float("nan")
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= x:
            lo = mid
        else:
            hi = mid
    if xs[hi] == xs[lo]:
        return ys[lo]
    return ys[lo] + (ys[hi] - ys[lo]) * (x - xs[lo]) / (xs[hi] - xs[lo])


def mean_curve(runs, grid):
    """The runs' mean test accuracy at each time of `grid` (nan where a run has no evaluation
    on both sides)."""
    ys = []
    for g in grid:
        vals = [interp([e[0] for e in r["evals"]], [e[1] for e in r["evals"]], g) for r in runs]
        ys.append(statistics.mean(vals) if vals and all(v == v for v in vals) else float("nan"))
    return ys


def run_metrics(r, T, thresholds, post_frac, control_curve, rate, tables, servers, t_ref):
    """Per-run numbers; T is the no-kill control's mean duration (the 'run length')."""
    ev = r["evals"]
    ts = [e[0] for e in ev]
    acc = [e[1] for e in ev]
    m = {}
    for i, k in enumerate(r["kills"]):
        nxt = r["kills"][i + 1] if i + 1 < len(r["kills"]) else float("inf")
        rs = r["restarts"][i] if i < len(r["restarts"]) else float("nan")
        before = [a for t, a in zip(ts, acc) if t < k]
        post_end = min(rs + post_frac * T, nxt)
        # The window also takes the first evaluation after the kill: under checkpointing
        # worker 0 may be blocked (SSP) for the whole outage and then some.
        window = [a for t, a in zip(ts, acc) if k <= t <= post_end]
        first_after = next((a for t, a in zip(ts, acc) if t >= k), None)
        if first_after is not None:
            window.append(first_after)
        m[f"before{i+1}"] = before[-1] if before else float("nan")
        m[f"drop{i+1}"] = (before[-1] - min(window)) if before and window else float("nan")
        post = [(t, a) for t, a in zip(ts, acc) if rs <= t <= post_end]
        m[f"post{i+1}"] = statistics.mean(a for _, a in post) if post else float("nan")
        gaps = [a - interp(*control_curve, t) for t, a in post]
        gaps = [g for g in gaps if not math.isnan(g)]
        m[f"postgap{i+1}"] = statistics.mean(gaps) if gaps else float("nan")
        m[f"outage{i+1}"] = (r["rejoined"][i] - k) if i < len(r["rejoined"]) else float("nan")
        m[f"rollback{i+1}"] = r["rollback"][i] if i < len(r["rollback"]) else float("nan")
    for thr in thresholds:
        hit = next((t for t, a in zip(ts, acc) if a >= thr), float("nan"))
        m[f"t{thr}"] = hit
    m["final"] = r["final"]["test_accuracy"] if r["final"] and not r["died"] else float("nan")
    m["last_acc"] = acc[-1] if acc else float("nan")
    m["duration"] = r["duration"]
    m["died_at"] = r["duration"] if r["died"] else float("nan")
    s = r["summary"]
    cmd = r["cmd"]
    workers = int(cmd[cmd.index("--workers") + 1]) if "--workers" in cmd else 4
    if s:
        grads = s["gradients"]
        workers = s["workers"]
        # A gradient is tables x servers pushes. (The trainer leaves lost_pushes out when it
        # cannot count them: replica-log without every shard's final state.)
        lost = s.get("lost_pushes", float("nan")) / (tables * servers)
        m["busy"] = s["compute_s"] / (workers * s["time_s"])
        m["per_use"] = s["compute_s"] * rate
        m["local_clocks"] = s["local_clocks"]
    else:
        grads = (r["final"]["clock"] * workers) if r["final"] and not r["died"] else float("nan")
        lost = 0.0
        m["busy"] = m["per_use"] = m["local_clocks"] = float("nan")
    m["gradients"] = grads
    m["lost"] = lost
    m["useful"] = grads - lost
    m["grads_per_s"] = m["useful"] / m["duration"] if not r["died"] else float("nan")
    clocks_ts = [e[0] for e in ev]
    clocks = [e[2] for e in ev]
    if r["final"] and not r["died"]:
        clocks_ts.append(r["final"]["time_s"])
        clocks.append(r["final"]["clock"])
    c_ref = interp(clocks_ts, clocks, t_ref)
    m["grads_at_ref"] = c_ref * workers
    # Chain replication runs every shard on --replicas servers (and a chain master, which is
    # not counted: it is a membership service, not a parameter server).
    nodes = servers * (int(cmd[cmd.index("--replicas") + 1]) if "--replicas" in cmd else 1)
    m["reserved"] = (nodes + workers) * m["duration"] * rate
    m["useful_per_reserved"] = m["useful"] / m["reserved"]
    m["useful_per_use"] = m["useful"] / m["per_use"] if m["per_use"] == m["per_use"] else float("nan")
    return m


def ms(values, fmt="{:.3f}", scale=1.0, show_n=None):
    vals = [v * scale for v in values if v == v]
    if not vals:
        return "—"
    s = fmt.format(statistics.mean(vals))
    if len(vals) > 1:
        s += " ± " + fmt.replace("+", "").format(statistics.stdev(vals))
    if show_n is not None and len(vals) < show_n:
        s += f" ({len(vals)}/{show_n})"
    return s


def per_seed_metrics(allruns, schedule, model="cnn", thresholds=(0.75, 0.8, 0.85),
                     post_frac=0.2, rate=1.0, servers=2):
    """The runs of kill schedule `schedule` (1, 2, ...) with the no-kill controls, and their
    run_metrics as table.md computes them (the script's defaults), each run paired with its own
    seed's control curve. Returns (T, t_ref, per): T the mean control length (s), t_ref the
    shortest surviving run (s), per[config][seed] = (run, metrics). For the derivation scripts
    under docs/results/ (recovery/derive.py, swift/derive_paper_a_cnn.py)."""
    runs = [r for r in allruns if not r["kills_scheduled"] or r["schedule"] == schedule]
    ctrl = [r for r in runs if r["config"] == CONTROL]
    T = statistics.mean(r["duration"] for r in ctrl if not r["died"])
    t_ref = min(r["duration"] for r in runs if not r["died"])
    curves = {r["seed"]: ([e[0] for e in r["evals"]], [e[1] for e in r["evals"]]) for r in ctrl}
    per = {}
    for r in runs:
        m = run_metrics(r, T, list(thresholds), post_frac, curves[r["seed"]], rate, TABLES[model],
                        servers, t_ref)
        per.setdefault(r["config"], {})[r["seed"]] = (r, m)
    return T, t_ref, per


def analyse(out_dir, args):
    """Writes table.md (a section per kill schedule, each against the same no-kill controls)
    and accuracy-<k>kill.png; returns the table's text."""
    runs = [parse_run(p) for p in sorted(out_dir.glob("*.jsonl"))]
    if not runs:
        sys.exit(f"no runs in {out_dir}")
    schedules = sorted({r["schedule"] for r in runs if r["kills_scheduled"]}) or [0]
    parts = []
    for k in schedules:
        sub = [r for r in runs if not r["kills_scheduled"] or r["schedule"] == k]
        title = f"{k} kill{'s' if k != 1 else ''}" if k else "no kills"
        parts.append(f"## {title}\n\n" + analyse_schedule(sub, out_dir, args, k))
    text = "\n\n".join(parts)
    print(text)
    (out_dir / "table.md").write_text(text + "\n")
    return text


def analyse_schedule(runs, out_dir, args, schedule):
    by_cfg = {}
    for r in runs:
        by_cfg.setdefault(r["config"], []).append(r)
    order = [c for c in CONFIGS if c in by_cfg]
    ctrl = by_cfg.get(CONTROL, [])
    T = statistics.mean(r["duration"] for r in ctrl if not r["died"]) if ctrl else float("nan")
    # Mean control curve on a grid, for the gap "post-recovery accuracy minus control".
    grid = [i * 0.25 for i in range(int(max((r["duration"] for r in runs
                                              if r["duration"] == r["duration"]),
                                             default=0) / 0.25) + 2)]
    curves = {c: mean_curve(by_cfg[c], grid) for c in order}
    control_curve = ([g for g, y in zip(grid, curves.get(CONTROL, [])) if y == y],
                     [y for y in curves.get(CONTROL, []) if y == y])
    tables = TABLES[args.model]
    servers = 2
    alive = [r["duration"] for r in runs if not r["died"]]
    t_ref = min(alive) if alive else float("nan")
    thresholds = [float(x) for x in args.thresholds.split(",")]
    # The gap to the control is paired: each run against the control run of its own seed
    # (which ran just before it); the mean control curve when that seed has none.
    ctrl_by_seed = {r["seed"]: ([e[0] for e in r["evals"]], [e[1] for e in r["evals"]])
                    for r in ctrl}
    per = {c: [run_metrics(r, T, thresholds, args.post_window,
                           ctrl_by_seed.get(r["seed"], control_curve), args.rate, tables,
                           servers, t_ref) for r in by_cfg[c]] for c in order}

    kill_runs = [r for r in runs if r["kills_scheduled"] and r["kills"]]
    nkills = max((len(r["kills"]) for r in kill_runs), default=0)

    def col(c, key, fmt="{:.3f}", scale=1.0, n=None):
        return ms([m.get(key, float("nan")) for m in per[c]], fmt, scale, n)

    out = []
    seeds = sorted({r["seed"] for r in runs})
    out.append(f"Run length T (no-kill control, mean of {len(ctrl)} seeds): {T:.1f} s; "
               f"seeds {','.join(map(str, seeds))}; gradient counts at t_ref = {t_ref:.1f} s "
               f"(the shortest surviving run).")
    if kill_runs:
        for i in range(nkills):
            ks = [r["kills"][i] for r in kill_runs if len(r["kills"]) > i]
            rs = [r["restarts"][i] for r in kill_runs if len(r["restarts"]) > i]
            lag = [r["listening"][i] - r["restarts"][i] for r in kill_runs
                   if len(r["listening"]) > i and r["listening"][i] == r["listening"][i]]
            out.append(f"Kill {i+1} (metrics time base): killed at {min(ks):.1f}-{max(ks):.1f} s "
                       f"(mean {statistics.mean(ks):.1f}), restarted at "
                       + (f"{min(rs):.1f}-{max(rs):.1f} s" if rs else "—")
                       + (f", listening again {min(lag):.2f}-{max(lag):.2f} s (mean "
                          f"{statistics.mean(lag):.2f}) after the restart in {len(lag)} of "
                          f"{len(rs)} runs" if lag else ""))
        offs = [r["load_offset"] for r in runs if r["load_offset"] == r["load_offset"]]
        sup = [r["supervisor_origin"] for r in kill_runs
               if r["supervisor_origin"] == r["supervisor_origin"]]
        out.append(f"Data-loading offset (launch -> metrics origin): {min(offs):.2f}-{max(offs):.2f} s "
                   f"(mean {statistics.mean(offs):.2f}); supervisor clock origin vs launch: "
                   f"{min(sup):+.3f}..{max(sup):+.3f} s.")
    loads = [r["loadavg_before"] for r in runs]
    out.append(f"1-min load average before each run: {min(loads):.1f}-{max(loads):.1f}.")
    foreign = [r["foreign_cores"] for r in runs if r.get("foreign_cores") is not None]
    if foreign:
        out.append(f"Other load during each run (machine busy time minus the trainer's CPU, in "
                   f"cores of 2): {min(foreign):.2f}-{max(foreign):.2f} "
                   f"(mean {statistics.mean(foreign):.2f}).")
    out.append("")
    n = len(seeds)
    hdr = ["config", "runs ok"]
    for i in range(nkills):
        hdr += [f"outage {i+1} (s)", f"rolled back {i+1} (clocks)", f"drop at kill {i+1} (pts)",
                f"acc after recovery {i+1}", f"vs control {i+1} (pts)"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for c in order:
        ok = sum(1 for r in by_cfg[c] if not r["died"])
        row = [c, f"{ok}/{len(by_cfg[c])}"]
        for i in range(nkills):
            if CONFIGS[c][1]:
                row += [col(c, f"outage{i+1}", "{:.1f}"), col(c, f"rollback{i+1}", "{:.0f}"),
                        col(c, f"drop{i+1}", "{:.1f}", 100),
                        col(c, f"post{i+1}"), col(c, f"postgap{i+1}", "{:+.1f}", 100)]
            else:
                row += ["—"] * 5
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    hdr = ["config"] + [f"time to {t:.0%} (s)" for t in thresholds] + [
        "final acc", "duration (s)", "gradients (lost)", f"gradients by {t_ref:.0f} s",
        "busy", "reserved cost", "per-use cost", "useful grads / reserved unit",
        "useful grads / per-use unit"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for c in order:
        row = [c] + [col(c, f"t{t}", "{:.1f}", 1, n) for t in thresholds]
        if all(r["died"] for r in by_cfg[c]):
            row += ["died at " + col(c, "died_at", "{:.1f}") + " s (last acc "
                    + col(c, "last_acc") + ")"] + ["—"] * 8
        else:
            lost = col(c, "lost", "{:.0f}")
            row += [col(c, "final"), col(c, "duration", "{:.1f}"),
                    col(c, "gradients", "{:.0f}") + (f" ({lost})" if lost not in ("—", "0", "0 ± 0")
                                                      else ""),
                    col(c, "grads_at_ref", "{:.0f}"), col(c, "busy", "{:.0%}"),
                    col(c, "reserved", "{:.0f}"), col(c, "per_use", "{:.0f}"),
                    col(c, "useful_per_reserved", "{:.1f}"), col(c, "useful_per_use", "{:.0f}")]
        out.append("| " + " | ".join(row) + " |")
    plot(out_dir, order, by_cfg, grid, curves, kill_runs, nkills, seeds, args, schedule)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------
# Plot


def plot(out_dir, order, by_cfg, grid, curves, kill_runs, nkills, seeds, args, schedule):
    if args.no_plot:
        return
    plt = common.require_matplotlib("bench/recovery_experiment.py")
    fig, axes = plt.subplots(2, 1, figsize=(12, 10), sharex=True)
    first_seed = seeds[0]
    for ax, title in zip(axes, [f"mean over seeds {','.join(map(str, seeds))}",
                                f"seed {first_seed} (each evaluation)"]):
        for i in range(nkills):
            ks = [r["kills"][i] for r in kill_runs if len(r["kills"]) > i]
            rs = [r["restarts"][i] for r in kill_runs if len(r["restarts"]) > i]
            ls = [r["listening"][i] for r in kill_runs if len(r["listening"]) > i
                  and r["listening"][i] == r["listening"][i]]
            if ks and rs:
                ax.axvspan(statistics.mean(ks), statistics.mean(rs), color="red", alpha=0.12,
                           label="server 0 down (mean)" if i == 0 else None)
            if rs and ls:
                ax.axvspan(statistics.mean(rs), statistics.mean(ls), color="red", alpha=0.05,
                           label="restarted, not listening yet" if i == 0 else None)
        ax.set_title(f"Fashion-MNIST {args.model.upper()}, 2 servers + 4 workers, "
                     f"SSP({args.staleness}), {nkills} kill{'s' if nkills != 1 else ''}: "
                     f"test accuracy — {title}")
        ax.set_ylabel("test accuracy (the servers' model)")
        ax.set_ylim(0.5, 0.92)
        ax.grid(alpha=0.3)
    for c in order:
        style = dict(color=COLORS.get(c, None), lw=1.4,
                     ls="--" if c.startswith("control") else "-")
        ys = curves[c]
        axes[0].plot(grid, ys, label=c, **style)
        runs = [r for r in by_cfg[c] if r["seed"] == first_seed]
        for r in runs:
            xs = [e[0] for e in r["evals"]]
            ys1 = [e[1] for e in r["evals"]]
            axes[1].plot(xs, ys1, marker=".", ms=3, label=c, **style)
            if r["died"] and xs:
                axes[1].plot(xs[-1], ys1[-1], "x", color=style["color"], ms=10, mew=2)
    axes[1].set_xlabel("seconds since training start (metrics time base)")
    axes[0].legend(loc="lower right", fontsize=8, ncol=2)
    fig.tight_layout()
    path = out_dir / f"accuracy-{schedule}kill.png"
    fig.savefig(path, dpi=110)
    print(f"plot: {path}", file=sys.stderr)


# ------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=common.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(DEFAULT_BIN), help="the fashion_mnist binary")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help="directory for JSONL, PNG, table; " + common.out_help("recovery"))
    ap.add_argument("--overwrite", action="store_true",
                    help=common.overwrite_help() + " (a run deletes the folder's *.jsonl first)")
    ap.add_argument("--no-plot", action="store_true", help="no accuracy.png (no matplotlib)")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help="comma-separated subset of: " + "; ".join(CONFIGS))
    ap.add_argument("--model", default="cnn", choices=["cnn", "mlp", "softmax"])
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=0.05, help="held constant (--decay-factor 1)")
    ap.add_argument("--staleness", type=int, default=3)
    ap.add_argument("--eval-every", type=float, default=0.25)
    ap.add_argument("--kill-fractions", default="0.14,0.37",
                    help="kill times as fractions of the control's run length (paper A: 30 s "
                         "and 80 s of about 215 s)")
    ap.add_argument("--kills", default="1,2",
                    help="schedules: how many of --kill-fractions' kills each run has "
                         "(paper A ran 1 and 2)")
    ap.add_argument("--downtime-fraction", type=float, default=0.093,
                    help="downtime as a fraction of the run length (paper A: 20 s of 215 s)")
    ap.add_argument("--kill-at", default=None,
                    help="explicit supervisor kill times (s); default: from the control runs")
    ap.add_argument("--downtime", type=float, default=None, help="explicit downtime (s)")
    ap.add_argument("--post-window", type=float, default=0.2,
                    help="post-recovery window as a fraction of the run length")
    ap.add_argument("--thresholds", default="0.75,0.8,0.85")
    ap.add_argument("--rate", type=float, default=1.0, help="cost units per node-second")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run")
    ap.add_argument("--analyze-only", action="store_true")
    args = ap.parse_args()

    prog = "bench/recovery_experiment.py"
    if not args.no_plot:
        common.require_matplotlib(prog)  # before hours of runs, not after
    out_dir = Path(args.out)
    if args.analyze_only:
        # Rewrites table.md (and accuracy.png) from the JSONL files already there: derived
        # files, so only docs/ needs --overwrite.
        common.check_out(prog, out_dir, args.overwrite, [])
        analyse(out_dir, args)
        return
    common.check_out(prog, out_dir, args.overwrite, sorted(out_dir.glob("*.jsonl")))
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = Path(args.bin).resolve()
    if not binary.exists():
        sys.exit(f"no trainer at {binary}; build the fashion_mnist target or pass --bin")
    seeds = [int(s) for s in args.seeds.split(",")]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"unknown config {c!r}")
    for old in out_dir.glob("*.jsonl"):  # only with --overwrite (check_out above)
        old.unlink()
    started = time.monotonic()

    def log(msg):
        print(f"[{time.monotonic() - started:7.1f} s] {msg}", file=sys.stderr, flush=True)

    # Seeds outer, configurations inner (the control first), so that machine noise spreads
    # over the configurations and each seed's control runs next to its kill runs. The first
    # control run gives the run length T and the data-loading offset, from which the kill
    # schedule (supervisor time) is derived, unless --kill-at is given.
    kill_at = [float(x) for x in args.kill_at.split(",")] if args.kill_at else None
    downtime = args.downtime
    schedules = [int(k) for k in args.kills.split(",")]
    for seed in seeds:
        plan = [(CONTROL, 0)] if CONTROL in configs else []
        plan += [(c, k) for k in schedules for c in configs if c != CONTROL]
        for c, k in plan:
            if CONFIGS[c][1] and kill_at is None:
                ctrl = [parse_run(p) for p in out_dir.glob(f"{slug(CONTROL)}-seed*.jsonl")]
                if not ctrl:
                    sys.exit("need a control run or --kill-at/--downtime")
                T = statistics.mean(r["duration"] for r in ctrl)
                off = statistics.mean(r["load_offset"] for r in ctrl)
                # The trainer counts --kill-at from worker 0's first clock, so no load offset.
                kill_at = [round(f * T, 1) for f in map(float, args.kill_fractions.split(","))]
                if downtime is None:
                    downtime = round(args.downtime_fraction * T, 1)
                log(f"kill schedule (supervisor time): {kill_at}, downtime {downtime} s "
                    f"(T {T:.1f} s, offset {off:.2f} s)")
            if CONFIGS[c][1] and k > len(kill_at):
                sys.exit(f"--kills {k}: only {len(kill_at)} kill times")
            p = run_one(binary, c, *CONFIGS[c], seed, args, (kill_at or [])[:k], downtime or 0,
                        out_dir, args.timeout)
            r = parse_run(p)
            log(f"{c} seed {seed}: rc {r.get('rc')}, {r['duration']:.1f} s, offset "
                f"{r['load_offset']:.2f} s, kills at {[round(k, 1) for k in r['kills']]}, restarts "
                f"{[round(k, 1) for k in r['restarts']]}, other load {r['foreign_cores']} cores")
    log("done; analysing")
    analyse(out_dir, args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Plots and tables for paper D's consistency experiment (bench/consistency_experiment.cpp).

Reads the JSON lines written by `asyncps_consistency_experiment --out FILE` (one run each) and
writes, into the output folder:

  * staleness_<profile>.png    observed-staleness histograms, SSP(s) next to ESSP(s) for each
                               s, at 1% and 10% minibatches (reads of all workers and seeds);
                               ASP and VAP in the last row;
  * staleness_cdf_<profile>.png  the same reads as cumulative distributions, one panel per
                               family (SSP, ESSP, ASP and VAP) and minibatch, side by side;
  * vap_<profile>_<b>pct.png   when the runs hold VAP bounds: per policy, value waits and the
                               blocked fraction against the bound, the distribution of the
                               per-clock update magnitude VAP counts, and the loss against
                               simulated seconds (tight bounds dark, loose light);
  * loss_<profile>_<b>pct.png  training RMSE of the servers' model against the mean worker
                               clock (top) and against simulated seconds (bottom), one column
                               per policy family (SSP, ESSP, ASP and VAP), BSP in each; mean
                               over seeds;
  * table.md                   per profile and minibatch: final train/test RMSE (mean +- std
                               over seeds), simulated seconds and mean clock to reach a target
                               RMSE, mean staleness and its distribution (share of reads at
                               0-1 clocks, at s, median, 90th percentile), messages, bytes,
                               fraction of time blocked, the clocks each worker computed
                               (fastest, slowest), and VAP's value waits.

Output goes to build/experiments/consistency unless --out says otherwise; the committed
results (docs/results/consistency) are replaced only with --overwrite.

Standard library plus matplotlib for the figures: when it is missing the script installs it
first through `bash .ci/deps python3-matplotlib` (Debian's package) and re-runs itself with
/usr/bin/python3; --no-plot writes table.md only. Not used by CI.

    python3 bench/consistency_experiment.py docs/results/consistency/runs.jsonl [--target 0.3]
    python3 bench/consistency_experiment.py docs/results/consistency/runs.jsonl \
        --out docs/results/consistency --overwrite     # regenerate the committed figures
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

import experiment_common as common

plt = None  # matplotlib.pyplot, imported by main() unless --no-plot

STALENESS = [1, 3, 7, 15]


def load(path: Path) -> list[dict]:
    """All runs of a JSONL file."""
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def group(runs: list[dict]) -> dict:
    """Runs keyed by (profile, batch_percent, label), seeds in a list."""
    out: dict = defaultdict(list)
    for r in runs:
        out[(r["profile"], r["batch_percent"], r["label"])].append(r)
    return out


def order_key(label: str) -> tuple:
    """Report order: BSP, SSP(s), ESSP(s), ASP, VAP(v), shrinking VAP last."""
    fam = label.split("(")[0]
    rank = {"BSP": 0, "SSP": 1, "ESSP": 2, "ASP": 3, "VAP": 4}.get(fam, 5)
    m = re.match(r"[A-Z]+\(([0-9.e+-]+)", label)
    arg = float(m.group(1)) if m else 0.0
    return (rank, "/" in label, arg)


def finite(xs) -> list[float]:
    """The finite values of xs (None and NaN dropped)."""
    return [x for x in xs if x is not None and math.isfinite(x)]


def mean_std(xs) -> str:
    """'m +- s' of the finite values, or 'diverged'."""
    v = finite(xs)
    if not v:
        return "diverged"
    m = statistics.fmean(v)
    s = statistics.stdev(v) if len(v) > 1 else 0.0
    note = "" if len(v) == len(xs) else f" ({len(xs) - len(v)}/{len(xs)} diverged)"
    return f"{m:.4f} ± {s:.4f}{note}"


def first_reach(run: dict, target: float, axis: str) -> float | None:
    """First value of series[axis] at which the training RMSE is <= target."""
    s = run["series"]
    for x, y in zip(s[axis], s["rmse"]):
        if y is not None and y <= target:
            return x
    return None


def histogram(runs: list[dict]) -> list[float]:
    """Fractions of reads per staleness bucket, summed over runs."""
    total = [0] * 32
    for r in runs:
        for i, c in enumerate(r["staleness"]):
            total[i] += c
    n = sum(total)
    return [c / n if n else 0.0 for c in total]


def quantile(h: list[float], q: float) -> int:
    """The smallest bucket at which the cumulative fraction of `h` reaches q."""
    acc = 0.0
    for i, f in enumerate(h):
        acc += f
        if acc >= q - 1e-12:
            return i
    return len(h) - 1


def mean_curve(runs: list[dict], axis: str, points: int = 200):
    """Mean RMSE over seeds against `axis` (clock: shared sample points; time: a common grid
    up to the shortest run). Diverged samples (null) end a seed's curve."""
    if axis == "clock":
        n = min(len(r["series"]["clock"]) for r in runs)
        xs = runs[0]["series"]["clock"][:n]
        ys = []
        for i in range(len(xs)):
            vals = [r["series"]["rmse"][i] for r in runs if i < len(r["series"]["rmse"])]
            vals = finite(vals)
            ys.append(statistics.fmean(vals) if len(vals) == len(runs) else float("nan"))
        return xs, ys
    end = min(r["series"]["time"][-1] for r in runs)
    grid = [end * k / (points - 1) for k in range(points)]
    ys = []
    for g in grid:
        vals = []
        for r in runs:
            t, y = r["series"]["time"], r["series"]["rmse"]
            # step interpolation: the last sample at or before g
            j = max(i for i in range(len(t)) if t[i] <= g)
            vals.append(y[j] if y[j] is not None else float("nan"))
        ys.append(statistics.fmean(vals))
    return grid, ys


def plot_staleness(groups: dict, profile: str, batches: list[int], out: Path) -> None:
    """staleness_<profile>.png: SSP vs ESSP per s and batch, plus ASP/VAP."""
    rows = len(STALENESS) + 1
    fig, axes = plt.subplots(rows, len(batches), figsize=(6 * len(batches), 2.3 * rows),
                             squeeze=False)
    for c, b in enumerate(batches):
        for r, s in enumerate(STALENESS):
            ax = axes[r][c]
            for k, (label, color) in enumerate([(f"SSP({s})", "tab:blue"),
                                                (f"ESSP({s})", "tab:orange")]):
                runs = groups.get((profile, b, label))
                if not runs:
                    continue
                h = histogram(runs)[: max(s + 3, 6)]
                xs = [i + (k - 0.5) * 0.4 for i in range(len(h))]
                mean = statistics.fmean(r_["staleness_mean"] for r_ in runs)
                ax.bar(xs, h, width=0.4, color=color, label=f"{label} (mean {mean:.2f})")
            ax.set_title(f"{profile}, {b}% minibatch, s={s}", fontsize=9)
            ax.set_ylabel("fraction of reads")
            ax.legend(fontsize=8)
        ax = axes[rows - 1][c]
        others = sorted({k[2] for k in groups if k[0] == profile and k[1] == b
                         and k[2].split("(")[0] in ("ASP", "VAP")}, key=order_key)
        width = 0.8 / max(1, len(others))
        for k, label in enumerate(others):
            runs = groups[(profile, b, label)]
            h = histogram(runs)
            xs = [i + (k - (len(others) - 1) / 2) * width for i in range(len(h))]
            mean = statistics.fmean(r_["staleness_mean"] for r_ in runs)
            ax.bar(xs, h, width=width, label=f"{label} (mean {mean:.2f})")
        ax.set_title(f"{profile}, {b}% minibatch, unbounded (bucket 31 = 31 or more)",
                     fontsize=9)
        ax.set_xlabel("observed staleness (clocks)")
        ax.set_ylabel("fraction of reads")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"staleness_{profile}.png", dpi=90)
    plt.close(fig)


def plot_staleness_cdf(groups: dict, profile: str, batches: list[int], out: Path) -> None:
    """staleness_cdf_<profile>.png: cumulative staleness per family, side by side."""
    fams = ["SSP", "ESSP", "ASP, VAP"]
    fig, axes = plt.subplots(len(batches), len(fams), figsize=(5 * len(fams), 3.4 * len(batches)),
                             squeeze=False, sharey=True)
    for r, b in enumerate(batches):
        labels = sorted({k[2] for k in groups if k[0] == profile and k[1] == b}, key=order_key)
        for c, fam in enumerate(fams):
            ax = axes[r][c]
            pick = [l for l in labels if l.split("(")[0] in fam.split(", ")]
            for label in ["BSP"] + pick:
                runs = groups.get((profile, b, label))
                if not runs:
                    continue
                h = histogram(runs)
                cdf, acc = [], 0.0
                for f in h:
                    acc += f
                    cdf.append(acc)
                style = {"color": "black", "linestyle": "--"} if label == "BSP" else {}
                ax.step(range(32), cdf, where="post", linewidth=1.2,
                        label=f"{label} (mean {statistics.fmean(x['staleness_mean'] for x in runs):.2f})",
                        **style)
            ax.set_xlim(-0.5, 31.5)
            ax.set_title(f"{fam}: {profile}, {b}% minibatch", fontsize=9)
            ax.set_xlabel("observed staleness (clocks; 31 = 31 or more)")
            if c == 0:
                ax.set_ylabel("fraction of reads <= x")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / f"staleness_cdf_{profile}.png", dpi=90)
    plt.close(fig)


def vap_bound(label: str) -> float | None:
    """v of 'VAP(v)' (None for other labels and the shrinking bound)."""
    m = re.match(r"VAP\(([0-9.e+-]+)\)$", label)
    return float(m.group(1)) if m else None


def plot_vap(groups: dict, profile: str, b: int, out: Path) -> None:
    """vap_<profile>_<b>pct.png: what the VAP bound does, tight to loose."""
    labels = sorted({k[2] for k in groups if k[0] == profile and k[1] == b}, key=order_key)
    vaps = [l for l in labels if l.startswith("VAP")]
    if not vaps:
        return
    fixed = [l for l in vaps if vap_bound(l) is not None]
    others = [l for l in labels if not l.startswith("VAP")]
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    # (0,0): value waits per clock and blocked fraction against the bound
    ax = axes[0][0]
    xs = [vap_bound(l) for l in fixed]
    waits = [statistics.fmean(r["value_waits"] / max(1, r["total_clocks"]) for r in groups[(profile, b, l)])
             for l in fixed]
    blocked = [statistics.fmean(r["wait_fraction"] for r in groups[(profile, b, l)]) for l in fixed]
    ax.plot(xs, waits, "o-", label="clocks that waited for visibility (fraction)")
    ax.plot(xs, blocked, "s-", label="blocked fraction of run time")
    for l, ls in (("BSP", "--"), ("ASP", ":")):
        if (profile, b, l) in groups:
            ax.axhline(statistics.fmean(r["wait_fraction"] for r in groups[(profile, b, l)]),
                       color="gray", linestyle=ls, label=f"{l}: blocked fraction")
    ax.set_xscale("log")
    ax.set_xlabel("VAP bound v (parameter units)")
    ax.set_title(f"VAP waits: {profile}, {b}% minibatch", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    # (0,1): per-clock update magnitude distribution (VAP's measure), with the bounds marked
    ax = axes[0][1]
    for l in vaps + [x for x in others if x in ("BSP", "ASP")]:
        runs = groups[(profile, b, l)]
        hh = runs[0]["vap_magnitude_hist"]
        counts = [sum(r["vap_magnitude_hist"]["counts"][i] for r in runs) for i in range(len(hh["counts"]))]
        n = sum(counts)
        edges = [hh["lo"] * 10 ** (i / hh["per_decade"]) for i in range(len(counts) + 1)]
        acc, cdf = 0, []
        for c in counts:
            acc += c
            cdf.append(acc / n if n else 0)
        style = {"color": "black", "linestyle": "--"} if l == "BSP" else {}
        ax.step(edges[1:], cdf, where="post", label=l, linewidth=1.0, **style)
    for v in xs:
        ax.axvline(v, color="gray", alpha=0.3)
    ax.set_xscale("log")
    ax.set_xlabel("per-clock update magnitude (sum over servers of lr * |slice|_2)")
    ax.set_ylabel("fraction of clocks <= x")
    ax.set_title("update magnitudes (gray: the bounds)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    # (0,2): staleness cdf per bound, BSP and ASP
    ax = axes[0][2]
    for l in ["BSP"] + [x for x in others if x != "BSP"] + vaps:
        runs = groups.get((profile, b, l))
        if not runs:
            continue
        h = histogram(runs)
        acc, cdf = 0.0, []
        for f in h:
            acc += f
            cdf.append(acc)
        style = {"color": "black", "linestyle": "--"} if l == "BSP" else {}
        ax.step(range(32), cdf, where="post", linewidth=1.0,
                label=f"{l} (mean {statistics.fmean(x['staleness_mean'] for x in runs):.2f})", **style)
    ax.set_xlabel("observed staleness (clocks; 31 = 31 or more)")
    ax.set_ylabel("fraction of reads <= x")
    ax.set_title("staleness", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    # (1,*): loss against time and clock; final RMSE against the bound
    for c, axis in enumerate(["time", "clock"]):
        ax = axes[1][c]
        for l in others + vaps:
            runs = groups[(profile, b, l)]
            cx, cy = mean_curve(runs, axis)
            style = {"color": "black", "linestyle": "--"} if l == "BSP" else (
                {"color": "gray", "linestyle": ":"} if l == "ASP" else {})
            ax.plot(cx, cy, label=l, linewidth=1.1, **style)
        ax.set_yscale("log")
        ax.set_xlabel("simulated seconds" if axis == "time" else "mean worker clock")
        ax.set_ylabel("training RMSE (servers' model)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    ax = axes[1][2]
    fin = [statistics.fmean(finite(r["final_train_rmse"] for r in groups[(profile, b, l)]) or [float("nan")])
           for l in fixed]
    sim = [statistics.fmean(r["sim_seconds"] for r in groups[(profile, b, l)]) for l in fixed]
    ax.plot(xs, fin, "o-", label="final train RMSE")
    for l, ls in (("BSP", "--"), ("ASP", ":")):
        if (profile, b, l) in groups:
            ax.axhline(statistics.fmean(finite(r["final_train_rmse"] for r in groups[(profile, b, l)])),
                       color="gray", linestyle=ls, label=f"{l}")
    ax.set_xscale("log")
    ax.set_xlabel("VAP bound v")
    ax.set_ylabel("final train RMSE")
    ax2 = ax.twinx()
    ax2.plot(xs, sim, "s-", color="tab:red", label="run length (sim s)")
    ax2.set_ylabel("run length (simulated s)", color="tab:red")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"vap_{profile}_{b}pct.png", dpi=90)
    plt.close(fig)


def plot_loss(groups: dict, profile: str, b: int, out: Path) -> None:
    """loss_<profile>_<b>pct.png: RMSE vs clock and vs simulated seconds per family."""
    labels = sorted({k[2] for k in groups if k[0] == profile and k[1] == b}, key=order_key)
    families = [("SSP", lambda l: l.startswith("SSP")),
                ("ESSP", lambda l: l.startswith("ESSP")),
                ("ASP, VAP", lambda l: l.startswith("ASP") or l.startswith("VAP"))]
    fig, axes = plt.subplots(2, len(families), figsize=(5.5 * len(families), 7.5),
                             squeeze=False, sharey=True)
    for c, (name, pick) in enumerate(families):
        chosen = ["BSP"] + [l for l in labels if pick(l)]
        for r, axis in enumerate(["clock", "time"]):
            ax = axes[r][c]
            for label in chosen:
                runs = groups.get((profile, b, label))
                if not runs:
                    continue
                xs, ys = mean_curve(runs, axis)
                style = {"color": "black", "linestyle": "--"} if label == "BSP" else {}
                ax.plot(xs, ys, label=label, linewidth=1.2, **style)
            ax.set_yscale("log")
            ax.set_xlabel("mean worker clock" if axis == "clock" else "simulated seconds")
            if c == 0:
                ax.set_ylabel("training RMSE (servers' model)")
            ax.set_title(f"{name}: {profile}, {b}% minibatch", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"loss_{profile}_{b}pct.png", dpi=90)
    plt.close(fig)


def table(groups: dict, profiles: list[str], batches: list[int], target: float) -> str:
    """The markdown table."""
    lines = [
        "<!-- generated by bench/consistency_experiment.py; do not edit -->",
        f"Target training RMSE for 'time to target': {target}. Mean over seeds "
        "(± sample std). 'n/r': not reached by every seed (k/n = seeds that reached it). "
        "Messages and bytes: every message delivered by the simulated network (both "
        "directions, 64-byte headers included). Blocked: time workers spent waiting for rows "
        "(and, for VAP, for their updates to become visible) over the sum of their run times.",
        "",
    ]
    for p in profiles:
        for b in batches:
            labels = sorted({k[2] for k in groups if k[0] == p and k[1] == b}, key=order_key)
            if not labels:
                continue
            n = len(groups[(p, b, labels[0])])
            lines += [f"### {p} profile, {b}% minibatch ({n} seed{'s' if n > 1 else ''})", "",
                      "| policy | final train RMSE | final test RMSE | sim s to target "
                      "| mean clock to target | sim s (run) | mean staleness "
                      "| reads at 0-1 / at s | median / p90 | messages | GB | blocked "
                      "| worker clocks min-max | value waits |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for label in labels:
                runs = groups[(p, b, label)]
                def reach(axis):
                    v = [first_reach(r, target, axis) for r in runs]
                    ok = [x for x in v if x is not None]
                    if len(ok) == len(v):
                        return f"{statistics.fmean(ok):.2f}"
                    return f"n/r ({len(ok)}/{len(v)})"
                sim = statistics.fmean(r["sim_seconds"] for r in runs)
                stale = statistics.fmean(r["staleness_mean"] for r in runs)
                msgs = statistics.fmean(r["messages"] for r in runs)
                gb = statistics.fmean(r["bytes"] for r in runs) / 1e9
                blocked = statistics.fmean(r["wait_fraction"] for r in runs)
                h = histogram(runs)
                s_ = runs[0]["s"]
                at_s = f"{h[min(s_, 31)]:.1%}" if s_ > 0 else "-"
                wc = [c for r in runs for c in r.get("worker_clocks", [])]
                wcs = f"{min(wc)}-{max(wc)}" if wc else "-"
                vw = (f"{statistics.fmean(r['value_waits'] for r in runs):,.0f}"
                      if runs[0]["family"] == "vap" else "-")
                lines.append(
                    f"| {label} | {mean_std([r['final_train_rmse'] for r in runs])} "
                    f"| {mean_std([r['final_test_rmse'] for r in runs])} | {reach('time')} "
                    f"| {reach('clock')} | {sim:.2f} | {stale:.2f} "
                    f"| {h[0] + h[1]:.1%} / {at_s} | {quantile(h, 0.5)} / {quantile(h, 0.9)} "
                    f"| {msgs:,.0f} | {gb:.2f} | {blocked:.1%} | {wcs} | {vw} |")
            lines.append("")
            vaps = [l for l in labels if l.startswith("VAP")]
            if not vaps:
                continue
            lines += [f"VAP's bound, {p} profile, {b}% minibatch: clocks whose push waited for "
                      "earlier updates to become visible (share of all clocks), seconds waited "
                      "per worker, and the per-clock update magnitude VAP counts (sum over "
                      "servers of lr * |slice|_2; 10th, 50th, 90th percentile, from a "
                      "histogram with 10 bins per decade: bin lower edges). BSP and ASP for "
                      "comparison.", "",
                      "| policy | value waits | s waited per worker | magnitude p10 / p50 / p90 "
                      "| mean staleness | final train RMSE | sim s (run) | messages |",
                      "|---|---|---|---|---|---|---|---|"]
            for label in [l for l in labels if l in ("BSP", "ASP")] + vaps:
                runs = groups[(p, b, label)]
                waits = statistics.fmean(r["value_waits"] / r["total_clocks"] for r in runs)
                secs = statistics.fmean(r["value_wait_seconds"] / r["workers"] for r in runs)
                hh = runs[0]["vap_magnitude_hist"]
                counts = [sum(r["vap_magnitude_hist"]["counts"][i] for r in runs)
                          for i in range(len(hh["counts"]))]
                n = sum(counts)
                frac = [c / n for c in counts] if n else counts
                edge = lambda i: hh["lo"] * 10 ** (i / hh["per_decade"])
                mags = " / ".join(f"{edge(quantile(frac, q)):.2f}" for q in (0.1, 0.5, 0.9))
                lines.append(
                    f"| {label} | {waits:.1%} | {secs:.3f} | {mags} "
                    f"| {statistics.fmean(r['staleness_mean'] for r in runs):.2f} "
                    f"| {mean_std([r['final_train_rmse'] for r in runs])} "
                    f"| {statistics.fmean(r['sim_seconds'] for r in runs):.3f} "
                    f"| {statistics.fmean(r['messages'] for r in runs):,.0f} |")
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Reads the runs, writes the figures and table.md."""
    global plt
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=common.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", type=Path)
    ap.add_argument("--out", type=Path, default=common.default_out("consistency"),
                    help=common.out_help("consistency"))
    ap.add_argument("--overwrite", action="store_true", help=common.overwrite_help())
    ap.add_argument("--no-plot", action="store_true", help="write table.md only (no matplotlib)")
    ap.add_argument("--target", type=float, default=0.3)
    args = ap.parse_args()
    prog = "bench/consistency_experiment.py"
    if not args.no_plot:
        plt = common.require_matplotlib(prog)
    common.check_out(prog, args.out, args.overwrite, [])  # figures are derived: no raw data lost
    runs = load(args.jsonl)
    groups = group(runs)
    profiles = list(dict.fromkeys(r["profile"] for r in runs))
    batches = sorted({r["batch_percent"] for r in runs})
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        for p in profiles:
            plot_staleness(groups, p, batches, args.out)
            plot_staleness_cdf(groups, p, batches, args.out)
            for b in batches:
                plot_loss(groups, p, b, args.out)
                plot_vap(groups, p, b, args.out)
    md = table(groups, profiles, batches, args.target)
    (args.out / "table.md").write_text(md + "\n")
    print(md)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

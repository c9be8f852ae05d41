#!/usr/bin/env python3
"""Plots and tables for paper D's consistency experiment (bench/consistency_experiment.cpp).

Reads the JSON lines written by `asyncps_consistency_experiment --out FILE` (one run each) and
writes, into the output folder:

  * staleness_<profile>.png    observed-staleness histograms, SSP(s) next to ESSP(s) for each
                               s, at 1% and 10% minibatches (reads of all workers and seeds);
                               ASP and VAP in the last row;
  * loss_<profile>_<b>pct.png  training RMSE of the servers' model against the mean worker
                               clock (top) and against simulated seconds (bottom), one column
                               per policy family (SSP, ESSP, ASP and VAP), BSP in each; mean
                               over seeds;
  * table.md                   per profile and minibatch: final train/test RMSE (mean +- std
                               over seeds), simulated seconds and mean clock to reach a target
                               RMSE, mean staleness, messages, bytes, fraction of time blocked.

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


def mean_curve(runs: list[dict], axis: str, points: int = 200):
    """Mean RMSE over seeds against `axis` (clock: shared sample points; time: a common grid
    up to the shortest run). Diverged samples (null) end a seed's curve."""
    if axis == "clock":
        xs = runs[0]["series"]["clock"]
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
                      "| mean clock to target | sim s (run) | mean staleness | messages "
                      "| GB | blocked |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
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
                lines.append(
                    f"| {label} | {mean_std([r['final_train_rmse'] for r in runs])} "
                    f"| {mean_std([r['final_test_rmse'] for r in runs])} | {reach('time')} "
                    f"| {reach('clock')} | {sim:.2f} | {stale:.2f} | {msgs:,.0f} | {gb:.2f} "
                    f"| {blocked:.1%} |")
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
            for b in batches:
                plot_loss(groups, p, b, args.out)
    md = table(groups, profiles, batches, args.target)
    (args.out / "table.md").write_text(md + "\n")
    print(md)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

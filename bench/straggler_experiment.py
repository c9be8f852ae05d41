#!/usr/bin/env python3
"""Plots and tables for asyncps_straggler_experiment (paper C; docs/results/stragglers.md).

    straggler_experiment.py RUNS.jsonl [--out DIR] [--overwrite] [--no-plot]

DIR defaults to build/experiments/stragglers; the committed results (docs/results/stragglers)
are replaced only with --overwrite. The figures need matplotlib: when it is missing the script
installs it first through `bash .ci/deps python3-matplotlib` (Debian's package) and re-runs
itself with /usr/bin/python3; --no-plot writes table.md only.

Writes into DIR:
  curves_{mlp,mf}.png   metric vs simulated seconds, one panel per configuration, with and
                        without the straggler (seed 1; the other seeds as thin lines)
  time_{mlp,mf}.png     simulated seconds to finish the budget, per configuration (mean, min-max)
  regroup_{mlp,mf}.png  the regrouping demo: metric vs simulated seconds per variant
  table.md              the tables quoted in docs/results/stragglers.md
"""
import argparse
import json
import os
import statistics
from collections import defaultdict

from pathlib import Path

import experiment_common as common

plt = None  # matplotlib.pyplot, imported by main() unless --no-plot

CONFIGS = ["BSP", "ASP", "2 groups", "4 groups"]
VARIANTS = ["static", "rebalance", "regroup"]
METRIC_LABEL = {"mlp": "test accuracy", "mf": "test RMSE"}


def load(path):
    """Returns the JSON objects of the file, one per line."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def mean_sd(xs):
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs, digits):
    """'mean ± sd' of xs with `digits` decimals (just the mean for one value)."""
    m, s = mean_sd(xs)
    return f"{m:.{digits}f}" if len(xs) == 1 else f"{m:.{digits}f} ± {s:.{digits}f}"


def staleness_text(counts):
    """A histogram's non-zero buckets as 'k:n' pairs."""
    return " ".join(f"{i}{'+' if i == len(counts) - 1 else ''}:{c}"
                    for i, c in enumerate(counts) if c)


def plot_curves(runs, model, out):
    """Metric vs simulated seconds per configuration, even vs straggler."""
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8), sharey=True)
    for ax, cfg in zip(axes, CONFIGS):
        for straggler, color in ((False, "tab:blue"), (True, "tab:red")):
            sel = sorted((r for r in runs if r["config"] == cfg and r["straggler"] == straggler),
                         key=lambda r: r["seed"])
            for i, r in enumerate(sel):
                s = r["series"]
                ax.plot(s["time"], s["metric"], color=color, lw=1.6 if i == 0 else 0.6,
                        alpha=1.0 if i == 0 else 0.5,
                        label=("straggler (1 worker 4x)" if straggler else "no straggler")
                        if i == 0 else None)
        ax.set_title(cfg)
        ax.set_xlabel("simulated seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(METRIC_LABEL[model])
    if model == "mlp":
        axes[0].set_ylim(0.5, 0.9)
    else:
        axes[0].set_ylim(0.35, 1.05)
    axes[0].legend(loc="lower right" if model == "mlp" else "upper right", fontsize=8)
    fig.suptitle(f"{model.upper()}: {METRIC_LABEL[model]} of the central/server model vs time "
                 "(same gradient budget)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"curves_{model}.png"), dpi=110)
    plt.close(fig)


def plot_times(runs, model, out):
    """Bar chart: simulated seconds to finish the budget."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.38
    for k, (straggler, color) in enumerate(((False, "tab:blue"), (True, "tab:red"))):
        means, lo, hi = [], [], []
        for cfg in CONFIGS:
            t = [r["sim_seconds"] for r in runs if r["config"] == cfg and r["straggler"] == straggler]
            m = statistics.mean(t)
            means.append(m)
            lo.append(m - min(t))
            hi.append(max(t) - m)
        xs = [i + (k - 0.5) * width for i in range(len(CONFIGS))]
        ax.bar(xs, means, width, color=color, yerr=[lo, hi], capsize=3,
               label="straggler (1 worker 4x)" if straggler else "no straggler")
        for x, m in zip(xs, means):
            ax.text(x, m, f"{m:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(CONFIGS)))
    ax.set_xticklabels(CONFIGS)
    ax.set_ylabel("simulated seconds to finish")
    ax.set_title(f"{model.upper()}: time to compute the same number of gradients")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"time_{model}.png"), dpi=110)
    plt.close(fig)


def plot_regroup(runs, model, out):
    """Regrouping demo: metric vs time per variant and group count (seed 1)."""
    groups = sorted({r["groups"] for r in runs})
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 3.8), squeeze=False)
    seed = min(r["seed"] for r in runs)
    for ax, g in zip(axes[0], groups):
        for variant, color in zip(VARIANTS, ("tab:red", "tab:orange", "tab:green")):
            for r in runs:
                if r["groups"] == g and r["config"] == variant and r["seed"] == seed:
                    s = r["series"]
                    ax.plot(s["time"], s["metric"], color=color,
                            label=f"{variant} ({r['sim_seconds']:.1f} s)")
                    t_change = r["phases"][0]["seconds"]
                    ax.axvline(t_change, color="grey", ls=":", lw=1)
        ax.set_title(f"{g} groups: worker 2 becomes 4x slow at 50% of the budget")
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel(METRIC_LABEL[model])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if model == "mlp":
            ax.set_ylim(0.5, 0.9)
        else:
            ax.set_ylim(0.35, 1.05)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"regroup_{model}.png"), dpi=110)
    plt.close(fig)


def sweep_table(runs, model):
    """Markdown table of the sweep for one model."""
    seeds = sorted({r["seed"] for r in runs})
    digits = 4
    scale = 100.0 if model == "mlp" else 1.0
    unit = "accuracy (%)" if model == "mlp" else "test RMSE"
    diff = "Δ acc vs BSP no-straggler (points)" if model == "mlp" else "Δ RMSE vs BSP no-straggler"
    base = {r["seed"]: r["final_metric"] for r in runs
            if r["config"] == "BSP" and not r["straggler"]}
    even_time = {(r["config"], r["seed"]): r["sim_seconds"] for r in runs if not r["straggler"]}
    lines = [f"### {model.upper()} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}: "
             f"{', '.join(map(str, seeds))}; mean ± sd)", "",
             f"| config | straggler | simulated s | slowdown vs same config, no straggler | "
             f"final {unit} | {diff} | push staleness (groups, all seeds) |",
             "|---|---|---|---|---|---|---|"]
    for cfg in CONFIGS:
        for straggler in (False, True):
            sel = [r for r in runs if r["config"] == cfg and r["straggler"] == straggler]
            if not sel:
                continue
            t = [r["sim_seconds"] for r in sel]
            slow = [r["sim_seconds"] / even_time[(cfg, r["seed"])] for r in sel]
            m = [r["final_metric"] * scale for r in sel]
            d = [(r["final_metric"] - base[r["seed"]]) * scale for r in sel]
            hist = [0] * len(sel[0]["push_staleness"])
            for r in sel:
                hist = [a + b for a, b in zip(hist, r["push_staleness"])]
            st = staleness_text(hist) if any(hist) else "–"
            if any(hist):
                n = sum(hist)
                st += f" (mean {sum(i * c for i, c in enumerate(hist)) / n:.2f})"
            lines.append(f"| {cfg} | {'yes' if straggler else 'no'} | {fmt(t, 2)} | "
                         f"{fmt(slow, 2)}x | {fmt(m, 2 if model == 'mlp' else digits)} | "
                         f"{fmt(d, 2 if model == 'mlp' else digits)} | {st} |")
    return "\n".join(lines)


def regroup_table(runs, model):
    """Markdown table of the regrouping demo for one model."""
    scale = 100.0 if model == "mlp" else 1.0
    unit = "accuracy (%)" if model == "mlp" else "test RMSE"
    seeds = sorted({r["seed"] for r in runs})
    lines = [f"### {model.upper()} regrouping ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})",
             "",
             "| groups | variant | phase 1 s | phase 2 s | phase 3 s | total simulated s | "
             f"final {unit} | phase-3 plan (group of each worker, seed {seeds[0]}) |",
             "|---|---|---|---|---|---|---|---|"]
    for g in sorted({r["groups"] for r in runs}):
        for v in VARIANTS:
            sel = [r for r in runs if r["groups"] == g and r["config"] == v]
            if not sel:
                continue
            ph = [[r["phases"][i]["seconds"] for r in sel] for i in range(3)]
            first = min(sel, key=lambda r: r["seed"])
            plan = "".join(map(str, first["phases"][2]["group_of"]))
            lines.append(f"| {g} | {v} | {fmt(ph[0], 2)} | {fmt(ph[1], 2)} | {fmt(ph[2], 2)} | "
                         f"{fmt([r['sim_seconds'] for r in sel], 2)} | "
                         f"{fmt([r['final_metric'] * scale for r in sel], 2 if model == 'mlp' else 4)}"
                         f" | {plan} |")
    return "\n".join(lines)


def main():
    """Reads the runs, writes the figures and table.md."""
    global plt
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=common.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs")
    ap.add_argument("--out", default=str(common.default_out("stragglers")),
                    help=common.out_help("stragglers"))
    ap.add_argument("--overwrite", action="store_true", help=common.overwrite_help())
    ap.add_argument("--no-plot", action="store_true", help="write table.md only (no matplotlib)")
    args = ap.parse_args()
    prog = "bench/straggler_experiment.py"
    if not args.no_plot:
        plt = common.require_matplotlib(prog)
    out = Path(args.out)
    common.check_out(prog, out, args.overwrite, [])  # figures are derived: no raw data lost
    os.makedirs(args.out, exist_ok=True)
    runs = load(args.runs)
    bad = [r for r in runs if r["errors"]]
    by_model = defaultdict(list)
    for r in runs:
        by_model[r["model"]].append(r)
    parts = ["<!-- generated by bench/straggler_experiment.py; do not edit -->", ""]
    if bad:
        parts += [f"**{len(bad)} run(s) reported errors.**", ""]
    for model in ("mlp", "mf"):
        rs = by_model.get(model, [])
        sweep = [r for r in rs if r["kind"] == "sweep"]
        regroup = [r for r in rs if r["kind"] == "regroup"]
        if sweep:
            if not args.no_plot:
                plot_curves(sweep, model, args.out)
                plot_times(sweep, model, args.out)
            parts += [sweep_table(sweep, model), ""]
        if regroup:
            if not args.no_plot:
                plot_regroup(regroup, model, args.out)
            parts += [regroup_table(regroup, model), ""]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(parts))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

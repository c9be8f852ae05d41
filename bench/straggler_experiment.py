#!/usr/bin/env python3
"""Tables and plots for asyncps_straggler_experiment (paper C; docs/results/stragglers.md).

    straggler_experiment.py RUNS.jsonl [RUNS2.jsonl ...] [--out DIR] [--overwrite] [--no-plot]
        [--target-mlp X] [--target2-mlp X] [--target-mf X] [--target2-mf X]

DIR defaults to build/experiments/stragglers; the committed results (docs/results/stragglers)
are replaced only with --overwrite. The figures need matplotlib: when it is missing the script
installs it first through `bash .ci/deps python3-matplotlib` (Debian's package) and re-runs
itself with /usr/bin/python3; --no-plot writes table.md only.

Time to target: the simulated time at which the run's sampled curve (MLP: accuracy on the first
2,000 test images; MF: test RMSE) first reaches the target, interpolated linearly between the
two samples around the crossing. Every ratio is against the no-delay BSP run of the same seed
(delay factor 1), as is every accuracy difference.

Writes into DIR:
  ttt_{mlp,mf}.png      time to target / no-delay BSP time vs delay factor, per configuration
  final_{mlp,mf}.png    final metric (whole test set) vs delay factor, per configuration
  curves_{mlp,mf}.png   metric vs simulated seconds at delay 1 and 9 (seed 1, others thin)
  regroup_{mlp,mf}.png  the regrouping demo: metric vs simulated seconds per variant
  table.md              the tables quoted in docs/results/stragglers.md
"""
import argparse
import json
import math
import os
import statistics
from collections import defaultdict
from pathlib import Path

import experiment_common as common

plt = None  # matplotlib.pyplot, imported by main() unless --no-plot

CONFIGS = ["BSP", "ASP", "2 groups", "4 groups", "2 groups isolating", "4 groups isolating"]
COLORS = {"BSP": "black", "ASP": "tab:red", "2 groups": "tab:blue", "4 groups": "tab:green",
          "2 groups isolating": "tab:purple", "4 groups isolating": "tab:orange"}
STYLES = {"2 groups isolating": "--", "4 groups isolating": "--"}
METRIC_LABEL = {"mlp": "test accuracy", "mf": "test RMSE"}
# Targets on the sampled curve (MLP: accuracy on 2,000 test images; MF: test RMSE), chosen from
# the no-delay BSP runs (docs/results/stragglers.md, "Targets").
TARGETS = {"mlp": (0.85, 0.80), "mf": (0.36, 0.40)}
CLAIM_TIME = 1.20     # paper C: within 20% of the no-delay time ...
CLAIM_POINTS = 2.5    # ... with at most 2.5 (percentage points of accuracy; MF: % of RMSE)


def load(paths):
    """Returns the JSON objects of the files, one per line."""
    runs = []
    for p in paths:
        with open(p) as f:
            runs += [json.loads(line) for line in f if line.strip()]
    return runs


def mean_sd(xs):
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs, digits, suffix=""):
    """'mean ± sd' of xs with `digits` decimals (just the mean for one value, '–' for none)."""
    if not xs:
        return "–"
    m, s = mean_sd(xs)
    return (f"{m:.{digits}f}{suffix}" if len(xs) == 1
            else f"{m:.{digits}f} ± {s:.{digits}f}{suffix}")


def better(model, a, b):
    """Whether metric value a is at least as good as b (accuracy up, RMSE down)."""
    return a >= b if model == "mlp" else a <= b


def time_to(run, target):
    """Simulated seconds at which the sampled curve first reaches `target` (interpolated), or
    None when it never does."""
    s = run["series"]
    t, m = s["time"], s["metric"]
    for i, (ti, mi) in enumerate(zip(t, m)):
        if mi is not None and better(run["model"], mi, target):
            if i == 0 or m[i - 1] is None or m[i] == m[i - 1]:
                return ti
            f = (target - m[i - 1]) / (m[i] - m[i - 1])
            return t[i - 1] + f * (ti - t[i - 1])
    return None


def loss_vs(model, x, base):
    """Quality lost against `base`: accuracy points (MLP) or % RMSE increase (MF)."""
    return (base - x) * 100.0 if model == "mlp" else (x / base - 1.0) * 100.0


def staleness_mean(runs):
    """Mean central push staleness over `runs` (None when there were no pushes)."""
    hist = None
    for r in runs:
        h = r["push_staleness"]
        hist = h if hist is None else [a + b for a, b in zip(hist, h)]
    if not hist or not sum(hist):
        return None
    return sum(i * c for i, c in enumerate(hist)) / sum(hist)


class Sweep:
    """The sweep runs of one model, indexed by (config, delay, seed)."""

    def __init__(self, runs, model, target):
        self.model = model
        self.target = target
        self.runs = {(r["config"], r["delay"], r["seed"]): r for r in runs}
        self.configs = [c for c in CONFIGS if any(k[0] == c for k in self.runs)]
        self.delays = sorted({k[1] for k in self.runs})
        self.seeds = sorted({k[2] for k in self.runs})
        self.base = {s: self.runs[("BSP", 1.0, s)] for s in self.seeds
                     if ("BSP", 1.0, s) in self.runs}

    def cell(self, cfg, delay, target=None):
        """Per-seed numbers of one (config, delay): dict of lists."""
        target = self.target if target is None else target
        out = defaultdict(list)
        for s in self.seeds:
            r = self.runs.get((cfg, delay, s))
            b = self.base.get(s)
            if r is None or b is None:
                continue
            out["runs"].append(r)
            t, t0 = time_to(r, target), time_to(b, target)
            out["reached"].append(t is not None)
            if t is not None and t0 is not None:
                out["ttt"].append(t)
                out["ttt_ratio"].append(t / t0)
            out["total"].append(r["sim_seconds"])
            out["total_ratio"].append(r["sim_seconds"] / b["sim_seconds"])
            out["final"].append(r["final_metric"])
            out["loss"].append(loss_vs(self.model, r["final_metric"], b["final_metric"]))
            out["straggler_share"].append(straggler_share(r))
        return out

    def meets(self, c):
        """Whether the mean time ratio and the mean quality loss of a cell meet the claim
        (and every seed reached the target)."""
        if not c["ttt_ratio"] or not all(c["reached"]):
            return False
        return (statistics.mean(c["ttt_ratio"]) <= CLAIM_TIME
                and statistics.mean(c["loss"]) <= CLAIM_POINTS)


def straggler_share(run):
    """Fraction of all gradients that the straggler computed (over all phases)."""
    w = run["straggler"]
    total = sum(sum(p["clocks"]) for p in run["phases"])
    return sum(p["clocks"][w] for p in run["phases"]) / total if total else float("nan")


def delay_label(d):
    """'x4 (+300%)'."""
    return f"x{d:g} (+{(d - 1) * 100:.0f}%)"


def sweep_table(sw):
    """Markdown table: one row per (config, delay)."""
    m = sw.model
    scale, digits = (100.0, 2) if m == "mlp" else (1.0, 4)
    unit = "accuracy (%)" if m == "mlp" else "test RMSE"
    lost = "points lost" if m == "mlp" else "RMSE increase (%)"
    tgt = f"{sw.target * 100:.0f}% (2,000 test images)" if m == "mlp" else f"RMSE {sw.target}"
    lines = [f"### {m.upper()}: delay sweep ({len(sw.seeds)} seeds: "
             f"{', '.join(map(str, sw.seeds))}; mean ± sd; target {tgt})", "",
             "| config | straggler | time to target (s) | vs no-delay BSP | reached | "
             f"time to N (s) | vs no-delay BSP | final {unit} | {lost} vs no-delay BSP | "
             "straggler's share of N | push staleness | claim |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cfg in sw.configs:
        for d in sw.delays:
            c = sw.cell(cfg, d)
            if not c["runs"]:
                continue
            st = staleness_mean(c["runs"])
            lines.append(
                f"| {cfg} | {delay_label(d)} | {fmt(c['ttt'], 2)} | {fmt(c['ttt_ratio'], 2, 'x')} "
                f"| {sum(c['reached'])}/{len(c['reached'])} | {fmt(c['total'], 2)} | "
                f"{fmt(c['total_ratio'], 2, 'x')} | "
                f"{fmt([x * scale for x in c['final']], digits)} | {fmt(c['loss'], 2)} | "
                f"{fmt([x * 100 for x in c['straggler_share']], 1, '%')} | "
                f"{'–' if st is None else f'{st:.2f}'} | {'✓' if sw.meets(c) else ''} |")
    return "\n".join(lines)


def compact_table(sw, target, label):
    """Markdown table: time ratio to `target` and quality lost, configs x delays."""
    m = sw.model
    lines = [f"### {m.upper()}: {label} (time to target vs no-delay BSP / "
             f"{'points lost' if m == 'mlp' else 'RMSE increase %'}; mean over seeds)", "",
             "| config | " + " | ".join(delay_label(d) for d in sw.delays) + " |",
             "|---|" + "---|" * len(sw.delays)]
    for cfg in sw.configs:
        cells = []
        for d in sw.delays:
            c = sw.cell(cfg, d, target)
            if not c["runs"]:
                cells.append("–")
                continue
            ratio = (f"{statistics.mean(c['ttt_ratio']):.2f}x" if c["ttt_ratio"] else "never")
            if c["ttt_ratio"] and not all(c["reached"]):
                ratio += f" ({sum(c['reached'])}/{len(c['reached'])} reached)"
            mark = " ✓" if sw.meets(c) else ""
            cells.append(f"{ratio} / {statistics.mean(c['loss']):.2f}{mark}")
        lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def convergence_table(sw):
    """Markdown table: the whole-test-set metric at the phase ends (before the rate drop, at the
    end) and the sampled curve over the last quarter, at delay 1 and the largest delay."""
    m = sw.model
    scale, digits = (100.0, 2) if m == "mlp" else (1.0, 4)
    lines = [f"### {m.upper()}: convergence (whole test set; mean ± sd over seeds)", "",
             "| config | straggler | before the rate drop (75% of N) | at N | "
             "sampled curve at 87.5% of N | at N |", "|---|---|---|---|---|---|"]
    for cfg in sw.configs:
        for d in (sw.delays[0], sw.delays[-1]):
            c = sw.cell(cfg, d)
            if not c["runs"]:
                continue
            pre = [r["phases"][-2]["full_metric"] * scale for r in c["runs"]]
            fin = [r["final_metric"] * scale for r in c["runs"]]
            q7, q8 = [], []
            for r in c["runs"]:
                g, x = r["series"]["gradients"], r["series"]["metric"]
                i7 = min(range(len(g)), key=lambda i: abs(g[i] - 0.875 * r["budget"]))
                q7.append(x[i7] * scale)
                q8.append(x[-1] * scale)
            lines.append(f"| {cfg} | {delay_label(d)} | {fmt(pre, digits)} | {fmt(fin, digits)} | "
                         f"{fmt(q7, digits)} | {fmt(q8, digits)} |")
    return "\n".join(lines)


def plans_table(sw):
    """Markdown table: the groups each grouped configuration ran with after measuring (seed 1)."""
    seed = sw.seeds[0]
    lines = [f"### {sw.model.upper()}: groups after the measuring window (group of workers 0-7, "
             f"seed {seed}; worker 7 is the straggler)", "",
             "| config | " + " | ".join(delay_label(d) for d in sw.delays) + " |",
             "|---|" + "---|" * len(sw.delays)]
    for cfg in sw.configs:
        if "groups" not in cfg:
            continue
        cells = []
        for d in sw.delays:
            r = sw.runs.get((cfg, d, seed))
            cells.append("".join(map(str, r["phases"][1]["group_of"])) if r else "–")
        lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(sw):
    """Markdown lines: per delay > 300%, which configurations meet both halves of the claim."""
    lines = [f"### {sw.model.upper()}: the claim at delays of more than 300% "
             f"(time ≤ {CLAIM_TIME:.2f}x no-delay BSP and ≤ {CLAIM_POINTS} "
             f"{'points' if sw.model == 'mlp' else '% RMSE'} lost)", ""]
    for d in sw.delays:
        if d <= 4.0:
            continue
        parts = []
        for cfg in sw.configs:
            c = sw.cell(cfg, d)
            if not c["runs"]:
                continue
            ratio = f"{statistics.mean(c['ttt_ratio']):.2f}x" if c["ttt_ratio"] else "never"
            parts.append(f"{cfg} {ratio} / {statistics.mean(c['loss']):.2f}"
                         f"{' ✓' if sw.meets(c) else ''}")
        lines.append(f"* {delay_label(d)}: " + "; ".join(parts))
    return "\n".join(lines)


def plot_ttt(sw, out):
    """Time to target / no-delay BSP vs delay, per configuration (mean, min-max)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for cfg in sw.configs:
        xs, ys, lo, hi, fx, fy, flo, fhi = [], [], [], [], [], [], [], []
        for d in sw.delays:
            c = sw.cell(cfg, d)
            if c["ttt_ratio"]:
                m = statistics.mean(c["ttt_ratio"])
                xs.append(d), ys.append(m)
                lo.append(m - min(c["ttt_ratio"])), hi.append(max(c["ttt_ratio"]) - m)
            if c["loss"]:
                m = statistics.mean(c["loss"])
                fx.append(d), fy.append(m)
                flo.append(m - min(c["loss"])), fhi.append(max(c["loss"]) - m)
        kw = dict(color=COLORS[cfg], ls=STYLES.get(cfg, "-"), marker="o", ms=4, capsize=3,
                  label=cfg)
        axes[0].errorbar(xs, ys, yerr=[lo, hi], **kw)
        axes[1].errorbar(fx, fy, yerr=[flo, fhi], **kw)
    axes[0].axhline(CLAIM_TIME, color="grey", ls=":", lw=1)
    axes[0].set_ylabel("time to target / no-delay BSP")
    axes[0].set_yscale("log")
    axes[0].set_yticks([0.5, 0.8, 1, 1.2, 1.5, 2, 3, 5, 8])
    axes[0].get_yaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    tgt = f"{sw.target * 100:.0f}% on 2,000 test images" if sw.model == "mlp" else \
        f"test RMSE {sw.target}"
    axes[0].set_title(f"{sw.model.upper()}: time to {tgt}")
    axes[1].axhline(CLAIM_POINTS, color="grey", ls=":", lw=1)
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_ylabel("accuracy points lost vs no-delay BSP" if sw.model == "mlp"
                       else "% RMSE increase vs no-delay BSP")
    axes[1].set_title(f"{sw.model.upper()}: final {METRIC_LABEL[sw.model]} at N gradients "
                      "(whole test set)")
    for ax in axes:
        ax.set_xlabel("straggler's compute-time factor (1 = no delay)")
        ax.set_xticks(sw.delays)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"ttt_{sw.model}.png"), dpi=110)
    plt.close(fig)


def plot_final(sw, out):
    """Final metric vs delay, per configuration (mean ± sd)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    scale = 100.0 if sw.model == "mlp" else 1.0
    for cfg in sw.configs:
        xs, ys, es = [], [], []
        for d in sw.delays:
            c = sw.cell(cfg, d)
            if c["final"]:
                m, s = mean_sd([x * scale for x in c["final"]])
                xs.append(d), ys.append(m), es.append(s)
        ax.errorbar(xs, ys, yerr=es, color=COLORS[cfg], ls=STYLES.get(cfg, "-"), marker="o",
                    ms=4, capsize=3, label=cfg)
    ax.set_xlabel("straggler's compute-time factor (1 = no delay)")
    ax.set_xticks(sw.delays)
    ax.set_ylabel("final test accuracy (%)" if sw.model == "mlp" else "final test RMSE")
    ax.set_title(f"{sw.model.upper()}: final model after N gradients (mean ± sd)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"final_{sw.model}.png"), dpi=110)
    plt.close(fig)


def plot_curves(sw, out):
    """Metric vs simulated seconds per configuration at no delay and the largest delay."""
    delays = [sw.delays[0], sw.delays[-1]]
    fig, axes = plt.subplots(1, len(sw.configs), figsize=(3.3 * len(sw.configs), 3.8),
                             sharey=True, squeeze=False)
    for ax, cfg in zip(axes[0], sw.configs):
        for d, color in zip(delays, ("tab:blue", "tab:red")):
            for i, s in enumerate(sw.seeds):
                r = sw.runs.get((cfg, d, s))
                if r is None:
                    continue
                ax.plot(r["series"]["time"], r["series"]["metric"], color=color,
                        lw=1.4 if i == 0 else 0.5, alpha=1.0 if i == 0 else 0.5,
                        label=delay_label(d) if i == 0 else None)
        ax.axhline(sw.target, color="grey", ls=":", lw=1)
        ax.set_title(cfg, fontsize=9)
        ax.set_xlabel("simulated seconds")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(METRIC_LABEL[sw.model])
    axes[0][0].set_ylim(*((0.6, 0.9) if sw.model == "mlp" else (0.1, 1.05)))
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"curves_{sw.model}.png"), dpi=110)
    plt.close(fig)


def regroup_table(runs, model, target):
    """Markdown table of the regrouping demo for one model."""
    scale, digits = (100.0, 2) if model == "mlp" else (1.0, 4)
    unit = "accuracy (%)" if model == "mlp" else "test RMSE"
    seeds = sorted({r["seed"] for r in runs})
    lines = [f"### {model.upper()} regrouping demo ({len(seeds)} seeds; mean ± sd)", "",
             "| groups | variant | time to target (s) | time to N (s) | time from the change to N (s) "
             f"| final {unit} | groups at the end (seed {seeds[0]}) |",
             "|---|---|---|---|---|---|---|"]
    for g in sorted({r["groups"] for r in runs}):
        for v in ("static", "regroup"):
            sel = [r for r in runs if r["groups"] == g and r["variant"] == v]
            if not sel:
                continue
            ttt = [t for t in (time_to(r, target) for r in sel) if t is not None]
            after = []
            for r in sel:
                t, acc = 0.0, 0
                for p in r["phases"]:
                    if acc >= round(r["change_at"] * r["budget"]):
                        t += p["seconds"]
                    acc += p["budget"]
                after.append(t)
            first = min(sel, key=lambda r: r["seed"])
            plan = "".join(map(str, first["phases"][-1]["group_of"]))
            lines.append(f"| {g} | {v} | {fmt(ttt, 2)} ({len(ttt)}/{len(sel)} reached) | "
                         f"{fmt([r['sim_seconds'] for r in sel], 2)} | {fmt(after, 2)} | "
                         f"{fmt([r['final_metric'] * scale for r in sel], digits)} | {plan} |")
    return "\n".join(lines)


def plot_regroup(runs, model, out):
    """Regrouping demo: metric vs time per variant and group count (first seed)."""
    groups = sorted({r["groups"] for r in runs})
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 3.8), squeeze=False)
    seed = min(r["seed"] for r in runs)
    for ax, g in zip(axes[0], groups):
        for v, color in (("static", "tab:red"), ("regroup", "tab:green")):
            for r in runs:
                if r["groups"] == g and r["variant"] == v and r["seed"] == seed:
                    ax.plot(r["series"]["time"], r["series"]["metric"], color=color,
                            label=f"{v} ({r['sim_seconds']:.1f} s)")
                    t, acc = 0.0, 0
                    for p in r["phases"]:
                        if acc == round(r["change_at"] * r["budget"]):
                            ax.axvline(t, color="grey", ls=":", lw=1)
                        t += p["seconds"]
                        acc += p["budget"]
        ax.set_title(f"{g} groups: worker 2 also slows down at 50% of the work")
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel(METRIC_LABEL[model])
        ax.set_ylim(*((0.6, 0.9) if model == "mlp" else (0.1, 1.05)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"regroup_{model}.png"), dpi=110)
    plt.close(fig)


def main():
    """Reads the runs, writes the figures and table.md."""
    global plt
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=common.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default=str(common.default_out("stragglers")),
                    help=common.out_help("stragglers"))
    ap.add_argument("--overwrite", action="store_true", help=common.overwrite_help())
    ap.add_argument("--no-plot", action="store_true", help="write table.md only (no matplotlib)")
    for m in ("mlp", "mf"):
        ap.add_argument(f"--target-{m}", type=float, default=TARGETS[m][0],
                        help=f"main target (default {TARGETS[m][0]})")
        ap.add_argument(f"--target2-{m}", type=float, default=TARGETS[m][1],
                        help=f"second target (default {TARGETS[m][1]})")
    args = ap.parse_args()
    prog = "bench/straggler_experiment.py"
    if not args.no_plot:
        plt = common.require_matplotlib(prog)
        import matplotlib.ticker  # noqa: F401  (plt.matplotlib.ticker)
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
        target = getattr(args, f"target_{model}")
        target2 = getattr(args, f"target2_{model}")
        sweep = [r for r in rs if r["kind"] == "sweep"]
        regroup = [r for r in rs if r["kind"] == "regroup"]
        if sweep:
            sw = Sweep(sweep, model, target)
            if not args.no_plot:
                plot_ttt(sw, args.out)
                plot_final(sw, args.out)
                plot_curves(sw, args.out)
            parts += [compact_table(sw, target, f"target {target}"), "",
                      compact_table(sw, target2, f"second target {target2}"), "",
                      verdicts(sw), "", sweep_table(sw), "", convergence_table(sw), "",
                      plans_table(sw), ""]
        if regroup:
            if not args.no_plot:
                plot_regroup(regroup, model, args.out)
            parts += [regroup_table(regroup, model, target), ""]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(parts))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

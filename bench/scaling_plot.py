#!/usr/bin/env python3
"""Plots and tables for the scaling bench (bench/scaling.cpp, asyncps_scaling).

Reads the JSON written by `asyncps_scaling --json FILE` and writes, into the output folder:

  * scaling.png   aggregate push+pull GB/s (top) and clocks/s (bottom) against the number of
                  workers, one line per shard count; TCP loopback on the left (bars: min..max
                  over the repetitions), the simulated link model on the right (per simulated
                  second; dashed: the link model's bound, for BSP without compute time);
                  log2 worker axis;
  * table.md      the same figures as Markdown tables (GB/s and clocks/s, workers x shards),
                  with the run's policy, table size and load averages.

Output goes to build/experiments/scaling unless --out says otherwise; a folder under docs/ is
written only with --overwrite.

Standard library plus matplotlib for the figure (installed through `bash .ci/deps
python3-matplotlib` when missing, see experiment_common.py); --no-plot writes table.md only.

    build/bench/asyncps_scaling --json scaling.json
    python3 bench/scaling_plot.py scaling.json [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import experiment_common as common

plt = None  # matplotlib.pyplot, imported by main() unless --no-plot


def by_shards(cells: list[dict]) -> dict[int, list[dict]]:
    """Cells grouped by shard count, each group sorted by workers."""
    out: dict[int, list[dict]] = {}
    for c in cells:
        out.setdefault(c["shards"], []).append(c)
    return {s: sorted(cs, key=lambda c: c["workers"]) for s, cs in sorted(out.items())}


def value(c: dict, key: str) -> float:
    """c[key], NaN for null (a run that measured nothing)."""
    v = c.get(key)
    return float("nan") if v is None else v


def link_bound(meta: dict, workers: int, shards: int) -> float | None:
    """The simulated push+pull GB/s bound of the link model under BSP without compute time: a
    round moves W x size of pushes through the workers' own interfaces (in parallel), then
    W x size of rows through the S servers' interfaces, so at most 2 B W S / (W + S) with B the
    interface's bytes per second. None for other settings (no simple bound)."""
    if meta["policy"] != "ssp(0)" or meta["compute_us"] != 0:
        return None
    b = meta["sim_gbit"] / 8  # GB/s
    return 2 * b * workers * shards / (workers + shards)


def plot(data: dict, out: Path) -> None:
    """scaling.png: GB/s and clocks/s against workers, TCP and simulated side by side."""
    meta = data["meta"]
    parts = [("tcp", "TCP loopback (this machine)"),
             ("sim", f"simulated: {meta['sim_gbit']:g} Gbit/s, {meta['sim_latency_us']:g} us")]
    parts = [(k, t) for k, t in parts if data.get(k)]
    if not parts:
        return
    fig, axes = plt.subplots(2, len(parts), figsize=(6.2 * len(parts), 8.0), squeeze=False)
    for col, (kind, title) in enumerate(parts):
        for row, (key, label) in enumerate([("gbps", "push+pull payload, GB/s"),
                                            ("clocks_per_s", "clocks/s, all workers")]):
            ax = axes[row][col]
            for shards, cs in by_shards(data[kind]).items():
                xs = [c["workers"] for c in cs]
                ys = [value(c, key) for c in cs]
                name = f"{shards} shard{'s' if shards > 1 else ''}"
                if kind == "tcp" and meta.get("reps", 1) > 1:
                    lo = [y - value(c, key + "_min") for c, y in zip(cs, ys)]
                    hi = [value(c, key + "_max") - y for c, y in zip(cs, ys)]
                    line = ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=name)
                    color = line.lines[0].get_color()
                else:
                    color = ax.plot(xs, ys, marker="o", label=name)[0].get_color()
                bound = [link_bound(meta, w, shards) for w in xs]
                if kind == "sim" and key == "gbps" and None not in bound:
                    ax.plot(xs, bound, linestyle="--", linewidth=1, color=color, alpha=0.6,
                            label=f"bound, {shards} shard{'s' if shards > 1 else ''}")
            ax.set_xscale("log", base=2)
            workers = sorted({c["workers"] for c in data[kind]})
            ax.set_xticks(workers)
            ax.set_xticklabels([str(w) for w in workers])
            ax.set_ylim(bottom=0)
            ax.set_xlabel("workers")
            ax.set_ylabel(label + (" (simulated time)" if kind == "sim" else ""))
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(title)
            ax.legend(fontsize=8)
    load = f"load average {meta['load_before']:.2f} -> {meta['load_after']:.2f}"
    fig.suptitle(f"asyncps scaling: policy {meta['policy']}, table "
                 f"{meta['table_bytes'] / 2**20:g} MiB, {meta['compute_us']} us compute, "
                 f"{meta['worker_threads']} worker thread(s) over TCP; {load}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)


def grid_table(cells: list[dict], key: str, fmt: str) -> list[str]:
    """A Markdown table of `key`: one row per worker count, one column per shard count."""
    groups = by_shards(cells)
    shards = list(groups)
    workers = sorted({c["workers"] for c in cells})
    at = {(c["workers"], c["shards"]): c for c in cells}
    lines = ["| workers | " + " | ".join(f"{s} shard{'s' if s > 1 else ''}" for s in shards) + " |",
             "|---:|" + "---:|" * len(shards)]
    for w in workers:
        row = []
        for s in shards:
            c = at.get((w, s))
            if c is None or c.get(key) is None:
                row.append("-")
                continue
            text = fmt.format(c[key])
            if c.get("whole_run"):
                text += " *"
            if c.get("error"):
                text += " (error)"
            row.append(text)
        lines.append(f"| {w} | " + " | ".join(row) + " |")
    return lines


def tables(data: dict) -> str:
    """table.md's text."""
    meta = data["meta"]
    parts = ["<!-- generated by bench/scaling_plot.py; do not edit -->", "",
             f"Policy {meta['policy']}, table {meta['table_bytes'] / 2**20:g} MiB "
             f"({meta['rows']} x {meta['width']} floats), {meta['compute_us']} us compute; "
             f"{meta['hardware_threads']} hardware threads, load average (1 min) "
             f"{meta['load_before']:.2f} at start, {meta['load_after']:.2f} at end"
             + (" (--quick)" if meta.get("quick") else "") + ".", ""]
    if data.get("tcp"):
        parts += [f"TCP loopback, {meta['worker_threads']} worker io_context thread(s), median "
                  f"of {meta['reps']} x ~{meta['seconds']:g} s. Push+pull payload GB/s:", ""]
        parts += grid_table(data["tcp"], "gbps", "{:.2f}") + [""]
        parts += ["Clocks/s (all workers):", ""]
        parts += grid_table(data["tcp"], "clocks_per_s", "{:.0f}") + [""]
    if data.get("sim"):
        parts += [f"Simulated, {meta['sim_gbit']:g} Gbit/s per node interface, "
                  f"{meta['sim_latency_us']:g} us latency, {meta['sim_clocks']} clocks per "
                  f"worker, per simulated second. Push+pull payload GB/s:", ""]
        parts += grid_table(data["sim"], "gbps", "{:.2f}") + [""]
        parts += ["Clocks/s (all workers):", ""]
        parts += grid_table(data["sim"], "clocks_per_s", "{:.0f}") + [""]
    if any(c.get("whole_run") for k in ("tcp", "sim") for c in data.get(k, [])):
        parts += ["\\* no steady state (workers that never wait drift apart): the whole run.", ""]
    return "\n".join(parts)


def main():
    """Reads the JSON, writes scaling.png and table.md."""
    global plt
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=common.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="the file written by asyncps_scaling --json")
    ap.add_argument("--out", default=str(common.default_out("scaling")),
                    help=common.out_help("scaling"))
    ap.add_argument("--overwrite", action="store_true", help=common.overwrite_help())
    ap.add_argument("--no-plot", action="store_true", help="write table.md only (no matplotlib)")
    args = ap.parse_args()
    prog = "bench/scaling_plot.py"
    if not args.no_plot:
        plt = common.require_matplotlib(prog)
    out = Path(args.out)
    common.check_out(prog, out, args.overwrite, [])  # figures are derived: no raw data lost
    os.makedirs(out, exist_ok=True)
    with open(args.json) as f:
        data = json.load(f)
    if not args.no_plot:
        plot(data, out)
    with open(out / "table.md", "w") as f:
        f.write(tables(data))
    print(f"written to {out}")


if __name__ == "__main__":
    main()

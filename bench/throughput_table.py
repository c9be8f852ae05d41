#!/usr/bin/env python3
"""Markdown tables from `asyncps_bench --json FILE` (docs/performance.md).

    python3 bench/throughput_table.py perf.json [--api worker,raw] [--size 4194304,4096]

Prints one table row per JSON row, in the bench's order: api, transport, op, size, window,
workers, median, unit, vs raw, p99, server + client CPU ns per byte, min..max.
"""
import argparse
import json


def size_text(b):
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return f"{b >> 20} MiB"
    if b >= 1024 and b % 1024 == 0:
        return f"{b >> 10} KiB"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--api", help="comma-separated: raw, worker, protocol (default: all)")
    ap.add_argument("--size", help="comma-separated byte sizes (default: all)")
    args = ap.parse_args()
    with open(args.json) as f:
        doc = json.load(f)
    apis = set(args.api.split(",")) if args.api else None
    sizes = {int(s) for s in args.size.split(",")} if args.size else None
    m = doc["meta"]
    print(f"<!-- {m['reps']} repetitions x {m['seconds']} s, load average "
          f"{m['load_before']} before / {m['load_after']} after, cpu pinning "
          f"{m.get('server_cpu', -1)},{m.get('client_cpu', -1)}, spin {m.get('spin_us', 0)} us -->")
    print("| api | transport | op | size | window | workers | median | unit | vs raw "
          "| p99 us / ops/s | CPU ns/B server + client | min..max |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for r in doc["rows"]:
        if apis and r.get("api", "protocol") not in apis:
            continue
        if sizes and r["size"] not in sizes:
            continue
        us = r["unit"] == "us"
        fmt = (lambda v: f"{v:.1f}") if us else (lambda v: f"{v:.0f}")
        ratio = f"{r['ratio_to_raw']:.2f}x" if r["ratio_to_raw"] > 0 else "-"
        p99 = f"{r['p99']:.1f}" if r.get("p99", 0) > 0 else "-"
        if r.get("ops_per_s", 0) > 0:
            p99 = f"{r['ops_per_s']:.0f}/s"
        s, c = r.get("server_cpu_ns_per_byte", 0), r.get("client_cpu_ns_per_byte", 0)
        cpu = f"{s:.2f} + {c:.2f}" if s > 0 or c > 0 else "-"
        print(f"| {r.get('api', 'protocol')} | {r['transport']} | {r['op']} | "
              f"{size_text(r['size'])} | {r['window']} | {r['workers']} | {fmt(r['median'])} | "
              f"{r['unit']} | {ratio} | {p99} | {cpu} | {fmt(r['min'])}..{fmt(r['max'])} |")


if __name__ == "__main__":
    main()

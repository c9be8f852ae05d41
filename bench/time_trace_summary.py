#!/usr/bin/env python3
"""Summarise a clang -ftime-trace JSON file: where one translation unit's compile time goes.

Usage:
  clang++-14 -std=c++20 -O2 -ftime-trace -ftime-trace-granularity=100 \
      -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1 -DASIO_STANDALONE -DASIO_NO_DEPRECATED \
      -Iinclude -isystem /usr/include/eigen3 -c examples/tutorial/1_quick_start.cpp -o /tmp/q.o
  python3 bench/time_trace_summary.py /tmp/q.json [--top 25]

Prints plain-text tables (docs/results/build_time/ keeps some):
  phases     the "Total ..." events clang records: front end (parsing, instantiation) and back end
             (optimisation, code generation)
  headers    inclusive parse time of each header (a header's time includes what it includes;
             with #pragma once a header is charged to the first file that includes it)
  by library the same, summed per library for the headers the translation unit includes directly
             or through asyncps headers (asyncps, asio, Eigen, Boost, OpenSSL, libstdc++, libc)
  templates  instantiation time summed per template (arguments stripped), inclusive of nested
             instantiations, so rows overlap
  functions  back-end time (OptFunction + CodeGen Function) summed per function family, and per
             namespace: which generated code costs the most to optimise

Events shorter than -ftime-trace-granularity (default 500 us) are not in the file, so the
per-header and per-template sums undercount; the phase totals are exact.
"""

import argparse
import collections
import json
import re
import shutil
import subprocess


def strip_template_args(name: str) -> str:
    """'std::vector<int, std::allocator<int>>::push_back' -> 'std::vector<>::push_back'."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            if depth == 0:
                out.append("<>")
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def demangle(names):
    """Demangles Itanium names in one c++filt call; returns them unchanged without c++filt."""
    names = list(names)
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(
        ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False
    ).stdout.split("\n")
    return {n: (out[i] if i < len(out) else n) for i, n in enumerate(names)}


def library_of(path: str) -> str:
    rules = [
        ("asyncps/", "asyncps"),
        ("/asio/", "asio"),
        ("/eigen3/", "Eigen"),
        ("/boost/", "Boost (Outcome)"),
        ("/openssl/", "OpenSSL"),
        ("/c++/", "libstdc++"),
        ("doctest", "doctest"),
    ]
    for needle, lib in rules:
        if needle in path:
            return lib
    return "libc / system" if path.startswith("/usr/") else "other"


def namespace_of(name: str) -> str:
    m = re.match(r"(?:\w+ )*?(?:\(anonymous namespace\)::)?([A-Za-z_]\w*)::", name)
    return m.group(1) if m else "(global)"


def ms(us: float) -> str:
    return f"{us / 1000:9.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="the .json file that clang -ftime-trace wrote")
    ap.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    args = ap.parse_args()

    events = [e for e in json.load(open(args.trace))["traceEvents"] if e.get("ph") == "X"]
    totals = {e["name"][6:]: e for e in events if e["name"].startswith("Total ")}
    main_tid = min((e["tid"] for e in events if e["name"] == "ExecuteCompiler"), default=None)
    work = [e for e in events if e["tid"] == main_tid and not e["name"].startswith("Total ")]

    print(f"# time-trace summary of {args.trace}")
    print("\n## phases (ms; exact, from clang's Total events)")
    for name in [
        "ExecuteCompiler",
        "Frontend",
        "Source",
        "ParseClass",
        "ParseTemplate",
        "InstantiateClass",
        "InstantiateFunction",
        "PerformPendingInstantiations",
        "Backend",
        "Optimizer",
        "OptModule",
        "CodeGenPasses",
        "CodeGen Function",
    ]:
        if name in totals:
            e = totals[name]
            print(f"{ms(e['dur'])}  {name:30s} (count {e['args'].get('count', '?')})")

    # Headers: Source events nest; inclusive time per header, and the include depth.
    sources = sorted((e for e in work if e["name"] == "Source"), key=lambda e: (e["ts"], -e["dur"]))
    stack, rows = [], []
    for e in sources:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        parent = stack[-1]["args"]["detail"] if stack else "(main file)"
        rows.append((e["dur"], e["args"]["detail"], len(stack), parent))
        stack.append(e)
    print(f"\n## headers: inclusive parse time (ms), top {args.top}")
    print(f"{'ms':>9s}  depth  header  (included from)")
    for dur, path, depth, parent in sorted(rows, reverse=True)[: args.top]:
        print(f"{ms(dur)}  {depth:5d}  {path}  ({parent.split('/include/')[-1]})")

    # Per library: charge each header's own (exclusive) time to its library.
    child_time = collections.Counter()
    stack = []
    for e in sources:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            child_time[id(stack[-1])] += e["dur"]
        stack.append(e)
    by_lib = collections.Counter()
    for e in sources:
        by_lib[library_of(e["args"]["detail"])] += e["dur"] - child_time[id(e)]
    print("\n## parse time by library (ms, exclusive: each header's own time)")
    for lib, us in by_lib.most_common():
        print(f"{ms(us)}  {lib}")

    for kind in ("InstantiateClass", "InstantiateFunction"):
        agg = collections.Counter()
        cnt = collections.Counter()
        for e in work:
            if e["name"] == kind:
                fam = strip_template_args(e["args"]["detail"])
                agg[fam] += e["dur"]
                cnt[fam] += 1
        print(f"\n## {kind}: time per template (ms, inclusive, rows overlap), top {args.top}")
        for fam, us in agg.most_common(args.top):
            print(f"{ms(us)}  x{cnt[fam]:<5d} {fam}")

    backend = [e for e in work if e["name"] in ("OptFunction", "CodeGen Function")]
    names = demangle({e["args"]["detail"] for e in backend})
    fam_time, fam_cnt, ns_time = collections.Counter(), collections.Counter(), collections.Counter()
    for e in backend:
        full = names[e["args"]["detail"]]
        fam = strip_template_args(full.split("(")[0] if "(" in full else full)
        fam = re.sub(r"\.(resume|destroy|cleanup|actor)$", "", fam)
        fam_time[fam] += e["dur"]
        fam_cnt[fam] += 1
        ns_time[namespace_of(full)] += e["dur"]
    print(f"\n## back end per namespace (ms, OptFunction + CodeGen Function, >= granularity only)")
    for ns, us in ns_time.most_common(12):
        print(f"{ms(us)}  {ns}")
    print(f"\n## back end per function family (ms), top {args.top}")
    for fam, us in fam_time.most_common(args.top):
        print(f"{ms(us)}  x{fam_cnt[fam]:<5d} {fam[:160]}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Which weak (COMDAT) symbols several test objects of a dev build define, by size: code that
each of those translation units generated again. Usage:
  duplicate_instantiations.py <build>/tests/CMakeFiles   (after a dev build of the tests)
Prints the duplicated bytes in all, then the basic_server / basic_worker / server_protocol /
worker_core instantiations with the test TUs that generate each."""
import collections, glob, os, re, subprocess, sys

root = sys.argv[1]
objs = sorted(glob.glob(os.path.join(root, "asyncps_*tests.dir", "*", "*.o")))
rows = []
for o in objs:
    tu = os.path.basename(o).removesuffix(".cpp.o")
    out = subprocess.run(["nm", "-S", "--defined-only", "-t", "d", o], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split(None, 3)
        if len(f) == 4 and f[2] in ("W", "w", "V", "v"):
            rows.append((tu, int(f[1]), f[3]))
size = {}
tus = collections.defaultdict(set)
for tu, sz, name in rows:
    size[name] = sz
    tus[name].add(tu)
text = 0
for o in objs:
    text += int(subprocess.run(["size", o], capture_output=True, text=True).stdout.split("\n")[1].split()[0])
total = sum(len(t) * size[n] for n, t in tus.items())
dup = sum((len(t) - 1) * size[n] for n, t in tus.items())
print(f"{len(objs)} objects, text {text} bytes; weak symbols {total} bytes, of which {dup} "
      f"({100 * dup / text:.1f} % of text) are copies of a symbol another object defines too")
names = sorted(tus)
dem = dict(zip(names, subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                                     text=True).stdout.split("\n")))

def head(d, prefix):
    i = d.find(prefix)
    if i < 0 or i > 40:
        return None
    depth = 0
    for j in range(i + len(prefix) - 1, len(d)):
        if d[j] == "<":
            depth += 1
        elif d[j] == ">":
            depth -= 1
            if depth == 0:
                return d[i:j + 1]
    return None

def short(h):
    for a, b in (("asyncps::", ""), ("std::chrono::_V2::", ""), ("consistency::", ""),
                 ("recovery::", ""), ("optimizer::", "")):
        h = h.replace(a, b)
    return re.sub(r"std::__cxx11::basic_string<[^>]*>[^>]*>\s*>", "string", h)[:160]

for prefix in ("asyncps::basic_server<", "asyncps::basic_worker<",
               "asyncps::detail::server_protocol<", "asyncps::detail::worker_core<"):
    agg = collections.defaultdict(lambda: [0, set()])
    for tu, sz, name in rows:
        h = head(dem[name], prefix)
        if h:
            agg[h][0] += sz
            agg[h][1].add(tu)
    print(f"\n== {prefix}...> in 2+ objects: bytes over all objects, objects, which")
    for h, (sz, t) in sorted(agg.items(), key=lambda x: -x[1][0] * (len(x[1][1]) - 1) / len(x[1][1])):
        if len(t) > 1:
            print(sz, len(t), ",".join(sorted(t)), short(h))

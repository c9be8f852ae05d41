#!/usr/bin/env bash
# Compiles test files of the dev build at -O2 and at -Og side by side (one compiler per core,
# the same flags otherwise: the dev build's compile command from compile_commands.json), and
# prints wall seconds, peak memory and the load. docs/build_time.md, "CI time: the tests at -Og".
# Usage: bench/test_opt_level.sh BUILD_DIR tests/unit/a_test.cpp [...]
set -euo pipefail
build=$1
shift
for src in "$@"; do
  cmd="$(python3 - "$build" "$src" <<'PY'
import json, sys, shlex
build, src = sys.argv[1], sys.argv[2]
for e in json.load(open(f"{build}/compile_commands.json")):
    if e["file"].endswith(src):
        args = shlex.split(e["command"])
        # drop the output, dependency-file and -O flags; the caller adds its own
        out, skip = [], False
        for a in args:
            if skip: skip = False; continue
            if a in ("-o", "-MF", "-MT"): skip = True; continue
            if a == "-MD" or a.startswith("-O"): continue
            out.append(a)
        print(shlex.join(out)); break
PY
)"
  [[ -n "$cmd" ]] || { echo "no compile command for $src in $build" >&2; exit 1; }
  echo "== $src (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
  for level in -O2 -Og; do
    ( /usr/bin/time -f "$level %e s wall, %U s user, %M KB peak" $cmd $level -o /tmp/opt_level$level.o ) 2>&1 | tail -1 &
  done
  wait
  echo "   load after: $(cut -d' ' -f1-3 /proc/loadavg)"
done

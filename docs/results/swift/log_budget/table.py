"""Issue 34: the log_budget memory table from memory.txt (the tab-separated `memory` lines of
replica_log_test). Per configuration: the largest value over the seeds of the most one worker
held at once (log, replica, both) as a multiple of the shard's parameter bytes, and the
replicas' bytes on the wire over the pushes' bytes (mean over the seeds)."""
import collections
import sys

rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    if "MESSAGE: memory\t" not in line:
        continue
    fields = line.rstrip("\n").split("MESSAGE: ", 1)[1].split("\t")[1:]
    name, kv = fields[0], dict(f.split("=", 1) for f in fields[1:])
    rows.setdefault((name, float(kv["budget"])), []).append(kv)

print("| optimizer | log_budget | seeds | log / worker (x params) | replica / worker (x params) "
      "| both (x params) | both (x one replica) | replicas sent | replica bytes / push bytes |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, budget), rs in rows.items():
    mx = lambda k: max(float(r[k]) for r in rs)
    mean = lambda k: sum(float(r[k]) for r in rs) / len(rs)
    sent = sorted(int(r["replicas_sent"]) for r in rs)
    print(f"| {name} | {'off' if budget == 0 else f'{budget:g}'} | {len(rs)} "
          f"| {mx('log_x_params'):.2f} | {mx('replica_x_params'):.2f} | {mx('both_x_params'):.2f} "
          f"| {mx('both_x_state'):.2f} | {sent[0]}-{sent[-1]} | {mean('replica_wire_x_pushes'):.3f} |")

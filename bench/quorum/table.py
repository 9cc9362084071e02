"""bench/quorum.sh's table: the JSON lines of the rows on stdin, Markdown out."""

import json
import sys

import statistics

runs = [json.loads(line) for line in sys.stdin if line.strip()]
names = list(dict.fromkeys(r["name"] for r in runs))
rows = []
for name in names:
    mine = [r for r in runs if r["name"] == name]
    med = lambda k: statistics.median(r[k] for r in mine)
    rows.append({"name": name, "cycles_per_s": med("cycles_per_s"), "p50_us": med("p50_us"), "p99_us": med("p99_us"), "failed": sum(r["failed"] for r in mine)})
for r in rows:
    print(f"| {r['name']} | {r['cycles_per_s']:.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['failed']} |")
def find(prefix):
    return next((r for r in rows if r["name"].startswith(prefix)), None)


NODE_REDLOCK = "node-redlock"
POTTERY = "pottery"
print()
print("| ratio of cycles/s (above 1: the helper is faster) | value |")
print("|---|---:|")
for a, b, label in [
    ("redis-lease Redlock drop-in", NODE_REDLOCK, "Node Redlock drop-in (5 masters) / node-redlock"),
    ("redis-lease QuorumClient", NODE_REDLOCK, "Node QuorumClient / node-redlock"),
    ("redis-lease-client QuorumClient", NODE_REDLOCK, "Rust sync helper / node-redlock"),
    ("redis-lease-client aio::", NODE_REDLOCK, "Rust tokio helper / node-redlock"),
    ("redis_lease.QuorumClient", POTTERY, "Python sync helper / pottery Redlock"),
    ("redis_lease.AsyncQuorumClient", POTTERY, "Python asyncio helper / pottery Redlock"),
]:
    x, y = find(a), find(b)
    if x and y:
        print(f"| {label} | {x['cycles_per_s'] / y['cycles_per_s']:.2f} |")

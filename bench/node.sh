#!/usr/bin/env bash
# `make bench`, part J: the Node.js helper's acquire + release cycle
# (clients/node: LeaseClient, the Redlock drop-in, QuorumClient) against
# node-redlock 5.0.0-beta.2 and against the raw LEASE.ACQUIRE +
# LEASE.RELEASE on one ioredis connection: one master, and five for the
# quorum rows. Redis 7.0 (`redis-server` on PATH) with the release module,
# no persistence. NODE_REPS (5) interleaved runs of BENCH_MS (2000) per
# client, medians. Needs `make node-deps` (clients/node/node_modules) and
# target/release (make build). Writes $BENCH_DIR/NODE.md (target/bench) and prints it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${BENCH_MODULE:-$ROOT/target/release/libredis_lease.so}
SERVER=${REDIS7_SERVER:-redis-server}
OUT=${NODE_OUT:-${BENCH_DIR:-$ROOT/target/bench}/NODE.md}
mkdir -p "$(dirname "$OUT")"
DIR=$(mktemp -d)
PIDS=()
# The servers write their shutdown marks into $DIR as they exit: wait for
# them before removing it.
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

(cd clients/node && npm run --silent build)
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
PORTS=()
for _ in 1 2 3 4 5 6; do
  p=$(free_port)
  "$SERVER" --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --logfile "$DIR/$p.log" \
    --loadmodule "$MODULE" grace-ms 0 &
  PIDS+=($!)
  PORTS+=("$p")
done
for p in "${PORTS[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
done

echo "J node cycles on ports ${PORTS[*]}" >&2
TABLE=$(node "$ROOT/bench/node/cycles.js" "${PORTS[@]}")
{
  echo "# Node.js acquire + release cycles (bench/node.sh)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, Node $(node --version), $($SERVER --version | awk '{print $3}' | tr -d v=), ioredis $(node -p 'require("./clients/node/node_modules/ioredis/package.json").version'), one master (first four rows) and five masters (last three) on one machine with the module, no persistence. A cycle: acquire, then release, one at a time for ${BENCH_MS:-2000} ms; ${NODE_REPS:-5} runs of each client interleaved, medians shown. Command: \`make bench\` (part J), or \`bash bench/node.sh\` after \`make build node-deps\`."
  echo
  echo "$TABLE"
} >"$OUT"
cat "$OUT"

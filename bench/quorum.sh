#!/usr/bin/env bash
# `make bench`, part G: quorum lock cycles on five local masters (Redis 7.0,
# `redis-server` on PATH, each with the module, no replication between them,
# no persistence), the helpers against the peers on the same servers:
# node-redlock (npm `redlock`) and pottery's Redlock (PyPI `pottery`). One
# client at a time: node-redlock, the Node drop-in for it (several clients:
# a quorum lease) and the Node QuorumClient; Rust sync and tokio; Python sync
# and asyncio, and pottery. A cycle is acquire on a majority, one write on
# the first master, release, one after the other for QUORUM_MS (3000),
# QUORUM_REPS (3) interleaved runs of each client, medians shown. The
# helpers propose the token (one round trip when a majority answers it
# exactly, as the peers make, two when it misses) and give a fencing token
# the peers do not. Writes $BENCH_DIR/QUORUM.md (target/bench) and prints
# it. Needs `make deps-bench` (the npm packages under .tools/bench-node,
# pottery in the pyenv), target/release (make build, the bench client) and
# the Node helper's dependencies (make node-deps; its dist/ is built here
# when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${BENCH_MODULE:-$ROOT/target/release/libredis_lease.so}
SERVER=${REDIS7_SERVER:-redis-server}
PYTHON=${BENCH_PYTHON:-$ROOT/.tools/pyenv/bin/python}
OUT=${QUORUM_OUT:-${BENCH_DIR:-$ROOT/target/bench}/QUORUM.md}
mkdir -p "$(dirname "$OUT")"
HANDOFF=${CARGO_TARGET_DIR:-$ROOT/target}/release/handoff
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

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORTS=()
for _ in 1 2 3 4 5; do
  p=$(free_port)
  "$SERVER" --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --logfile "$DIR/$p.log" \
    --loadmodule "$MODULE" grace-ms 0 &
  PIDS+=($!)
  PORTS+=("$p")
done
for p in "${PORTS[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
done

# The Node helper as the package ships it (its dist/, built once).
test -f clients/node/dist/src/index.js || (cd clients/node && npm run --silent build)

echo "G quorum cycles on ports ${PORTS[*]}" >&2
# QUORUM_REPS interleaved runs of every client; the table shows medians.
ROWS=$(
  for _ in $(seq "${QUORUM_REPS:-3}"); do
    NODE_PATH=$ROOT/.tools/bench-node/node_modules node "$ROOT/bench/quorum/redlock.js" "${PORTS[@]}"
    "$HANDOFF" quorum "${PORTS[@]}"
    PYTHONPATH=$ROOT/clients/python/src "$PYTHON" "$ROOT/bench/quorum/pyquorum.py" "${PORTS[@]}"
  done
)
{
  echo "# Quorum lock cycles (bench/quorum.sh)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $($SERVER --version | awk '{print $3}' | tr -d v=), five masters on one machine with the module, no replication, no persistence. A cycle: acquire on a majority, one write on the first master (the helpers: fenced with the token, on the first master that committed it), release; one at a time for ${QUORUM_MS:-3000} ms (the Node clients after ${QUORUM_WARMUP:-300} untimed cycles each: V8 compiles while they run), ${QUORUM_REPS:-3} runs of each client interleaved, medians shown. The helpers propose the token and hold it when a majority answers it exactly (one round trip with agreeing clocks, two when the proposal misses, design.md S9) and give a fencing token; the peers make one round trip and give none. Each helper is compared with the one-round-trip peer of its language: node-redlock for Node and Rust, pottery for Python."
  echo
  echo "| client | cycles/s | acquire p50, µs | acquire p99, µs | failed acquires |"
  echo "|---|---:|---:|---:|---:|"
  echo "$ROWS" | "$PYTHON" "$ROOT/bench/quorum/table.py"
} >"$OUT"
cat "$OUT"

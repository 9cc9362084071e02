#!/usr/bin/env bash
# `make bench`, part H: the cost of multi-key leases. One local Redis 7.0
# (`redis-server` on PATH) with the module, no persistence; one client does
# full cycles on k = 2, 10 and 100 keys (take all, give all back), one after
# the other: LEASE.MACQUIRE + LEASE.MRELEASE, k single LEASE.ACQUIRE and k
# LEASE.RELEASE pipelined (not all or nothing: the speed baseline), and a
# Redisson-style MultiLock (RedissonLock's lock and unlock scripts, one key
# and one round trip at a time, as RedissonMultiLock does). MULTIKEY_REPS (3)
# interleaved runs of MULTIKEY_MS (2000) ms, medians shown; about 75 s. The
# client is `handoff multikey <port>` (bench/src/multikey.rs). Writes
# $BENCH_DIR/MULTIKEY.md (target/bench) and prints it. Needs target/release (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${BENCH_MODULE:-$ROOT/target/release/libredis_lease.so}
SERVER=${REDIS7_SERVER:-redis-server}
OUT=${MULTIKEY_OUT:-${BENCH_DIR:-$ROOT/target/bench}/MULTIKEY.md}
mkdir -p "$(dirname "$OUT")"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
HANDOFF=$TARGET_DIR/release/handoff
[ -f "$MODULE" ] || { echo "missing $MODULE: run 'make build' first" >&2; exit 1; }
cargo build --release --quiet -p redis-lease-bench

DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$SERVER" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --logfile "$DIR/server.log" \
  --loadmodule "$MODULE" grace-ms 0 &
SERVER_PID=$!
cleanup() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$PORT" ping >/dev/null || { cat "$DIR/server.log" >&2; exit 1; }

echo "H multi-key lease cycles on port $PORT" >&2
T0=$(date +%s)
UPTIME_BEFORE=$(uptime | sed 's/^ *//')
BODY=$("$HANDOFF" multikey "$PORT")
UPTIME_AFTER=$(uptime | sed 's/^ *//')
{
  echo "# Multi-key lease cycles (bench/multikey.sh)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, $("$SERVER" --version | awk '{print $3}' | tr -d v=), one server with the module (built from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src Cargo.lock 2>/dev/null || echo ' plus uncommitted changes in src/'), \`grace-ms 0\`), no persistence, client and server on the same machine; the part took $(( $(date +%s) - T0 )) s. The Redisson-style MultiLock follows RedissonMultiLock and RedissonLock: the keys one by one in order, each one \`EVALSHA\` of RedissonLock's lock script and one round trip (Redisson waits for each lock before the next), then one \`EVALSHA\` of its unlock script per key (HEXISTS, HINCRBY -1, DEL, PUBLISH on the lock's channel), one round trip each; see bench/README.md, part H. The pipelined singles are not all or nothing: they are the speed baseline."
  echo
  echo "Load (\`uptime\`): before \`$UPTIME_BEFORE\`; after \`$UPTIME_AFTER\`."
  echo
  echo "$BODY"
} >"$OUT"
cat "$OUT"

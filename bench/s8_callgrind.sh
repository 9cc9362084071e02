#!/usr/bin/env bash
# Instructions per call (callgrind, the whole server) of lease commands, for
# one module build: the before/after comparison of bench/S8-before-after.md.
#
#   bash bench/s8_callgrind.sh path/to/libredis_lease.so out.txt   (N=20000)
#
# redis-server runs under valgrind --tool=callgrind with instrumentation off;
# for each kind of call it is zeroed, switched on while N calls go through
# redis-cli --pipe, switched off and dumped; out.txt gets "<call> <instr/call>".
# The LIMIT and SHARED calls are errors for a build without them.
set -euo pipefail
MOD=$1; OUT=$2; N=${N:-20000}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
W=$(mktemp -d)
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$W/cg.out" \
  redis-server --port "$PORT" --bind 127.0.0.1 --dir "$W" --save '' --appendonly no \
  --loadmodule "$MOD" grace-ms 0 max-ttl-ms 600000 >/dev/null 2>&1 &
PID=$!
for _ in $(seq 300); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$PORT" "$@"; }
gen() { awk -v n="$N" -v f="$1" 'BEGIN { for (i = 0; i < n; i++) printf f "\r\n", i }'; }
# warm-up
gen "LEASE.ACQUIRE w:%d o:5f2a9c1d7e3b4a60 600000" | cli --pipe >/dev/null 2>&1
gen "LEASE.RELEASE w:%d o:5f2a9c1d7e3b4a60" | cli --pipe >/dev/null 2>&1
phase() { # name format
  callgrind_control -z "$PID" >/dev/null 2>&1
  callgrind_control -i on "$PID" >/dev/null 2>&1
  gen "$2" | cli --pipe >/dev/null 2>&1 || true
  callgrind_control -i off "$PID" >/dev/null 2>&1
  rm -f "$W"/cg.out*
  callgrind_control -d "$PID" >/dev/null 2>&1
  local ir="" f
  for _ in $(seq 100); do
    for f in "$W"/cg.out*; do [ -f "$f" ] && ir=$(grep -h '^totals:' "$f" | awk '{print $2}'); done
    [ -n "$ir" ] && break; sleep 0.1
  done
  echo "$1 $(( ir / N ))" >> "$OUT"
}
: > "$OUT"
phase acquire "LEASE.ACQUIRE k:%d o:5f2a9c1d7e3b4a60 600000"
phase reacquire "LEASE.ACQUIRE k:%d o:5f2a9c1d7e3b4a60 600000"
phase renew "LEASE.RENEW k:%d o:5f2a9c1d7e3b4a60 600000"
phase fence-stale "LEASE.FENCE k:%d 5"
phase info "LEASE.INFO k:%d"
phase release "LEASE.RELEASE k:%d o:5f2a9c1d7e3b4a60"
phase acquire-limit "LEASE.ACQUIRE m:%d o:5f2a9c1d7e3b4a60 600000 LIMIT 4"
phase release-limit "LEASE.RELEASE m:%d o:5f2a9c1d7e3b4a60"
phase acquire-shared "LEASE.ACQUIRE s:%d o:5f2a9c1d7e3b4a60 600000 SHARED"
phase release-shared "LEASE.RELEASE s:%d o:5f2a9c1d7e3b4a60"
cli shutdown nosave >/dev/null 2>&1 || true
wait "$PID" || true
rm -rf "$W"

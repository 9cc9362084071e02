#!/usr/bin/env bash
# Part E of `make bench`: a crowded counting lease. CROWD holders of one
# `LIMIT 100000` key, taken in one burst with a short ttl (a worker fleet
# that took its permits and crashed), pass their deadlines while one holder
# stays. Then one call of each kind on the key, each on a freshly crowded
# key: its server time (INFO commandstats) and the AOF bytes it added (what
# every replica gets too; read right after its reply, before the drain
# timer's first batch). Then the drain: how long until every ended holder
# is out, its AOF bytes, and the longest PING round trip a client saw
# meanwhile. Prints a markdown section; appends crowd_* lines to $KV.
#
#   SERVER=redis-server MODULE=target/release/libredis_lease.so bash bench/crowded.sh
#
# Environment: SERVER (default redis-server), MODULE (default
# target/release/libredis_lease.so), CROWD (100000), CROWD_TTL_MS (the
# burst's ttl, 3000: longer than the burst takes), KV (a file for the
# matrix summary; none by default).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER=${SERVER:-redis-server}
MODULE=$(realpath "${MODULE:-target/release/libredis_lease.so}")
CROWD=${CROWD:-100000}
CROWD_TTL_MS=${CROWD_TTL_MS:-3000}
KV=${KV:-/dev/null}
WORK=$(mktemp -d /tmp/lease-crowded.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$SERVER" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync no \
  --dir "$WORK" --logfile "$WORK/server.log" --daemonize no \
  --loadmodule "$MODULE" grace-ms 0 max-ttl-ms 600000 &
PID=$!
cli() { redis-cli -p "$PORT" "$@"; }
trap 'cli shutdown nosave >/dev/null 2>&1 || kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 200); do cli ping >/dev/null 2>&1 && break; sleep 0.05; done
info() { cli info "$1" | tr -d '\r' | awk -F: -v k="$2" '$1 == k { print $2 }'; }
aof_size() { info persistence aof_current_size; }
expired() { info lease lease_expired; }
usec_of() { # the server time of the one call of command $1 since the reset
  cli info commandstats | tr -d '\r' | awk -F'[:=,]' -v n="cmdstat_$1" 'tolower($1) == n { print $5 }'
}

# The bytes of key `crowd` (MEMORY USAGE), or 0 when it is missing.
crowd_bytes() { local b; b=$(cli memory usage crowd); [[ $b =~ ^[0-9]+$ ]] && echo "$b" || echo 0; }

# crowd: CROWD ended holders of key `crowd`, one live survivor (and `mine`,
# live, to release); returns once every burst holder has ended. The burst's
# ttl (CROWD_TTL_MS) must outlast the burst itself: an acquire takes out up
# to 64 ended holders, so holders that end while the burst still runs never
# pile up. A key that did not get crowded ends the part: it says so and
# prints no figure.
crowd() {
  cli flushall >/dev/null
  local t0; t0=$(date +%s%N)
  awk -v n="$CROWD" -v ttl="$CROWD_TTL_MS" 'BEGIN { for (i = 0; i < n; i++) printf "LEASE.ACQUIRE crowd w%d %d LIMIT 100000\r\n", i, ttl }' |
    cli --pipe >/dev/null
  cli LEASE.ACQUIRE crowd survivor 600000 LIMIT 100000 >/dev/null
  cli LEASE.ACQUIRE crowd mine 600000 LIMIT 100000 >/dev/null
  local took_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  local bytes; bytes=$(crowd_bytes)
  if (( took_ms >= CROWD_TTL_MS || bytes < CROWD * 8 )); then
    echo "The setup of this part did not happen: the burst of $CROWD acquires took ${took_ms} ms against a ${CROWD_TTL_MS} ms ttl, and the key holds $bytes bytes (at least $(( CROWD * 8 )) expected). No figure is printed (raise CROWD_TTL_MS)."
    exit 0
  fi
  sleep "$(awk -v ms=$(( CROWD_TTL_MS - took_ms + 100 )) 'BEGIN { print ms / 1000 }')"
}

declare -A US BYTES
call() { # label, command...
  crowd
  cli config resetstat >/dev/null
  local before; before=$(aof_size)
  cli "${@:2}" >/dev/null
  BYTES[$1]=$(( $(aof_size) - before ))
  US[$1]=$(usec_of "$(tr '[:upper:]' '[:lower:]' <<<"$2")")
}
call acquire LEASE.ACQUIRE crowd newcomer 600000 LIMIT 100000
call renew LEASE.RENEW crowd survivor 600000
call release LEASE.RELEASE crowd mine

# The drain: after one call, the timer takes out the rest.
crowd
E0=$(expired)
AOF0=$(aof_size)
redis-benchmark -p "$PORT" -c 1 -n 20000 --csv PING 2>/dev/null | tail -n 1 >"$WORK/ping.csv" &
PINGER=$!
sleep 0.05
T0=$(date +%s%N)
cli LEASE.RENEW crowd survivor 600000 >/dev/null
# Done when the record holds its two live holders only (bounded: 20 s).
for _ in $(seq 4000); do
  [ "$(crowd_bytes)" -lt 2000 ] && break
  sleep 0.005
done
DRAIN_MS=$(( ($(date +%s%N) - T0) / 1000000 ))
DRAIN_BYTES=$(( $(aof_size) - AOF0 ))
TAKEN=$(( $(expired) - E0 ))
wait "$PINGER" || true
PING_MAX=$(awk -F'","' '{ gsub(/"/, "", $8); print $8 }' "$WORK/ping.csv")
{
  echo "crowd_acquire_us ${US[acquire]}"; echo "crowd_acquire_bytes ${BYTES[acquire]}"
  echo "crowd_drain_ms $DRAIN_MS"; echo "crowd_ping_max_ms $PING_MAX"
} >>"$KV"

echo "$CROWD holders of one \`LIMIT 100000\` key, taken in one burst with a ${CROWD_TTL_MS} ms ttl, have passed their deadlines (two live holders stay). One call of each kind on the key, each on a freshly crowded key: its server time (\`INFO commandstats\`) and the AOF bytes it added (what every replica gets too). A call takes out at most 64 ended holders, in one \`LEASE.PRUNE\` effect; a timer takes out the rest, 1,024 at a time."
echo
echo "| call | server time (usec) | AOF bytes added |"
echo "|---|---:|---:|"
for c in acquire renew release; do echo "| \`LEASE.$(tr '[:lower:]' '[:upper:]' <<<"$c")\` | ${US[$c]} | ${BYTES[$c]} |"; done
echo
echo "Then the drain, on a freshly crowded key: ${DRAIN_MS} ms from a \`LEASE.RENEW\` until the record held only its live holders ($TAKEN counted in \`lease_expired\`), with $DRAIN_BYTES AOF bytes in all, the call's included; the longest PING round trip a client saw meanwhile: ${PING_MAX} ms (\`redis-benchmark -c 1 PING\`, max latency)."

#!/usr/bin/env bash
# `make bench`: the lease module against the client-side lock recipes, on one
# redis-server started here, in one run (so the ratios are comparable).
# Writes bench/RESULTS.md and prints it. See bench/README.md.
#
# Knobs (environment): BENCH_N (requests per redis-benchmark run, 100000),
# BENCH_REPS (runs per variant, interleaved, 5), BENCH_REL_REPS (release runs,
# 2), BENCH_MEM_LEASES (1000000, also the number of held keys for release),
# BENCH_FENCE_N (200000), BENCH_MULTI_KEYS (50000), BENCH_MULTI_REPS (3),
# BENCH_MULTI_REL_KEYS (100000), BENCH_MULTI_REL_N (20000) for part C
# (counting and shared leases), BENCH_MAXCLIENTS (the server's maxclients, 10100),
# REDIS_SERVER (redis-server), plus the HANDOFF_*, EXPIRY_*, HERD*, MASS_*
# and CPU_WINDOW_MS knobs of bench/handoff.rs.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=$ROOT/target/release/libredis_lease.so
OUT=$ROOT/bench/RESULTS.md
SERVER_BIN=${REDIS_SERVER:-redis-server}
N=${BENCH_N:-100000}
REPS=${BENCH_REPS:-5}
MEM_LEASES=${BENCH_MEM_LEASES:-1000000}
FENCE_N=${BENCH_FENCE_N:-200000}
SCALES=(1000 100000 1000000)
OWNER=o:5f2a9c1d7e3b4a60     # a 18-byte owner id, like a random per-client id
LONG_TTL=600000               # 10 minutes: nothing expires during the run

[ -f "$MODULE" ] || { echo "missing $MODULE: run 'make build' first" >&2; exit 1; }
T_START=$(date +%s)
# What was built (make build ran just before): the commit, and whether the
# module's sources differ from it.
BUILT_FROM="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src Cargo.lock 2>/dev/null || echo ' plus uncommitted changes in src/')"

echo "building the hand-off client (cargo example 'handoff')..." >&2
cargo build --release --quiet --example handoff
HANDOFF=$ROOT/target/release/examples/handoff

# The mass timeout of part B (B4) opens up to 10,000 client connections: the
# server gets room for them plus the benchmark's own (--maxclients), and both
# processes the file descriptors (each needs its own: the limit is per
# process). The server lowers maxclients itself if it gets fewer; B4 reads
# CONFIG GET maxclients and uses at most maxclients - 100.
MAXCLIENTS=${BENCH_MAXCLIENTS:-10100}
ulimit -n $((MAXCLIENTS + 1024)) 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
WORK=$(mktemp -d /tmp/lease-bench.XXXXXX)
"$SERVER_BIN" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --enable-debug-command local --dir "$WORK" --logfile "$WORK/server.log" \
  --maxclients "$MAXCLIENTS" --loadmodule "$MODULE" grace-ms 0 max-ttl-ms "$LONG_TTL" &
SERVER_PID=$!
cleanup() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 100); do cli ping >/dev/null 2>&1 && break; sleep 0.05; done
cli ping >/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
echo "redis-server pid $SERVER_PID on port $PORT" >&2

# --- helpers --------------------------------------------------------------

log() { echo "[$(( $(date +%s) - T_START ))s] $*" >&2; }

# prefill FORMAT FROM TO: sends printf(FORMAT, i, i, i) for i in [FROM, TO)
# as inline commands through redis-cli --pipe.
prefill() {
  local out
  out=$(awk -v a="$2" -v b="$3" -v f="$1" \
    'BEGIN { for (i = a; i < b; i++) printf f "\r\n", i, i, i }' | cli --pipe 2>&1)
  grep -q 'errors: 0,' <<<"$out" || { echo "prefill '$1' failed: $out" >&2; exit 1; }
  settle
}

# Waits until the keyspace's hash table is not rehashing any more (a big
# prefill leaves it growing incrementally, which would slow the next
# commands and skew their numbers).
settle() {
  for _ in $(seq 200); do
    cli debug htstats 0 2>/dev/null | grep -q 'rehashing target' || return 0
    sleep 0.05
  done
}

dbsize() { cli dbsize; }
used_memory() { cli info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }'; }
# calls, usec and failed_calls of one command in INFO commandstats ("0 0 0"
# when absent).
cmdstat() {
  cli info commandstats | tr -d '\r' |
    awk -F'[:=,]' -v n="cmdstat_$1" 'tolower($1) == tolower(n) { c = $3; u = $5; f = $11 }
                                      END { print c + 0, u + 0, f + 0 }'
}

declare -A CALLS USEC RPS_LIST EFFECT EFF_N
# one_run LABEL STAT PREP EFFECT -- redis-benchmark arguments...
# PREP runs first; EFFECT (a function printing how many of the requests did
# the intended work) runs after. Accumulates commandstats and throughput.
one_run() {
  local label=$1 stat=$2 prep=$3 effect=$4; shift 5
  CUR_STAT=$stat
  "$prep"
  BEFORE_DBSIZE=$(dbsize)
  cli config resetstat >/dev/null
  local csv rps c u
  csv=$(redis-benchmark -p "$PORT" -P 16 -c 20 --csv "$@" 2>/dev/null | tail -n 1)
  rps=$(awk -F'","' '{ print $2 }' <<<"$csv")
  read -r c u _ < <(cmdstat "$stat")
  CALLS[$label]=$(( ${CALLS[$label]:-0} + c ))
  USEC[$label]=$(( ${USEC[$label]:-0} + u ))
  RPS_LIST[$label]="${RPS_LIST[$label]:-} $rps"
  EFFECT[$label]=$(( ${EFFECT[$label]:-0} + $("$effect") ))
  EFF_N[$label]=$(( ${EFF_N[$label]:-0} + LAST_N ))
}

usec_per_call() { awk -v u="${USEC[$1]}" -v c="${CALLS[$1]}" 'BEGIN { printf "%.2f", (c ? u / c : 0) }'; }
median_rps() { tr ' ' '\n' <<<"${RPS_LIST[$1]}" | grep . | sort -g |
  awk '{ a[NR] = $1 } END { printf "%.0f", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
effect_pct() { awk -v e="${EFFECT[$1]}" -v n="${EFF_N[$1]}" 'BEGIN { printf "%.1f%%", (n ? 100 * e / n : 0) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

# Effects: how many requests did the work that is being measured.
eff_created() { dbsize; }                                  # acquires that created a key
eff_incr() { read -r c _ < <(cmdstat incr); echo "$c"; }  # Lua acquires that took the lock
eff_deleted() { echo $(( BEFORE_DBSIZE - $(dbsize) )); }  # releases that deleted
eff_all() { echo "$LAST_N"; }                              # every call hits (by construction)
eff_ok() { read -r c _ f < <(cmdstat "$CUR_STAT"); echo $(( c - f )); }  # calls without an error reply

nothing() { :; }
flush() { cli flushall >/dev/null; }

# --- Lua recipes ------------------------------------------------------------

# The usual fenced acquire: SET NX PX, and only if it succeeded INCR a
# per-lock counter for the fencing token.
LUA_FENCED_ACQUIRE="if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2]) end
return false"
# Equivalent of Redisson's RedissonFencedLock acquire script (written here,
# same commands): a hash KEYS[1] {owner-field: hold count} with PEXPIRE, a
# token counter KEYS[2] INCRed on every (re)entry; returns {-1, token} when
# taken, {pttl, -1} when held by another.
LUA_REDISSON_ACQUIRE="if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return {-1, token} end
return {redis.call('PTTL', KEYS[1]), -1}"
LUA_CAD="if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"
LUA_RENEW="if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0"
# Fence check: the lock is still held and its counter is the caller's token.
LUA_FENCE="if redis.call('GET', KEYS[2]) == ARGV[1] and redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.status_reply('OK') end
return redis.error_reply('STALE token ' .. ARGV[1])"

SHA_FENCED=$(cli script load "$LUA_FENCED_ACQUIRE")
SHA_REDISSON=$(cli script load "$LUA_REDISSON_ACQUIRE")
SHA_CAD=$(cli script load "$LUA_CAD")
SHA_RENEW=$(cli script load "$LUA_RENEW")
SHA_FENCE=$(cli script load "$LUA_FENCE")

# --- A1. acquire ------------------------------------------------------------
# Free keys: a fresh keyspace per run, -r 1000000 so that ~95% of the N
# acquires find their key free (random owners: a repeat is "held by another").
log "A1 acquire"
LAST_N=$N
R_ACQ=1000000
for rep in $(seq "$REPS"); do
  one_run acq_lease LEASE.ACQUIRE flush eff_created -- -n "$N" -r "$R_ACQ" \
    LEASE.ACQUIRE lk:__rand_int__ __rand_int__ "$LONG_TTL"
  one_run acq_set set flush eff_created -- -n "$N" -r "$R_ACQ" \
    SET lk:__rand_int__ __rand_int__ NX PX "$LONG_TTL"
  one_run acq_lua evalsha flush eff_incr -- -n "$N" -r "$R_ACQ" \
    EVALSHA "$SHA_FENCED" 2 lk:__rand_int__ tk:__rand_int__ __rand_int__ "$LONG_TTL"
  one_run acq_redisson evalsha flush eff_incr -- -n "$N" -r "$R_ACQ" \
    EVALSHA "$SHA_REDISSON" 2 lk:__rand_int__ tk:__rand_int__ "$LONG_TTL" __rand_int__
done

# --- A2. renew (every call renews a held key) ---------------------------------
log "A2 renew"
flush
prefill "LEASE.ACQUIRE rl:%012d $OWNER $LONG_TTL" 0 100000
prefill "SET rs:%012d $OWNER PX $LONG_TTL" 0 100000
for rep in $(seq "$REPS"); do
  one_run renew_lease LEASE.RENEW nothing eff_all -- -n "$N" -r 100000 \
    LEASE.RENEW rl:__rand_int__ "$OWNER" "$LONG_TTL"
  one_run renew_lua evalsha nothing eff_all -- -n "$N" -r 100000 \
    EVALSHA "$SHA_RENEW" 1 rs:__rand_int__ "$OWNER" "$LONG_TTL"
done

# --- A3. fence check (valid token, one held key) ------------------------------
log "A3 fence"
TOKEN=$(cli LEASE.ACQUIRE fence:lease "$OWNER" "$LONG_TTL")
cli set fence:lock "$OWNER" PX "$LONG_TTL" >/dev/null
LUA_TOKEN=$(cli incr fence:lock:token)
LAST_N=$FENCE_N
for rep in $(seq "$REPS"); do
  one_run fence_lease LEASE.FENCE nothing eff_ok -- -n "$FENCE_N" \
    LEASE.FENCE fence:lease "$TOKEN"
  one_run fence_lua evalsha nothing eff_ok -- -n "$FENCE_N" \
    EVALSHA "$SHA_FENCE" 2 fence:lock fence:lock:token "$LUA_TOKEN"
done
FENCE_CHECK_LEASE=$(cli LEASE.FENCE fence:lease "$TOKEN" 2>&1)
FENCE_CHECK_LUA=$(cli evalsha "$SHA_FENCE" 2 fence:lock fence:lock:token "$LUA_TOKEN" 2>&1)

# --- A4. scale: LEASE.ACQUIRE cost with 1k, 100k, 1M live leases --------------
# At each size: 20 rounds of (1000 LEASE.ACQUIRE on free keys, then 1000
# LEASE.RELEASE of them) through one pipe, so the live count stays within
# size..size+1000; same with SET NX PX + DEL for reference.
SCALE_ROUNDS=50
scale_at() {
  local size=$1
  cli config resetstat >/dev/null
  awk -v r=$SCALE_ROUNDS -v o="$OWNER" -v t=$LONG_TTL 'BEGIN { for (k = 0; k < r; k++) {
      for (i = 0; i < 1000; i++) printf "LEASE.ACQUIRE sc:%d %s %d\r\n", i, o, t
      for (i = 0; i < 1000; i++) printf "LEASE.RELEASE sc:%d %s\r\n", i, o
      for (i = 0; i < 1000; i++) printf "SET ss:%d %s NX PX %d\r\n", i, o, t
      for (i = 0; i < 1000; i++) printf "DEL ss:%d\r\n", i } }' | cli --pipe >/dev/null
  read -r c u _ < <(cmdstat LEASE.ACQUIRE)
  SCALE_LEASE[$size]=$(awk -v u="$u" -v c="$c" 'BEGIN { printf "%.2f", u / c }')
  read -r c u _ < <(cmdstat set)
  SCALE_SET[$size]=$(awk -v u="$u" -v c="$c" 'BEGIN { printf "%.2f", u / c }')
  SCALE_LIVE[$size]=$(dbsize)
}
declare -A SCALE_LEASE SCALE_SET SCALE_LIVE
log "A4 scale 1k, 100k"
flush
prefill "LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL" 0 1000
scale_at 1000
prefill "LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL" 1000 100000
scale_at 100000

# --- A5. memory (then scale at 1M on the same leases) -------------------------
log "A5 memory: $MEM_LEASES leases"
flush
M0=$(used_memory)
prefill "LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL" 0 "$MEM_LEASES"
M1=$(used_memory)
MEM_LEASE=$(( (M1 - M0) / MEM_LEASES ))
MEMUSAGE_LEASE=$(cli memory usage lk:000000000007)
if [ "$MEM_LEASES" -ge 1000000 ]; then
  log "A4 scale 1M"
  scale_at 1000000
fi

log "A5 memory: $MEM_LEASES SET NX PX locks + counters"
flush
M0=$(used_memory)
prefill "EVALSHA $SHA_FENCED 2 lk:%012d lk:%012d:token $OWNER $LONG_TTL" 0 "$MEM_LEASES"
M1=$(used_memory)
MEM_LUA=$(( (M1 - M0) / MEM_LEASES ))
MEMUSAGE_LOCK=$(cli memory usage lk:000000000007)
MEMUSAGE_COUNTER=$(cli memory usage lk:000000000007:token)

# --- A6. release ----------------------------------------------------------------
# -r R_REL over R_REL freshly prefilled held keys (1,000,000 by default), so
# ~95% of the N releases find their key held and delete it; the rest find it
# already released. Each run needs a fresh prefill, hence fewer runs.
LAST_N=$N
R_REL=$MEM_LEASES
REL_REPS=${BENCH_REL_REPS:-2}
held_leases() { flush; prefill "LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL" 0 "$R_REL"; }
held_locks() { flush; prefill "SET lk:%012d $OWNER PX $LONG_TTL" 0 "$R_REL"; }
for rep in $(seq "$REL_REPS"); do
  log "A6 release, run $rep of $REL_REPS"
  one_run rel_lease LEASE.RELEASE held_leases eff_deleted -- -n "$N" -r "$R_REL" \
    LEASE.RELEASE lk:__rand_int__ "$OWNER"
  one_run rel_del del held_locks eff_deleted -- -n "$N" -r "$R_REL" \
    DEL lk:__rand_int__
  one_run rel_lua evalsha held_locks eff_deleted -- -n "$N" -r "$R_REL" \
    EVALSHA "$SHA_CAD" 1 lk:__rand_int__ "$OWNER"
done
flush

# --- C. counting and shared leases against Redisson-style scripts ---------------
# Written here from the documented algorithms of Redisson's
# RPermitExpirableSemaphore (a counter of free permits, and a sorted set of
# permit ids scored by their expiry: expired permits are returned first, an
# acquire takes one and adds its id, a release removes the id and returns
# the permit, both PUBLISH to the semaphore's channel) and of RReadWriteLock's
# read side (a hash with `mode` and a hold count per reader, one key per
# reader hold for its timeout; a release scans every reader's timeout keys
# for the longest one). Two differences, both in the recipes' favour or
# neutral: the scripts read the time with TIME (Redisson passes the client's
# clock), and they derive their other key names from KEYS[1]
# (redis-benchmark draws each __rand_int__ separately, so keys cannot be
# passed together).
LUA_NOW="local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)"
LUA_SEM_ACQUIRE="$LUA_NOW
local zset, chan = KEYS[1] .. ':timeout', KEYS[1] .. ':channel'
local expired = redis.call('ZRANGEBYSCORE', zset, 0, now, 'LIMIT', 0, 1)
if #expired > 0 then
  redis.call('ZREM', zset, unpack(expired))
  local free = redis.call('INCRBY', KEYS[1], #expired)
  if free > 0 then redis.call('PUBLISH', chan, free) end
end
local free = tonumber(redis.call('GET', KEYS[1]) or '0')
if free >= 1 then
  redis.call('DECRBY', KEYS[1], 1)
  redis.call('ZADD', zset, now + tonumber(ARGV[2]), ARGV[1])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', zset, ttl) end
  return ARGV[1]
end
local first = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
if first[1] then return ':' .. first[2] end
return false"
LUA_SEM_RELEASE="local zset, chan = KEYS[1] .. ':timeout', KEYS[1] .. ':channel'
local expires = redis.call('ZSCORE', zset, ARGV[1])
if redis.call('ZREM', zset, ARGV[1]) ~= 1 then return 0 end
local free = redis.call('INCRBY', KEYS[1], 1)
redis.call('PUBLISH', chan, free)
$LUA_NOW
if tonumber(expires) <= now then return 0 end
return 1"
LUA_READ_ACQUIRE="local mode = redis.call('HGET', KEYS[1], 'mode')
local timeout = KEYS[1] .. ':' .. ARGV[2] .. ':rwlock_timeout:'
if mode == false then
  redis.call('HSET', KEYS[1], 'mode', 'read')
  redis.call('HSET', KEYS[1], ARGV[2], 1)
  redis.call('SET', timeout .. '1', 1)
  redis.call('PEXPIRE', timeout .. '1', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return false
end
if mode == 'read' or (mode == 'write' and redis.call('HEXISTS', KEYS[1], ARGV[3]) == 1) then
  local n = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  redis.call('SET', timeout .. n, 1)
  redis.call('PEXPIRE', timeout .. n, ARGV[1])
  local left = redis.call('PTTL', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], math.max(left, tonumber(ARGV[1])))
  return false
end
return redis.call('PTTL', KEYS[1])"
LUA_READ_RELEASE="local mode = redis.call('HGET', KEYS[1], 'mode')
local chan = 'rwlock:' .. KEYS[1]
if mode == false then redis.call('PUBLISH', chan, 0) return 1 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return false end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n == 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('DEL', KEYS[1] .. ':' .. ARGV[1] .. ':rwlock_timeout:' .. (n + 1))
if redis.call('HLEN', KEYS[1]) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    local count = tonumber(redis.call('HGET', KEYS[1], field))
    if count then
      for i = count, 1, -1 do
        longest = math.max(longest, redis.call('PTTL', KEYS[1] .. ':' .. field .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then redis.call('PEXPIRE', KEYS[1], longest) return 0 end
  if mode == 'write' then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', chan, 0)
return 1"
SHA_SEM_ACQ=$(cli script load "$LUA_SEM_ACQUIRE")
SHA_SEM_REL=$(cli script load "$LUA_SEM_RELEASE")
SHA_READ_ACQ=$(cli script load "$LUA_READ_ACQUIRE")
SHA_READ_REL=$(cli script load "$LUA_READ_RELEASE")

MULTI_KEYS=${BENCH_MULTI_KEYS:-50000}
MULTI_REPS=${BENCH_MULTI_REPS:-3}
MULTI_REL_KEYS=${BENCH_MULTI_REL_KEYS:-100000}
MULTI_REL_N=${BENCH_MULTI_REL_N:-20000}
MULTI_LIMIT=100
FAR=9999999999999   # a permit expiry far in the future (unix ms)
lease_ctr() { cli info lease | tr -d '\r' | awk -F: -v n="lease_$1" '$1 == n { print $2 }'; }
snap() { ACQ0=$(lease_ctr acquired); REL0=$(lease_ctr released); }
eff_acquired() { echo $(( $(lease_ctr acquired) - ACQ0 )); }
eff_released() { echo $(( $(lease_ctr released) - REL0 )); }
eff_calls() { read -r c _ < <(cmdstat "$1"); echo "$c"; }
eff_zadd() { eff_calls zadd; }      # semaphore acquires that took a permit
eff_incrby() { eff_calls incrby; }  # semaphore releases that returned one
eff_set() { eff_calls set; }        # read-lock acquires that took the lock
eff_hincrby() { eff_calls hincrby; }  # read-lock releases of a held read lock
# The keys of one kind hold `holders` holders already (h1, h2, ...; then
# `owner` when given): LIMIT keys ml:N, SHARED keys ms:N, semaphores rs:N
# (the counter of free permits) with rs:N:timeout, read locks rw:N.
prefill_kind() { # kind, keys, holders, [owner]
  local kind=$1 keys=$2 all o
  all=$(seq -f 'h%g' 1 "$3")
  [ -n "${4:-}" ] && all="$all $4"
  [ "$kind" = sem ] && prefill "SET rs:%012d $((MULTI_LIMIT - $(wc -w <<<"$all")))" 0 "$keys"
  for o in $all; do
    case $kind in
      limit) prefill "LEASE.ACQUIRE ml:%012d $o $LONG_TTL LIMIT $MULTI_LIMIT" 0 "$keys" ;;
      shared) prefill "LEASE.ACQUIRE ms:%012d $o $LONG_TTL SHARED" 0 "$keys" ;;
      sem) prefill "ZADD rs:%012d:timeout $FAR $o" 0 "$keys" ;;
      read) prefill "EVALSHA $SHA_READ_ACQ 1 rw:%012d $LONG_TTL $o rw-writer" 0 "$keys" ;;
    esac
  done
}
held_limit() { flush; prefill_kind limit "$MULTI_REL_KEYS" 3 "$OWNER"; snap; }
held_shared() { flush; prefill_kind shared "$MULTI_REL_KEYS" 3 "$OWNER"; snap; }
held_sem() { flush; prefill_kind sem "$MULTI_REL_KEYS" 3 "$OWNER"; }
held_read() { flush; prefill_kind read "$MULTI_REL_KEYS" 3 "$OWNER"; }

log "C1 acquire of counting and shared leases: $MULTI_KEYS keys with 3 holders each"
flush
for kind in limit sem shared read; do prefill_kind "$kind" "$MULTI_KEYS" 3; done
LAST_N=$N
for rep in $(seq "$MULTI_REPS"); do
  one_run macq_limit LEASE.ACQUIRE snap eff_acquired -- -n "$N" -r "$MULTI_KEYS" \
    LEASE.ACQUIRE ml:__rand_int__ o:__rand_int__ "$LONG_TTL" LIMIT "$MULTI_LIMIT"
  one_run macq_sem evalsha nothing eff_zadd -- -n "$N" -r "$MULTI_KEYS" \
    EVALSHA "$SHA_SEM_ACQ" 1 rs:__rand_int__ o:__rand_int__ "$LONG_TTL"
  one_run macq_shared LEASE.ACQUIRE snap eff_acquired -- -n "$N" -r "$MULTI_KEYS" \
    LEASE.ACQUIRE ms:__rand_int__ o:__rand_int__ "$LONG_TTL" SHARED
  one_run macq_read evalsha nothing eff_set -- -n "$N" -r "$MULTI_KEYS" \
    EVALSHA "$SHA_READ_ACQ" 1 rw:__rand_int__ "$LONG_TTL" o:__rand_int__ rw-writer
done
HOLDERS_AFTER=$(( $(cli LEASE.INFO ml:000000000007 | grep -c '^token$') - 1 ))
MEMUSAGE_LIMIT=$(cli memory usage ml:000000000007)
MEMUSAGE_SEM=$(( $(cli memory usage rs:000000000007) + $(cli memory usage rs:000000000007:timeout) ))

LAST_N=$MULTI_REL_N
for rep in $(seq "$REL_REPS"); do
  log "C2 release of counting and shared leases, run $rep of $REL_REPS: $MULTI_REL_KEYS keys with 4 holders each"
  one_run mrel_limit LEASE.RELEASE held_limit eff_released -- -n "$MULTI_REL_N" -r "$MULTI_REL_KEYS" \
    LEASE.RELEASE ml:__rand_int__ "$OWNER"
  one_run mrel_sem evalsha held_sem eff_incrby -- -n "$MULTI_REL_N" -r "$MULTI_REL_KEYS" \
    EVALSHA "$SHA_SEM_REL" 1 rs:__rand_int__ "$OWNER"
  one_run mrel_shared LEASE.RELEASE held_shared eff_released -- -n "$MULTI_REL_N" -r "$MULTI_REL_KEYS" \
    LEASE.RELEASE ms:__rand_int__ "$OWNER"
  one_run mrel_read evalsha held_read eff_hincrby -- -n "$MULTI_REL_N" -r "$MULTI_REL_KEYS" \
    EVALSHA "$SHA_READ_REL" 1 rw:__rand_int__ "$OWNER"
done
flush

# --- B. hand-off latency, 1,000 waiters, mass timeout --------------------------
log "B hand-off (bench/handoff.rs; its B4 mass timeout takes about 30 s)"
PART_B=$(CLK_TCK=$(getconf CLK_TCK) "$HANDOFF" "$PORT" "$SERVER_PID")

INFO_LEASE=$(cli info lease | tr -d '\r' | grep -v '^#' | grep . | paste -sd' ' -)
log "done"

# --- report -------------------------------------------------------------------
row() { # label, operation, command
  printf '| %s | `%s` | %s | %s | %s |\n' "$2" "$3" "$(usec_per_call "$1")" "$(median_rps "$1")" "$(effect_pct "$1")"
}
{
  echo "# Benchmark results"
  echo
  echo "- Command: \`make bench\` (= \`make build\` + \`bash bench/run.sh\`), defaults (BENCH_N=$N, BENCH_REPS=$REPS)"
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), run took $(( $(date +%s) - T_START )) s"
  echo "- Machine: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -sr)"
  echo "- Server: $("$SERVER_BIN" --version | awk '{ print $1, $2, $3 }'), \`--save '' --appendonly no\`, module built from commit $BUILT_FROM"
  echo "- Client and server share the $(nproc) cores. Absolute numbers drift between runs and machines; compare ratios within one run."
  echo
  echo "## A. Server cost and pipelined throughput"
  echo
  echo "usec/call: \`INFO commandstats\` after \`CONFIG RESETSTAT\`, summed over the runs of each variant ($REPS interleaved runs; release $REL_REPS) (server time only; for EVALSHA the whole script)."
  echo "ops/s: median of the runs of \`redis-benchmark -P 16 -c 20 -n $N -r <range>\` (release: $REL_REPS runs, each on a fresh prefill)."
  echo "did the work: share of the calls that acquired / renewed / released / passed the check (the rest hit an already held or already released key)."
  echo
  echo "| operation | command | usec/call | ops/s | did the work |"
  echo "|---|---|---:|---:|---:|"
  row acq_lease "acquire: module" "LEASE.ACQUIRE lk:R owner:R $LONG_TTL"
  row acq_set "acquire: plain lock, no token" "SET lk:R owner:R NX PX $LONG_TTL"
  row acq_lua "acquire: Lua fenced (SET NX PX, then INCR)" "EVALSHA fenced 2 lk:R tk:R owner:R $LONG_TTL"
  row acq_redisson "acquire: Redisson-style fenced lock script" "EVALSHA redisson 2 lk:R tk:R $LONG_TTL owner:R"
  row rel_lease "release: module" "LEASE.RELEASE lk:R owner"
  row rel_del "release: plain DEL (no owner check)" "DEL lk:R"
  row rel_lua "release: Lua compare-and-delete" "EVALSHA cad 1 lk:R owner"
  row renew_lease "renew: module" "LEASE.RENEW rl:R owner $LONG_TTL"
  row renew_lua "renew: Lua compare-and-PEXPIRE" "EVALSHA renew 1 rs:R owner $LONG_TTL"
  row fence_lease "fence check: module" "LEASE.FENCE fence:lease <token>"
  row fence_lua "fence check: Lua GET + compare (+ EXISTS lock)" "EVALSHA fence 2 fence:lock fence:lock:token <token>"
  echo
  echo "R = \`__rand_int__\`: a random 12-digit number per occurrence and request; acquire uses \`-r $R_ACQ\` on an empty keyspace, release \`-r $R_REL\` on $R_REL prefilled held keys, renew \`-r 100000\` (100,000 prefilled held keys), the fence check one held key (its token is fixed: $FENCE_N requests, no R)."
  echo "Sanity: \`LEASE.FENCE fence:lease $TOKEN\` answered \`$FENCE_CHECK_LEASE\`; the Lua fence answered \`$FENCE_CHECK_LUA\`."
  echo
  echo "### Ratios (server time per call)"
  echo
  echo "| ratio | value |"
  echo "|---|---:|"
  echo "| LEASE.ACQUIRE / SET NX PX | $(ratio "$(usec_per_call acq_lease)" "$(usec_per_call acq_set)") |"
  echo "| LEASE.ACQUIRE / Lua fenced acquire | $(ratio "$(usec_per_call acq_lease)" "$(usec_per_call acq_lua)") |"
  echo "| LEASE.ACQUIRE / Redisson-style script | $(ratio "$(usec_per_call acq_lease)" "$(usec_per_call acq_redisson)") |"
  echo "| LEASE.RELEASE / Lua compare-and-delete | $(ratio "$(usec_per_call rel_lease)" "$(usec_per_call rel_lua)") |"
  echo "| LEASE.RELEASE / DEL | $(ratio "$(usec_per_call rel_lease)" "$(usec_per_call rel_del)") |"
  echo "| LEASE.RENEW / Lua compare-and-PEXPIRE | $(ratio "$(usec_per_call renew_lease)" "$(usec_per_call renew_lua)") |"
  echo "| LEASE.FENCE / Lua GET + compare | $(ratio "$(usec_per_call fence_lease)" "$(usec_per_call fence_lua)") |"
  echo "| bytes per lease / bytes per SET NX lock + counter key | $(ratio "$MEM_LEASE" "$MEM_LUA") |"
  echo
  echo "### Memory per held lock ($MEM_LEASES locks, used_memory delta / $MEM_LEASES)"
  echo
  echo "| lock | bytes per lock | MEMORY USAGE of one key |"
  echo "|---|---:|---:|"
  echo "| lease key (\`LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL\`) | $MEM_LEASE | $MEMUSAGE_LEASE |"
  echo "| SET NX PX lock + its fencing counter key (Lua fenced acquire on \`lk:%012d\`, \`lk:%012d:token\`) | $MEM_LUA | $MEMUSAGE_LOCK + $MEMUSAGE_COUNTER |"
  echo
  echo "The counters hold 1 (a shared integer object); a counter past 9999 costs a bit more."
  echo
  echo "### Scale: server time of an acquire on a free key, by live leases"
  echo
  echo "$SCALE_ROUNDS rounds of 1,000 acquires on free keys then 1,000 releases, through one pipe (redis-cli --pipe)."
  echo
  echo "| live leases | LEASE.ACQUIRE usec/call | SET NX PX usec/call (same keyspace) | ratio |"
  echo "|---:|---:|---:|---:|"
  for s in "${SCALES[@]}"; do
    [ -n "${SCALE_LEASE[$s]:-}" ] || continue
    echo "| $s (dbsize after: ${SCALE_LIVE[$s]}) | ${SCALE_LEASE[$s]} | ${SCALE_SET[$s]} | $(ratio "${SCALE_LEASE[$s]}" "${SCALE_SET[$s]}") |"
  done
  echo
  echo "## C. Counting and shared leases against Redisson-style scripts"
  echo
  echo "Same columns as part A. Acquire: $MULTI_REPS interleaved runs of \`-n $N -r $MULTI_KEYS\` on $MULTI_KEYS keys of each kind that held 3 holders each before the first run (a random new owner or permit id per call, so each call adds a holder; about $((N / MULTI_KEYS)) more per key per run). Release: $REL_REPS runs of \`-n $MULTI_REL_N -r $MULTI_REL_KEYS\`, each on $MULTI_REL_KEYS freshly prefilled keys with 4 holders, one of them \`$OWNER\`, whose holding the call gives back (the rest of the calls hit a key where it was already given back)."
  echo "The scripts are written from the documented algorithms of Redisson's RPermitExpirableSemaphore and RReadWriteLock (read side); see bench/README.md."
  echo
  echo "| operation | command | usec/call | ops/s | did the work |"
  echo "|---|---|---:|---:|---:|"
  row macq_limit "acquire: LIMIT lease" "LEASE.ACQUIRE ml:R o:R $LONG_TTL LIMIT $MULTI_LIMIT"
  row macq_sem "acquire: Redisson-style expirable semaphore" "EVALSHA sem-acquire 1 rs:R o:R $LONG_TTL"
  row macq_shared "acquire: SHARED lease" "LEASE.ACQUIRE ms:R o:R $LONG_TTL SHARED"
  row macq_read "acquire: Redisson-style read lock" "EVALSHA read-acquire 1 rw:R $LONG_TTL o:R rw-writer"
  row mrel_limit "release: LIMIT lease" "LEASE.RELEASE ml:R $OWNER"
  row mrel_sem "release: Redisson-style expirable semaphore" "EVALSHA sem-release 1 rs:R $OWNER"
  row mrel_shared "release: SHARED lease" "LEASE.RELEASE ms:R $OWNER"
  row mrel_read "release: Redisson-style read lock" "EVALSHA read-release 1 rw:R $OWNER"
  echo
  echo "| ratio (server time per call) | value |"
  echo "|---|---:|"
  echo "| LIMIT acquire / semaphore script acquire | $(ratio "$(usec_per_call macq_limit)" "$(usec_per_call macq_sem)") |"
  echo "| LIMIT release / semaphore script release | $(ratio "$(usec_per_call mrel_limit)" "$(usec_per_call mrel_sem)") |"
  echo "| SHARED acquire / read-lock script acquire | $(ratio "$(usec_per_call macq_shared)" "$(usec_per_call macq_read)") |"
  echo "| SHARED release / read-lock script release | $(ratio "$(usec_per_call mrel_shared)" "$(usec_per_call mrel_read)") |"
  echo "| SHARED acquire / exclusive LEASE.ACQUIRE (part A) | $(ratio "$(usec_per_call macq_shared)" "$(usec_per_call acq_lease)") |"
  echo
  echo "After the acquire runs, \`ml:000000000007\` had $HOLDERS_AFTER holders: \`MEMORY USAGE\` $MEMUSAGE_LIMIT bytes, against $MEMUSAGE_SEM for the semaphore's counter and sorted set \`rs:000000000007\` (which hold the same number of permits only on average)."
  echo
  echo "## B. Blocking hand-off (bench/handoff.rs, same server)"
  echo
  echo "$PART_B"
  echo
  echo "## Server counters at the end (INFO lease)"
  echo
  echo "\`$INFO_LEASE\`"
} >"$OUT"
cat "$OUT"

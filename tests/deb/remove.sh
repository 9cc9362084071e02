#!/usr/bin/env bash
# Taking the module out again (docs/operations.md, "Taking the module
# out"), on a server run by hand, done for real and checked:
#   - "file": a server started from deploy/standalone.conf (AOF on; the
#     loadmodule line pointed at MODULE, port and dir set as
#     tests/setups.rs does);
#   - "rdb": a server whose file has only a loadmodule line (RDB only, as
#     Debian's redis.conf with the module added by hand).
# Each holds keys of every kind in two databases, lease keys of every
# kind (exclusive, counting, shared, multi-key, a guard whose tag holds
# data) and a snapshot saved while they existed. First the control: a copy
# of its data directory, started without the module, does not serve (the
# server exits, and its log says why). Then the page's steps, the lease
# script taken from the page itself; the server, restarted from its file
# without the module, serves every key that is not a lease (same value,
# same expiry) and no lease key, the guarded key is writable again, and
# after SAVE it also starts from its RDB file alone.
#
#   bash tests/deb/remove.sh /usr/bin/redis-server target/release/libredis_lease.so
#   bash tests/deb/remove.sh "$REDIS82_SERVER" target/release/libredis_lease.so
#
# Needs bash and redis-cli; not root: it runs its own servers on free
# ports in a scratch directory and stops them (by their pids) at the end.
set -euo pipefail
# The server's path as given, made absolute but not resolved: Debian's
# /usr/bin/redis-server is a link to redis-check-rdb, which acts on its name.
server=${1:?usage: remove.sh path/to/redis-server path/to/module.so}
case $server in /*) ;; *) server=$PWD/$server ;; esac
module=$(realpath "${2:?usage: remove.sh path/to/redis-server path/to/module.so}")
cd "$(dirname "$0")/../.."
page=${LEASE_OPERATIONS_MD:-docs/operations.md}

say() { echo "remove-test: $*"; }
fail() { echo "remove-test: FAILED: $*" >&2; exit 1; }

# The page's script, as the page gives it (between LEASES=' and its quote).
LEASES=$(sed -n "/^ *LEASES='/,/^ *return n'\$/p" "$page" | sed -e 's/^   //' -e "1s/^LEASES='//" -e "\$s/'\$//")
case $LEASES in *'TYPE", "leasetype"'*'return n') ;; *) fail "no LEASES script in $page" ;; esac

work=$(mktemp -d)
pids=()
cleanup() {
  rc=$?
  set +e
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; done
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { for p in $(seq "$1" $(($1 + 200))); do port_busy "$p" || { echo "$p"; return; }; done; fail "no free port from $1"; }

# start CONF LOG: the server in the foreground of a background job; its pid
# in $pid. up PORT: waits until it answers PING (or has exited).
start() { "$server" "$1" >"$2" 2>&1 & pid=$!; pids+=("$pid"); }
up() {
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$1" PING 2>/dev/null)" = PONG ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop() { # stop PORT: SHUTDOWN (a clean one: final save and AOF flushed), waits for the exit
  redis-cli -p "$1" SHUTDOWN >/dev/null 2>&1 || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  fail "the server on $1 did not stop"
}

# Every key that is not a lease, with its value (DUMP) and whether it
# expires, sorted: what must survive.
state() {
  local port=$1 db key type ttl
  for db in $(redis-cli -p "$port" INFO keyspace | sed -n 's/^db\([0-9]*\):.*/\1/p'); do
    while IFS= read -r key; do
      type=$(redis-cli -p "$port" -n "$db" TYPE "$key")
      [ "$type" = leasetype ] && continue
      ttl=$(redis-cli -p "$port" -n "$db" PTTL "$key")
      [ "$ttl" -gt 0 ] && ttl=expires
      printf '%s %s %s %s %s\n' "$db" "$key" "$type" "$ttl" "$(redis-cli -p "$port" -n "$db" --no-raw DUMP "$key")"
    done < <(redis-cli -p "$port" -n "$db" --scan)
  done | sort
}
leases() { # leases PORT: lease keys left, over every database
  local port=$1 n=0 db
  for db in $(redis-cli -p "$port" INFO keyspace | sed -n 's/^db\([0-9]*\):.*/\1/p'); do
    n=$((n + $(redis-cli -p "$port" -n "$db" EVAL_RO "$LEASES" 0 count)))
  done
  echo "$n"
}

# The data: plain keys of every type, one with an expiry, in db 0 and 7;
# a lease key of every kind; {acct:7} guarded by its lease key, written
# before the guard.
fill() {
  local c=(redis-cli -p "$1")
  "${c[@]}" SET plain v >/dev/null
  "${c[@]}" SET session s PX 3600000 >/dev/null
  "${c[@]}" HSET h a 1 b 2 >/dev/null
  "${c[@]}" RPUSH l a b c >/dev/null
  "${c[@]}" SADD s 1 2 3 >/dev/null
  "${c[@]}" ZADD z 1 a 2 b >/dev/null
  "${c[@]}" XADD st '*' f v >/dev/null
  "${c[@]}" SET '{acct:7}balance' 100 >/dev/null
  "${c[@]}" -n 7 SET other 7 >/dev/null
  for cmd in "LEASE.ACQUIRE job:1 me 30000" "LEASE.ACQUIRE pool me 30000 LIMIT 3" \
             "LEASE.ACQUIRE rw me 30000 SHARED" "LEASE.MACQUIRE 2 {m}a {m}b me 30000" \
             "LEASE.ACQUIRE lock:{acct:7} me 30000" "LEASE.GUARD lock:{acct:7}"; do
    # shellcheck disable=SC2086
    out=$("${c[@]}" $cmd) || fail "$cmd: $out"
    case $out in '' | ERR* | *rror*) fail "$cmd: '$out'" ;; esac
  done
  "${c[@]}" -n 7 LEASE.ACQUIRE job:7 me 30000 >/dev/null
  case $("${c[@]}" SET '{acct:7}balance' 0) in FENCED*) ;; *) fail "the guard did not refuse a write" ;; esac
  [ "$(leases "$1")" = 7 ] || fail "7 lease keys expected, $(leases "$1") found"
  "${c[@]}" SAVE >/dev/null
}

# A copy of DIR started without the module (CONF without its loadmodule
# line) must not serve: the server exits, and the log says why.
control() {
  local kind=$1 dir=$2 conf=$3 port copy
  copy=$work/control-$kind
  cp -a "$dir" "$copy"
  port=$(free_port 17500)
  grep -v '^loadmodule ' "$conf" | sed -e "s|^dir .*|dir $copy|" -e "s|^port .*|port $port|" > "$copy/server.conf"
  start "$copy/server.conf" "$copy/log"
  if up "$port"; then fail "control ($kind): the server started without the module on data saved with it"; fi
  wait "$pid" 2>/dev/null && fail "control ($kind): the server exited with status 0"
  grep -E "AUX module data I can't load|Unknown command 'LEASE\.|no matching module" "$copy/log" | sed 's/^/    /' ||
    fail "control ($kind): no line in the log says why it did not start: $(tail -3 "$copy/log")"
}

run() { # run file|rdb
  local kind=$1 dir=$work/$1 port conf before after db n
  port=$(free_port 17300)
  mkdir -p "$dir"
  conf=$dir/server.conf
  if [ "$kind" = file ]; then
    # deploy/standalone.conf as tests/setups.rs starts it: the module's path,
    # dir and port; grace-ms 0 for the first start of an empty server.
    sed -e "s|^loadmodule .*|loadmodule $module grace-ms 0|" -e "s|^dir .*|dir $dir|" -e "s|^port .*|port $port|" \
      deploy/standalone.conf > "$conf"
    grep -qx 'appendonly yes' "$conf" || fail "deploy/standalone.conf has no 'appendonly yes'"
  else
    printf 'port %s\nbind 127.0.0.1\ndir %s\nloadmodule %s grace-ms 0\n' "$port" "$dir" "$module" > "$conf"
  fi
  say "$kind: $("$server" --version | cut -d' ' -f1-3) with the module on $port"
  start "$conf" "$dir/log"
  up "$port" || fail "$kind: the server did not start: $(tail -5 "$dir/log")"
  fill "$port"
  before=$(state "$port")
  say "$kind: $(wc -l <<<"$before") keys that are not leases, 7 lease keys"

  say "$kind: control: the data as it is, started without the module"
  stop "$port"
  control "$kind" "$dir" "$conf"
  start "$conf" "$dir/log"
  up "$port" || fail "$kind: the server did not start again with the module"

  say "$kind: step 2, delete every lease key"
  n=0
  for db in $(redis-cli -p "$port" INFO keyspace | sed -n 's/^db\([0-9]*\):.*/\1/p'); do
    n=$((n + $(redis-cli -p "$port" -n "$db" EVAL "$LEASES" 0 unlink)))
  done
  [ "$n" = 7 ] || fail "$kind: the script deleted $n lease keys, not 7"

  say "$kind: step 3, the module out of the server's file"
  if [ "$kind" = file ]; then
    sed -i '/^loadmodule /d' "$conf"
  else
    sed -i 's|^loadmodule .*|appendonly yes|' "$conf"
  fi

  say "$kind: step 4, pause writes, check, rewrite the AOF as plain commands"
  redis-cli -p "$port" CLIENT PAUSE 600000 WRITE >/dev/null
  [ "$(leases "$port")" = 0 ] || fail "$kind: lease keys left"
  redis-cli -p "$port" CONFIG SET aof-use-rdb-preamble no >/dev/null
  if [ "$(redis-cli -p "$port" CONFIG GET appendonly | sed -n 2p)" = yes ]; then
    [ "$kind" = file ] || fail "$kind: appendonly is already yes"
    redis-cli -p "$port" BGREWRITEAOF
  else
    [ "$kind" = rdb ] || fail "$kind: appendonly is no"
    redis-cli -p "$port" CONFIG SET appendonly yes
  fi
  for _ in $(seq 600); do
    redis-cli -p "$port" INFO persistence | grep -Eq '^aof_rewrite_(in_progress|scheduled):1' || break
    sleep 0.1
  done
  redis-cli -p "$port" INFO persistence | grep -q '^aof_last_bgrewrite_status:ok' || fail "$kind: the rewrite failed"
  # Time for the module's announcement, had it not been held back.
  sleep 0.5

  say "$kind: step 5, restart from the file, without the module"
  stop "$port"
  start "$conf" "$dir/log.after"
  up "$port" || fail "$kind: the server did not start without the module: $(tail -5 "$dir/log.after")"
  # (Redis 8 lists its built-in modules, vectorset among them.)
  ! redis-cli -p "$port" MODULE LIST | grep -qx lease || fail "$kind: the module lease is loaded"
  after=$(state "$port")
  [ "$after" = "$before" ] || fail "$kind: the keys differ: $(diff <(echo "$before") <(echo "$after"))"
  [ "$(redis-cli -p "$port" --scan | grep -c -E '^(job:1|pool|rw|\{m\}a|\{m\}b|lock:\{acct:7\})$')" = 0 ] || fail "$kind: a lease key is left"
  [ "$(redis-cli -p "$port" SET '{acct:7}balance' 0)" = OK ] || fail "$kind: the guarded key is not writable"
  redis-cli -p "$port" SET '{acct:7}balance' 100 >/dev/null
  say "$kind: serves all $(wc -l <<<"$after") keys that are not leases, no lease key, the guarded key writable"

  say "$kind: step 6, SAVE, then start from the RDB file alone"
  redis-cli -p "$port" SAVE >/dev/null
  redis-cli -p "$port" CONFIG SET appendonly no >/dev/null
  stop "$port"
  sed -i '/^appendonly /d' "$conf"
  echo 'appendonly no' >> "$conf"
  start "$conf" "$dir/log.rdb"
  up "$port" || fail "$kind: the server did not start from its RDB file: $(tail -5 "$dir/log.rdb")"
  grep -q 'DB loaded from disk' "$dir/log.rdb" || fail "$kind: not loaded from the RDB file"
  after=$(state "$port")
  [ "$after" = "$before" ] || fail "$kind: from the RDB file, the keys differ: $(diff <(echo "$before") <(echo "$after"))"
  stop "$port"
  say "$kind: PASSED"
}

run file
run rdb
say "PASSED: $("$server" --version | cut -d' ' -f1-3): both setups, without the module, serve every key that is not a lease"

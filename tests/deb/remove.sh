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
# data) and a snapshot saved while they existed. First the controls: a copy
# of its data directory, started without the module, does not serve (the
# server exits, and its log says why), nor does a copy whose AOF was
# rewritten without the pause of step 4. Then the page's steps, the lease
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

# (checked on its own by shellcheck)
# shellcheck disable=SC1091
. tests/deb/common.sh
# shellcheck disable=SC2034 # used by the functions of common.sh
LEASES=$(leases_script "$page")

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
  grep -iE "AUX module data I can't load|Unknown command 'LEASE\.|no matching module" "$copy/log" | sed 's/^/    /' ||
    fail "control ($kind): no line in the log says why it did not start: $(tail -3 "$copy/log")"
}

# The same steps on a copy of DIR, but the rewrite without the pause: the
# module writes its announcements into the new AOF, and the copy, started
# without the module, does not serve. (Why step 4 pauses writes.)
control_unpaused() {
  local dir=$1 conf=$2 port copy
  copy=$work/control-unpaused
  cp -a "$dir" "$copy"
  port=$(free_port 17600)
  sed -e "s|^dir .*|dir $copy|" -e "s|^port .*|port $port|" "$conf" > "$copy/with-module.conf"
  start "$copy/with-module.conf" "$copy/log"
  up "$port" || fail "control (unpaused): the copy did not start with the module"
  redis-cli -p "$port" CONFIG SET aof-use-rdb-preamble no >/dev/null
  redis-cli -p "$port" BGREWRITEAOF >/dev/null
  for _ in $(seq 600); do
    redis-cli -p "$port" INFO persistence | grep -Eq '^aof_rewrite_(in_progress|scheduled):1' || break
    sleep 0.1
  done
  sleep 0.5
  stop "$port"
  grep -v '^loadmodule ' "$copy/with-module.conf" > "$copy/server.conf"
  start "$copy/server.conf" "$copy/log.after"
  if up "$port"; then fail "control (unpaused): the copy started without the module"; fi
  grep -iE "unknown command 'LEASE\." "$copy/log.after" | sed 's/^/    /' ||
    fail "control (unpaused): no line says why it did not start: $(tail -3 "$copy/log.after")"
}

run() { # run file|rdb
  local kind=$1 dir=$work/$1 port conf before n out
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
  n=$(unlink_leases "$port")
  [ "$n" = 7 ] || fail "$kind: the script deleted $n lease keys, not 7"

  if [ "$kind" = file ]; then
    say "$kind: control: the next steps without the pause, on a copy"
    control_unpaused "$dir" "$conf"
  fi

  say "$kind: step 3, the module out of the server's file"
  if [ "$kind" = file ]; then
    sed -i '/^loadmodule /d' "$conf"
  else
    sed -i 's|^loadmodule .*|appendonly yes|' "$conf"
  fi

  say "$kind: step 4, pause writes, check, rewrite the AOF as plain commands"
  out=$(rewrite_paused "$port")
  echo "    $out"
  case $kind:$out in file:BGREWRITEAOF* | rdb:"CONFIG SET appendonly yes"*) ;; *) fail "$kind: $out" ;; esac

  say "$kind: step 5, restart from the file, without the module"
  stop "$port"
  start "$conf" "$dir/log.after"
  up "$port" || fail "$kind: the server did not start without the module: $(tail -5 "$dir/log.after")"
  # (Redis 8 lists its built-in modules, vectorset among them.)
  ! redis-cli -p "$port" MODULE LIST | grep -qx lease || fail "$kind: the module lease is loaded"
  after_removal "$port" "$before"
  say "$kind: serves all $(wc -l <<<"$before") keys that are not leases, no lease key, the guarded key writable"

  say "$kind: step 6, SAVE, then start from the RDB file alone"
  redis-cli -p "$port" SAVE >/dev/null
  redis-cli -p "$port" CONFIG SET appendonly no >/dev/null
  stop "$port"
  sed -i '/^appendonly /d' "$conf"
  echo 'appendonly no' >> "$conf"
  start "$conf" "$dir/log.rdb"
  up "$port" || fail "$kind: the server did not start from its RDB file: $(tail -5 "$dir/log.rdb")"
  grep -q 'DB loaded from disk' "$dir/log.rdb" || fail "$kind: not loaded from the RDB file"
  after_removal "$port" "$before"
  stop "$port"
  say "$kind: PASSED"
}

run file
run rdb
say "PASSED: $("$server" --version | cut -d' ' -f1-3): both setups, without the module, serve every key that is not a lease"

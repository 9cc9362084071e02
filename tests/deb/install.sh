#!/usr/bin/env bash
# The README's "Install from the Debian package", done for real on this
# machine's own redis-server (Debian's package), then undone:
#   1. apt-get install ./redis-lease_<version>_<arch>.deb
#   2. the one line `include /etc/redis/redis-lease.conf` at the end of
#      Debian's /etc/redis/redis.conf
#   3. service redis-server restart
#   4. the quick start with redis-cli: me gets a token, you gets nil, me gets
#      the same token again, LEASE.INFO shows it; MODULE LIST and INFO lease
#      show the packaged version.
#   5. the module taken out again by the steps of the packaged
#      docs/operations.md, "Taking the module out" (the lease script read
#      from the installed page), with keys of every type in two databases
#      and a lease key of every kind: first the controls (the package's
#      prerm warns while redis.conf loads the module; the server restarted
#      with the include line only taken out does not serve, whatever the
#      init script says; the prerm warns again while the data still needs
#      the module), then the steps, apt-get remove without a warning, and
#      the restart without the module serves every key that is not a lease,
#      from the AOF and, after SAVE, from the RDB file alone.
# Afterwards it puts the machine back as it was: redis.conf, /var/lib/redis
# and /var/log/redis restored, redis-lease purged, and every package the
# install pulled in (redis-server on a fresh machine) purged too; the
# server stopped, or started again if it ran before.
#
# A shell script, not a Rust test: it needs only bash, apt and redis-cli,
# so it runs on a fresh Debian that has the .deb and no Rust toolchain.
#
#   bash tests/deb/install.sh target/package/redis-lease_0.5.0_amd64.deb
#   bash tests/deb/install.sh --may-run   # exit 0 if it would run, else say why not
#
# It changes the system, so it runs only as root, and only with CI=true or
# LEASE_DEB_TEST=1 (make test sets neither: a developer opts in).
set -euo pipefail

may_run() {
  if [ "$(id -u)" != 0 ]; then
    echo "deb-test skipped: it installs the package and restarts the system's redis-server, so it runs as root only"
    return 1
  fi
  if [ "${CI:-}" != true ] && [ "${LEASE_DEB_TEST:-}" != 1 ]; then
    echo "deb-test skipped: it changes /etc/redis/redis.conf and restarts the system's redis-server (and puts them back);"
    echo "  run it with LEASE_DEB_TEST=1 make test (CI runs it)"
    return 1
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [ ! -f /etc/debian_version ]; then
    echo "deb-test skipped: not a Debian system"
    return 1
  fi
}
if [ "${1:-}" = --may-run ]; then may_run; exit; fi
may_run || exit 0

deb=$(realpath "${1:?usage: install.sh path/to/redis-lease_VERSION_ARCH.deb}")
export DEBIAN_FRONTEND=noninteractive
say() { echo "deb-test: $*"; }
fail() { echo "deb-test: FAILED: $*" >&2; exit 1; }
# (checked on its own by shellcheck)
# shellcheck disable=SC1091
. "$(dirname "$0")/common.sh"
save=$(mktemp -d)
pidfile=/run/redis/redis-server.pid

running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Starts or stops Debian's redis-server the way the README says, with the
# init system. Where there is none that works (a container or chroot without
# an init whose `service` fails), the same server is started directly:
# redis-server /etc/redis/redis.conf as the user redis (Debian's file
# daemonizes and writes the pid file), and stopped by its pid file.
service_do() {
  if service redis-server "$1" >"$save/service.log" 2>&1; then return 0; fi
  say "'service redis-server $1' failed ($(tr '\n' ' ' <"$save/service.log")); doing it directly"
  case $1 in
    stop) if running; then kill "$(cat "$pidfile")"; for _ in $(seq 100); do running || break; sleep 0.1; done; fi ;;
    start)
      install -d -o redis -g redis -m 755 /run/redis
      runuser -u redis -- redis-server /etc/redis/redis.conf ;;
    restart) service_do stop && service_do start ;;
  esac
}

# --- the state to restore -------------------------------------------------
dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}' | sort > "$save/packages"
was_running=no
if running; then
  was_running=yes
  say "Debian's redis-server runs: stopped for the test (it saves its data), started again afterwards"
  service_do stop
fi
for d in /etc/redis /var/lib/redis /var/log/redis; do
  if [ -e "$d" ]; then mkdir -p "$save$(dirname "$d")" && cp -a "$d" "$save$d"; fi
done
had_redis_user=$(id -u redis >/dev/null 2>&1 && echo yes || echo no)
had_rundir=$([ -d /run/redis ] && echo yes || echo no)

restore() {
  rc=$?
  set +e
  say "restoring the machine"
  service_do stop
  [ -e /etc/redis/redis.conf ] && [ -e "$save/etc/redis/redis.conf" ] && cp -a "$save/etc/redis/redis.conf" /etc/redis/redis.conf
  apt-get purge -y -q -o DPkg::Lock::Timeout=300 redis-lease >"$save/purge.log" 2>&1 || cat "$save/purge.log"
  new=$(comm -13 "$save/packages" "$save/packages.after" 2>/dev/null | grep -vx redis-lease | tr '\n' ' ')
  if [ -n "$new" ]; then
    say "purging what the install pulled in: $new"
    # shellcheck disable=SC2086
    apt-get purge -y -q -o DPkg::Lock::Timeout=300 $new >>"$save/purge.log" 2>&1 || cat "$save/purge.log"
  fi
  for d in /etc/redis /var/lib/redis /var/log/redis; do
    if [ -e "$save$d" ]; then rm -rf "$d" && cp -a "$save$d" "$d"; fi
  done
  if [ "$had_redis_user" = no ] && id -u redis >/dev/null 2>&1; then userdel redis 2>/dev/null; fi
  # The init script makes /run/redis (a runtime directory): gone again.
  if [ "$had_rundir" = no ] && [ "$was_running" = no ]; then rm -rf /run/redis; fi
  [ "$was_running" = yes ] && service_do start
  rm -rf "$save"
  exit $rc
}
trap restore EXIT

# --- 1. the package -------------------------------------------------------
# A fresh machine has no package lists yet.
ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -q >"$save/apt.log" 2>&1 || { cat "$save/apt.log"; fail "apt-get update"; }
say "apt-get install -y $deb"
apt-get install -y -q -o DPkg::Lock::Timeout=300 "$deb" >"$save/apt.log" 2>&1 || { cat "$save/apt.log"; fail "apt-get install"; }
# What it pulled in, read while apt still held the lock (nobody else installed meanwhile).
dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}' | sort > "$save/packages.after"
version=$(dpkg-query -W -f '${Version}' redis-lease)
[ -f /usr/lib/redis/modules/redis_lease.so ] || fail "no /usr/lib/redis/modules/redis_lease.so"
say "installed redis-lease $version"

# --- 2. the one line in redis.conf ----------------------------------------
port=6379
# The package's postinst started redis-server on a fresh machine: ours to restart.
running && service_do stop
if port_busy $port; then
  # Something else holds 6379 (a `make run`, another server): the test's
  # server takes another port, set after the include line.
  port=$(for p in $(seq 16379 16479); do port_busy "$p" || { echo "$p"; break; }; done)
  say "port 6379 is held by another process: this server listens on $port instead (port $port after the include line)"
fi
echo "include /etc/redis/redis-lease.conf" >> /etc/redis/redis.conf
[ "$port" = 6379 ] || echo "port $port" >> /etc/redis/redis.conf

# --- 3. restart -----------------------------------------------------------
say "service redis-server restart"
service_do restart
cli() { redis-cli -p "$port" --no-raw "$@"; }
for _ in $(seq 100); do [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done
[ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] || { tail -20 /var/log/redis/redis-server.log; fail "redis-server did not answer on $port"; }

# --- 4. the quick start -----------------------------------------------------
expect() { # expect LABEL PATTERN OUTPUT
  printf '%s\n' "$3" | sed 's/^/    /'
  printf '%s\n' "$3" | grep -Eqx -- "$2" || fail "$1: expected /$2/"
}
say "redis-cli LEASE.ACQUIRE job:1 me 30000"
out=$(cli LEASE.ACQUIRE job:1 me 30000); expect "me acquires" '\(integer\) [0-9]+' "$out"
token=${out#(integer) }
say "redis-cli LEASE.ACQUIRE job:1 you 30000"
out=$(cli LEASE.ACQUIRE job:1 you 30000); expect "you is refused" '\(nil\)' "$out"
say "redis-cli LEASE.ACQUIRE job:1 me 30000"
out=$(cli LEASE.ACQUIRE job:1 me 30000); expect "me gets the same token" "\(integer\) $token" "$out"
say "redis-cli LEASE.INFO job:1"
out=$(cli LEASE.INFO job:1)
printf '%s\n' "$out" | sed 's/^/    /'
[ "$(redis-cli -p "$port" LEASE.INFO job:1 | sed -n 2p)" = "$token" ] || fail "LEASE.INFO: not token $token"
ttl=$(redis-cli -p "$port" LEASE.INFO job:1 | sed -n 4p)
if [ "$ttl" -le 0 ] || [ "$ttl" -gt 30000 ]; then fail "LEASE.INFO: ttl $ttl"; fi
[ "$(redis-cli -p "$port" LEASE.INFO job:1 | sed -n 6p)" = 0 ] || fail "LEASE.INFO: waiters"

# The version: MODULE LIST gives major*10000+minor*100+patch, INFO lease the
# version itself; both must be the package's (a tilde in the package version
# is Cargo.toml's hyphen).
semver=${version//\~/-}
IFS=. read -r major minor patch <<<"${semver%%[-+]*}"
number=$((major * 10000 + minor * 100 + patch))
say "redis-cli MODULE LIST"
out=$(redis-cli -p "$port" MODULE LIST)
printf '%s\n' "$out" | sed 's/^/    /'
[ "$(printf '%s\n' "$out" | grep -A3 -x name | sed -n 2p)" = lease ] || fail "MODULE LIST: no module lease"
[ "$(printf '%s\n' "$out" | grep -A1 -x ver | sed -n 2p)" = "$number" ] || fail "MODULE LIST: ver is not $number ($version)"
[ "$(redis-cli -p "$port" INFO lease | tr -d '\r' | sed -n 's/^lease_version://p')" = "$semver" ] || fail "INFO lease: lease_version is not $semver"
grep -q "lease module $semver (commit" /var/log/redis/redis-server.log || fail "no load line in /var/log/redis/redis-server.log"
say "quick start PASSED: package $version at /usr/lib/redis/modules/redis_lease.so, MODULE LIST ver $number, served on port $port"

# --- 5. taking the module out again -----------------------------------------
conf=/etc/redis/redis.conf
log=/var/log/redis/redis-server.log
prerm=/var/lib/dpkg/info/redis-lease.prerm
# shellcheck disable=SC2034 # used by the functions of common.sh
LEASES=$(leases_script /usr/share/doc/redis-lease/docs/operations.md)
# up: waits until the server answers PING (3 s: a server that cannot load
# its data exits at once).
up() { for _ in $(seq 30); do [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && return 0; sleep 0.1; done; return 1; }
prerm_says() { "$prerm" remove 2>&1 | sed 's/^/    /'; }

say "taking the module out: data of every kind and a lease key of every kind"
fill "$port"
before=$(state "$port")
say "$(wc -l <<<"$before") keys that are not leases, $(lease_keys "$port") lease keys, saved"

say "control: the package's prerm while redis.conf includes /etc/redis/redis-lease.conf"
out=$(prerm_says); printf '%s\n' "$out"
grep -q 'still loads the module' <<<"$out" || fail "the prerm did not warn that redis.conf loads the module"

say "control: only the include line taken out, service redis-server restart"
cp -a "$conf" "$save/redis.conf.with-include"
sed -i '\|^include /etc/redis/redis-lease\.conf$|d' "$conf"
: >"$log"
service_do restart
sed 's/^/    /' "$save/service.log"
if up; then fail "the server started without the module on data saved with it"; fi
# Debian's init script (no systemd here) reports the start as done: the
# server daemonizes before it reads its data (operations.md says so).
if grep -q 'Starting redis-server' "$save/service.log"; then
  # (A container's ulimit error may come between "Starting redis-server: "
  # and the script's "redis-server.")
  tr -d '\n' <"$save/service.log" | grep -q 'Starting redis-server: .*redis-server\.$' ||
    fail "the init script did not report success: the page says it does"
fi
grep "AUX module data I can't load" "$log" | sed 's/^/    /' || fail "no line in $log says why the server did not start"
cp -a "$save/redis.conf.with-include" "$conf"
running && service_do stop
service_do start
up || fail "the server did not start again with the module"
[ "$(state "$port")" = "$before" ] || fail "the keys changed across the failed start"
[ "$(lease_keys "$port")" = 7 ] || fail "the lease keys did not survive the failed start"

say "step 2: delete every lease key (the installed page's script)"
n=$(unlink_leases "$port")
[ "$n" = 7 ] || fail "the script deleted $n lease keys, not 7"
say "step 3: the include line replaced with appendonly yes"
sed -i 's|^include /etc/redis/redis-lease\.conf$|appendonly yes|' "$conf"
grep -qx 'appendonly yes' "$conf" || fail "no include line to replace"
say "control: the prerm while the AOF still has the module's data"
out=$(prerm_says); printf '%s\n' "$out"
grep -q 'still needs the module' <<<"$out" || fail "the prerm did not warn that the data needs the module"
say "step 4: pause writes, check, rewrite the AOF as plain commands"
out=$(rewrite_paused "$port"); echo "    $out"
case $out in BGREWRITEAOF*) ;; *) fail "appendonly was not yes with the package's file: $out" ;; esac
say "step 5: service redis-server restart, without the module"
: >"$log"
service_do restart
up || { tail -5 "$log"; fail "the server did not start without the module"; }
! redis-cli -p "$port" MODULE LIST | grep -qx lease || fail "the module lease is loaded"
after_removal "$port" "$before"
say "serves all $(wc -l <<<"$before") keys that are not leases, no lease key, the guarded key writable"
say "step 6: SAVE"
[ "$(redis-cli -p "$port" SAVE)" = OK ] || fail "SAVE"
say "step 7: apt-get remove redis-lease"
apt-get remove -y -q -o DPkg::Lock::Timeout=300 redis-lease >"$save/remove.log" 2>&1 || { cat "$save/remove.log"; fail "apt-get remove"; }
if grep 'redis-lease:' "$save/remove.log"; then fail "the prerm warned after the steps"; fi
[ ! -e /usr/lib/redis/modules/redis_lease.so ] || fail "the module's file is still there"
rm -f /var/lib/redis/lease-*.mark
say "back to Debian's RDB-only settings, restart"
redis-cli -p "$port" CONFIG SET appendonly no >/dev/null
sed -i '/^appendonly yes$/d' "$conf"
: >"$log"
service_do restart
up || { tail -5 "$log"; fail "the server did not start from its RDB file"; }
grep -q 'DB loaded from disk' "$log" || fail "not loaded from the RDB file"
after_removal "$port" "$before"
say "PASSED: package $version installed, quick start served on port $port, taken out again: every key that is not a lease served, from the AOF and from the RDB file"

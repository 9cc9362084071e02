#!/bin/sh
# prerm of redis-lease. On removal (not on upgrade), warns loudly when
# Debian's redis-server would not start again once the module's file is
# gone: when /etc/redis/redis.conf still loads the module, or when the data
# it would load at its next start (the AOF with appendonly yes, else the
# RDB file) still needs the module (lease keys, the token clock, LEASE.*
# commands). It never stops the removal: the running server keeps the
# module it loaded, and the steps can still be done (docs/operations.md,
# "Taking the module out").
set -e
[ "$1" = remove ] || exit 0

conf=/etc/redis/redis.conf
[ -r "$conf" ] || exit 0

warn() { echo "redis-lease: $*" >&2; }

# The last value of a setting in redis.conf, without quotes; else $2.
setting() {
  v=$(sed -n "s/^[[:space:]]*$1[[:space:]][[:space:]]*//p" "$conf" | tail -n 1 |
      sed -e 's/[[:space:]]*$//' -e 's/^"\(.*\)"$/\1/')
  echo "${v:-$2}"
}

# Data that needs the module: an RDB (also an AOF's RDB preamble) holding
# the module's type id, as the RDB format writes it (the length prefix
# 0x81, then the id's first 6 bytes: the name "leasetype"), or an AOF with
# a LEASE.* command.
type_id=$(printf '\201\225\346\254\172\334\251')
cr=$(printf '\r')
needs_module() {
  LC_ALL=C grep -qaF -- "$type_id" "$1" 2>/dev/null ||
    LC_ALL=C grep -qaix -- "LEASE\.[a-z]*$cr" "$1" 2>/dev/null
}

loads=no
if grep -Eqs '^[[:space:]]*include[[:space:]]+/etc/redis/redis-lease\.conf' "$conf" ||
   grep -Eqs '^[[:space:]]*loadmodule[[:space:]]+[^[:space:]]*redis_lease\.so' "$conf"; then
  loads=yes
fi

needing=
dir=$(setting dir /var/lib/redis)
case $dir in /*) ;; *) dir= ;; esac
if [ -n "$dir" ] && [ "$loads" = no ]; then
  if [ "$(setting appendonly no)" = yes ]; then
    aofdir=$dir/$(setting appenddirname appendonlydir)
    manifest=$aofdir/$(setting appendfilename appendonly.aof).manifest
    # The base and incremental files the manifest lists (not history).
    files=$(sed -n 's/^file \([^ ]*\) seq [0-9]* type [bi].*/\1/p' "$manifest" 2>/dev/null || true)
    for f in $files; do
      if needs_module "$aofdir/$f"; then needing="$needing $aofdir/$f"; fi
    done
  else
    f=$dir/$(setting dbfilename dump.rdb)
    if [ -f "$f" ] && needs_module "$f"; then needing=" $f"; fi
  fi
fi

if [ "$loads" = yes ] || [ -n "$needing" ]; then
  warn "WARNING: redis-server will not start again once this package is removed:"
  if [ "$loads" = yes ]; then
    warn "  $conf still loads the module (include /etc/redis/redis-lease.conf, or a loadmodule"
    warn "  line of redis_lease.so), and the module's file goes with this package."
  fi
  if [ -n "$needing" ]; then
    warn "  the data it loads at its next start still needs the module (lease keys, or the"
    warn "  module's token clock):$needing"
  fi
  warn "The server that runs now keeps the module. To keep every key that is not a lease:"
  warn "  1. stop the clients that take leases; delete every lease key, in every database"
  warn "     (SCAN 0 TYPE leasetype, then UNLINK them);"
  warn "  2. in $conf, replace the include line with: appendonly yes"
  warn "  3. redis-cli CLIENT PAUSE 600000 WRITE; redis-cli CONFIG SET aof-use-rdb-preamble no;"
  warn "     redis-cli BGREWRITEAOF (or CONFIG SET appendonly yes when it is no); wait until"
  warn "     INFO persistence shows aof_rewrite_in_progress:0 and aof_last_bgrewrite_status:ok;"
  warn "  4. service redis-server restart; redis-cli PING; redis-cli SAVE."
  warn "In full: docs/operations.md, \"Taking the module out\" (in /usr/share/doc/redis-lease"
  warn "until the removal ends). A server that no longer starts: apt install redis-lease again,"
  warn "start it, and follow these steps."
fi
exit 0

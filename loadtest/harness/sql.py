"""The load harness's own queries (``loadtest/harness/sql/*.sql``), kept out of the product:
``loadtest.sql`` (runs and their checks), ``baseline.sql`` (the naive consumer of
bench-consumers), ``growth.sql`` (bench-growth)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gateway.store.sqlfiles import load_queries

SQL_DIR = Path(__file__).with_name("sql")


@cache
def queries(file: str) -> dict[str, str]:
    """The named queries of ``sql/<file>``."""
    return load_queries(SQL_DIR / file)


def q(name: str) -> str:
    return queries("loadtest.sql")[name]

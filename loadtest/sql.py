"""The load harness's own queries (``loadtest/sql/loadtest.sql``), kept out of the product."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gateway.store.sqlfiles import load_queries

SQL_FILE = Path(__file__).with_name("sql") / "loadtest.sql"


@cache
def _queries() -> dict[str, str]:
    return load_queries(SQL_FILE)


def q(name: str) -> str:
    return _queries()[name]

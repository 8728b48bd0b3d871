"""The cost of each statement over a phase, from pg_stat_statements (on the harness's own
embedded PostgreSQL: loadtest.harness.database.statements): calls, mean and total time
(planning included) and its share of the database's statement time. The queries are in
``sql/pgstat.sql``."""

from __future__ import annotations

import re
from typing import Any

import asyncpg

from loadtest.harness.report import table
from loadtest.harness.sql import queries

SQL = queries("pgstat.sql")
TOP = 8


async def reset(dsn: str) -> bool:
    """Start counting now; False when the server has not loaded pg_stat_statements (a
    DATABASE_URL server may not have: the benchmark then says so instead of a table)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.fetchval(SQL["pgstat_reset"])
    except asyncpg.PostgresError:
        return False
    finally:
        await conn.close()
    return True


async def top(dsn: str, n: int = TOP) -> list[dict[str, Any]]:
    """The ``n`` statements that took the most time since the last ``reset``."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(SQL["pgstat_top"], n)
    finally:
        await conn.close()
    # JSON values as they go into a result: query, calls, total and mean ms, rows, share (0-1).
    return [
        {"query": r["query"], "calls": int(r["calls"]), "total_ms": float(r["total_ms"]),
         "mean_ms": float(r["mean_ms"] or 0.0), "rows": int(r["rows"]), "share": float(r["share"] or 0.0)}
        for r in rows
    ]  # fmt: skip


def _short(query: str, width: int = 72) -> str:
    one = re.sub(r"\s+", " ", query).strip()
    return one if len(one) <= width else one[: width - 1] + "…"


def describe(statements: list[dict[str, Any]], per: int = 0, unit: str = "webhook", when: str = "") -> str:
    """A table of ``top``'s statements; ``per``: the phase's count of ``unit`` (calls per one)."""
    head = ("statement", "calls", *((f"per {unit}",) if per else ()), "mean ms", "total ms", "share")
    rows = [
        (_short(s["query"]), str(s["calls"]), *((f"{s['calls'] / per:.2f}",) if per else ()),
         f"{s['mean_ms']:.3f}", f"{s['total_ms']:.0f}", f"{s['share'] * 100:.1f} %")
        for s in statements
    ]  # fmt: skip
    title = f"pg_stat_statements{when}: the top statements by total time (planning included)"
    return title + "\n" + table(head, rows)

"""After a run: wait for the consumers to drain, then prove in the database that nothing was lost
or doubled and that no badly signed body was stored.

The comparisons are pure functions over what was sent (the ledger) and what the database
holds; the I/O around them only fetches. Consumer checks switch on by themselves once
``processed_webhook_events`` exists; before that the ingest checks still run.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from loadtest.harness.sql import q
from loadtest.harness.stats import Entry

CHUNK = 20_000


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    examples: tuple[str, ...] = ()


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)
    e2e: dict[str, float] = field(default_factory=dict)
    e2e_timeline: list[dict[str, float]] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [
                {"name": c.name, "ok": c.ok, "detail": c.detail, "examples": list(c.examples)}
                for c in self.checks
            ],
            "e2e_ms": self.e2e,
            "inbox_states": self.states,
        }


def _examples(items: Iterable[Any], n: int = 3) -> tuple[str, ...]:
    out = []
    for x in items:
        out.append(x.hex()[:16] if isinstance(x, bytes) else str(x))
        if len(out) >= n:
            break
    return tuple(out)


# ---- pure comparisons ----------------------------------------------------------------------
def compare_inbox(entries: dict[bytes, Entry], stored: dict[bytes, int]) -> list[Check]:
    """Every acknowledged body stored at least as often as it was acked, never more often than
    it was validly sent; no badly signed body stored at all."""
    lost = [d for d, e in entries.items() if stored.get(d, 0) < e.acked]
    doubled = [d for d, e in entries.items() if e.sent and stored.get(d, 0) > e.sent]
    bad = [d for d, e in entries.items() if e.bad_sent and not e.sent and stored.get(d, 0)]
    foreign = [d for d in stored if d not in entries]
    acked = sum(e.acked for e in entries.values())
    rows = sum(stored.get(d, 0) for d in entries)
    return [
        Check(
            "ingest: every 200 stored",
            not lost,
            f"{len(lost)} acknowledged bodies missing of {acked} acks",
            _examples(lost),
        ),
        Check(
            "ingest: no extra rows",
            not doubled,
            f"{len(doubled)} bodies stored more often than sent ({rows} rows)",
            _examples(doubled),
        ),
        Check(
            "ingest: bad signatures not stored",
            not bad,
            f"{len(bad)} of {sum(1 for e in entries.values() if e.bad_sent)} badly signed bodies stored",
            _examples(bad),
        ),
        Check(
            "ingest: no rows from elsewhere",
            not foreign,
            f"{len(foreign)} stored bodies this run never sent",
            _examples(foreign),
        ),
    ]


def expected_sets(entries: dict[bytes, Entry]) -> tuple[set[str], set[str]]:
    """(keys that must be processed: from acknowledged bodies; keys that may be: any valid send)."""
    must: set[str] = set()
    may: set[str] = set()
    for e in entries.values():
        if e.sent:
            may.update(e.keys)
            if e.acked:
                must.update(e.keys)
    return must, may


def compare_keys(
    must: set[str], may: set[str], processed: set[str], phantom_check: bool = True
) -> list[Check]:
    lost = must - processed
    checks = [
        Check(
            "consumers: every event processed",
            not lost,
            f"{len(lost)} of {len(must)} unique keys lost",
            _examples(sorted(lost)),
        )
    ]
    if phantom_check:
        phantom = processed - may
        checks.append(
            Check(
                "consumers: no unknown keys",
                not phantom,
                f"{len(phantom)} processed keys never sent",
                _examples(sorted(phantom)),
            )
        )
    return checks


def side_effect_expectations(
    entries: dict[bytes, Entry],
) -> tuple[Counter[str], Counter[str], Counter[str], Counter[str]]:
    """Per wamid: inbound rows (must, may) and status-history rows (must, may), one per unique key."""
    in_must: set[str] = set()
    in_may: set[str] = set()
    st_must: set[str] = set()
    st_may: set[str] = set()
    for e in entries.values():
        if e.sent:
            in_may.update(e.msg_wamids)
            st_may.update(e.status_keys)
            if e.acked:
                in_must.update(e.msg_wamids)
                st_must.update(e.status_keys)

    def per_wamid(keys: set[str]) -> Counter[str]:
        return Counter(k.split(":", 2)[1] for k in keys)

    return Counter(in_must), Counter(in_may), per_wamid(st_must), per_wamid(st_may)


def compare_counts(label: str, must: Counter[str], may: Counter[str], rows: Counter[str]) -> list[Check]:
    lost = [w for w, n in must.items() if rows.get(w, 0) < n]
    doubled = [w for w, n in rows.items() if n > may.get(w, 0)]
    return [
        Check(
            f"{label}: none missing",
            not lost,
            f"{len(lost)} of {len(must)} wamids short of rows ({sum(must.values())} expected)",
            _examples(lost),
        ),
        Check(
            f"{label}: none doubled",
            not doubled,
            f"{len(doubled)} wamids with more rows than unique events ({sum(rows.values())} rows)",
            _examples(doubled),
        ),
    ]


# ---- I/O -----------------------------------------------------------------------------------
async def columns(conn: asyncpg.Connection, table: str) -> set[str]:
    return {r[0] for r in await conn.fetch(q("lt_table_columns"), table)}


async def allow_repartition_joins(conn: asyncpg.Connection) -> None:
    """On Citus, the latency queries join processed_webhook_events (distributed by subject)
    with webhook_inbox (by lane): shards that are not colocated, which Citus joins only when
    allowed to repartition. On one PostgreSQL the setting is an unused placeholder."""
    await conn.execute("SET citus.enable_repartition_joins = on")


async def backlog(conn: asyncpg.Connection, start_id: int) -> tuple[int, float]:
    row = await conn.fetchrow(q("lt_inbox_backlog"), start_id)
    assert row is not None
    return int(row["pending"]), float(row["lag_s"])


async def on_citus(conn: asyncpg.Connection) -> bool:
    """Whether the database is a Citus coordinator (the citus extension installed in it)."""
    return bool(await conn.fetchval(q("lt_on_citus")))


async def wait_keys_processed(
    conn: asyncpg.Connection, start_id: int, must: set[str], timeout_s: float
) -> tuple[bool, int]:
    """The drain on Citus: every key of an acknowledged body processed and no webhook of the
    run waiting for a retry. Which rows the lanes' cursors have read is a question for each
    worker (a cursor holds its worker's snapshot), which no one statement on the coordinator
    can ask; the keys the consumers record answer it for the rows that must be processed.
    Returns (drained, how many keys or retries are left)."""
    deadline = time.monotonic() + timeout_s
    left: int | None = None  # not read yet
    while True:
        try:
            processed = {r[0] for r in await conn.fetch(q("lt_processed_keys_since"), start_id)}
            retrying = int(await conn.fetchval(q("lt_parked_retrying"), start_id))
            left = len(must - processed) + retrying
        except (asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError):
            # A worker still in crash recovery after a restart: the coordinator reports it as a
            # connection failure to the remote node (SQLSTATE 08006). The drain waits on; the
            # count stays the last one read.
            pass
        if left == 0:
            return True, 0
        if time.monotonic() > deadline:
            return False, len(must) if left is None else left
        await asyncio.sleep(0.5)


async def wait_drained(conn: asyncpg.Connection, start_id: int, timeout_s: float) -> tuple[bool, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        pending, _ = await backlog(conn, start_id)
        if pending == 0:
            return True, 0
        if time.monotonic() > deadline:
            return False, pending
        await asyncio.sleep(0.25)


async def _counts(conn: asyncpg.Connection, query: str, wamids: Iterable[str]) -> Counter[str]:
    ws = list(wamids)
    out: Counter[str] = Counter()
    for i in range(0, len(ws), CHUNK):
        for r in await conn.fetch(q(query), ws[i : i + CHUNK]):
            out[r["wamid"]] += int(r["n"])
    return out


async def verify(
    conn: asyncpg.Connection,
    entries: dict[bytes, Entry],
    start_id: int,
    drain_timeout_s: float = 120.0,
    consumers: bool | None = None,
) -> Verdict:
    """``consumers``: None checks the consumers' work when their tables exist; False checks
    the ingest edge only (a gateway running without consumers)."""
    v = Verdict()
    processed_cols = await columns(conn, "processed_webhook_events") if consumers is not False else set()
    citus = await on_citus(conn)
    if processed_cols and citus:
        drained, left = await wait_keys_processed(conn, start_id, expected_sets(entries)[0], drain_timeout_s)
        v.checks.append(
            Check(
                "consumers: inbox drained",
                drained,
                f"{left} keys of acknowledged bodies unprocessed or rows retrying "
                f"after {drain_timeout_s:.0f}s",
            )
        )
    elif processed_cols:
        drained, left = await wait_drained(conn, start_id, drain_timeout_s)
        v.checks.append(
            Check(
                "consumers: inbox drained", drained, f"{left} rows still pending after {drain_timeout_s:.0f}s"
            )
        )
    stored = {bytes(r["digest"]): int(r["n"]) for r in await conn.fetch(q("lt_inbox_digests"), start_id)}
    v.checks += compare_inbox(entries, stored)
    if not processed_cols:
        # Without consumers every row of the run is pending: there are no states to tell apart.
        return v
    # On Citus only the webhooks moved aside (inbox_parked) are told apart (see wait_keys_processed).
    states = q("lt_parked_states") if citus else q("lt_inbox_states")
    v.states = {r["state"]: int(r["n"]) for r in await conn.fetch(states, start_id)}
    dead = v.states.get("dead", 0)
    v.checks.append(Check("consumers: no dead rows", dead == 0, f"{dead} rows parked as dead"))
    must, may = expected_sets(entries)
    if "inbox_id" in processed_cols:
        processed = {r[0] for r in await conn.fetch(q("lt_processed_keys_since"), start_id)}
        v.checks += compare_keys(must, may, processed)
    else:
        keys = list(may)
        processed = set()
        for i in range(0, len(keys), CHUNK):
            processed |= {r[0] for r in await conn.fetch(q("lt_processed_keys_among"), keys[i : i + CHUNK])}
        v.checks += compare_keys(must, may, processed, phantom_check=False)
    in_must, in_may, st_must, st_may = side_effect_expectations(entries)
    if "wamid" in await columns(conn, "inbound_messages"):
        v.checks += compare_counts(
            "inbound_messages", in_must, in_may, await _counts(conn, "lt_inbound_counts", in_may)
        )
    if "wamid" in await columns(conn, "message_statuses"):
        v.checks += compare_counts(
            "message_statuses", st_must, st_may, await _counts(conn, "lt_status_counts", st_may)
        )
    if "inbox_id" in processed_cols and "processed_at" in processed_cols:
        await allow_repartition_joins(conn)
        row = await conn.fetchrow(q("lt_e2e_latency"), start_id)
        if row is not None and row["n"]:
            ps = [x * 1000 for x in row["ps"]]
            v.e2e = {
                "count": int(row["n"]),
                "p50": ps[0],
                "p90": ps[1],
                "p99": ps[2],
                "p99.9": ps[3],
                "max": row["mx"] * 1000,
            }
    return v


async def e2e_timeline(conn: asyncpg.Connection, start_id: int, t0: Any) -> list[dict[str, float]]:
    cols = await columns(conn, "processed_webhook_events")
    if not {"inbox_id", "processed_at"} <= cols:
        return []
    await allow_repartition_joins(conn)
    rows = await conn.fetch(q("lt_e2e_timeline"), start_id, t0)
    return [{"t": r["t"], "p50_ms": r["p50"] * 1000, "p99_ms": r["p99"] * 1000} for r in rows]

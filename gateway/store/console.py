"""What the operator console reads (sql/queries/console.sql): keyset pages, bounded counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from gateway.core import console as pure
from gateway.store.db import Conn
from gateway.store.sqlfiles import q

PAGE = 50
SCAN = 20_000  # rows a filter no index orders may look at per page
CAP = 100_000  # what a bulk action would touch is counted up to here ("at least")
LIST_CAP = 10_000  # backlogs on the overview and the destinations page stop here ("+")
INGEST_WINDOW = 100_000  # the ingest rate reads at most this many of the newest rows
FIRST_ID = 2**63 - 1
FAR_PAST = datetime(1, 1, 2, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 12, 30, tzinfo=UTC)

Row = asyncpg.Record
Delivery = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[Row]
    after: str | None = None  # the cursor of the next page (None: this is the last)
    scanned: int | None = None  # rows looked at, when a filter no index orders was applied
    notes: list[str] = field(default_factory=list)


def _range(since: datetime | None, until: datetime | None) -> tuple[datetime, datetime]:
    return since or FAR_PAST, until or FAR_FUTURE


async def dead_rows(
    conn: Conn, *, before: int | None, since: datetime | None, until: datetime | None, limit: int
) -> list[Row]:
    lo, hi = _range(since, until)
    return list(await conn.fetch(q("console_dead_rows"), before or FIRST_ID, lo, hi, limit))


async def dead_items(
    conn: Conn,
    *,
    state: str,
    kind: str | None,
    after: tuple[datetime, int] | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> list[Row]:
    lo, hi = _range(since, until)
    at, ident = after or (FAR_FUTURE, FIRST_ID)
    if kind is None:
        return list(await conn.fetch(q("console_dead_items"), state, lo, hi, at, ident, limit))
    return list(await conn.fetch(q("console_dead_items_kind"), state, lo, hi, at, ident, limit, kind))


async def dead_count(conn: Conn, *, since: datetime | None, until: datetime | None) -> tuple[int, int]:
    lo, hi = _range(since, until)
    r = await conn.fetchrow(q("console_dead_count"), lo, hi, CAP)
    assert r is not None
    return int(r["rows"]), int(r["items"])


async def outbox_exact(conn: Conn, *, key: str | None, wamid: str | None, tenant: str | None) -> list[Row]:
    """Rows by key (any tenant, or ``tenant``'s) or by wamid: a handful at most."""
    if key is not None:
        rows = await conn.fetch(q("console_outbox_by_key"), key)
    else:
        rows = await conn.fetch(q("console_outbox_by_wamid"), wamid)
    return [r for r in rows if tenant is None or r["tenant"] == tenant]


ATTENTION = ("unknown", "review", "failed", "cancelled")


async def outbox_page(
    conn: Conn,
    *,
    before: int | None,
    recipient: str | None,
    tenant: str | None,
    state: str | None,
    limit: int,
) -> Page:
    """Newest first. The recipient or a state that needs a person picks the index; a tenant,
    or a state every send passes through, is a filter on at most SCAN rows per page."""
    start = before or FIRST_ID
    residual = tenant is not None or (state is not None and state not in ATTENTION and recipient is None)
    scan = SCAN if residual else limit + 1
    if recipient is not None:
        who = await identities(conn, recipient)
        rows = await conn.fetch(
            q("console_outbox_scan_recipient"), start, scan, tenant, state, limit + 1, who
        )
    elif state in ATTENTION:
        rows = await conn.fetch(
            q("console_outbox_scan_attention"), start, scan, tenant, None, limit + 1, state
        )
    else:
        rows = await conn.fetch(q("console_outbox_scan"), start, scan, tenant, state, limit + 1)
    return _scanned_page(rows, limit, scan, residual)


def _scanned_page(rows: list[Row], limit: int, scan: int, residual: bool) -> Page:
    """A page of a bounded scan: its hits, and where the next page starts."""
    hits = [r for r in rows if r["id"] is not None]
    scanned = int(rows[0]["scanned"]) if rows else 0
    scanned_to = rows[0]["scanned_to"] if rows else None
    if len(hits) > limit:
        return Page(hits[:limit], str(hits[limit - 1]["id"]), scanned if residual else None)
    if scanned >= scan and scanned_to is not None:  # the scan was cut: more rows below
        return Page(hits, str(scanned_to), scanned if residual else None)
    return Page(hits, None, scanned if residual else None)


async def identities(conn: Conn, customer: str) -> list[str]:
    """The customer's phone number and BSUIDs as seen together (``customer`` first)."""
    found = [r[0] for r in await conn.fetch(q("console_customer_ids"), customer)]
    return [customer, *sorted(x for x in found if x != customer)]


async def outbox_bulk_count(
    conn: Conn, *, state: str, since: float | None, until: float | None, tenant: str | None
) -> int:
    n: int = await conn.fetchval(q("console_outbox_bulk_count"), state, since, until, tenant, CAP)
    return n


async def outbox_row(conn: Conn, *, tenant: str, key: str) -> Row | None:
    r: Row | None = await conn.fetchrow(q("outbox_get"), tenant, key)
    return r


async def attempts(conn: Conn, *, outbox_id: int, tenant: str, key: str) -> list[Row]:
    """A send's attempts and the operators' actions on it, in order."""
    return list(await conn.fetch(q("console_attempts"), outbox_id, f"{tenant}/{key}", key))


async def statuses(conn: Conn, *, wamid: str) -> list[Row]:
    return list(await conn.fetch(q("console_statuses"), wamid))


async def destinations(conn: Conn) -> list[dict[str, Any]]:
    """Every destination, with its backlog and failures counted up to LIST_CAP."""
    out = []
    for d in await conn.fetch(q("console_destinations")):
        n = await conn.fetchrow(q("console_destination_counts"), d["id"], d["due_from"], LIST_CAP)
        assert n is not None
        out.append(dict(d) | dict(n))
    return out


async def deliveries_page(
    conn: Conn,
    *,
    destination_id: int,
    destination: str,
    state: str | None,
    after: tuple[datetime, int] | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> tuple[list[Delivery], tuple[datetime, int] | None, int | None]:
    """One destination's deliveries, newest first: (rows, the next page's cursor, rows
    scanned when pending ones were told from failed ones)."""
    lo, hi = _range(since, until)
    # One upper bound, the tighter of the cursor and the range's end (receipt times before
    # ``hi``: every id after (hi, 0)).
    at, ident = min(after or (FAR_FUTURE, FIRST_ID), (hi, 0))
    page, nxt, told = await _page(conn, destination_id, state, lo, at, ident, limit)
    return await _with_events(conn, page, destination), nxt, told


async def _page(
    conn: Conn, destination_id: int, state: str | None, lo: datetime, at: datetime, ident: int, limit: int
) -> tuple[list[Row], tuple[datetime, int] | None, int | None]:
    """deliveries_page's rows before their events are read."""
    if state == "failed":
        rows = list(
            await conn.fetch(q("console_deliveries_failed"), destination_id, lo, at, ident, limit + 1)
        )
        nxt = (rows[limit - 1]["received_at"], rows[limit - 1]["id"]) if len(rows) > limit else None
        return rows[:limit], nxt, None
    # Delivered ones are all the log holds: no filter to scan past (pending ones share the queue
    # with failed ones).
    scan = SCAN if state == "pending" else limit + 1
    got = await conn.fetch(q("console_deliveries"), destination_id, lo, at, ident, limit + 1, scan, state)
    hits = [r for r in got if r["id"] is not None]
    scanned = int(got[0]["scanned"]) if got else 0
    told = scanned if state == "pending" else None
    if len(hits) > limit:
        return hits[:limit], (hits[limit - 1]["received_at"], hits[limit - 1]["id"]), None
    if scanned >= scan and got and got[0]["scanned_at"] is not None:
        return hits, (got[0]["scanned_at"], got[0]["scanned_id"]), told
    return hits, None, told


async def _with_events(conn: Conn, rows: list[Row], destination: str) -> list[Delivery]:
    """The page's events, read by their keys in a statement of their own."""
    if not rows:
        return []
    events = await conn.fetch(
        q("console_delivery_events"),
        [r["id"] for r in rows],
        [r["event_day"] for r in rows],
        [r["lane"] for r in rows],
        destination,
    )
    return pure.with_events([dict(r) for r in rows], [dict(e) for e in events])


async def deliveries_count(
    conn: Conn, *, destination: str | None, state: str, since: datetime | None, until: datetime | None
) -> int:
    lo, hi = _range(since, until)
    n: int = await conn.fetchval(q("console_deliveries_count"), destination, state, lo, hi, CAP)
    return n


async def inbound_by_wamid(conn: Conn, *, wamid: str) -> list[Row]:
    return list(await conn.fetch(q("console_inbound_by_wamid"), wamid))


async def inbound_page(conn: Conn, *, before: int | None, customer: str | None, limit: int) -> Page:
    scan = SCAN if customer is not None else limit + 1
    who = None if customer is None else await identities(conn, customer)
    rows = await conn.fetch(q("console_inbound_scan"), before or FIRST_ID, scan, who, limit + 1)
    return _scanned_page(list(rows), limit, scan, customer is not None)


async def event_story(conn: Conn, *, key: str, inbox_id: int | None) -> list[dict[str, Any]]:
    """What the gateway did with an event key: its dedup key, its deliveries, its dead items."""
    rows = await conn.fetch(q("console_event_story"), key, inbox_id)
    queued_or_sent = await conn.fetch(q("console_event_deliveries"), key)
    deliveries = pure.story_deliveries([dict(r) for r in queued_or_sent])
    return (
        [dict(r) for r in rows if r["what"] == "key"]
        + deliveries
        + [dict(r) for r in rows if r["what"] == "dead"]
    )


async def replies(conn: Conn, *, wamid: str) -> list[Row]:
    return list(await conn.fetch(q("console_replies"), wamid))


async def overview(conn: Conn) -> dict[str, Any]:
    r = await conn.fetchrow(q("console_overview"), LIST_CAP, INGEST_WINDOW)
    assert r is not None
    return dict(r) | {"partitions_ahead_days": await conn.fetchval(q("console_partitions_ahead"))}

"""``destinations`` and their deliveries: forwarding to downstream HTTP endpoints. The only
module that knows the SQL of ``delivery_events`` (bodies), ``delivery_queue`` (open work),
``delivery_log`` (attempts) and ``delivery_leases`` (the consumers' batch statement in inbox.sql
appends events and queues their deliveries)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway.core.stdwebhooks import webhook_id
from gateway.store.db import Conn
from gateway.store.sqlfiles import q

CHANNEL = "deliveries"
# A forwarder's token, as a transaction that queues deliveries names its process's forwarder
# in the setting gateway.forwarder (the payload of its commit's NOTIFY,
# sql/functions/deliveries_notify.sql). Hex digits only: it is spliced into SET LOCAL.
_WOKEN = re.compile(r"[0-9a-f]{1,32}")
# A connection that can open a transaction (not a pool).
Tx = asyncpg.Connection | PoolConnectionProxy


class DestinationExists(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Destination:
    id: int
    name: str
    url: str
    events: list[str]
    secret: str
    enabled: bool
    max_in_flight: int
    ordered: bool
    breaker_state: str
    consecutive_failures: int
    breaker_changed_at: datetime
    previous_secret: str | None  # still valid (signed with too) until previous_secret_until
    previous_secret_until: datetime | None
    created_at: datetime
    backlog: int
    failed: int
    gone: bool  # disabled after answering 410 Gone
    numbers: list[str] | None = None  # only these numbers' events (None: every number)
    tenant: str | None = None  # a tenant's destination (its numbers when it was added)
    format: str = "standard"  # or "meta": each event as Meta's own webhook body


class Claimed(NamedTuple):
    """One delivery claimed for an attempt, with what its request needs: the delivery is
    (destination_id, id), ``id`` being its event's. (Tuples: one is built per delivery on the
    forwarder's hot path, where a frozen dataclass costs 3x.)"""

    id: int
    webhook_id: str
    body: bytes | None  # None: its event's body is gone (recorded as failed, never sent)
    attempts: int
    received_at: float  # Unix time the gateway received the event
    window_start: float  # Unix time the retry window started
    destination_id: int
    destination: str
    url: str
    secret: str
    ordered: bool  # the destination's per-conversation ordering
    previous_secret: str | None  # during a rotation's grace period: signed with it too
    meta: bool = False  # a Meta-format destination: body is Meta's, signed X-Hub-Signature-256
    lane: int = 0  # its delivery's lane (a round of some lanes writes only their outcomes)

    @property
    def ref(self) -> Ref:
        return Ref(self.destination_id, self.id)


class Ref(NamedTuple):
    """A delivery: its destination and its event (the key of delivery_queue)."""

    destination_id: int
    id: int


class Result(NamedTuple):
    """What one attempt leaves a delivery in: ``state`` delivered, pending (again, after
    ``delay_s``) or failed."""

    destination_id: int
    id: int
    state: str
    delay_s: float | None
    status: int | None
    error: str | None

    @property
    def ref(self) -> Ref:
        return Ref(self.destination_id, self.id)


@dataclass(frozen=True, slots=True)
class Gauge:
    name: str
    breaker_state: str
    enabled: bool
    backlog: int
    oldest_due_s: float


@dataclass(frozen=True, slots=True)
class Delivery:
    id: int
    destination: str
    webhook_id: str
    event_key: str
    kind: str
    state: str
    attempts: int
    received_at: datetime
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None


# --- destinations ---------------------------------------------------------------------------


async def add_destination(
    conn: Conn,
    *,
    name: str,
    url: str,
    events: Sequence[str],
    secret: str,
    max_in_flight: int,
    ordered: bool,
    numbers: Sequence[str] | None = None,
    tenant: str | None = None,
    format: str = "standard",
) -> int:
    """Insert a destination; ``DestinationExists`` if the name is taken. ``numbers``: it gets only
    events of these business numbers; ``format``: standard or meta."""
    dest_id: int | None = await conn.fetchval(
        q("destination_add"),
        name,
        url,
        list(events),
        secret,
        max_in_flight,
        ordered,
        None if numbers is None else list(numbers),
        tenant,
        format,
    )
    if dest_id is None:
        raise DestinationExists(name)
    return dest_id


async def list_destinations(conn: Conn) -> list[Destination]:
    return [Destination(**dict(r)) for r in await conn.fetch(q("destination_list"))]


async def get_destination(conn: Conn, *, name: str) -> asyncpg.Record | None:
    r: asyncpg.Record | None = await conn.fetchrow(q("destination_get"), name)
    return r


async def set_enabled(conn: Conn, *, name: str, enabled: bool) -> bool:
    """True if the destination exists. Enabling wakes the forwarders for its backlog."""
    found = await conn.fetchval(q("destination_set_enabled"), name, enabled) is not None
    if found and enabled:
        await conn.execute(q("deliveries_notify"), "")
    return found


def woken_by(token: str) -> str:
    """The statement that names, for the rest of the caller's transaction, the forwarder its
    process wakes itself after the commit (``token``: hex digits)."""
    if not _WOKEN.fullmatch(token):
        raise ValueError(f"a forwarder's token is 1 to 32 hex digits, not {token!r}")
    return f"SET LOCAL gateway.forwarder = '{token}'"


async def wake_forwarders(conn: Conn, woken: str = "") -> None:
    """NOTIFY deliveries (the forwarders LISTEN), from a statement of its own; ``woken`` names
    the forwarder the caller woke itself (it ignores this one)."""
    await conn.execute(q("deliveries_notify"), woken)


async def rotate_secret(conn: Conn, *, name: str, secret: str, grace_s: float) -> datetime | None:
    """Make ``secret`` the destination's secret, the current one valid for ``grace_s`` more
    seconds; until when (None: no such destination)."""
    until: datetime | None = await conn.fetchval(q("destination_rotate_secret"), name, secret, grace_s)
    return until


async def remove_destination(conn: Conn, *, name: str) -> int | None:
    """Delete it and its deliveries; how many deliveries went with it (None: no such name)."""
    r = await conn.fetchrow(q("destination_remove"), name)
    return None if r is None else int(r["deliveries"])


# --- the forwarder ----------------------------------------------------------------------------


async def cycle(
    conn: Conn,
    *,
    forwarder: str,
    results: Sequence[Result],
    breakers: Sequence[tuple[int, bool, int]],
    threshold: int,
    limit: int,
    lease_s: float,
    cooldown_s: float,
    housekeeping: bool,
    held: Collection[tuple[int, int]] = (),
    gone: Collection[int] = (),
    lanes: Sequence[int] | None = None,
) -> tuple[list[Claimed], list[tuple[str, str, str]], list[str]]:
    """One round of ``forwarder``, one statement and round trip, serialised across forwarders:
    write finished attempts and breaker counts (``breakers``: destination, any success,
    failures after the last success), claim up to ``limit`` due deliveries (of ``lanes`` only,
    when given; then only the ``results`` of deliveries in those lanes are written: name the
    others in ``held``) and renew the forwarder's leases on what it holds; with ``housekeeping``, then
    delete dead forwarders' expired leases and move breakers whose cool-down passed to
    half-open (their deliveries are claimed in the next round). ``gone``: destinations that
    answered 410 Gone, disabled in the same statement. ``held``: the deliveries (``Ref``) the
    forwarder still holds besides ``results`` (its leases keep only those, so a claim whose
    answer never reached it is due again). Returns (claimed, breaker transitions as
    (destination, old, new) and a (destination, "enabled", "gone") per destination disabled,
    names now half-open).

    One transaction. If the call fails or is cancelled, the connection is terminated (a pool
    replaces it, a forwarder's own connection is reopened): a cancel must not wait on a
    silent network."""
    try:
        rows = await conn.fetch(
            q("forward_round"),
            forwarder,
            [(r.destination_id, r.id, r.state, r.delay_s, r.status, r.error) for r in results],
            list(held),
            list(breakers),
            list(gone),
            limit,
            None if lanes is None else list(lanes),
            lease_s,
            threshold,
            housekeeping,
            cooldown_s,
        )
    except BaseException:
        conn.terminate()
        raise
    # Rows by kind (sql/functions/forward_round.sql), read by name.
    claimed: list[Claimed] = []
    changes: list[tuple[str, str, str]] = []
    half: list[str] = []
    for r in rows:
        kind = r["kind"]
        if kind == "claimed":
            name = r["destination"]
            claimed.append(
                Claimed(
                    id=r["event_id"],
                    webhook_id=webhook_id(name, r["event_key"]) if r["event_key"] is not None else "",
                    body=r["body"],
                    attempts=r["attempts"],
                    received_at=r["received_at"],
                    window_start=r["window_start"],
                    destination_id=r["destination_id"],
                    destination=name,
                    url=r["url"],
                    secret=r["secret"],
                    ordered=r["ordered"],
                    previous_secret=r["previous_secret"],
                    meta=r["meta"],
                    lane=r["lane"],
                )
            )
        elif kind == "breaker":
            changes.append((r["destination"], r["old_state"], r["new_state"]))
        elif kind == "disabled":
            changes.append((r["destination"], "enabled", "gone"))
        elif kind == "half_open":
            half.append(r["destination"])
        else:
            raise ValueError(f"forward_round returned a row of unknown kind {kind!r}")
    return claimed, changes, half


async def gauges(conn: Conn, *, cap: int) -> list[Gauge]:
    """Per destination: backlog (counted up to ``cap``), oldest due age, breaker, enabled."""
    found = []
    for d in await conn.fetch(q("deliveries_gauge_destinations")):
        r = await conn.fetchrow(q("deliveries_gauge"), d["id"], d["due_from"], cap)
        assert r is not None
        found.append(Gauge(d["name"], d["breaker_state"], d["enabled"], r["backlog"], r["oldest_due_s"]))
    return found


# --- operators ------------------------------------------------------------------------------


async def list_deliveries(
    conn: Conn,
    *,
    destination: str | None,
    since: datetime | None,
    until: datetime | None,
    state: str | None,
    limit: int,
) -> list[Delivery]:
    rows = await conn.fetch(q("deliveries_list"), destination, since, until, state, limit)
    return [Delivery(**dict(r)) for r in rows]


async def count_deliveries(
    conn: Conn, *, destination: str | None, since: datetime | None, until: datetime | None
) -> dict[str, int]:
    rows = await conn.fetch(q("deliveries_count"), destination, since, until)
    return {r["state"]: r["n"] for r in rows}


async def replay(
    conn: Tx,
    *,
    destination: str | None,
    since: datetime | None,
    until: datetime | None,
    state: str,
) -> tuple[int, int]:
    """Finished deliveries in the range due again now, with a fresh retry window: failed ones,
    or delivered ones (queued again, while their event's body is kept). (How many, how many
    delivered ones were not: their bodies are past retention.)"""
    if state not in ("failed", "delivered"):
        raise ValueError(f"only failed or delivered deliveries are replayed, not {state!r}")
    async with conn.transaction():
        if state == "failed":
            n, expired = len(await conn.fetch(q("deliveries_replay_failed"), destination, since, until)), 0
        else:
            # Not while retention carries bodies forward and drops the rest (a body referenced
            # from here after the carry would be dropped under the queued delivery).
            await conn.execute(q("deliveries_bodies_lock_shared"))
            r = await conn.fetchrow(q("deliveries_replay_delivered"), destination, since, until)
            assert r is not None
            n, expired = r["replayed"], r["expired"]
        if n:
            await conn.execute(q("deliveries_notify"), "")
    return n, expired


async def insert_rebuilt(conn: Conn, *, destination_id: int, rows: Sequence[dict[str, Any]]) -> int:
    """Backfill: deliveries for rebuilt events the destination does not have yet; how many.
    Backfills of one destination run one at a time."""
    if not rows:
        return 0
    async with _transaction(conn) as tx:
        await tx.execute(q("deliveries_lock_destination"), destination_id)
        n: int = await tx.fetchval(q("deliveries_insert"), destination_id, list(rows))
    return n


@contextlib.asynccontextmanager
async def _transaction(conn: Conn) -> AsyncIterator[Tx]:
    """A transaction on ``conn``, or on a connection of the pool ``conn``."""
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as c, c.transaction():
            yield c
    else:
        async with conn.transaction():
            yield conn


BACKFILL_QUERIES = {
    "message": ("backfill_messages",),
    "status": ("backfill_statuses",),
    "account": ("backfill_account_errors", "backfill_account_updates"),
}


async def backfill_page(
    conn: Conn, *, query: str, since: datetime, until: datetime, after_id: int, limit: int
) -> list[dict[str, Any]]:
    """One page of already-processed events of one table, by id."""
    assert query in {name for names in BACKFILL_QUERIES.values() for name in names}
    return [dict(r) for r in await conn.fetch(q(query), since, until, after_id, limit)]

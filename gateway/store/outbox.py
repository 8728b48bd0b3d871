"""``outbox``: one row per business event (tenant, key); the sender's claims and results,
the reconciler's transitions and the operator's decisions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.core.enums import OutboxState, Provider, UnknownPolicy
from gateway.core.messages import callback_data
from gateway.store.db import Conn
from gateway.store.sqlfiles import q

# Every column of a row, as outbox_get returns it.
OutboxRow = asyncpg.Record


@dataclass(frozen=True, slots=True)
class NewMessage:
    tenant: str
    key: str
    provider: Provider | str
    phone_number_id: str
    recipient: str
    payload: dict[str, Any]
    unknown_policy: UnknownPolicy | str = UnknownPolicy.REVIEW
    fingerprint: str | None = None  # the send API's body fingerprint (None: not from the API)
    biz_opaque_callback_data: str | None = None  # the caller's own, returned with its statuses
    # A request waits for the outcome (the Graph-compatible endpoint): state changes are
    # announced on NOTIFY outbox_outcome.
    notify_outcome: bool = False


@dataclass(frozen=True, slots=True)
class Result:
    """What one send attempt did to its row (see ``record_results``)."""

    id: int
    state: OutboxState
    wamid: str | None
    next_at: float | None
    error: str | None
    code: int | None
    sent_at: float
    counted: bool = True  # False: an account-level refusal, which counts no attempt
    maybe_sent: bool = False  # the provider may have acted on it (sets ambiguous_at, retry_until)
    refusal: dict[str, Any] | None = None  # the provider's refusal as it answered (provider_error)


@dataclass(frozen=True, slots=True)
class Reconciled:
    id: int
    tenant: str
    idem_key: str
    state: OutboxState


def _columns(m: NewMessage, generation: int) -> tuple[Any, ...]:
    """$1-$11 of outbox_enqueue and outbox_renew."""
    policy = UnknownPolicy(m.unknown_policy)  # ValueError on anything else
    return (
        m.tenant,
        m.key,
        callback_data(m.tenant, m.key, generation),
        str(Provider(m.provider)),
        m.phone_number_id,
        m.recipient,
        m.payload,
        str(policy),
        m.fingerprint,
        m.biz_opaque_callback_data,
        m.notify_outcome,
    )


async def enqueue(conn: Conn, m: NewMessage) -> tuple[bool, OutboxRow]:
    """Insert the row unless (tenant, key) exists; returns (created, row). One statement when
    it is new (it commits on its own outside a transaction). The senders are not woken: see
    ``notify_senders`` and ``wake_senders``."""
    created: OutboxRow | None = await conn.fetchrow(q("outbox_enqueue"), *_columns(m, 0))
    if created is not None:
        return True, created
    row = await get(conn, tenant=m.tenant, key=m.key)
    assert row is not None
    return False, row


async def enqueue_batch(conn: Conn, msgs: Sequence[NewMessage]) -> dict[tuple[str, str], OutboxRow]:
    """Insert the rows of ``msgs`` (each under a key of its own) in one statement; the new rows
    by (tenant, key). A key that exists gets none."""
    columns = zip(*(_columns(m, 0) for m in msgs), strict=True)
    rows = await conn.fetch(q("outbox_enqueue_batch"), *(list(c) for c in columns))
    return {(r["tenant"], r["idem_key"]): r for r in rows}


async def renew(conn: Conn, m: NewMessage, *, generation: int) -> OutboxRow | None:
    """Make the failed row of (tenant, key) at ``generation`` a new send of ``m`` (the next
    generation); the row, or None if it is no longer that failed row."""
    done = await conn.fetchrow(q("outbox_renew"), *_columns(m, generation + 1), generation)
    if done is None:
        return None
    return await get(conn, tenant=m.tenant, key=m.key)


async def notify_senders(conn: Conn) -> None:
    """Wake the senders when the caller's transaction commits (NOTIFY ``outbox``): for a
    transaction that commits a batch, once; a request's own commit uses ``wake_senders`` after it."""
    await conn.execute(q("outbox_notify"))


async def wake_senders(conn: Conn) -> None:
    """Wake the senders now: NOTIFY ``outbox`` in a transaction of its own, committed without
    waiting for its flush (a hint: the senders also poll)."""
    await conn.execute(q("outbox_wake"))


async def get(conn: Conn, *, tenant: str, key: str) -> OutboxRow | None:
    row: OutboxRow | None = await conn.fetchrow(q("outbox_get"), tenant, key)
    return row


async def cancel_pending(conn: Conn, *, tenant: str, key: str) -> tuple[OutboxState, bool] | None:
    """Cancel the row if it is still pending: (its state now, whether this cancelled it); None
    when there is no such row."""
    r = await conn.fetchrow(q("outbox_cancel_pending"), tenant, key)
    return None if r is None else (OutboxState(r["state"]), bool(r["cancelled"]))


async def claim_candidates(conn: Conn, *, now: float, limit: int) -> list[asyncpg.Record]:
    """Due pending rows, locked until the caller's transaction ends; other senders skip them."""
    return list(await conn.fetch(q("outbox_claim_candidates"), now, limit))


async def mark_sending(conn: Conn, *, ids: Sequence[int], now: float) -> list[asyncpg.Record]:
    """The rows that go: ``sending`` from ``now``; returns what the provider request needs.
    A row past its ``retry_until`` goes to ``review`` instead (``parked`` is true in its record)."""
    if not ids:
        return []
    return list(await conn.fetch(q("outbox_mark_sending"), list(ids), now))


async def defer(conn: Conn, *, ids: Sequence[int], until: Sequence[float]) -> None:
    """Pacing or a breaker holds these back: still pending, due later (not an attempt)."""
    if ids:
        await conn.execute(q("outbox_defer"), list(ids), list(until))


async def bring_forward(conn: Conn, *, ids: Sequence[int], to: Sequence[float]) -> None:
    """Pending rows due later than ``to`` become due then (the send they waited for is done)."""
    if ids:
        await conn.execute(q("outbox_bring_forward"), list(ids), list(to))


async def record_results(conn: Conn, results: Sequence[Result], *, now: float, key_window_s: float) -> None:
    """Each attempt's outcome, for rows still ``sending`` (a status may have overtaken it);
    ``key_window_s``: how long after an ambiguous attempt a Tenashi row may still be retried."""
    await conn.execute(
        q("outbox_record_results"),
        [r.id for r in results],
        [str(r.state) for r in results],
        [r.wamid for r in results],
        [r.next_at for r in results],
        [r.error for r in results],
        [r.code for r in results],
        [r.sent_at for r in results],
        now,
        [r.counted for r in results],
        [r.maybe_sent for r in results],
        key_window_s,
        [r.refusal for r in results],
    )


async def announce_outcomes(conn: Conn, ids: Sequence[int]) -> int:
    """NOTIFY outbox_outcome for those of rows ``ids`` a Graph-compatible request waits for
    and whose state ends its wait, as the trigger does on one PostgreSQL (on a Citus
    coordinator the trigger is dropped); how many were announced. Outside the transaction that
    recorded them, after its commit."""
    payloads = [r["payload"] for r in await conn.fetch(q("outbox_outcome_final"), list(ids))]
    if not payloads:
        return 0
    n: int = await conn.fetchval(q("outbox_outcome_announce"), payloads)
    return n


async def expire_sending(
    conn: Conn, *, now: float, lease_s: float, limit: int, key_window_s: float
) -> list[int]:
    """Rows left ``sending`` past the lease (their sender died mid-request) become unknown;
    the attempt may have reached the provider (a Tenashi row's key window starts then)."""
    rows = await conn.fetch(q("outbox_expire_sending"), now, lease_s, limit, key_window_s)
    return [r["id"] for r in rows]


@dataclass(frozen=True, slots=True)
class Waiting:
    """Unknown rows past their window that wait for the inbox to catch up."""

    rows: int
    oldest_unprocessed: float | None  # epoch seconds of the oldest webhook they wait for
    dead: bool  # some of what they wait for is dead (an operator must replay or drop it)


async def reconcile_unknown(
    conn: Conn, *, now: float, window_s: float, limit: int
) -> tuple[list[Reconciled], Waiting]:
    """Unknown past the window: those waiting for no webhook follow their policy (resend →
    pending once; otherwise review), ``limit`` at most, oldest first; and what the others wait
    for. One look at the inbox for both."""
    due = await conn.fetch(q("outbox_unknown_due"), now, window_s)
    blocked = await _blockers(conn, due)
    waiting = Waiting(0, None, False)
    if blocked:
        oldest = min(r["oldest"] for r in blocked)
        waiting = Waiting(len(blocked), oldest.timestamp(), any(r["dead"] > 0 for r in blocked))
    held = {r["id"] for r in blocked}
    free = [r["id"] for r in due if r["id"] not in held][:limit]
    if not free:
        return [], waiting
    rows = await conn.fetch(q("outbox_reconcile_unknown"), free, now)
    return [Reconciled(r["id"], r["tenant"], r["idem_key"], OutboxState(r["state"])) for r in rows], waiting


async def _blockers(conn: Conn, due: Sequence[asyncpg.Record]) -> list[asyncpg.Record]:
    """Of the unknown rows ``due`` (outbox_unknown_due's), those that wait for a webhook: id,
    the oldest webhook waited for, how many of them are dead."""
    if not due:
        return []
    return list(
        await conn.fetch(
            q("outbox_unknown_blockers"),
            [r["id"] for r in due],
            [r["since"] for r in due],
            [r["until"] for r in due],
            min(r["since"] for r in due),
            max(r["until"] for r in due),
        )
    )


async def count_open(conn: Conn, *, cap: int) -> dict[OutboxState, int]:
    """Rows per state that drains (pending, sending, unknown, review, failed), each up to ``cap``."""
    return {OutboxState(r["state"]): r["n"] for r in await conn.fetch(q("outbox_count_open"), cap)}


async def oldest_unknown(conn: Conn) -> float | None:
    """Epoch seconds of the oldest ``unknown`` row's unknown_at (None: none)."""
    at: float | None = await conn.fetchval(q("outbox_oldest_unknown"))
    return at


async def list_state(conn: Conn, *, state: OutboxState | str, limit: int) -> list[asyncpg.Record]:
    return list(await conn.fetch(q("outbox_list_state"), str(OutboxState(state)), limit))


class AmbiguousKey(Exception):
    pass


async def _resolve_tenant(conn: Conn, key: str, tenant: str | None) -> str | None:
    rows = await conn.fetch(q("outbox_tenants_for_key"), key, tenant)
    if not rows:
        return None
    if len(rows) > 1:
        raise AmbiguousKey(", ".join(r["tenant"] for r in rows))
    tenant_name: str = rows[0]["tenant"]
    return tenant_name


class TooEarly(ValueError):
    """An unknown row inside its reconcile window: its status may still come, and a release now
    may send it twice. ``at``: when it may be released."""

    def __init__(self, text: str, at: datetime) -> None:
        super().__init__(text)
        self.at = at


def releasable_at(row: OutboxRow, window_s: float) -> datetime | None:
    """When an unknown row's reconcile window ends (None: the row is not unknown). The window
    runs from the moment its fate became unknown, as the reconciler's does."""
    if row["state"] != OutboxState.UNKNOWN:
        return None
    since: datetime = row["unknown_at"] or row["updated_at"]
    return since + timedelta(seconds=window_s)


def utc_text(t: datetime) -> str:
    return f"{t.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


async def release(
    conn: Conn, key: str, tenant: str | None = None, *, window_s: float, may_duplicate: bool = False
) -> str:
    """review/unknown/failed → pending (an operator decided to send). Returns a one-line result.
    An unknown row inside its reconcile window (``window_s``) is refused (``TooEarly``) unless
    ``may_duplicate``: the operator accepts that the customer may get it twice."""
    early: datetime | None = None
    if may_duplicate:
        row = await _row_of(conn, key, tenant)
        at = None if row is None else releasable_at(row, window_s)
        early = at if at is not None and at > datetime.now(UTC) else None
    text = await _transition(
        conn, "outbox_release", key, tenant, "released", window_s=window_s, may_duplicate=may_duplicate
    )
    if early is not None:
        text += (
            f" (before its reconcile window ended at {utc_text(early)}: the operator accepted that it"
            " may be sent twice)"
        )
    return text


async def cancel(conn: Conn, key: str, tenant: str | None = None) -> str:
    """pending/review/unknown/failed → cancelled."""
    return await _transition(conn, "outbox_cancel", key, tenant, "cancelled")


async def unprocessed_latest(conn: Conn) -> datetime | None:
    """When the newest webhook not processed yet was received (None: none): a release waits
    for it if the row is older (read in the release's transaction, before its statement)."""
    at: datetime | None = await conn.fetchval(q("outbox_unprocessed_latest"))
    return at


async def _row_of(conn: Conn, key: str, tenant: str | None) -> OutboxRow | None:
    found = await _resolve_tenant(conn, key, tenant)
    return None if found is None else await get(conn, tenant=found, key=key)


async def _transition(
    conn: Conn,
    query: str,
    key: str,
    tenant: str | None,
    verb: str,
    *,
    window_s: float = 0.0,
    may_duplicate: bool = False,
) -> str:
    found = await _resolve_tenant(conn, key, tenant)
    if found is None:
        raise LookupError(f"no outbox row with key {key!r}" + (f" for tenant {tenant!r}" if tenant else ""))
    extra = (window_s, may_duplicate, await unprocessed_latest(conn)) if verb == "released" else ()
    state = await conn.fetchval(q(query), found, key, *extra)
    if state is None:
        row = await get(conn, tenant=found, key=key)
        if row is None:
            raise ValueError(f"{found}/{key} is gone: not {verb}")
        reached = never_again(row)
        if verb == "released" and reached and row["state"] in RELEASABLE:
            raise ValueError(
                f"{found}/{key} is {row['state']} but {reached}: not {verb} (it would be sent twice)"
            )
        at = releasable_at(row, window_s)
        if verb == "released" and not may_duplicate and at is not None and at > datetime.now(UTC):
            raise TooEarly(
                f"{found}/{key} is unknown since {utc_text(row['unknown_at'] or row['updated_at'])} and its "
                f"status may still come (the reconcile window, GATEWAY_RECONCILE_WINDOW_S, is "
                f"{window_s:g} s): not {verb} yet; it may be released from {utc_text(at)}, when the "
                "reconciler also decides on it (a release before then may send it twice)",
                at,
            )
        if verb == "released" and row["state"] in RELEASABLE:
            u = await conn.fetchrow(q("outbox_unprocessed_since"), row["created_at"])
            assert u is not None
            raise ValueError(
                f"{found}/{key} is {row['state']} but {u['pending']} pending and {u['dead']} dead "
                "webhook(s) received since it was created are unprocessed and may hold its status: "
                f"not {verb} yet (retry once the consumers catch up; replay dead ones with "
                "`gateway dead replay`)"
            )
        raise ValueError(f"{found}/{key} is {row['state']}: not {verb}")
    return f"{found}/{key} {verb}: now {state}"


RELEASABLE = frozenset({OutboxState.REVIEW, OutboxState.UNKNOWN, OutboxState.FAILED})
CANCELLABLE = RELEASABLE | {OutboxState.PENDING}


def reached_provider(row: OutboxRow) -> str | None:
    """Why a row is known to have reached the provider (None: it is not known to)."""
    if row["wamid"] is not None:
        return f"the provider accepted it as {row['wamid']}"
    if row["delivery_status"] is not None:
        return f"it has delivery status {row['delivery_status']!r}"
    return None


def never_again(row: OutboxRow, now: datetime | None = None) -> str | None:
    """Why a row must never be sent again (None: a release may send it): it reached the
    provider, or its provider no longer remembers the Idempotency-Key of an attempt that may
    have reached it (``retry_until``, Tenashi's 24 h). The statements that release
    (``outbox_release``, ``outbox_release_bulk``) and claim (``outbox_mark_sending``) check
    the same in SQL."""
    reached = reached_provider(row)
    if reached is not None:
        return reached
    until = row["retry_until"]
    if until is not None and until <= (now or datetime.now(UTC)):
        provider, first = row["provider"], row["ambiguous_at"]
        return (
            f"its first attempt that may have reached {provider} was at {first:%Y-%m-%d %H:%M:%S} UTC "
            f"and {provider} honours its Idempotency-Key only until {until:%Y-%m-%d %H:%M:%S} UTC"
        )
    return None


@dataclass(frozen=True, slots=True)
class Bulk:
    done: int
    refused: int  # release only: rows that must never be sent again (``never_again``)
    waiting: int = 0  # release only: rows whose period has unprocessed webhooks
    early: int = 0  # release only: unknown rows inside their reconcile window
    early_first: datetime | None = None  # when the first of those may be released
    early_last: datetime | None = None  # and the last
    released_early: int = 0  # released inside their window: the operator accepted duplicates


async def release_bulk(
    conn: Conn,
    *,
    state: OutboxState | str,
    since: float | None,
    until: float | None,
    tenant: str | None,
    window_s: float,
    may_duplicate: bool = False,
) -> Bulk:
    """Release every row in ``state`` changed in [since, until) (of ``tenant``), except rows
    that reached the provider, and unknown rows inside their reconcile window unless
    ``may_duplicate``."""
    if OutboxState(state) not in RELEASABLE:
        raise ValueError(f"only review, unknown or failed rows can be released, not {state}")
    r = await conn.fetchrow(
        q("outbox_release_bulk"), str(OutboxState(state)), since, until, tenant, window_s, may_duplicate,
        await unprocessed_latest(conn),
    )  # fmt: skip
    assert r is not None
    return Bulk(
        int(r["done"]), int(r["refused"]), int(r["waiting"]), int(r["early"]), r["early_first"],
        r["early_last"], int(r["released_early"]),
    )  # fmt: skip


async def cancel_bulk(
    conn: Conn, *, state: OutboxState | str, since: float | None, until: float | None, tenant: str | None
) -> Bulk:
    """Cancel every row in ``state`` changed in [since, until) (of ``tenant``)."""
    if OutboxState(state) not in CANCELLABLE:
        raise ValueError(f"only pending, review, unknown or failed rows can be cancelled, not {state}")
    r = await conn.fetchrow(q("outbox_cancel_bulk"), str(OutboxState(state)), since, until, tenant)
    assert r is not None
    return Bulk(int(r["done"]), int(r["refused"]))

"""The consumers' I/O around a failure (``gateway.core.faults`` decides what it means): the probe
that confirms a systemic error, the partition a row found missing, the attempt counted against
a webhook moved aside, and the metrics and log lines of a batch."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterable

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from gateway import metrics
from gateway.core.errors import describe
from gateway.core.faults import missing_partition
from gateway.core.jsonspan import pointer
from gateway.core.planning import Plan, probe_plan
from gateway.store import db, inbox, retention

log = logging.getLogger("gateway.inbound.consumer")

# Lines logged for one row's malformed fragments; the rest are counted in one more line (a
# body may hold thousands, each a dead item listed by `gateway dead list`).
BAD_LINES_PER_ROW = 3

# A connection the consumer holds a transaction on.
Conn = asyncpg.Connection | PoolConnectionProxy


class SystemFault(Exception):
    """The database failed systemically (a probe failed too): put the rows off."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(describe(cause))


class _Rollback(Exception):
    """Ends a probe's savepoint: nothing it wrote may stay."""


def cause(exc: BaseException) -> BaseException:
    return exc.cause if isinstance(exc, SystemFault) else exc


async def probe(
    pool: asyncpg.Pool, conn: Conn, exc: BaseException, kinds: Iterable[str], source: str = "meta"
) -> BaseException | None:
    """Confirm a systemic error: the error harmless events of ``kinds`` also get (applied in
    a savepoint of ``conn``'s transaction and rolled back), or None if they go through (then
    ``exc`` was the event's own). A day without its partition gets one (on a connection of its
    own) and counts as confirmed: the rows wait a moment, no attempt counted."""
    table = missing_partition(exc)
    if table is not None:
        async with pool.acquire() as own:
            created = await retention.ensure_today(own, table=table)
        log.warning("a row of %s found no day partition: %s", table, "made" if created else "it exists now")
        return exc
    try:
        async with conn.transaction():
            probe = probe_plan(list(kinds) or ["message"], source, uuid.uuid4().hex)
            await inbox.apply_plan(conn, probe, citus=(await db.citus_state(conn))[0])
            raise _Rollback
    except _Rollback:
        return None
    except Exception as failed:
        if conn.is_closed():
            raise
        return failed


async def parked_attempt(
    conn: asyncpg.Pool | Conn,
    *,
    inbox_id: int,
    max_attempts: int,
    delay_s: float,
    exc: BaseException | None = None,
) -> None:
    """A webhook moved aside failed again (``exc``; None: it headed retries that committed
    nothing): one attempt, in ``conn``'s transaction or one of its own; dead at ``max_attempts``."""
    why = "taken alone after retries that committed nothing" if exc is None else describe(exc)
    row = await inbox.parked_attempt(
        conn, inbox_id=inbox_id, max_attempts=max_attempts, delay_s=delay_s, error=why
    )
    if row is None:
        return
    state, attempts = row
    metrics.CONSUMER_FAILURES.inc()
    if state == "dead":
        metrics.DEAD_LETTERS.labels("stalled").inc()
        log.error("inbox row %d dead after %d attempts on its own: %s", inbox_id, attempts, why)
    else:
        log.warning("inbox row %d failed on its own (attempt %d): %s", inbox_id, attempts, why)


def moved_aside(inbox_id: int, state: str | None, exc: BaseException) -> None:
    """A row that failed alone where nothing could be recorded left its lane (``state`` in
    ``inbox_parked``; None: it was there already)."""
    metrics.CONSUMER_FAILURES.inc()
    if state == "dead":
        metrics.DEAD_LETTERS.labels("stalled").inc()
        log.error("inbox row %d moved aside dead: %s", inbox_id, describe(exc))
    else:
        log.warning("inbox row %d moved aside, retried on its own: %s", inbox_id, describe(exc))


def observe(plan: Plan, result: inbox.Applied) -> None:
    """Metrics and log lines of a batch that committed on the fast path."""
    fresh = {
        "message": result.messages,
        "status": result.statuses,
        "account_error": result.account_errors,
        "account_update": result.account_updates,
    }
    duplicates = plan.duplicates_in_batch
    for kind, total in plan.kinds.items():
        new = fresh.get(kind, 0)
        metrics.CONSUMER_EVENTS.labels(kind, "processed").inc(new)
        metrics.CONSUMER_EVENTS.labels(kind, "duplicate").inc(total - new)
        duplicates += total - new
    metrics.CONSUMER_DUPLICATES.inc(duplicates)
    if plan.parked:
        metrics.DEAD_LETTERS.labels("unparseable").inc(len(plan.parked))
        for inbox_id, why in zip(plan.parked, plan.parked_why, strict=True):
            log.error("inbox row %d moved aside dead: %s", inbox_id, why)
    if plan.bad:
        metrics.DEAD_LETTERS.labels("bad_fragment").inc(len(plan.bad))
        # A row's fragments are next to each other in ``plan.bad`` (planned row by row).
        for inbox_id, group in itertools.groupby(plan.bad, key=lambda bad: bad[0].id):
            items = [item for _, item in group]
            for item in items[:BAD_LINES_PER_ROW]:
                log.error(
                    "inbox row %d: fragment %s parked as dead: %s", inbox_id, pointer(item.path), item.error
                )
            if len(items) > BAD_LINES_PER_ROW:
                more = len(items) - BAD_LINES_PER_ROW
                log.error(
                    "inbox row %d: %d more fragments parked as dead (gateway dead list)", inbox_id, more
                )

"""The one maintenance job for storage: day partitions created ahead of time, partitions
past their table's horizon dropped whole, and the few unpartitioned row sets trimmed in
bounded batches. One replica at a time (a session advisory lock); the others skip the run.

A pass makes the coming partitions first, then drops, then trims, each DDL under
lock_timeout and on its own, so one that cannot get its lock (a session idle in transaction,
say) delays neither the others nor the next step; what failed is retried on the next pass,
and the pass as a whole raises ``PassFailed`` naming every step that failed. A DDL that would
take a lock writers queue behind is not even tried while a transaction has held the table for
``BLOCKER_S``: the failure names its pid. Nothing that writes depends on a pass having run
(migration 0017: partitions made on demand, a default partition for dedup keys); the gauges
say how many days are ready and when a pass last went through, and alert rules watch them.

Horizons (days): dedup keys ``dedup_retention_days`` (never below Meta's 7-day retry
window, plus one day of slack for clocks), staging rows ``inbox_retention_days``, statuses
``status_retention_days``, the inbound feed ``inbound_retention_days``, account records
``account_retention_days``, terminal outbox rows ``outbox_retention_days`` (at least the send
API's idempotency window), delivery attempts ``delivery_retention_days`` (open deliveries,
failed ones included, stay queued for an operator's replay), delivery bodies that much more
the retry window (an open delivery's body is carried forward first), dead events a retry or
replay finished ``inbox_retention_days``, reply claims ``dedup_retention_days``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

import asyncpg

from gateway import metrics
from gateway.core.settings import Settings
from gateway.store import retention

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Partitioned:
    table: str
    keep_days: int  # a partition is dropped when its day is before today - keep_days
    back_days: int  # partitions kept existing from today - back_days (events' own days)


def partitioned(s: Settings) -> list[Partitioned]:
    """Every partitioned table with its horizon."""
    return [
        # Keys whose event day is today - dedup_retention_days are still consulted; a day of
        # slack covers a consumer whose clock is ahead of ours.
        Partitioned("processed_webhook_events", s.dedup_retention_days + 1, s.dedup_retention_days + 1),
        Partitioned("webhook_inbox", s.inbox_retention_days, 1),
        Partitioned("inbound_messages", s.inbound_retention_days, 1),
        Partitioned("message_statuses", s.status_retention_days, 1),
        Partitioned("account_errors", s.account_retention_days, 1),
        Partitioned("account_updates", s.account_retention_days, 1),
        # Attempts of deliveries, by the attempt's day.
        Partitioned("delivery_log", s.delivery_retention_days, 1),
        # Delivery bodies, by the day stored: as long as the log rows that may replay them (a
        # delivery is made within the retry window of its storing), and as long as an open
        # delivery needs one (carried forward before its day is dropped).
        Partitioned("delivery_events", delivery_events_keep_days(s), 1),
    ]


def delivery_events_keep_days(s: Settings) -> int:
    """Days delivery bodies are kept: the log's days, the retry window and a day of slack."""
    return s.delivery_retention_days + math.ceil(s.forward_retry_h / 24) + 1


# A DDL that writers would queue behind is not tried while a transaction has held its table
# this long (seconds): a forgotten session would otherwise stall them for the lock_timeout
# of every pass.
BLOCKER_S = 10.0


class PassFailed(Exception):
    """Some steps of a pass failed (each retried on the next pass); the rest went through."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        super().__init__("; ".join(failures))


@dataclass
class Report:
    """What one run did (for logs and tests); ``ran`` is False when another replica held the lock."""

    ran: bool = False
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    carried: int = 0
    carried_events: int = 0  # delivery bodies of open deliveries moved out of dropped days
    purged: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    ahead_days: int | None = None


MEDIA_DAYS = 30


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


async def run_once(
    pool: asyncpg.Pool, settings: Settings, stop: asyncio.Event | None = None, *, today: date | None = None
) -> Report:
    """One maintenance pass, if no other replica is running one. The days of partitions ready
    ahead are measured in every case (a gauge that keeps an old value hides a failing job).
    Raises ``PassFailed`` after the pass if a step failed."""
    today = datetime.now(UTC).date() if today is None else today
    report = Report()
    async with pool.acquire() as conn:
        try:
            if await retention.try_lock(conn):
                report.ran = True
                try:
                    await _create(conn, settings, today, report)
                    await _drop(conn, settings, today, report)
                    await _purges(conn, settings, report, stop)
                finally:
                    await retention.unlock(conn)
            else:
                log.debug("maintenance: another replica holds the lock")
        finally:
            report.ahead_days = await _ahead(conn, settings, today)
            metrics.PARTITIONS_AHEAD.set(report.ahead_days)
    if report.created or report.dropped:
        log.info("partitions: created %s, dropped %s", report.created, report.dropped)
    if report.carried:
        log.warning("partitions: moved %d staged rows not done out of dropped days", report.carried)
    if report.carried_events:
        log.info("partitions: moved %d events of open deliveries out of dropped days", report.carried_events)
    if report.failures:
        metrics.MAINTENANCE_FAILURES.inc(len(report.failures))
        raise PassFailed(report.failures)
    if report.ran:
        metrics.MAINTENANCE_LAST_OK.set_to_current_time()
    return report


async def _ahead(conn: retention.Session, s: Settings, today: date) -> int:
    """Days ahead of today covered by partitions, the least over the partitioned tables."""
    ahead = [await retention.days(conn, table=p.table) for p in partitioned(s)]
    return min(((d[-1] - today).days if d else -1) for d in ahead)


def _failed(report: Report, step: str, exc: BaseException) -> None:
    why = f"{step}: {type(exc).__name__}: {exc}"[:500]
    report.failures.append(why)
    log.warning("maintenance: %s (retried on the next pass)", why)


async def _blocked(conn: retention.Session, table: str) -> str | None:
    """Who holds ``table`` long enough that a DDL writers queue behind must not wait for it."""
    held = await retention.blocker(conn, table=table, held_s=BLOCKER_S)
    if held is None:
        return None
    pid, since = held
    return f"a transaction has held {table} since {since:%Y-%m-%d %H:%M:%S %Z} (pid {pid}, idle in it?)"


async def _create(conn: retention.Session, s: Settings, today: date, report: Report) -> None:
    """The coming partitions of every table, first: a table whose DDL cannot get its lock is
    left for the next pass, the others go on."""
    for p in partitioned(s):
        if await retention.has_default(conn, table=p.table) and (why := await _blocked(conn, p.table)):
            # Its rows of those days are in the default partition meanwhile: nothing is lost.
            report.failures.append(f"create {p.table}: not tried: {why}")
            log.warning("maintenance: partitions of %s not made: %s", p.table, why)
            continue
        for offset in range(-p.back_days, s.partitions_ahead_days + 1):
            day = today + timedelta(days=offset)
            try:
                if await retention.ensure_day(conn, table=p.table, day=day):
                    report.created.append(f"{p.table}_p{day:%Y%m%d}")
            except asyncpg.PostgresError as exc:
                _failed(report, f"create {p.table}_p{day:%Y%m%d}", exc)
                break


async def _drop(conn: retention.Session, s: Settings, today: date, report: Report) -> None:
    """Partitions past their horizon, table by table; a drop that cannot get its lock is left
    for the next pass (a detach it began is finished then)."""
    for p in partitioned(s):
        cutoff = today - timedelta(days=p.keep_days)
        try:
            if p.table == "webhook_inbox":
                # Pending rows and dead letters are not ours to drop: they move to today.
                report.carried += await retention.inbox_carry_forward(conn, before=_midnight(cutoff))
            if await retention.has_default(conn, table=p.table) and (why := await _blocked(conn, p.table)):
                report.failures.append(f"drop {p.table}: not tried: {why}")
                log.warning("maintenance: old partitions of %s not dropped: %s", p.table, why)
                continue
            if p.table == "delivery_events":
                # Open deliveries' bodies move to today first; nothing refers to an old body
                # again until the old days are gone.
                async with retention.bodies_locked(conn):
                    report.carried_events += await retention.delivery_events_carry_forward(
                        conn, before=cutoff
                    )
                    await _drop_days(conn, p, cutoff, report)
            else:
                await _drop_days(conn, p, cutoff, report)
        except asyncpg.PostgresError as exc:
            _failed(report, f"drop {p.table}", exc)


async def _drop_days(conn: retention.Session, p: Partitioned, cutoff: date, report: Report) -> None:
    while name := await retention.drop_oldest(conn, table=p.table, before=cutoff, keep_days=p.keep_days):
        report.dropped.append(name)
        metrics.PARTITIONS_DROPPED.labels(p.table).inc()


async def _purges(conn: retention.Session, s: Settings, report: Report, stop: asyncio.Event | None) -> None:
    plan = (
        ("processed_webhook_events", s.dedup_retention_days),
        ("reply_claims", s.dedup_retention_days),
        ("outbox", s.outbox_retention_days),
        # Open deliveries of removed destinations (the rest of the deliveries are partitioned).
        ("delivery_queue", 1),
        ("dead_events", s.inbox_retention_days),  # only those a retry or replay finished
        ("inbox_parked", s.inbox_retention_days),  # the same
        # Exact bytes of escaped events: kept as long as the raw bodies they came from.
        ("event_fragments", s.inbox_retention_days),
        # Meta keeps a media file 30 days: its id means nothing after that.
        ("media", MEDIA_DAYS),
    )
    for table, days in plan:
        n = await retention.purge_table(
            conn, table=table, older_than_days=days, batch=s.purge_batch, stop=stop
        )
        report.purged[table] = n
        if n:
            metrics.RETENTION_PURGED.labels(table).inc(n)
            log.info("retention: purged %d rows from %s (older than %d days)", n, table, days)

"""The one maintenance job for storage: day partitions created ahead of time, partitions
past their table's horizon dropped whole, and the few unpartitioned row sets trimmed in
bounded batches. One replica at a time (a session advisory lock); the others skip the run.

Horizons (days): dedup keys ``dedup_retention_days`` (never below Meta's 7-day retry
window, plus one day of slack for clocks), staging rows ``inbox_retention_days``, statuses
``status_retention_days``, the inbound feed ``inbound_retention_days``, account records
``account_retention_days``, terminal outbox rows ``outbox_retention_days`` (at least the send
API's idempotency window), delivered deliveries ``delivery_retention_days`` (failed ones stay
for an operator's replay), dead events a retry or replay finished ``inbox_retention_days``,
reply claims
``dedup_retention_days``.
"""

from __future__ import annotations

import asyncio
import logging
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
    ]


@dataclass
class Report:
    """What one run did (for logs and tests); ``ran`` is False when another replica held the lock."""

    ran: bool = False
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    carried: int = 0
    purged: dict[str, int] = field(default_factory=dict)


MEDIA_DAYS = 30


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


async def run_once(
    pool: asyncpg.Pool, settings: Settings, stop: asyncio.Event | None = None, *, today: date | None = None
) -> Report:
    """One maintenance pass, if no other replica is running one."""
    today = datetime.now(UTC).date() if today is None else today
    report = Report()
    async with pool.acquire() as conn:
        if not await retention.try_lock(conn):
            log.debug("maintenance: another replica holds the lock")
            return report
        try:
            report.ran = True
            await _partitions(conn, settings, today, report)
            await _purges(conn, settings, report, stop)
        finally:
            await retention.unlock(conn)
    return report


async def _partitions(conn: retention.Session, s: Settings, today: date, report: Report) -> None:
    for p in partitioned(s):
        for offset in range(-p.back_days, s.partitions_ahead_days + 1):
            day = today + timedelta(days=offset)
            if await retention.ensure_day(conn, table=p.table, day=day):
                report.created.append(f"{p.table}_p{day:%Y%m%d}")
        cutoff = today - timedelta(days=p.keep_days)
        if p.table == "webhook_inbox":
            # Pending rows and dead letters are not ours to drop: they move to today.
            report.carried += await retention.inbox_carry_forward(conn, before=_midnight(cutoff))
        while (name := await retention.drop_oldest(conn, table=p.table, before=cutoff)) is not None:
            report.dropped.append(name)
            metrics.PARTITIONS_DROPPED.labels(p.table).inc()
    ahead = [await retention.days(conn, table=p.table) for p in partitioned(s)]
    metrics.PARTITIONS_AHEAD.set(min(((d[-1] - today).days if d else -1) for d in ahead))
    if report.created or report.dropped:
        log.info("partitions: created %s, dropped %s", report.created, report.dropped)
    if report.carried:
        log.warning("partitions: moved %d staged rows not done out of dropped days", report.carried)


async def _purges(conn: retention.Session, s: Settings, report: Report, stop: asyncio.Event | None) -> None:
    plan = (
        ("processed_webhook_events", s.dedup_retention_days),
        ("reply_claims", s.dedup_retention_days),
        ("outbox", s.outbox_retention_days),
        ("deliveries", s.delivery_retention_days),
        ("dead_events", s.inbox_retention_days),  # only those a retry or replay finished
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

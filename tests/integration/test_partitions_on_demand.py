"""Nothing that ingests or consumes depends on the maintenance job; a forgotten session (idle in
transaction) delays neither the coming partitions nor the gauges; a dedup key's day is its
event's, whatever the clock did between a delivery and its redelivery."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession
from prometheus_client import REGISTRY

from gateway.core import planning
from gateway.core.settings import Settings
from gateway.maintenance import retention
from gateway.operator import actions
from gateway.store import retention as store
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.support.clock import MovedClock
from tests.support.consume import drain
from tests.support.forward import add, all_delivered, fast, forwarding, process_messages, until
from tests.support.http import post_meta

OPERATOR = actions.Actor("tester", "cli")
TIME_TABLES = ("webhook_inbox", "inbound_messages", "message_statuses", "account_errors", "account_updates")


async def detach_days(pool: asyncpg.Pool, table: str, days: list[date]) -> None:
    """Take days' partitions away, as if the job had not made them."""
    for day in days:
        name = f"{table}_p{day:%Y%m%d}"
        if await pool.fetchval("SELECT to_regclass($1)", name) is not None:
            await pool.execute(f"ALTER TABLE {table} DETACH PARTITION {name}")
            await pool.execute(f"DROP TABLE {name}")


async def test_ingest_and_consumers_make_a_day_that_has_no_partition(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, today: date
) -> None:
    """The job never ran: today has no partition anywhere. A webhook is still acknowledged only
    once stored, and processed."""
    for table in TIME_TABLES:
        await detach_days(pool, table, [today, today + timedelta(days=1)])
    gw = await start_gateway(settings)
    body = to_bytes(messages_payload(message_obj("wamid.NOPART")))
    assert (await post_meta(http, gw, body))[0] == 200
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 1
    await drain(pool, settings)
    assert await pool.fetchval("SELECT state FROM inbox_row_states()") == "done"
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages WHERE wamid = 'wamid.NOPART'") == 1
    for table in ("webhook_inbox", "inbound_messages"):
        assert today in await store.days(pool, table=table)


async def test_deliveries_make_a_day_that_has_no_partition(
    settings: Settings, pool: asyncpg.Pool, receiver: FakeReceiver, today: date
) -> None:
    """The job never ran: today has no partition of the deliveries' events or of their log (a
    database a migration alone set up, which the job has not reached since). Events are still
    appended for the destination, delivered and their attempts logged."""
    for table in ("delivery_events", "delivery_log"):
        await detach_days(pool, table, [today, today + timedelta(days=1)])
    await add(pool, "crm", receiver.url, ("message",))
    keys = await process_messages(pool, settings, 3, prefix="wamid.DAY")
    assert await pool.fetchval("SELECT count(*) FROM delivery_queue") == len(keys)
    async with forwarding(pool, fast(settings)):
        await until(lambda: all_delivered(pool), timeout_s=15, what="every delivery delivered")
    assert len(receiver.state.processed) == len(keys)
    assert await pool.fetchval("SELECT count(*) FROM delivery_log WHERE outcome = 'delivered'") == len(keys)
    for table in ("delivery_events", "delivery_log"):
        assert today in await store.days(pool, table=table)


async def test_a_backfill_on_a_day_without_its_partition_writes_nothing_until_the_day_is_made(
    settings: Settings, pool: asyncpg.Pool, receiver: FakeReceiver, today: date
) -> None:
    """An operator's backfill runs in its action's transaction, where a partition made on the
    spot would stay invisible to the consumers until it ends: on a day the job has not made
    yet it fails with PostgreSQL's error and writes nothing, and succeeds once the day exists."""
    keys = await process_messages(pool, settings, 2, prefix="wamid.BACK")
    await detach_days(pool, "delivery_events", [today, today + timedelta(days=1)])
    await add(pool, "late", receiver.url, ("message",))
    now = await pool.fetchval("SELECT now()")
    window = {"destination": "late", "since": now - timedelta(hours=1), "until": now + timedelta(hours=1)}
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.CheckViolationError, match="no partition of relation"):
            await actions.backfill_deliveries(conn, OPERATOR, **window)
        assert await conn.fetchval("SELECT count(*) FROM delivery_queue") == 0
        assert await store.ensure_today(conn, table="delivery_events")
        done = await actions.backfill_deliveries(conn, OPERATOR, **window)
    assert done.inserted == len(keys)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_forgotten_session_delays_neither_the_coming_partitions_nor_the_gauge(
    http: ClientSession,
    start_gateway: Any,
    settings: Settings,
    pool: asyncpg.Pool,
    db_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    today: date,
) -> None:
    s = dataclasses.replace(settings, partitions_ahead_days=3)
    old = today - timedelta(days=60)
    coming = [today + timedelta(days=d) for d in (1, 2, 3)]
    for table in (*TIME_TABLES, "processed_webhook_events"):
        async with pool.acquire() as conn:
            await store.ensure_day(conn, table=table, day=old)  # due for a drop
    for table in TIME_TABLES:
        await detach_days(pool, table, coming)  # the horizon ran out
    # Someone's psql: BEGIN; SELECT ... and off to lunch.
    forgotten = await asyncpg.connect(db_dsn)
    await forgotten.execute("BEGIN")
    for table in (*TIME_TABLES, "processed_webhook_events"):
        await forgotten.fetchval(f"SELECT count(*) FROM {table}")
    try:
        # The blocker check looks for transactions older than BLOCKER_S: make this one so.
        monkeypatch.setattr(retention, "BLOCKER_S", 0.0, raising=False)
        failures_before = sample("gateway_maintenance_failures_total")
        ok_before = sample("gateway_maintenance_last_ok_timestamp_seconds")
        try:
            await asyncio.wait_for(retention.run_once(pool, s), 60)  # a minute is plenty
        except retention.PassFailed as exc:
            why = exc.failures
        else:
            pytest.fail("the pass did not say what it could not do")
        monkeypatch.undo()
        # The coming days were made all the same, first, for every table written by time.
        for table in TIME_TABLES:
            assert set(coming) <= set(await store.days(pool, table=table)), table
        # What could not be done is named, and waits for the next pass.
        assert any(f.startswith("drop webhook_inbox") and "lock timeout" in f for f in why), why
        pid = f"pid {forgotten.get_server_pid()}"
        assert any("processed_webhook_events" in f and pid in f for f in why), why
        assert old in await store.days(pool, table="webhook_inbox")
        # The gauge is measured after a failed pass too; the last success is not moved.
        assert sample("gateway_partitions_ahead_days") == 3
        assert sample("gateway_maintenance_failures_total") >= failures_before + 2
        assert sample("gateway_maintenance_last_ok_timestamp_seconds") == ok_before
        # Webhooks are taken and processed meanwhile.
        gw = await start_gateway(s)
        assert (await post_meta(http, gw, to_bytes(messages_payload(message_obj("wamid.LUNCH")))))[0] == 200
        await drain(pool, s)
        assert await pool.fetchval("SELECT count(*) FROM inbound_messages WHERE wamid = 'wamid.LUNCH'") == 1
    finally:
        await forgotten.close()
    # Back from lunch: the next pass finishes what was left.
    report = await retention.run_once(pool, s)
    assert old not in await store.days(pool, table="webhook_inbox")
    assert f"processed_webhook_events_p{old:%Y%m%d}" in report.dropped
    assert sample("gateway_maintenance_last_ok_timestamp_seconds") > ok_before


@pytest.mark.parametrize(("hours_ahead", "days_later"), [(36, 1), (36, 2), (24 * 6, 3)])
async def test_a_redelivery_after_midnight_meets_its_key(
    monkeypatch: pytest.MonkeyPatch,
    pool: asyncpg.Pool,
    settings: Settings,
    hours_ahead: int,
    days_later: int,
    today: date,
) -> None:
    """A status stamped ahead of our clock, then its redelivery consumed days later (after the
    job made more days): one history row, one key."""
    monkeypatch.setattr(planning, "datetime", MovedClock, raising=False)
    stamp = datetime.now(UTC) + timedelta(hours=hours_ahead)
    at = str(int(stamp.timestamp()))
    body = to_bytes(statuses_payload(status_obj("wamid.AHEAD", "delivered", timestamp=at)))
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", body)
    await drain(pool, settings)
    MovedClock.shift = timedelta(days=days_later)
    await retention.run_once(pool, settings, today=today + timedelta(days=days_later))
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", body)
    await drain(pool, settings)
    assert await pool.fetchval("SELECT count(*) FROM message_statuses WHERE wamid = 'wamid.AHEAD'") == 1
    keys = await pool.fetch(
        "SELECT event_day FROM processed_webhook_events WHERE event_key LIKE 'status:wamid.AHEAD%'"
    )
    assert [r[0] for r in keys] == [stamp.date()]


async def test_a_process_that_hangs_after_making_a_partition_holds_its_table_for_seconds_only(
    pool: asyncpg.Pool, db_dsn: str, today: date
) -> None:
    """A replica stopped (SIGSTOP, a paused VM) between making a partition and its COMMIT
    leaves a transaction idle that holds the default partition's lock (rows of the new day
    move out of it): the server ends that transaction, so readers whose scan includes the
    default partition (a key looked up without its day: the console, replay) go on within seconds
    instead of waiting for the process to come back."""
    hung = await asyncpg.connect(db_dsn)
    try:
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
            async with hung.transaction():  # ensure_day's own transaction becomes a savepoint
                day = today + timedelta(days=40)
                assert await store.ensure_day(hung, table="processed_webhook_events", day=day)
                seen = pool.fetchval(
                    "SELECT count(*) FROM processed_webhook_events WHERE event_key = 'msg:wamid.HUNG'"
                )
                assert await asyncio.wait_for(seen, 30) == 0
                await hung.execute("SELECT 1")  # its session was ended meanwhile
    finally:
        await hung.close()

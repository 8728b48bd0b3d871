"""Retention: whole day partitions dropped past each table's horizon, never a dedup key younger
than the window; partitions created ahead; unpartitioned row sets trimmed in bounded batches;
two replicas at once; start-up refuses a dedup retention below 7 days."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta

import asyncpg
import pytest
from prometheus_client import REGISTRY

from gateway.core.events import UNTIMED_DAY
from gateway.core.lanes import LaneSet, advance
from gateway.core.planning import plan_batch
from gateway.core.settings import Settings, SettingsError
from gateway.inbound.lanes import LaneLease
from gateway.maintenance import retention
from gateway.store import inbox
from gateway.store import retention as store
from gateway.store.db import create_pool
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.support.citus_db import on_cluster
from tests.support.config import replace
from tests.support.consume import dead_row, drain, read_all, stage
from tests.support.deliveries import made_up
from tests.support.forward import until

# The tests marked citus also run on a Citus cluster (make test-citus), where every partition is
# made and dropped on each shard; the others check the same SQL's rules (horizons per table,
# one replica at a time) at many times the cost there.


async def ensure_day(pool: asyncpg.Pool, table: str, day: date) -> None:
    async with pool.acquire() as conn:
        await store.ensure_day(conn, table=table, day=day)


def noon(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 12, tzinfo=UTC)


@pytest.mark.parametrize("days", ["1", "6"])
def test_dedup_retention_below_seven_days_is_refused(days: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"GATEWAY_DEDUP_RETENTION_DAYS": days})
    assert f"GATEWAY_DEDUP_RETENTION_DAYS: must be >= 7 (Meta redelivers for 7 days), got {days}" in str(
        err.value
    )


def test_dedup_retention_of_seven_days_is_accepted() -> None:
    assert Settings.from_env({"GATEWAY_DEDUP_RETENTION_DAYS": "7"}).dedup_retention_days == 7


def test_outbox_retention_must_cover_the_idempotency_window() -> None:
    with pytest.raises(SettingsError, match="GATEWAY_OUTBOX_RETENTION_DAYS: must cover"):
        Settings.from_env({"GATEWAY_OUTBOX_RETENTION_DAYS": "2", "GATEWAY_IDEMPOTENCY_TTL_H": "72"})


async def redeliver(pool: asyncpg.Pool, body: bytes) -> inbox.Applied:
    """Stage ``body`` again and process it as a consumer would (whatever the day: a key's day
    is its event's)."""
    inbox_id = await stage(pool, body)
    lanes = LaneSet()
    lease = LaneLease(Settings(), lanes)
    async with pool.acquire() as conn:
        await lease.refresh(conn)
        taken = lanes.take_lane(await conn.fetchval("SELECT lane FROM webhook_inbox WHERE id = $1", inbox_id))
        batch = await inbox.read(conn, taken, limit=100, max_bytes=1 << 20)
        assert batch.snapshots
        last = batch.rows[-1]
        moved = advance(taken, batch.snapshots, (last.txid, last.id), batch.exhausted)
        async with conn.transaction():
            applied = await inbox.apply_plan(
                conn,
                plan_batch(batch.rows),
                member=lease.member,
                advance=inbox.advance_arg(taken, moved),
                citus=on_cluster(),
            )
        await lease.leave(conn)
    return applied


@pytest.mark.citus
async def test_a_redelivery_six_days_later_is_still_deduplicated(
    pool: asyncpg.Pool, settings: Settings, today: date
) -> None:
    ts = str(int(noon(today).timestamp()))
    body = to_bytes(
        messages_payload(
            {"from": "49", "id": "wamid.SIX", "timestamp": ts, "type": "text", "text": {"body": "x"}}
        )
    )
    status = to_bytes(statuses_payload(status_obj("wamid.OUT6", "read", timestamp=ts)))
    first = await redeliver(pool, body)
    assert (first.fresh, first.messages_inserted) == (1, 1)
    assert (await redeliver(pool, status)).fresh == 1
    assert (
        await pool.fetchval(
            "SELECT event_day FROM processed_webhook_events WHERE event_key = 'msg:wamid.SIX'"
        )
        == today
    )

    # Six days on: maintenance has run every day, then Meta redelivers both.
    s = replace(settings, dedup_retention_days=7, inbox_retention_days=30)
    for offset in range(1, 7):
        await retention.run_once(pool, s, today=today + timedelta(days=offset))
    for again in (body, status):
        later = await redeliver(pool, again)
        assert (later.fresh, later.messages_inserted, later.statuses_inserted) == (0, 0, 0)
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages WHERE wamid = 'wamid.SIX'") == 1
    assert await pool.fetchval("SELECT count(*) FROM message_statuses WHERE wamid = 'wamid.OUT6'") == 1


@pytest.mark.citus
async def test_dropping_partitions_keeps_every_key_younger_than_the_window(
    pool: asyncpg.Pool, settings: Settings, today: date
) -> None:
    s = replace(settings, dedup_retention_days=7, purge_batch=3)
    days = [today + timedelta(days=d) for d in range(-12, 2)]
    for day in days:
        await ensure_day(pool, "processed_webhook_events", day)
    # Each processed on its event's day, as a consumer does.
    await pool.execute(
        "INSERT INTO processed_webhook_events (event_key, event_day, processed_at, subject)"
        " SELECT 'k:' || d || ':' || n, d, d + time '12:00', 's'"
        " FROM unnest($1::date[]) d, generate_series(1, 5) n",
        days,
    )
    # An event stamped twelve days back that came just now: kept for the retention, by when
    # it was processed (its redeliveries may come for a week).
    late = "INSERT INTO processed_webhook_events (event_key, event_day, subject) VALUES ('late', $1, 's')"
    await pool.execute(late, days[0])
    # Untimed keys: trimmed by age, in bounded batches.
    await pool.execute(
        "INSERT INTO processed_webhook_events (event_key, event_day, processed_at, subject)"
        " SELECT 'old:' || n, $1::date, now() - interval '8 days', 's' FROM generate_series(1, 10) n"
        " UNION ALL SELECT 'new:' || n, $1, now() - interval '6 days', 's' FROM generate_series(1, 4) n",
        UNTIMED_DAY,
    )
    report = await retention.run_once(pool, s, today=today)
    assert report.ran
    # Keys of an event day >= today - 7 are consulted (plus a day of slack): kept.
    kept = {r[0] for r in await pool.fetch("SELECT DISTINCT event_day FROM processed_webhook_events")}
    assert kept == {UNTIMED_DAY, days[0]} | {d for d in days if d >= today - timedelta(days=8)}
    assert sorted(report.dropped) == [f"processed_webhook_events_p{d:%Y%m%d}" for d in days[:4]]
    assert await pool.fetchval(
        "SELECT array_agg(event_key) FROM processed_webhook_events_default WHERE event_day = $1", days[0]
    ) == ["late"]
    assert (
        await pool.fetchval("SELECT count(*) FROM processed_webhook_events WHERE event_day = $1", UNTIMED_DAY)
        == 4
    )
    assert report.purged["processed_webhook_events"] == 10
    # Partitions exist from the window's start to three days ahead, for every table.
    want = [today + timedelta(days=d) for d in range(-8, 4)]
    assert await store.days(pool, table="processed_webhook_events") == want
    for table in (
        "webhook_inbox",
        "inbound_messages",
        "message_statuses",
        "account_errors",
        "account_updates",
    ):
        assert (await store.days(pool, table=table))[-4:] == [today + timedelta(days=d) for d in range(4)]
    assert (
        REGISTRY.get_sample_value("gateway_partitions_dropped_total", {"table": "processed_webhook_events"})
        >= 4
    )
    assert REGISTRY.get_sample_value("gateway_partitions_ahead_days") == 3


@pytest.mark.citus
async def test_inbox_partitions_drop_done_rows_and_carry_the_rest(
    pool: asyncpg.Pool, settings: Settings, today: date
) -> None:
    old = today - timedelta(days=9)
    await ensure_day(pool, "webhook_inbox", old)
    stage_at = "INSERT INTO webhook_inbox (source, body, received_at) VALUES ('meta', $1, $2) RETURNING id"
    ids = {"done": await pool.fetchval(stage_at, b"done", noon(old))}
    await read_all(pool)  # the consumers read it
    ids["pending"] = await pool.fetchval(stage_at, b"pending", noon(old))
    ids["dead"] = await dead_row(pool, b"dead", received_at=noon(old))
    recent = await stage(pool, b"{}")
    report = await retention.run_once(pool, replace(settings, inbox_retention_days=7), today=today)
    assert f"webhook_inbox_p{old:%Y%m%d}" in report.dropped
    assert report.carried == 1  # the unread row; the dead one's bytes are kept aside
    rows = await pool.fetch(
        "SELECT w.id, s.state FROM webhook_inbox w JOIN inbox_row_states() s ON s.id = w.id ORDER BY w.id"
    )
    assert [(r["id"], r["state"]) for r in rows] == [(ids["pending"], "pending"), (recent, "pending")]
    # A row is still found by its id alone (every partition is probed) after it moved, and the
    # dead one, its day dropped, is still there for an operator, bytes intact.
    assert (await inbox.get_row(pool, inbox_id=ids["pending"])) is not None
    dead = await inbox.get(pool, inbox_id=ids["dead"])
    assert dead is not None and (dead["state"], bytes(dead["body"])) == ("dead", b"dead")


# Not on a cluster: Citus refuses DETACH PARTITION ... CONCURRENTLY, so there a day's detach is a
# plain one, which writers queue behind for up to its lock_timeout (docs/scaling.md, Retention on
# the cluster).
async def test_creating_and_dropping_partitions_never_blocks_writers(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str, today: date
) -> None:
    old = today - timedelta(days=9)
    await ensure_day(pool, "webhook_inbox", old)
    holder = await asyncpg.connect(db_dsn)
    try:
        tr = holder.transaction()
        await tr.start()
        await holder.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', 'held')")
        # A long transaction is open on the parent while the job attaches two new days to
        # every table and detaches an old one ...
        s = replace(settings, inbox_retention_days=7, partitions_ahead_days=5)
        job = asyncio.create_task(retention.run_once(pool, s, today=today))

        async def detach_waits() -> bool:
            n = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%'"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            return bool(n)

        # The job has created the new days and waits in DETACH ... CONCURRENTLY for the
        # holder ...
        await until(detach_waits, timeout_s=30, what="the detach waiting for the holder")
        # ... and writers are not queued behind it: a writer that had to wait for any lock
        # would fail at once (so the check does not depend on how fast the machine is).
        writer = await asyncpg.connect(db_dsn, server_settings={"lock_timeout": "10ms"})
        try:
            for _ in range(3):
                await writer.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', '{}')")
        finally:
            await writer.close()
        await tr.commit()
        report = await asyncio.wait_for(job, 30)
    finally:
        await holder.close()
    assert f"webhook_inbox_p{old:%Y%m%d}" in report.dropped
    assert f"webhook_inbox_p{today + timedelta(days=5):%Y%m%d}" in report.created
    assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 4
    assert await pool.fetchval("SELECT to_regclass($1)", f"webhook_inbox_p{old:%Y%m%d}") is None


async def test_side_effect_tables_drop_by_their_own_horizon(
    pool: asyncpg.Pool, settings: Settings, today: date
) -> None:
    for i in range(3):
        await stage(pool, to_bytes(messages_payload(message_obj(f"wamid.m{i}"))))
        await stage(pool, to_bytes(statuses_payload(status_obj(f"wamid.s{i}", "sent"))))
    await drain(pool, settings)
    s = replace(settings, status_retention_days=10, inbound_retention_days=20, dedup_retention_days=30)
    # Twelve days on, statuses (10 days) go, the feed (20 days) stays.
    report = await retention.run_once(pool, s, today=today + timedelta(days=12))
    assert f"message_statuses_p{today:%Y%m%d}" in report.dropped
    assert f"inbound_messages_p{today:%Y%m%d}" not in report.dropped
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == 0
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 3
    report = await retention.run_once(pool, s, today=today + timedelta(days=21))
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 0


@pytest.mark.citus
async def test_outbox_terminal_rows_and_reply_claims_are_bounded(
    pool: asyncpg.Pool, settings: Settings, today: date
) -> None:
    for i, (state, age) in enumerate(
        [
            ("accepted", 40),
            ("failed", 40),
            ("cancelled", 40),
            ("review", 40),
            ("pending", 40),
            ("accepted", 5),
        ]
    ):
        await pool.execute(
            "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state, updated_at)"
            " VALUES ('acme', $1, $1, '49', '{}', $2, now() - make_interval(days => $3))",
            f"k{i}",
            state,
            age,
        )
    await pool.execute(
        "INSERT INTO reply_claims (inbound_wamid, claimed_by, claimed_at) VALUES"
        " ('w.old', 'bot', now() - interval '31 days'), ('w.new', 'bot', now())"
    )
    dest = await pool.fetchval(
        "INSERT INTO destinations (name, url, events, secret)"
        " VALUES ('d', 'http://x', '{message}', 'whsec_x') RETURNING id"
    )
    finished = [("delivered", 20), ("failed", 20), ("pending", 20), ("delivered", 1)]
    for i, (state, age) in enumerate(finished):
        at = noon(today - timedelta(days=age))
        await made_up(pool, destination_id=dest, key=f"e{i}", state=state, received_at=at)
    s = replace(settings, outbox_retention_days=30, delivery_retention_days=14, purge_batch=2)
    report = await retention.run_once(pool, s, today=today)
    assert report.purged["outbox"] == 3
    # Delivered ones go with their day; a failed or pending one's body moves on (a failed one
    # waits for an operator).
    old = today - timedelta(days=20)
    assert {f"delivery_log_p{old:%Y%m%d}", f"delivery_events_p{old:%Y%m%d}"} <= set(report.dropped)
    assert report.carried_events == 2
    assert report.purged["dead_events"] == 0
    left_keys = [r[0] for r in await pool.fetch("SELECT event_key FROM delivery_events ORDER BY 1")]
    assert left_keys == ["e1", "e2", "e3"]
    left = await pool.fetch("SELECT idem_key, state FROM outbox ORDER BY idem_key")
    assert [(r[0], r[1]) for r in left] == [("k3", "review"), ("k4", "pending"), ("k5", "accepted")]
    assert [r[0] for r in await pool.fetch("SELECT inbound_wamid FROM reply_claims")] == ["w.new"]


@pytest.mark.citus
async def test_event_fragments_go_with_the_raw_bodies(
    pool: asyncpg.Pool, settings: Settings, today: date
) -> None:
    # Exact bytes of escaped events: 5 older than the inbox horizon, 2 younger.
    await pool.execute(
        "INSERT INTO event_fragments (event_key, subject, inbox_id, path, fragment, recorded_at)"
        " SELECT 'msg:' || n, n::text, n, '', '\\x00',"
        "        now() - make_interval(days => CASE WHEN n <= 5 THEN 4 ELSE 2 END)"
        " FROM generate_series(1, 7) n"
    )
    s = replace(settings, inbox_retention_days=3, purge_batch=2)
    report = await retention.run_once(pool, s, today=today)
    assert report.purged["event_fragments"] == 5  # in batches of 2
    left = [r[0] for r in await pool.fetch("SELECT event_key FROM event_fragments ORDER BY 1")]
    assert left == ["msg:6", "msg:7"]


async def test_two_replicas_at_once_do_the_work_once(
    pool: asyncpg.Pool, settings: Settings, db_dsn: str, today: date
) -> None:
    s = replace(settings, dedup_retention_days=7)
    far = today + timedelta(days=40)  # every partition of "today" is missing, many are old
    pools = [pool, await create_pool(db_dsn, 1, 2), await create_pool(db_dsn, 1, 2)]
    try:
        reports = await asyncio.gather(*(retention.run_once(p, s, today=far) for p in pools))
        # Whoever ran, nothing failed, nothing was created twice, and the result is complete.
        created = [n for r in reports for n in r.created]
        assert len(created) == len(set(created))
        assert await store.days(pool, table="processed_webhook_events") == [
            far + timedelta(days=d) for d in range(-8, 4)
        ]
        # While one replica holds the lock, another skips its run.
        async with pool.acquire() as holder:
            assert await store.try_lock(holder)
            try:
                assert not (await retention.run_once(pools[1], s, today=far)).ran
            finally:
                await store.unlock(holder)
        assert (await retention.run_once(pools[1], s, today=far)).ran
    finally:
        for p in pools[1:]:
            await p.close()


@pytest.mark.citus
async def test_metrics_count_processed_and_duplicates(pool: asyncpg.Pool, settings: Settings) -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (
        sample("gateway_consumer_events_total", kind="message", outcome="processed"),
        sample("gateway_consumer_events_total", kind="message", outcome="duplicate"),
        sample("gateway_consumer_duplicates_total"),
        sample("gateway_dead_letters_total", reason="unparseable"),
    )
    body = to_bytes(messages_payload(message_obj("wamid.m1"), message_obj("wamid.m2")))
    # one lane, so one batch reads them on a cluster too (a batch per shard counts a later
    # batch's redeliveries as duplicates of their kind)
    await inbox.insert_batch(
        pool, sources=["meta"] * 4, bodies=[body, body, body, b"<html>"], delivery_ids=[None] * 4, lane=5
    )
    await drain(pool, settings)
    after = (
        sample("gateway_consumer_events_total", kind="message", outcome="processed"),
        sample("gateway_consumer_events_total", kind="message", outcome="duplicate"),
        sample("gateway_consumer_duplicates_total"),
        sample("gateway_dead_letters_total", reason="unparseable"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 0, 4, 1]

"""Deliveries stored as a narrow queue plus a log (migration 0021): a body once per event and
format, lanes by customer, rounds restricted to lanes, retention that carries open deliveries'
bodies forward, and what happens when a body is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.maintenance import retention
from gateway.operator import actions
from gateway.outbound.forwarder import NO_BODY
from gateway.store import deliveries
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.payloads import message_obj, messages_payload, meta_payload, meta_value, to_bytes
from tests.support.config import replace
from tests.support.consume import drain, stage
from tests.support.forward import add, all_delivered, fast, forwarding, process_messages, states, until

ACTOR = actions.Actor("test", "cli")


async def test_a_body_is_stored_once_per_event_and_format(pool: asyncpg.Pool, settings: Settings) -> None:
    await add(pool, "a", "http://127.0.0.1:9/a")
    await add(pool, "b", "http://127.0.0.1:9/b")
    await deliveries.add_destination(
        pool, name="bot", url="http://127.0.0.1:9/c", events=["message"], secret="s", max_in_flight=4,
        ordered=False, format="meta",
    )  # fmt: skip
    await process_messages(pool, settings, 2)
    assert await pool.fetchval("SELECT count(*) FROM delivery_events") == 2
    assert await pool.fetchval("SELECT count(*) FROM delivery_queue") == 6
    # Both standard destinations get the same stored bytes; the Meta one its own format's.
    rows = await pool.fetch(
        "SELECT d.name, x.envelope::text AS body FROM deliveries x"
        " JOIN destinations d ON d.id = x.destination_id"
        " WHERE x.event_key = 'msg:wamid.F0'"
    )
    bodies = {r["name"]: r["body"] for r in rows}
    assert bodies["a"] == bodies["b"] != bodies["bot"]
    assert await pool.fetchval(
        "SELECT body IS NOT NULL AND meta_body IS NOT NULL FROM delivery_events"
        " WHERE event_key = 'msg:wamid.F0'"
    )


async def test_a_customers_deliveries_share_a_lane_and_a_round_claims_its_lanes_only(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    dest = await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=100)
    await process_messages(pool, settings, 30, customers=6)
    await stage(pool, to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000}])))))
    await drain(pool, settings)
    lanes = await pool.fetch(
        "SELECT e.conversation, array_agg(DISTINCT q.lane) AS lanes,"
        " array_agg(DISTINCT e.lane) AS event_lanes"
        " FROM delivery_queue q JOIN delivery_events e ON e.id = q.event_id GROUP BY 1"
    )
    assert len(lanes) == 7  # six customers and the account-level event (no customer)
    for r in lanes:
        assert len(r["lanes"]) == 1 and r["lanes"] == r["event_lanes"]
    # The SQL rule: a hash of the customer, else of the subject.
    assert await pool.fetchval(
        "SELECT bool_and(e.lane = delivery_lane(e.conversation, event_subject(e.event_key)))"
        " FROM delivery_events e"
    )
    some = sorted({r["lanes"][0] for r in lanes})[:3]
    async with pool.acquire() as conn:
        claimed, _, _ = await deliveries.cycle(
            conn, forwarder="lanes", results=[], breakers=[], threshold=5, limit=100, lease_s=60,
            cooldown_s=30, housekeeping=False, lanes=some,
        )  # fmt: skip
    expected = await pool.fetchval(
        "SELECT count(*) FROM delivery_queue WHERE destination_id = $1 AND lane = ANY ($2::smallint[])",
        dest,
        some,
    )
    assert 0 < len(claimed) == expected < 31
    got = await pool.fetchval(
        "SELECT array_agg(DISTINCT q.lane) FROM delivery_queue q WHERE q.event_id = ANY ($1::bigint[])",
        [c.id for c in claimed],
    )
    assert set(got) <= set(some)


async def test_retention_carries_a_failed_deliverys_body_and_a_replay_still_sends_it(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 2)
    # Stored, and failed, 40 days ago: its day is past every horizon.
    old = (datetime.now(UTC) - timedelta(days=40)).date()
    async with pool.acquire() as conn:
        from gateway.store import retention as store

        await store.ensure_day(conn, table="delivery_events", day=old)
    await pool.execute(
        "WITH moved AS (UPDATE delivery_events SET day = $1 RETURNING id)"
        " UPDATE delivery_queue SET event_day = $1, failed = true FROM moved WHERE event_id = moved.id",
        old,
    )
    report = await retention.run_once(pool, replace(settings, delivery_retention_days=30))
    assert f"delivery_events_p{old:%Y%m%d}" in report.dropped and report.carried_events == 2
    async with pool.acquire() as conn:
        assert await actions.replay_deliveries(conn, ACTOR, destination="crm", since=None, until=None) == 2
    async with forwarding(pool, fast(settings)):
        await until(lambda: all_delivered(pool), what="the carried ones delivered")
    assert len(receiver.state.processed) == 2 and not receiver.state.bad_signatures


@pytest.mark.citus
async def test_a_replay_of_delivered_ones_skips_and_counts_those_whose_bodies_are_gone(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 3)
    async with forwarding(pool, fast(settings)):
        await until(lambda: all_delivered(pool), what="delivered")
    # One event's body dropped (as a retention pass past its days would).
    await pool.execute("DELETE FROM delivery_events WHERE event_key = 'msg:wamid.F0'")
    async with pool.acquire() as conn:
        n = await actions.replay_deliveries(
            conn, ACTOR, destination="crm", since=None, until=None, state="delivered"
        )
    assert n == 2
    outcome = await pool.fetchval("SELECT outcome FROM operator_actions WHERE action = 'deliveries.replay'")
    assert outcome == "replayed 2 delivered deliveries; 1 not: their events' bodies are past retention"


async def test_a_delivery_whose_body_is_gone_fails_unsent(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 2)
    await pool.execute("DELETE FROM delivery_events WHERE event_key = 'msg:wamid.F0'")
    async with forwarding(pool, fast(settings)):
        await until(lambda: _states(pool), what="one delivered, one failed")
    assert len(receiver.state.attempts) == 1
    assert await pool.fetchval("SELECT last_error FROM delivery_queue WHERE failed") == NO_BODY


async def _states(pool: asyncpg.Pool) -> bool:
    return await states(pool) == {"delivered": 1, "failed": 1}


async def test_removing_a_destination_counts_and_drops_its_deliveries_and_orphans_are_purged(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    dest = await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 3)
    async with forwarding(pool, fast(settings)):
        await until(lambda: all_delivered(pool), what="delivered")
    await process_messages(pool, settings, 2, prefix="wamid.P")
    assert await deliveries.remove_destination(pool, name="crm") == 5  # 3 delivered, 2 open
    assert await pool.fetchval("SELECT count(*) FROM delivery_queue") == 0
    # A consumer that read the destination before its removal committed queues one after it.
    row = await pool.fetchrow("SELECT id, day FROM delivery_events LIMIT 1")
    await pool.execute(
        "INSERT INTO delivery_queue (destination_id, event_id, received_at, event_day, lane)"
        " VALUES ($1, $2, now() - interval '2 days', $3, 0)",
        dest, row["id"], row["day"],
    )  # fmt: skip
    report = await retention.run_once(pool, settings)
    assert report.purged["delivery_queue"] == 1
    assert await pool.fetchval("SELECT count(*) FROM delivery_queue") == 0


async def test_a_webhook_with_two_events_queues_each_in_arrival_order(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    await add(pool, "crm", "http://127.0.0.1:9/x")
    body = to_bytes(messages_payload(message_obj("wamid.O1", "one"), message_obj("wamid.O2", "two")))
    await stage(pool, body)
    await drain(pool, settings)
    keys = [r["event_key"] for r in await pool.fetch("SELECT event_key FROM delivery_events ORDER BY id")]
    assert keys == ["msg:wamid.O1", "msg:wamid.O2"]
    # Both from one webhook: one receipt time.
    assert await pool.fetchval("SELECT count(DISTINCT received_at) FROM delivery_events") == 1
    assert await pool.fetchval(
        "SELECT bool_and(e.received_at = w.received_at) FROM delivery_events e, webhook_inbox w"
    )

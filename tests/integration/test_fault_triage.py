"""No single input stops the consumers: what one event makes fail is that event's (dead with
its bytes after its attempts), only a systemic error a probe confirms pauses the pipeline, and a
row that keeps heading claims that commit nothing is taken alone and parked."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time

import asyncpg
import orjson
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.core.faults import ConsumerHealth
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.store.db import create_pool
from gateway.testing.hostile import staged
from gateway.testing.payloads import message_obj, messages_payload, meta_payload, meta_value, status_obj

STAGE = "INSERT INTO webhook_inbox (source, body, delivery_id) VALUES ($1, $2, $3) RETURNING id"


def quick(settings: Settings, **kw: object) -> Settings:
    base: dict[str, object] = {
        "max_attempts": 2,
        "retry_base_ms": 1,
        "retry_max_ms": 5,
        "fault_backoff_max_ms": 20,
        "consumer_batch": 10,
    }
    return dataclasses.replace(settings, **{**base, **kw})  # type: ignore[arg-type]


async def stage(pool: asyncpg.Pool, doc: object, source: str = "meta", delivery: str | None = None) -> int:
    raw = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    inbox_id: int = await pool.fetchval(STAGE, source, raw, delivery)
    return inbox_id


async def settle(pool: asyncpg.Pool, consumer: Consumer, ids: list[int], timeout_s: float = 20.0) -> None:
    """Step until every row of ``ids`` is done or dead and their dead items are settled."""
    deadline = time.monotonic() + timeout_s
    while True:
        open_rows = await pool.fetchval(
            "SELECT count(*) FROM inbox_row_states() WHERE id = ANY($1) AND state = 'pending'", ids
        )
        open_items = await pool.fetchval(
            "SELECT count(*) FROM dead_events WHERE inbox_id = ANY($1) AND state = 'retry'", ids
        )
        if not open_rows and not open_items:
            return
        assert time.monotonic() < deadline, f"{open_rows} rows and {open_items} items still open"
        await consumer.step()
        await asyncio.sleep(0.005)


async def test_a_status_with_odd_digits_for_a_timestamp_stops_nothing(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    health = ConsumerHealth(time.monotonic)
    consumer = Consumer(pool, quick(settings), health=health)
    odd = [{**status_obj(f"wamid.T{i}", "read"), "timestamp": t} for i, t in enumerate(("²", "①", "١٢"))]
    ids = [await stage(pool, meta_payload(("messages", meta_value(statuses=odd))))]
    ids += [await stage(pool, messages_payload(message_obj(f"wamid.OK{i}"))) for i in range(5)]
    data = {"message_id": "m", "status": "read"}
    tenashi = {"id": "evt_3", "type": "message.status", "created": "³", "data": data}
    ids.append(await stage(pool, tenashi, "tenashi", "evt_3"))
    await settle(pool, consumer, ids)
    assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'done'") == len(ids)
    assert await pool.fetchval("SELECT count(*) FROM message_statuses WHERE timestamp IS NULL") == 4
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 5
    assert health.fault_streak == 0


async def test_an_oversized_message_id_is_a_dead_item_at_once_and_delays_no_neighbour(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """3 200 random characters: no index row could hold its key (PostgreSQL refuses one past
    2704 bytes), so the planner makes it a dead item in the first batch, without attempts."""
    health = ConsumerHealth(time.monotonic)
    consumer = Consumer(pool, quick(settings), health=health)
    huge = "wamid." + secrets.token_urlsafe(2400)[:3200]
    ids = [await stage(pool, messages_payload(message_obj("wamid.N0"), message_obj(huge)))]
    ids += [await stage(pool, messages_payload(message_obj(f"wamid.N{i}"))) for i in range(1, 4)]
    await consumer.step()
    # One step: every neighbour committed, every row done, the giant dead.
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 4
    assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'done'") == 4
    item = await pool.fetchrow("SELECT state, last_error, fragment FROM dead_events")
    assert item["state"] == "dead"
    assert "at most 1024 can be indexed" in item["last_error"]
    assert orjson.loads(bytes(item["fragment"]))["id"] == huge
    assert health.fault_streak == 0


async def test_an_event_the_database_refuses_is_its_own_fault_and_delays_no_neighbour(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """An event whose row PostgreSQL refuses (here a trigger's SQLSTATE 54000, what an index row
    too large raises): its neighbours commit, it is retried alone and dies after its attempts."""
    await pool.execute(
        """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.wamid = 'wamid.REFUSED' THEN
               RAISE EXCEPTION 'index row size 3224 exceeds btree version 4 maximum 2704'
               USING ERRCODE = 'program_limit_exceeded'; END IF;
           RETURN NEW; END $$;
           CREATE TRIGGER refuse BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION refuse();"""
    )
    health = ConsumerHealth(time.monotonic)
    consumer = Consumer(pool, quick(settings), health=health)
    ids = [await stage(pool, messages_payload(message_obj("wamid.N0"), message_obj("wamid.REFUSED")))]
    ids += [await stage(pool, messages_payload(message_obj(f"wamid.N{i}"))) for i in range(1, 4)]
    await consumer.step()
    # One step: every neighbour committed, every row done, the refused one waits on its own.
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 4
    assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state = 'done'") == 4
    await settle(pool, consumer, ids)
    item = await pool.fetchrow("SELECT state, attempts, last_error, fragment FROM dead_events")
    assert (item["state"], item["attempts"]) == ("dead", 2)
    assert "index row" in item["last_error"]
    assert orjson.loads(bytes(item["fragment"]))["id"] == "wamid.REFUSED"
    assert health.fault_streak == 0


async def test_a_systemic_error_of_one_event_only_is_its_own_when_the_probe_passes(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # "Disk full" for one message only: the probe (a harmless message) goes through.
    await pool.execute(
        """CREATE FUNCTION odd() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.wamid = 'wamid.ODD' THEN
               RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'; END IF;
           RETURN NEW; END $$;
           CREATE TRIGGER odd BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION odd();"""
    )
    health = ConsumerHealth(time.monotonic)
    consumer = Consumer(pool, quick(settings), health=health)
    ids = [await stage(pool, messages_payload(message_obj("wamid.ODD")))]
    await settle(pool, consumer, ids)
    assert await pool.fetchval("SELECT state FROM dead_events") == "dead"
    assert await pool.fetchval("SELECT state FROM inbox_row_states()") == "done"
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 0


async def test_a_row_that_kills_its_connection_is_taken_alone_and_parked(
    db_dsn: str, settings: Settings
) -> None:
    """Its batch never commits (the backend dies under it); without isolation it would head
    every claim for ever, its neighbours with it."""
    pool = await create_pool(db_dsn, 1, 4)
    try:
        await pool.execute(
            """CREATE FUNCTION kill() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN IF NEW.wamid = 'wamid.KILL' THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
               RETURN NEW; END $$;
               CREATE TRIGGER kill BEFORE INSERT ON inbound_messages FOR EACH ROW EXECUTE FUNCTION kill();"""
        )
        poison = await stage(pool, messages_payload(message_obj("wamid.KILL")))
        others = [await stage(pool, messages_payload(message_obj(f"wamid.K{i}"))) for i in range(5)]
        consumer = Consumer(pool, quick(settings), health=ConsumerHealth(time.monotonic))
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        try:
            deadline = time.monotonic() + 30
            while await pool.fetchval("SELECT state FROM inbox_row_states() WHERE id = $1", poison) != "dead":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            while await pool.fetchval(
                "SELECT count(*) FROM inbox_row_states() WHERE id = ANY($1) AND state = 'done'", others
            ) < len(others):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            consumer.wake()
            await task
        row = await pool.fetchrow("SELECT attempts, last_error FROM inbox_parked WHERE inbox_id = $1", poison)
        assert row["attempts"] == 2 and "taken alone" in row["last_error"]
        assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == 5
    finally:
        await pool.close()


@hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(staged(), min_size=1, max_size=4))
def test_every_hostile_body_ends_processed_or_dead_and_none_is_a_system_fault(
    db_dsn: str, settings: Settings, bodies: list[tuple[str, bytes]]
) -> None:
    async def check() -> None:
        pool = await create_pool(db_dsn, 1, 3)
        try:
            health = ConsumerHealth(time.monotonic)
            consumer = Consumer(pool, quick(settings, database_url=db_dsn), health=health)
            ids = [
                await stage(pool, raw, source, f"evt_{secrets.token_hex(8)}" if source == "tenashi" else None)
                for source, raw in bodies
            ]
            await settle(pool, consumer, ids)
            assert health.fault_streak == 0
            rows = await pool.fetch("SELECT state FROM inbox_row_states() WHERE id = ANY($1)", ids)
            assert {r[0] for r in rows} <= {"done", "dead"}
        finally:
            await pool.close()

    asyncio.run(check())

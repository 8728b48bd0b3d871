"""A populated single-node database moves to a Citus cluster by the path docs/scaling.md gives
("Moving a single-node database to Citus"): the server gets Citus and becomes the coordinator,
the database the extension, the workers are registered, and `gateway migrate --citus`
distributes the tables with their rows. Every webhook redelivered afterwards meets its keys.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.store import db, idempotency, inbox, lanes
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    statuses_payload,
    tenashi_event,
    to_bytes,
)
from tests.support.citus_db import citus_dsn, drop_database, join_cluster, plain_database
from tests.support.consume import counts, drain

NAME = "gw_citus_move"
TS = str(int((datetime.now(UTC) - timedelta(days=1)).timestamp()))
BODIES = [
    (
        "meta",
        to_bytes(
            messages_payload(message_obj("wamid.MV1", timestamp=TS), message_obj("wamid.MV2", timestamp=TS))
        ),
    ),
    ("meta", to_bytes(statuses_payload(status_obj("wamid.MVS", "delivered", timestamp=TS)))),
    ("meta", to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000, "title": "x"}]))))),
    ("meta", to_bytes(meta_payload(("account_update", {"phone_number": "1", "event": "VERIFIED"})))),
    ("tenashi", to_bytes(tenashi_event("evt_mv", "message.received", {"message_id": "t.MV", "from": "49"}))),
]
# What the move must keep, row for row.
TABLES = {
    "processed_webhook_events": "event_key, event_day, subject",
    "inbound_messages": "wamid, subject",
    "message_statuses": "event_key, subject",
    "account_errors": "event_key, subject",
    "account_updates": "event_key, subject",
    "webhook_inbox": "id, lane, body",
    "idempotency_keys": "tenant, key, fingerprint",
}


async def rows(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, list[tuple[object, ...]]]:
    return {
        t: [tuple(r) for r in await conn.fetch(f"SELECT {c} FROM {t} ORDER BY {c}")]
        for t, c in TABLES.items()
    }


async def lanes_by_shard(conn: asyncpg.Connection | asyncpg.Pool) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for lane, shard in (await lanes.shards(conn)).items():
        out.setdefault(shard, []).append(lane)
    return out


async def stage_all(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    for i, (source, body) in enumerate(BODIES):
        await inbox.insert_batch(
            conn, sources=[source], bodies=[body], delivery_ids=[None], lane=(5 * i) % 32
        )


@pytest.fixture
async def single_node() -> object:
    dsn = await plain_database(citus_dsn(), NAME)
    yield dsn
    await drop_database(citus_dsn(), NAME)


async def test_a_populated_database_moves_and_every_redelivery_meets_its_keys(single_node: str) -> None:
    dsn = single_node
    settings = Settings(database_url=dsn, run_consumers=False, run_sender=False, migrate_on_start=False)
    # One PostgreSQL (Citus loaded by the server, not created in the database): the gateway's
    # own writes, processed by its consumers; a send API key.
    conn = await db.connect(dsn)
    await db.migrate(conn)
    await conn.close()
    pool = await db.create_pool(dsn, 1, 3)
    try:
        await stage_all(pool)
        await drain(pool, settings)
        assert await idempotency.claim(
            pool, tenant="acme", key="mv-1", fingerprint="fp", ttl_h=24, lease_s=30
        )
        # a webhook staged and not read yet when the operator tries to move
        await inbox.insert_batch(pool, sources=["meta"], bodies=[BODIES[1][1]], delivery_ids=[None], lane=3)
        processed = await counts(pool)
        assert processed["processed_webhook_events"] > len(BODIES)
    finally:
        await pool.close()

    # The move: the extension in the database, the workers registered, migrate --citus.
    await join_cluster(citus_dsn(), NAME)
    conn = await db.connect(dsn)
    try:
        # Refused while a staged webhook is unread: the log's positions do not survive it.
        with pytest.raises(db.CitusLayoutError, match="no consumer has read yet"):
            await db.migrate(conn, citus=True)
        assert not (await db.citus_state(conn))[1]
        pool = await db.create_pool(dsn, 1, 3)
        try:
            await drain(pool, settings)  # the consumers finish (the tables are still local)
            before = await rows(pool)
        finally:
            await pool.close()
        await db.migrate(conn, citus=True)
        assert await db.citus_state(conn) == (True, True)
        placed = await conn.fetchval(
            "SELECT count(DISTINCT nodeport) FROM pg_dist_shard_placement p"
            " JOIN pg_dist_shard s USING (shardid)"
            " WHERE s.logicalrelid = 'processed_webhook_events'::regclass"
        )
        assert placed == 2  # on both workers
        assert await rows(conn) == before  # every row kept, now read from the shards

        # Every webhook again, and one new one: staged on the cluster (one shard per batch),
        # processed by the gateway's consumers there (lane reads on the workers, the batch as
        # one distributed transaction). Every redelivery meets its keys: nothing is processed,
        # recorded or forwarded twice; the new webhook is processed once.
        pool = await db.create_pool(dsn, 1, 3)
        try:
            await stage_all(pool)
            new = to_bytes(statuses_payload(status_obj("wamid.MVN", "read", timestamp=TS)))
            await inbox.insert_batch(pool, sources=["meta"], bodies=[new], delivery_ids=[None], lane=9)
            # A consumer's step reads the lanes of one shard, the shards in turn
            # (tests.support.consume.drain ends at the first empty step): steps enough for
            # every shard group twice.
            consumer = Consumer(pool, settings)
            for _ in range(2 * len(await lanes_by_shard(pool))):
                await consumer.step()
            after = await counts(pool)
            assert after == {
                **processed,
                "processed_webhook_events": processed["processed_webhook_events"] + 1,
                "message_statuses": processed["message_statuses"] + 1,
            }
            assert (
                await pool.fetchval(
                    "SELECT count(*) FROM processed_webhook_events WHERE event_key LIKE 'status:wamid.MVN:%'"
                )
                == 1
            )
            # nothing left unread in any lane
            for shard_lanes in (await lanes_by_shard(pool)).values():
                cursors = await lanes.lease(pool, member="check", lanes=shard_lanes, live=["check"], ttl_s=30)
                async with pool.acquire() as c, c.transaction():
                    await inbox.read_mode(c, idle_ms=5000)
                    assert (await inbox.read(c, cursors, limit=10, max_bytes=1 << 20)).rows == []
                await lanes.leave(pool, member="check")
        finally:
            await pool.close()
    finally:
        await conn.close()

"""A populated single-node database moves to a Citus cluster by the path docs/scaling.md gives
("Moving a single-node database to Citus"): the server gets Citus and becomes the coordinator,
the database the extension, the workers are registered, and `gateway migrate --citus`
distributes the tables with their rows. Every webhook redelivered afterwards meets its keys.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.planning import StagedRow, plan_batch
from gateway.core.settings import Settings
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

        # Every webhook again: staged on the cluster (one shard per batch), read by a lane
        # read on its shard, planned as a consumer plans it; every key meets the one stored
        # before the move, on the shard of its subject (the consumers' key insert: nothing
        # fresh, so no side effect happens twice).
        await stage_all(conn)
        shards = await lanes.shards(conn)
        by_shard: dict[int, list[int]] = {}
        for lane, shard in shards.items():
            by_shard.setdefault(shard, []).append(lane)
        staged: list[StagedRow] = []
        for i, mine in enumerate(by_shard.values()):
            cursors = await lanes.lease(conn, member=f"m{i}", lanes=mine, live=[f"m{i}"], ttl_s=30)
            async with conn.transaction():
                await inbox.read_mode(conn, idle_ms=5000)
                staged += (await inbox.read(conn, cursors, limit=100, max_bytes=1 << 22)).rows
            await lanes.leave(conn, member=f"m{i}")
        assert sorted(r.body for r in staged) == sorted(b for _, b in BODIES)
        plan = plan_batch(staged)
        assert plan.keys
        fresh = await conn.fetch(
            "INSERT INTO processed_webhook_events (event_key, inbox_id, event_day, subject)"
            " SELECT * FROM unnest($1::text[], $2::bigint[], $3::date[], $4::text[])"
            " ON CONFLICT (event_key, event_day, subject) DO NOTHING RETURNING event_key",
            plan.keys,
            plan.key_inbox,
            plan.key_days,
            plan.key_subjects,
        )
        assert fresh == []
        assert (await counts(conn))["processed_webhook_events"] == len(before["processed_webhook_events"])
    finally:
        await conn.close()

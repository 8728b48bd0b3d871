"""Migration 0020 on a populated database: webhook_inbox becomes a log read by lanes. Rows the
consumers of 0019 had not processed yet are read once, processed rows never again, dead rows
move aside with their bytes, their attempts and their error."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.store import inbox
from gateway.store.db import connect, create_pool, migrate, with_database
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.config import replace
from tests.support.consume import counts, drain, inbox_states

LOG_MIGRATION = 20


@pytest.fixture
async def old_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"gw_l_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_admin_dsn, name)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


def body(wamid: str) -> bytes:
    return to_bytes(messages_payload(message_obj(wamid)))


async def test_pending_rows_are_read_once_processed_ones_never_dead_ones_move_aside(
    old_db: str, settings: Settings
) -> None:
    conn = await connect(old_db)
    try:
        await migrate(conn, upto=LOG_MIGRATION - 1)
        await conn.execute("SELECT partition_ensure_day('webhook_inbox', (now() - interval '2 days')::date)")
        insert = (
            "INSERT INTO webhook_inbox (source, body, state, attempts, last_error, received_at)"
            " VALUES ('meta', $1, $2, $3, $4, $5) RETURNING id"
        )
        now = datetime.now(UTC)
        # Done rows whose keys are gone (as after retention of the keys): read again, they
        # would make new keys, so their absence after the drain shows they were not.
        done = [await conn.fetchval(insert, body(f"wamid.DONE{i}"), "done", 0, None, now) for i in range(3)]
        pending = [
            await conn.fetchval(insert, body("wamid.P0"), "pending", 0, None, now),
            # a row a consumer had failed once, put off, in an older day's partition
            await conn.fetchval(
                insert, body("wamid.P1"), "pending", 1, "DiskFullError: x", now - timedelta(days=2)
            ),
        ]
        dead = await conn.fetchval(insert, b"not json \xff", "dead", 3, "NotJson: bad", now)
        await migrate(conn)
        assert await conn.fetchval("SELECT max(version) FROM schema_migrations") >= LOG_MIGRATION
    finally:
        await conn.close()

    pool = await create_pool(old_db, 1, 4)
    try:
        states = {r["id"]: r["state"] for r in await pool.fetch("SELECT id, state FROM inbox_row_states()")}
        assert states == {**dict.fromkeys(done, "done"), **dict.fromkeys(pending, "pending"), dead: "dead"}
        parked = await inbox.get(pool, inbox_id=dead)
        assert parked is not None
        assert (parked["state"], parked["attempts"], bytes(parked["body"])) == ("dead", 3, b"not json \xff")
        assert parked["last_error"] == "NotJson: bad"
        s = replace(settings, database_url=old_db)
        await drain(pool, s)
        keys = {r[0] for r in await pool.fetch("SELECT event_key FROM processed_webhook_events")}
        assert keys == {"msg:wamid.P0", "msg:wamid.P1"}
        assert (await counts(pool))["inbound_messages"] == 2
        assert await inbox_states(pool) == {"done": 5, "dead": 1}
        # New webhooks after the migration flow as usual, and the replayed dead one is
        # parked again (it is still no payload).
        await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ('meta', $1)", body("wamid.NEW"))
        async with pool.acquire() as c:
            assert await inbox.dead_replay(c, ids=[dead]) == [dead]
        await drain(pool, s)
        assert (await counts(pool))["inbound_messages"] == 3
        assert await pool.fetchval("SELECT state FROM inbox_parked WHERE inbox_id = $1", dead) == "dead"
    finally:
        await pool.close()

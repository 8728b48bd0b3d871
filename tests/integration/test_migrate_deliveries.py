"""Migration 0023 on a populated database: every delivery of the old table (pending, claimed the
old way, failed, delivered; a Standard Webhooks and a Meta-format destination; leases of a
forwarder that was running) is still there after it, as it was, and a forwarder then sends
exactly the open ones, each once, with the bytes the old one would have sent: nothing lost,
nothing delivered twice. Failed ones wait for a replay; events processed after it go out too."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from gateway.core import stdwebhooks
from gateway.core.settings import Settings
from gateway.store import deliveries
from gateway.store.db import connect, create_pool, migrate, with_database
from gateway.store.sqlfiles import migrations
from gateway.testing.fake_receiver import FakeReceiver
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.config import DESTINATION_SECRET, replace
from tests.support.consume import drain, stage
from tests.support.forward import fast, forwarding, until

QUEUE_AND_LOG = 23
BEFORE = max(m.version for m in migrations() if m.version < QUEUE_AND_LOG)
APP_SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
NOW = datetime.now(UTC)

# (state, customer, hours ago received, attempts, last status, last error): per destination.
OLD = [
    ("pending", "491510001", 2, 0, None, None),
    ("pending", "491510001", 1, 3, 503, "Service Unavailable"),  # after its predecessor (ordered)
    ("pending", "491510002", 1, 0, None, None),
    ("delivering", "491510003", 1, 1, None, None),  # claimed by a version before delivery_leases
    ("failed", "491510004", 30, 7, 500, "boom"),
    ("failed", "", 30, 7, None, "timeout"),  # an account-level event: no customer
    ("delivered", "491510005", 50, 1, 204, None),
    ("delivered", "491510006", 3, 2, 200, None),
]


@pytest.fixture
async def old_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"gw_d_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_admin_dsn, name)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


def _envelope(key: str, customer: str, meta: bool) -> dict[str, Any]:
    """A stored body as the old consumers wrote it (its jsonb text is what was sent)."""
    if meta:
        message = {"id": key, "from": customer, "type": "text"}
        value = {"messaging_product": "whatsapp", "messages": [message]}
        return {"object": "whatsapp_business_account",
                "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}]}  # fmt: skip
    return {"v": 1, "type": "message.received", "event_key": key, "source": "meta",
            "data": {"from": customer or None, "wamid": key}, "raw": {"text": {"body": "é ü"}}}  # fmt: skip


async def fill(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    """Deliveries as the consumers and forwarders of the schema before 0023 left them; by webhook id."""
    dests = {
        "crm": await conn.fetchval(
            "INSERT INTO destinations (name, url, events, secret, ordered) VALUES ('crm', 'http://x',"
            " '{message,status,account}', $1, true) RETURNING id",
            DESTINATION_SECRET,
        ),
        "bot": await conn.fetchval(
            "INSERT INTO destinations (name, url, events, secret, format) VALUES ('bot', 'http://x',"
            " '{message,status,account}', $1, 'meta') RETURNING id",
            APP_SECRET,
        ),
    }
    rows: dict[str, dict[str, Any]] = {}
    for name, dest in dests.items():
        for i, (state, customer, hours, attempts, status, error) in enumerate(OLD):
            key = f"msg:wamid.MIG{i}" if customer else f"change:account_update:{i}"
            received = NOW - timedelta(hours=hours)
            body = _envelope(key, customer, name == "bot")
            r = await conn.fetchrow(
                "INSERT INTO deliveries (destination_id, event_key, webhook_id, kind, conversation, envelope,"
                " state, attempts, next_attempt_at, lease_until, received_at, window_start, last_status,"
                " last_error, delivered_at, created_at, subject)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() - interval '1 second',"
                " CASE WHEN $7 = 'delivering' THEN now() + interval '1 hour' END,"
                " $9::timestamptz, $9, $10, $11,"
                " CASE WHEN $7 = 'delivered' THEN $9 + interval '1 second' END, $9, event_subject($2))"
                " RETURNING id, envelope::text AS text",
                dest, key, stdwebhooks.webhook_id(name, key), "message" if customer else "account", customer,
                body, state, attempts, received, status, error,
            )  # fmt: skip
            rows[stdwebhooks.webhook_id(name, key)] = {
                "id": r["id"], "destination": name, "key": key, "state": state, "attempts": attempts,
                "received_at": received, "status": status, "error": error, "body": r["text"],
            }  # fmt: skip
    # A forwarder of the old version holding the pending ones (its lease named old ids).
    held = [v["id"] for v in rows.values() if v["state"] == "pending" and v["destination"] == "crm"]
    await conn.execute(
        "INSERT INTO delivery_leases (forwarder, destination_id, ids, lease_until)"
        " VALUES ('old:1:x', $1, $2, now() + interval '1 hour')",
        dests["crm"],
        held,
    )
    return rows


async def test_a_populated_database_migrates_and_nothing_is_lost_or_sent_twice(
    old_db: str, settings: Settings
) -> None:
    conn = await connect(old_db)
    try:
        await migrate(conn, upto=BEFORE)
        rows = await fill(conn)
        assert await migrate(conn) == [m.version for m in migrations() if m.version > BEFORE]
    finally:
        await conn.close()
    s = replace(fast(settings), database_url=old_db)
    pool = await create_pool(old_db, 1, 5)
    std, meta = FakeReceiver(DESTINATION_SECRET), FakeReceiver(APP_SECRET, meta=True)
    try:
        # Every delivery is still there as it was: its id, event, body, state, attempts, last
        # answer and times ('delivering' was a claim: pending again).
        view = {r["webhook_id"]: r for r in await pool.fetch("SELECT * FROM deliveries")}
        assert set(view) == set(rows)
        for wid, old in rows.items():
            new = view[wid]
            assert (new["id"], new["event_key"], new["state"], new["attempts"]) == (
                old["id"], old["key"], "pending" if old["state"] == "delivering" else old["state"],
                old["attempts"],
            )  # fmt: skip
            assert (new["last_status"], new["received_at"]) == (old["status"], old["received_at"])
            assert new["last_error"] == (None if old["state"] == "delivered" else old["error"])
            assert orjson.dumps(new["envelope"]) == orjson.dumps(orjson.loads(old["body"]))
        counts = await deliveries.count_deliveries(pool, destination=None, since=None, until=None)
        assert counts == {"pending": 8, "failed": 4, "delivered": 4}
        assert await pool.fetchval("SELECT count(*) FROM delivery_leases") == 0  # old ids meant nothing now

        # A forwarder sends exactly the open ones, once each, the same bytes as before.
        for name, receiver in (("crm", std), ("bot", meta)):
            await pool.execute(
                "UPDATE destinations SET url = $2 WHERE name = $1", name, await receiver.start()
            )
        async with forwarding(pool, s):
            await until(lambda: _states(pool, {"delivered": 12, "failed": 4}), what="the open ones delivered")
        opened = {w for w, r in rows.items() if r["state"] in ("pending", "delivering")}
        assert set(std.state.attempts) | set(meta.state.attempts) == opened
        assert len(std.state.attempts) + len(meta.state.attempts) == len(opened)  # each once
        for wid in opened:
            old = rows[wid]
            if old["destination"] == "bot":
                assert hashlib.sha256(old["body"].encode()).hexdigest() in meta.state.digests
            else:
                assert std.state.processed[wid] == orjson.loads(old["body"])
        # The ordered destination's customer: the older one first.
        first, second = (stdwebhooks.webhook_id("crm", f"msg:wamid.MIG{i}") for i in (0, 1))
        assert std.state.attempts.index(first) < std.state.attempts.index(second)

        # Failed ones wait for a replay, then go out; a new event goes out too.
        async with pool.acquire() as c:
            assert await deliveries.replay(c, destination=None, since=None, until=None, state="failed") == (
                4,
                0,
            )
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.AFTER", sender="491510009"))))
        await drain(pool, s)
        async with forwarding(pool, s):
            await until(lambda: _states(pool, {"delivered": 18}), what="replayed and new ones delivered")
        assert stdwebhooks.webhook_id("crm", "msg:wamid.AFTER") in std.state.processed
        assert not std.state.duplicates and not meta.state.duplicates and not std.state.bad_signatures
        assert meta.state.bad_signatures == 0
    finally:
        await std.close()
        await meta.close()
        await pool.close()


async def _states(pool: asyncpg.Pool, expected: dict[str, int]) -> bool:
    return await deliveries.count_deliveries(pool, destination=None, since=None, until=None) == expected


async def test_a_delivery_an_old_consumer_commits_during_the_migration_is_migrated(old_db: str) -> None:
    """The previous version's consumers may still be running: one that queues a delivery while
    0023 runs makes it wait, and its delivery is there afterwards."""
    conn = await connect(old_db)
    old = await connect(old_db)
    try:
        await migrate(conn, upto=BEFORE)
        dest = await conn.fetchval(
            "INSERT INTO destinations (name, url, events, secret) VALUES ('crm', 'http://x', '{message}', $1)"
            " RETURNING id",
            DESTINATION_SECRET,
        )
        tx = old.transaction()
        await tx.start()
        await old.execute(
            "INSERT INTO deliveries (destination_id, event_key, webhook_id, kind, envelope, subject)"
            " VALUES ($1, 'msg:wamid.LATE', 'wh_late', 'message', '{}', 'wamid.LATE')",
            dest,
        )
        migrating = asyncio.create_task(migrate(conn))
        await asyncio.sleep(1.0)
        assert not migrating.done()  # waiting for the old consumer's transaction
        await tx.commit()
        await asyncio.wait_for(migrating, 60)
        assert await conn.fetchval("SELECT event_key FROM deliveries") == "msg:wamid.LATE"
        assert await conn.fetchval("SELECT state FROM deliveries") == "pending"
    finally:
        await old.close()
        await conn.close()

"""Migration 0007 on a populated database: every row and every dedup key survives, and a
redelivery of anything processed before the migration is still a duplicate after it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from gateway.core.settings import Settings
from gateway.store.db import connect, create_pool, migrate, with_database
from gateway.store.sqlfiles import migrations
from gateway.testing.payloads import status_obj, statuses_payload, tenashi_event, to_bytes
from tests.support.consume import drain, read_all, stage

PARTITIONS = 7
BEFORE = max(m.version for m in migrations() if m.version < PARTITIONS)
LOG = 20  # 0020_inbox_log
TABLES = {
    "webhook_inbox": "id",
    "inbound_messages": "id",
    "message_statuses": "id",
    "account_errors": "id",
    "account_updates": "id",
    "reply_claims": "inbound_wamid",
    "outbox": "id",
}


@pytest.fixture
async def old_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"gw_p_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_admin_dsn, name)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


def at(day: date, hour: int = 12) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def message_body(wamid: str, ts: datetime) -> bytes:
    msg = {
        "from": "49",
        "id": wamid,
        "timestamp": str(int(ts.timestamp())),
        "type": "text",
        "text": {"body": wamid},
    }
    value = {"messaging_product": "whatsapp", "metadata": {"phone_number_id": "1"}, "messages": [msg]}
    doc = {
        "object": "whatsapp_business_account",
        "entry": [{"id": "w", "changes": [{"field": "messages", "value": value}]}],
    }
    return orjson.dumps(doc)


async def fill(conn: asyncpg.Connection, today: date) -> list[bytes]:
    """What the consumers of the previous schema wrote; returns redeliveries of it all."""
    redeliveries: list[bytes] = []
    # Staged rows over four days of receipt, in every state.
    for d in range(4):
        for state in ("done", "pending", "dead"):
            await conn.execute(
                "INSERT INTO webhook_inbox (source, body, state, received_at) VALUES ('meta', $1, $2, $3)",
                f"{state}-{d}".encode(),
                state,
                at(today - timedelta(days=d)),
            )
    inbox_id = await conn.fetchval("SELECT min(id) FROM webhook_inbox")
    # Meta messages from today back to six days ago (inside Meta's window), and many more.
    for i, d in enumerate([0, 1, 3, 6] * 50):
        wamid, ts = f"wamid.M{i}", at(today - timedelta(days=d), hour=i % 24)
        await conn.execute(
            "INSERT INTO inbound_messages (wamid, source, timestamp, message, inbox_id, received_at)"
            " VALUES ($1, 'meta', $2, '{}', $3, $2)",
            wamid,
            ts,
            inbox_id,
        )
        await conn.execute(
            "INSERT INTO processed_webhook_events (event_key, inbox_id) VALUES ($1, $2)",
            f"msg:{wamid}",
            inbox_id,
        )
        redeliveries.append(message_body(wamid, ts))
    # Meta statuses, one of them whose history row was purged since (its day is unknown).
    for i, d in enumerate([0, 2, 5]):
        ts = at(today - timedelta(days=d))
        st = status_obj(f"wamid.S{i}", "delivered", timestamp=str(int(ts.timestamp())))
        key = f"status:wamid.S{i}:delivered:"
        await conn.execute("INSERT INTO processed_webhook_events (event_key) VALUES ($1)", key)
        if i != 2:
            await conn.execute(
                "INSERT INTO message_statuses (event_key, wamid, status, timestamp, raw, recorded_at)"
                " VALUES ($1, $2, 'delivered', $3, $4, $3)",
                key,
                f"wamid.S{i}",
                ts,
                st,
            )
        redeliveries.append(to_bytes(statuses_payload(st)))
    # Untimed: a Tenashi event, account records.
    await conn.execute("INSERT INTO processed_webhook_events (event_key) VALUES ('evt:evt_1')")
    await conn.execute(
        "INSERT INTO account_errors (event_key, field, errors, raw)"
        " VALUES ('acct-error:x', 'messages', '[]', '{}')"
    )
    await conn.execute("INSERT INTO account_updates (event_key, field, value) VALUES ('change:y', 'f', '{}')")
    await conn.execute("INSERT INTO reply_claims (inbound_wamid, claimed_by) VALUES ('wamid.M0', 'bot')")
    await conn.execute(
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload)"
        " VALUES ('acme', 'k', 'cb', '49', '{}')"
    )
    # 20 000 more keys, as a busy database would have.
    await conn.execute(
        "INSERT INTO processed_webhook_events (event_key)"
        " SELECT 'evt:bulk' || n FROM generate_series(1, 20000) n"
    )
    return redeliveries


async def snapshot(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    out = {
        t: [dict(r) for r in await conn.fetch(f"SELECT * FROM {t} ORDER BY {k}")] for t, k in TABLES.items()
    }
    out["keys"] = [
        dict(r)
        for r in await conn.fetch(
            "SELECT DISTINCT event_key, inbox_id FROM processed_webhook_events ORDER BY 1"
        )
    ]
    return out


async def test_migrating_a_populated_database_keeps_every_row_and_key(
    old_db: str, settings: Settings
) -> None:
    # Read when the test runs: the migrations place rows by the day they run on.
    today = datetime.now(UTC).date()
    conn = await connect(old_db)
    try:
        await migrate(conn, upto=BEFORE)
        redeliveries = await fill(conn, today)
        before = await snapshot(conn)
        # Up to the log (0020), which drops the staged rows' state columns (its own test:
        # test_migrate_inbox_log.py); then the rest.
        upto_log = [m.version for m in migrations() if BEFORE < m.version < LOG]
        assert await migrate(conn, upto=LOG - 1) == upto_log
        after = await snapshot(conn)
        assert await migrate(conn) == [m.version for m in migrations() if m.version >= LOG]
        for table, rows in before.items():
            # Every row, every column it had (later migrations may add some), the same ids.
            kept = [{k: r[k] for k in rows[0]} for r in after[table]] if rows else after[table]
            assert kept == rows, table
        assert (
            await conn.fetchval(
                "SELECT relkind::text FROM pg_class WHERE relname = 'processed_webhook_events'"
            )
            == "p"
        )
        # The untimed key and the bulk went to the untimed partition, the Meta keys to their days.
        day = await conn.fetchval(
            "SELECT event_day FROM processed_webhook_events WHERE event_key = 'msg:wamid.M2'"
        )
        assert day == today - timedelta(days=3)
        # The status whose day is unknown is findable on every day a redelivery could compute.
        copies = await conn.fetchval(
            "SELECT count(*) FROM processed_webhook_events WHERE event_key = 'status:wamid.S2:delivered:'"
        )
        assert copies == 10 + 1  # today - 8 .. today + 1, and the untimed partition
        # Identities continue after the old sequences; the staging NOTIFY still fires.
        top = {t: max(r["id"] for r in before[t]) for t in ("webhook_inbox", "inbound_messages")}
        woke = asyncio.Event()
        await conn.add_listener("webhook_inbox", lambda *_: woke.set())
        new_id = await conn.fetchval(
            "INSERT INTO webhook_inbox (source, body) VALUES ('meta', 'x') RETURNING id"
        )
        assert new_id > top["webhook_inbox"]
        await asyncio.wait_for(woke.wait(), 5)
        await conn.execute("DELETE FROM webhook_inbox WHERE id = $1", new_id)
    finally:
        await conn.close()

    # Meta redelivers everything: the consumers of the new schema find every key.
    s = Settings(database_url=old_db, run_consumers=False, run_sender=False, migrate_on_start=False)
    pool = await create_pool(old_db, 1, 3)
    try:
        await read_all(pool)
        await pool.execute("UPDATE inbox_parked SET state = 'done'")
        for body in redeliveries:
            await stage(pool, body)
        await stage(
            pool,
            to_bytes(tenashi_event("evt_1", "message.status", {"message_id": "t", "status": "read"})),
            "tenashi",
        )
        await drain(pool, s)
        assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'") == 0
        assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == len(before["inbound_messages"])
        assert await pool.fetchval("SELECT count(*) FROM message_statuses") == len(before["message_statuses"])
        assert await pool.fetchval("SELECT count(DISTINCT event_key) FROM processed_webhook_events") == len(
            before["keys"]
        )
        new = await pool.fetchval(
            "INSERT INTO inbound_messages (wamid, message, subject) VALUES ('wamid.new', '{}', 'wamid.new')"
            " RETURNING id"
        )
        assert new > top["inbound_messages"]
    finally:
        await pool.close()

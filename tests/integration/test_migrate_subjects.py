"""Migration 0009 on a populated database: every row gets its subject (the same one the
consumers compute), webhook_inbox its lane, and a redelivery of anything processed before
the migration is still a duplicate after it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from gateway.core.events import subject_of
from gateway.core.settings import Settings
from gateway.store.db import connect, create_pool, migrate, with_database
from gateway.store.sqlfiles import migrations
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
from tests.support.consume import counts, drain, stage
from tests.support.subjects import SUBJECTS

SUBJECTS_MIGRATION = 9
BEFORE = max(m.version for m in migrations() if m.version < SUBJECTS_MIGRATION)
NOW = datetime.now(UTC)
TS = str(int((NOW - timedelta(days=2)).timestamp()))

# What Meta and Tenashi sent before the migration (and send again after it).
BODIES = [
    (
        "meta",
        to_bytes(
            messages_payload(message_obj("wamid.M1", timestamp=TS), message_obj("wamid.M2", timestamp=TS))
        ),
    ),
    ("meta", to_bytes(statuses_payload(status_obj("wamid.S1", "delivered", timestamp=TS)))),
    (
        "meta",
        to_bytes(statuses_payload(status_obj("wamid.S2", "read", participant=["p1", "p2"], timestamp=TS))),
    ),
    ("meta", to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000, "title": "x"}]))))),
    ("meta", to_bytes(meta_payload(("account_update", {"phone_number": "1", "event": "VERIFIED"})))),
    ("tenashi", to_bytes(tenashi_event("evt_m", "message.received", {"message_id": "t.M", "from": "49"}))),
    ("tenashi", to_bytes(tenashi_event("evt_s", "message.status", {"message_id": "t.S", "status": "read"}))),
    ("tenashi", to_bytes(tenashi_event("evt_o", "account.changed", {"x": 1}))),
]


@pytest.fixture
async def old_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"gw_s_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(pg_admin_dsn, name)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


async def fill(conn: asyncpg.Connection) -> None:
    """What the consumers of schema 0008 wrote for BODIES (their batch statement, as it was)."""
    from gateway.core.planning import StagedRow, plan_batch

    dest = await conn.fetchval(
        "INSERT INTO destinations (name, url, events, secret) VALUES ('d', 'http://x',"
        " '{message,status,account}', 'whsec_x') RETURNING id"
    )
    for source, body in BODIES:
        inbox_id = await conn.fetchval(
            "INSERT INTO webhook_inbox (source, body, state) VALUES ($1, $2, 'done') RETURNING id",
            source,
            body,
        )
        plan = plan_batch([StagedRow(inbox_id, source, body, None)])
        for key, day in zip(plan.keys, plan.key_days, strict=True):
            await conn.execute(
                "INSERT INTO processed_webhook_events (event_key, inbox_id, event_day) VALUES ($1, $2, $3)",
                key,
                inbox_id,
                day,
            )
            await conn.execute(
                "INSERT INTO deliveries (destination_id, event_key, webhook_id, kind, envelope)"
                " VALUES ($1, $2, $2, 'message', '{}')",
                dest,
                key,
            )
        for m in plan.messages:
            await conn.execute(
                "INSERT INTO inbound_messages (wamid, source, message, inbox_id) VALUES ($1, $2, $3, $4)",
                m["wamid"],
                source,
                m["message"],
                inbox_id,
            )
        for s in plan.statuses:
            await conn.execute(
                "INSERT INTO message_statuses (event_key, source, wamid, status, participant, raw, inbox_id)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7)",
                s["key"],
                source,
                s["wamid"],
                s["status"],
                s["participant"],
                s["raw"],
                inbox_id,
            )
        for a in plan.account_errors:
            await conn.execute(
                "INSERT INTO account_errors (event_key, field, errors, raw, inbox_id)"
                " VALUES ($1, $2, $3, $4, $5)",
                a["key"],
                a["field"],
                a["errors"],
                a["raw"],
                inbox_id,
            )
        for u in plan.account_updates:
            await conn.execute(
                "INSERT INTO account_updates (event_key, field, value, inbox_id) VALUES ($1, $2, $3, $4)",
                u["key"],
                u["field"],
                u["value"],
                inbox_id,
            )
        await conn.execute(
            "INSERT INTO event_fragments (event_key, inbox_id, path, fragment) VALUES ($1, $2, '', $3)",
            plan.keys[0],
            inbox_id,
            body,
        )
    # Many more keys, as a busy database would have, in the untimed partition.
    await conn.execute(
        "INSERT INTO processed_webhook_events (event_key, event_day)"
        " SELECT 'evt:bulk' || n, DATE '1970-01-01' FROM generate_series(1, 5000) n"
    )


async def test_sql_and_python_agree_on_every_subject(pool: asyncpg.Pool) -> None:
    keys = [k for k, _ in SUBJECTS]
    got = await pool.fetch("SELECT k, event_subject(k) AS s FROM unnest($1::text[]) k", keys)
    assert {r["k"]: r["s"] for r in got} == {k: subject_of(k) for k in keys}


async def test_migrating_a_populated_database_gives_every_row_its_subject(old_db: str) -> None:
    conn = await connect(old_db)
    try:
        await migrate(conn, upto=BEFORE)
        await fill(conn)
        keys_before = await conn.fetchval("SELECT count(*) FROM processed_webhook_events")
        assert await migrate(conn) == [m.version for m in migrations() if m.version > BEFORE]

        # Every key and every keyed row: the subject the consumers compute from the key.
        for table in (
            "processed_webhook_events",
            "message_statuses",
            "account_errors",
            "account_updates",
            "deliveries",
            "event_fragments",
        ):
            rows = await conn.fetch(f"SELECT event_key, subject FROM {table}")
            assert rows, table
            assert all(r["subject"] == subject_of(r["event_key"]) for r in rows), table
        assert await conn.fetchval("SELECT count(*) FROM processed_webhook_events") == keys_before
        # The feed: a Meta message's wamid, a Tenashi message's event id (from its key).
        feed = {
            r["wamid"]: r["subject"] for r in await conn.fetch("SELECT wamid, subject FROM inbound_messages")
        }
        assert feed == {"wamid.M1": "wamid.M1", "wamid.M2": "wamid.M2", "t.M": "evt_m"}
        # Lanes: id mod 32, for old rows and new ones, and in a day partition created later.
        assert await conn.fetchval("SELECT bool_and(lane = id % 32) FROM webhook_inbox")
        later = (NOW + timedelta(days=20)).date()
        assert await conn.fetchval("SELECT partition_ensure_day('webhook_inbox', $1)", later)
        lane = await conn.fetchval(
            "INSERT INTO webhook_inbox (source, body, received_at) VALUES ('meta', 'x', $1)"
            " RETURNING lane - id % 32",
            datetime(later.year, later.month, later.day, 12, tzinfo=UTC),
        )
        assert lane == 0
        await conn.execute("DELETE FROM webhook_inbox WHERE body = 'x'")
    finally:
        await conn.close()

    # Everything is redelivered: the consumers of the new schema find every key.
    s = Settings(database_url=old_db, run_consumers=False, run_sender=False, migrate_on_start=False)
    pool = await create_pool(old_db, 1, 3)
    try:
        before = await counts(pool)
        deliveries = await pool.fetchval("SELECT count(*) FROM deliveries")
        for source, body in BODIES:
            await stage(pool, body, source)
        await drain(pool, s)
        assert await pool.fetchval("SELECT count(*) FROM inbox_row_states() WHERE state <> 'done'") == 0
        assert await counts(pool) == before
        assert await pool.fetchval("SELECT count(*) FROM deliveries") == deliveries
        # And a new event gets its subject on every row it writes.
        await stage(pool, to_bytes(statuses_payload(status_obj("wamid.N:1", "sent", timestamp=TS))))
        await drain(pool, s)
        assert (
            await pool.fetchval(
                "SELECT subject FROM processed_webhook_events WHERE event_key = 'status:wamid.N:1:sent:'"
            )
            == "wamid.N:1"
        )
        assert (
            await pool.fetchval("SELECT subject FROM message_statuses WHERE wamid = 'wamid.N:1'")
            == "wamid.N:1"
        )
    finally:
        await pool.close()

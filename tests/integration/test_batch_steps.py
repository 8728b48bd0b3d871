"""inbox_apply_batch_steps (the consumers' batch as Citus can plan it) does what the one-statement
inbox_apply_batch does: the same batch applied each way, in transactions rolled back, writes the
same rows and answers the same counts. On one PostgreSQL: the two differ only in how they are
planned, which is what Citus cares about (tests/citus/test_routing.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.core.planning import Plan, StagedRow, plan_batch
from gateway.store import inbox
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
from tests.support.consume import add_outbox

TS = str(int((datetime.now(UTC) - timedelta(hours=1)).timestamp()))
BODIES = [
    (
        "meta",
        to_bytes(
            messages_payload(message_obj("wamid.BS1", timestamp=TS), message_obj("wamid.BS2", timestamp=TS))
        ),
    ),
    (
        "meta",
        to_bytes(statuses_payload(status_obj("wamid.BSS", "delivered", callback="cb-bs", timestamp=TS))),
    ),
    ("meta", to_bytes(statuses_payload(status_obj("wamid.BSS", "read", callback="cb-bs", timestamp=TS)))),
    ("meta", to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000, "title": "x"}]))))),
    ("meta", to_bytes(meta_payload(("account_update", {"phone_number": "1", "event": "VERIFIED"})))),
    ("tenashi", to_bytes(tenashi_event("evt_bs", "message.received", {"message_id": "t.BS", "from": "49"}))),
    ("meta", b"not json at all"),
    # a customer known by phone number and BSUID: the identities' upsert (customer_ids)
    (
        "meta",
        to_bytes(messages_payload(message_obj("wamid.BSU", sender="4915", user_id="US.BS1", timestamp=TS))),
    ),
    # an image: its media row (a VALUES list on Citus too)
    (
        "meta",
        to_bytes(
            messages_payload(
                message_obj("wamid.BSM", timestamp=TS)
                | {"type": "image", "image": {"id": "media.BS1", "mime_type": "image/jpeg", "sha256": "x"}}
            )
        ),
    ),
    # keys are written into the steps' VALUES list: quotes, backslashes and SQL in a wamid stay data
    (
        "meta",
        to_bytes(messages_payload(message_obj("wamid.BS'3\\'); DROP TABLE media; --", timestamp=TS))),
    ),
]
TABLES = {
    "processed_webhook_events": "event_key, event_day, subject, inbox_id",
    "inbound_messages": "wamid, subject, sender, message",
    "message_statuses": "event_key, subject, status, biz_opaque_callback_data",
    "account_errors": "event_key, subject, errors",
    "account_updates": "event_key, subject, value",
    "customer_ids": "phone_number_id, user_id, wa_id",
    "inbox_parked": "inbox_id, state, last_error, body, attempts",
    "media": "media_id, phone_number_id, origin, mime_type, wamid",
    "outbox": "idem_key, state, wamid, delivery_status",
    "delivery_events": "lane, event_key, kind, conversation, body, meta_body",
    "delivery_queue": "destination_id, lane, conv",
}


async def applied(
    pool: asyncpg.Pool, plan: Plan, *, steps: bool
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The batch applied by the store as the consumers apply it (``steps``: the Citus form), and
    what it wrote, rolled back."""
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            r = await inbox.apply_plan(conn, plan, citus=steps)
            rows = {
                t: [tuple(x) for x in await conn.fetch(f"SELECT {c} FROM {t} ORDER BY {c}")]
                for t, c in TABLES.items()
            }
            return dataclasses.asdict(r), rows
        finally:
            await tx.rollback()


async def staged_plan(pool: asyncpg.Pool) -> Plan:
    """BODIES staged, planned as one batch."""
    rows = []
    for source, body in BODIES:
        inbox_id = await pool.fetchval(
            "INSERT INTO webhook_inbox (source, body) VALUES ($1, $2) RETURNING id", source, body
        )
        rows.append(StagedRow(inbox_id, source, body, None))
    return plan_batch(rows)


async def test_the_steps_write_what_the_statement_writes(pool: asyncpg.Pool) -> None:
    await add_outbox(pool, "cb-bs", biz_opaque_callback_data="caller-value")
    await pool.execute(
        "INSERT INTO destinations (name, url, events, secret, ordered, format) VALUES"
        " ('std', 'http://127.0.0.1:9/a', '{message,status,account}', 'whsec_abc', true, 'standard'),"
        " ('meta', 'http://127.0.0.1:9/b', '{message,status}', 'meta-secret', false, 'meta')"
    )
    plan = await staged_plan(pool)
    one, one_rows = await applied(pool, plan, steps=False)
    steps, steps_rows = await applied(pool, plan, steps=True)
    assert one["fresh"] > 5 and one["deliveries"] > 0 and one["outbox_updated"] == 1 and one["parked"] == 1
    assert {k: v for k, v in steps.items() if k != "fresh_keys"} == {
        k: v for k, v in one.items() if k != "fresh_keys"
    }
    assert sorted(steps["fresh_keys"]) == sorted(one["fresh_keys"])
    assert steps_rows == one_rows
    assert steps_rows["customer_ids"] and one["identities"] == 1
    assert [r[0] for r in steps_rows["media"]] == ["media.BS1"]
    assert steps_rows["inbox_parked"][0][3] == b"not json at all"
    assert any("DROP TABLE media" in k for k in steps["fresh_keys"])


async def test_the_steps_meet_their_keys_on_a_redelivery(pool: asyncpg.Pool) -> None:
    plan = await staged_plan(pool)
    async with pool.acquire() as conn, conn.transaction():
        first = await inbox.apply_plan(conn, plan, citus=True)
        again = await inbox.apply_plan(conn, plan, citus=True)
    assert first.fresh > 5 and again.fresh == 0 and again.fresh_keys == []
    empty = plan_batch([])
    async with pool.acquire() as conn, conn.transaction():
        assert (await inbox.apply_plan(conn, empty, citus=True)).fresh == 0

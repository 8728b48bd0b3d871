"""Webhook bodies in the shapes of Meta's webhook reference (tests/data/meta_webhooks.json):
every inbound message type, statuses with the 2026 identity fields (a username user without a
phone number, a failed status without contacts), system messages, calls, flows, edits, revokes,
template and account updates, user_preferences, user_id_update, echoes. Each is accepted by the
real ingest endpoint, processed, and none is parked dead.

The ``user_id_update`` body is written after the field names Meta's BSUID guide lists (the full
reference payload was not available to us): the gateway records any change field as an account
update and links the ``contacts`` it carries, whatever else the value holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.inbound.consumer import Consumer
from gateway.testing.payloads import meta_bytes

PAYLOADS: dict[str, Any] = json.loads((Path(__file__).parents[1] / "data" / "meta_webhooks.json").read_text())


async def test_every_meta_shape_is_accepted_and_processed(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool
) -> None:
    gw = await start_gateway(settings)
    for name, payload in PAYLOADS.items():
        body = meta_bytes(payload)
        headers = {"X-Hub-Signature-256": sign_meta(body, settings.meta_app_secrets[0])}
        async with http.post(gw.make_url("/webhooks/meta"), data=body, headers=headers) as r:
            assert r.status == 200, name
    consumer = Consumer(pool, settings)
    while await consumer.step():
        pass
    states = {
        r["state"]: r["n"]
        for r in await pool.fetch("SELECT state, count(*) AS n FROM inbox_row_states() GROUP BY 1")
    }
    assert states == {"done": len(PAYLOADS)}
    assert await pool.fetchval("SELECT count(*) FROM dead_events") == 0

    messages = [n for n, p in PAYLOADS.items() if _value(p).get("messages") and _field(p) == "messages"]
    statuses = [n for n, p in PAYLOADS.items() if _value(p).get("statuses") and _field(p) == "messages"]
    others = [n for n, p in PAYLOADS.items() if _field(p) != "messages"]
    assert await pool.fetchval("SELECT count(*) FROM inbound_messages") == len(messages)
    assert await pool.fetchval("SELECT count(*) FROM message_statuses") == len(statuses)
    assert await pool.fetchval("SELECT count(*) FROM account_updates") == len(others)
    assert await pool.fetchval("SELECT count(*) FROM account_errors") == 1  # value.errors

    # Who wrote: a username user has no phone number, and is named by BSUID.
    wamid = PAYLOADS["text_username_no_phone"]["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    row = await pool.fetchrow(
        "SELECT sender, user_id, parent_user_id, username, waba_id FROM inbound_messages WHERE wamid = $1",
        wamid,
    )
    assert dict(row) == {
        "sender": None,
        "user_id": "US.13491208655302741918",
        "parent_user_id": "US.ENT.11815799212886844830",
        "username": "sheena.n",
        "waba_id": "102290129340398",
    }
    # The media of inbound messages are known with their number (the two images share one id).
    assert await pool.fetchval("SELECT count(*) FROM media WHERE phone_number_id = '106540352242922'") == 5
    # Phone numbers and BSUIDs seen together, including a changed number and a new BSUID.
    links = {(r["wa_id"], r["user_id"]) for r in await pool.fetch("SELECT wa_id, user_id FROM customer_ids")}
    assert ("12195555358", "US.20004561223344556677") in links  # system: user_changed_number
    assert ("16505551234", "US.13491208655302741918") in links
    # The read and delivered statuses of a send to a BSUID: no phone number, the username.
    got = await pool.fetch(
        "SELECT status, recipient, recipient_user_id, recipient_username FROM message_statuses"
        " WHERE status IN ('delivered', 'read') AND participant = '' ORDER BY status"
    )
    assert [tuple(r) for r in got] == [
        ("delivered", None, "US.13491208655302741918", "sheena.n"),
        ("read", None, "US.13491208655302741918", "sheena.n"),
    ]


def _value(payload: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = payload["entry"][0]["changes"][0]["value"]
    return value


def _field(payload: dict[str, Any]) -> str:
    field: str = payload["entry"][0]["changes"][0]["field"]
    return field

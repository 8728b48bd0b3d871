"""The consumer renders an event's bodies in Python (gateway.core.meta_body for the Meta format)
while destinations take its events; a backfill, a status of a send of ours and a consumer's
first batch after destinations appear have them rendered by PostgreSQL (meta_webhook). Both
must give a destination the same webhook: for every shape of Meta's webhook reference
(tests/data/meta_webhooks.json), group statuses of either kind of participant list and a
Tenashi event, the two renderings are equal JSON, and the standard body is the envelope."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from gateway.core.envelope import envelope, forward_row
from gateway.core.events import Event
from gateway.core.meta_body import meta_webhook
from gateway.core.parsing import parse
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.store import deliveries
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    status_obj,
    statuses_payload,
    tenashi_event,
    to_bytes,
)
from tests.support.config import DESTINATION_SECRET
from tests.support.consume import stage

PAYLOADS: dict[str, Any] = json.loads((Path(__file__).parents[1] / "data" / "meta_webhooks.json").read_text())


def _events() -> list[tuple[str, Event]]:
    out: list[tuple[str, Event]] = [
        ("meta", ev) for p in PAYLOADS.values() for ev in parse("meta", to_bytes(p))
    ]
    numbers = ["4915100000001", "4915100000002"]
    by_number = status_obj("wamid.G1", "read", participant=numbers, recipient="120363")
    by_bsuid = status_obj("wamid.G2", "delivered", recipient="120363")
    by_bsuid["recipient_participant_user_id"] = ["US.11", "US.12"]
    for group in (by_number, by_bsuid):
        out += [("meta", ev) for ev in parse("meta", to_bytes(statuses_payload(group)))]
    text = {"message_id": "tm1", "from": "49151", "type": "text"}
    tenashi = tenashi_event("evt_1", "message.received", text)
    out += [("tenashi", ev) for ev in parse("tenashi", to_bytes(tenashi))]
    return out


async def test_python_and_sql_render_the_same_meta_webhook(pool: asyncpg.Pool) -> None:
    events = _events()
    assert len(events) > len(PAYLOADS)  # every payload parsed, the groups one event per participant
    envs = [envelope(ev, source) for source, ev in events]
    rendered = await pool.fetch(
        "SELECT meta_webhook(e::jsonb, NULL)::text AS meta, e::jsonb::text AS std"
        " FROM unnest($1::text[]) WITH ORDINALITY AS t(e, n) ORDER BY n",
        [orjson.dumps(e).decode() for e in envs],
    )
    seen_group = 0
    for (source, ev), env, r in zip(events, envs, rendered, strict=True):
        mine = meta_webhook(env)
        theirs = None if r["meta"] is None else orjson.loads(r["meta"])
        assert mine == theirs, ev.key
        assert (mine is None) == (source != "meta")
        if callback_free := forward_row(ev, source, 1, bodies=True).get("body"):
            assert orjson.loads(callback_free) == orjson.loads(r["std"])
        seen_group += ev.key.startswith(("status:wamid.G1:", "status:wamid.G2:"))
    assert seen_group == 4  # one event per participant of each group status


async def _stored(pool: asyncpg.Pool, key: str) -> tuple[bytes, bytes]:
    r = await pool.fetchrow("SELECT body, meta_body FROM delivery_events WHERE event_key = $1", key)
    assert r is not None, key
    return bytes(r["body"]), bytes(r["meta_body"])


async def test_the_consumer_renders_bodies_while_destinations_take_its_events(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    for name, fmt, secret in (("std", "standard", DESTINATION_SECRET), ("bot", "meta", "m" * 32)):
        await deliveries.add_destination(
            pool, name=name, url=f"http://127.0.0.1:9/{name}", events=["message"], secret=secret,
            max_in_flight=4, ordered=False, format=fmt,
        )  # fmt: skip
    consumer = Consumer(pool, settings)

    async def one(wamid: str) -> tuple[bytes, bytes]:
        await stage(pool, to_bytes(messages_payload(message_obj(wamid, "hi"))))
        assert await consumer.step() == 1
        return await _stored(pool, f"msg:{wamid}")

    # A consumer's first batch does not know of destinations: PostgreSQL prints its bodies
    # (jsonb: a space after each colon); once a batch queued deliveries, the consumer renders
    # them (compact). The same JSON either way.
    by_sql, by_consumer = await one("wamid.R1"), await one("wamid.R2")
    assert b'": ' in by_sql[0] and b'": ' in by_sql[1]
    assert b'": ' not in by_consumer[0] and b'": ' not in by_consumer[1]
    for sql_body, own_body in zip(by_sql, by_consumer, strict=True):
        assert orjson.loads(sql_body.replace(b"wamid.R1", b"wamid.R2")) == orjson.loads(own_body)
    # Without destinations a batch renders nothing; the first one after they are back has its
    # bodies printed by PostgreSQL again.
    for name in ("std", "bot"):
        await deliveries.set_enabled(pool, name=name, enabled=False)
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.R3", "hi"))))
    assert await consumer.step() == 1
    for name in ("std", "bot"):
        await deliveries.set_enabled(pool, name=name, enabled=True)
    again = await one("wamid.R4")
    assert b'": ' in again[0] and b'": ' in again[1]

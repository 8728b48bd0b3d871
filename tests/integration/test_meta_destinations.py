"""Meta-format destinations: each fresh event as its own Meta webhook body (the bytes fixed when
the delivery is created), signed X-Hub-Signature-256 with the destination's secret, with every
rule of forwarding (retries with the same bytes, 410, backfill, webhook-id)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from gateway.core.settings import Settings
from gateway.operator import actions
from gateway.outbound.backfill import backfill
from gateway.store import deliveries
from gateway.testing.fake_receiver import FakeReceiver, Scripted
from gateway.testing.payloads import message_obj, messages_payload, status_obj, statuses_payload, to_bytes
from tests.support.config import DESTINATION_SECRET
from tests.support.consume import add_outbox, drain, stage
from tests.support.forward import all_delivered, fast, forwarding, states, until

PAYLOADS: dict[str, Any] = json.loads((Path(__file__).parents[1] / "data" / "meta_webhooks.json").read_text())
APP_SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
ACTOR = actions.Actor("test", "cli")
CUSTOMER = "4915100000001"


async def add_meta(pool: asyncpg.Pool, name: str, url: str, events: tuple[str, ...], **kw: Any) -> int:
    return await deliveries.add_destination(
        pool, name=name, url=url, events=list(events), secret=APP_SECRET, max_in_flight=16,
        ordered=False, format="meta", **kw,
    )  # fmt: skip


async def bodies(pool: asyncpg.Pool, name: str) -> dict[str, Any]:
    """event key -> the stored body of the destination's delivery."""
    rows = await pool.fetch(
        "SELECT x.event_key, x.envelope::text AS body FROM deliveries x "
        "JOIN destinations d ON d.id = x.destination_id WHERE d.name = $1",
        name,
    )
    return {r["event_key"]: orjson.loads(r["body"]) for r in rows}


def _events(payload: dict[str, Any]) -> int:
    value = payload["entry"][0]["changes"][0]["value"]
    if payload["entry"][0]["changes"][0]["field"] != "messages":
        return 1
    n = len(value.get("messages") or ()) + len(value.get("statuses") or ())
    return n or 1


def _expected(payload: dict[str, Any]) -> dict[str, Any]:
    """A Meta body of one event, as the gateway relays it: the same JSON (Meta's "time" of an
    entry is not kept)."""
    out = copy.deepcopy(payload)
    for entry in out["entry"]:
        entry.pop("time", None)
    return out


async def test_every_meta_shape_is_relayed_as_meta_sent_it(pool: asyncpg.Pool, settings: Settings) -> None:
    await add_meta(pool, "bot", "http://127.0.0.1:9/hooks", ("message", "status", "account"))
    for payload in PAYLOADS.values():
        await stage(pool, to_bytes(payload))
    await drain(pool, settings)
    got = await bodies(pool, "bot")
    # Every event was queued for the destination, each as its own body.
    assert len(got) == sum(_events(p) for p in PAYLOADS.values())
    singles = {name: p for name, p in PAYLOADS.items() if _events(p) == 1}
    relayed = list(got.values())
    for name, payload in singles.items():
        assert _expected(payload) in relayed, name


async def test_a_group_status_is_one_body_per_participant(pool: asyncpg.Pool, settings: Settings) -> None:
    await add_meta(pool, "bot", "http://127.0.0.1:9/hooks", ("status",))
    group = status_obj("wamid.G1", "read", participant=["4915100000001", "4915100000002"], recipient="120363")
    await stage(pool, to_bytes(statuses_payload(group)))
    await drain(pool, settings)
    got = await bodies(pool, "bot")
    assert set(got) == {"status:wamid.G1:read:4915100000001", "status:wamid.G1:read:4915100000002"}
    for key, body in got.items():
        [status] = body["entry"][0]["changes"][0]["value"]["statuses"]
        assert status["recipient_participant_id"] == [key.rsplit(":", 1)[1]]
        assert {k: v for k, v in status.items() if k != "recipient_participant_id"} == {
            k: v for k, v in group.items() if k != "recipient_participant_id"
        }


async def test_a_batched_webhook_becomes_one_body_per_event(pool: asyncpg.Pool, settings: Settings) -> None:
    await add_meta(pool, "bot", "http://127.0.0.1:9/hooks", ("message",))
    batch = messages_payload(
        message_obj("wamid.B1", "one", sender="4915100000001"),
        message_obj("wamid.B2", "two", sender="4915100000002"),
    )
    await stage(pool, to_bytes(batch))
    await drain(pool, settings)
    got = await bodies(pool, "bot")
    assert set(got) == {"msg:wamid.B1", "msg:wamid.B2"}
    for key, body in got.items():
        value = body["entry"][0]["changes"][0]["value"]
        assert [m["id"] for m in value["messages"]] == [key.removeprefix("msg:")]
        assert value["metadata"] == batch["entry"][0]["changes"][0]["value"]["metadata"]


async def test_statuses_carry_the_tracker_the_caller_set(pool: asyncpg.Pool, settings: Settings) -> None:
    await add_meta(pool, "bot", "http://127.0.0.1:9/hooks", ("status",))
    await add_outbox(pool, "acme:k1", biz_opaque_callback_data="tracker-1", wamid="wamid.T1")
    await add_outbox(pool, "acme:k2", wamid="wamid.T2")
    for wamid, callback in (("wamid.T1", "acme:k1"), ("wamid.T2", "acme:k2"), ("wamid.T3", "theirs")):
        st = status_obj(wamid, "delivered")
        st["biz_opaque_callback_data"] = callback
        await stage(pool, to_bytes(statuses_payload(st)))
    await drain(pool, settings)
    got = {k.split(":")[1]: v["entry"][0]["changes"][0]["value"]["statuses"][0] for k, v in (
        await bodies(pool, "bot")).items()}  # fmt: skip
    assert got["wamid.T1"]["biz_opaque_callback_data"] == "tracker-1"  # the caller's own value
    assert "biz_opaque_callback_data" not in got["wamid.T2"]  # ours, and the caller set none
    assert got["wamid.T3"]["biz_opaque_callback_data"] == "theirs"  # not a send of ours: as Meta sent it


async def test_tenashi_events_go_to_standard_destinations_only(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    await add_meta(pool, "bot", "http://127.0.0.1:9/hooks", ("message",))
    await deliveries.add_destination(
        pool, name="std", url="http://127.0.0.1:9/std", events=["message"], secret=DESTINATION_SECRET,
        max_in_flight=4, ordered=False,
    )  # fmt: skip
    body = {"id": "evt_1", "type": "message.received", "created": 1749854575,
            "data": {"message_id": "tm1", "from": "4915100000009", "type": "text", "text": "hi"}}  # fmt: skip
    await stage(pool, orjson.dumps(body), source="tenashi")
    await drain(pool, settings)
    assert await bodies(pool, "bot") == {}
    assert set(await bodies(pool, "std")) == {"evt:evt_1"}


async def test_delivery_is_signed_retried_with_the_same_bytes_and_stops_on_410(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    receiver = FakeReceiver(APP_SECRET, meta=True)
    url = await receiver.start()
    try:
        await add_meta(pool, "bot", url, ("message",))
        receiver.script = [Scripted(500), Scripted(403)]
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.R1", "hello", sender=CUSTOMER))))
        await drain(pool, settings)
        s = fast(settings)
        async with forwarding(pool, s):
            await until(lambda: receiver.wait_for(1, 0.1), what="delivered")
        st = receiver.state
        assert st.bad_signatures == 0
        assert len(st.attempts) == 3 and len(set(st.attempts)) == 1  # webhook-id still sent, the same
        assert len(set(st.digests)) == 1  # every attempt sent the same bytes
        [body] = st.processed.values()
        assert body["entry"][0]["changes"][0]["value"]["messages"][0]["id"] == "wamid.R1"
        assert (await states(pool)) == {"delivered": 1}

        # A wrong secret is refused by the receiver (401 here), and retried like any failure.
        receiver.state.processed.clear()
        receiver.secret = "not-the-secret"
        receiver.script = []
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.R2", "again", sender=CUSTOMER))))
        await drain(pool, settings)
        async with forwarding(pool, s):
            await until(lambda: _bad(receiver), what="a refused signature")
        assert not receiver.state.processed

        # 410 Gone disables the destination; its delivery waits, pending.
        receiver.secret = APP_SECRET
        receiver.script = [Scripted(410)]
        async with forwarding(pool, s):
            await until(lambda: _disabled(pool), what="the destination disabled")
        assert (await states(pool)).get("pending") == 1
    finally:
        await receiver.close()


async def test_a_refusing_or_slow_bot_opens_the_breaker_and_gets_every_event_after(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """A 4xx (pywa's 422 for a body it cannot parse) and a 2xx past the forward timeout are
    failures like any other: retried with the same bytes, the breaker opens, and everything is
    delivered once the bot is well again."""
    receiver = FakeReceiver(APP_SECRET, meta=True)
    url = await receiver.start()
    s = fast(settings, forward_timeout_ms=200, forward_breaker_failures=3, forward_breaker_cooldown_s=0.3)

    async def breaker() -> str:
        return str(await pool.fetchval("SELECT breaker_state FROM destinations WHERE name = 'bot'"))

    async def is_open() -> bool:
        return await breaker() == "open"

    async def drained() -> bool:
        return await all_delivered(pool) and await breaker() == "closed"

    async def stage_messages(prefix: str) -> None:
        for i in range(4):
            msg = message_obj(f"wamid.{prefix}{i}", f"text {i}", sender=f"49151000000{i:02d}")
            await stage(pool, to_bytes(messages_payload(msg)))
        await drain(pool, settings)

    try:
        await add_meta(pool, "bot", url, ("message",))
        for phase in ("refusing", "slow"):
            if phase == "refusing":
                receiver.script = [Scripted(422)] * 6
            else:
                receiver.latency_ms = 600  # a 2xx, after the forwarder has given up
            await stage_messages(phase[0].upper())
            async with forwarding(pool, s):
                await until(is_open, what=f"the breaker open on a {phase} bot")
                receiver.script = []
                receiver.latency_ms = 0
                await until(drained, what=f"everything delivered after the {phase} bot recovered")
        st = receiver.state
        assert st.answered[422] >= 3 and st.bad_signatures == 0
        wamids = {b["entry"][0]["changes"][0]["value"]["messages"][0]["id"] for b in st.processed.values()}
        assert wamids == {f"wamid.{p}{i}" for p in "RS" for i in range(4)}
        # Every attempt of one delivery sent the same bytes.
        sent: dict[str, set[str]] = {}
        for webhook_id, digest in zip(st.attempts, st.digests, strict=True):
            sent.setdefault(webhook_id, set()).add(digest)
        assert len(sent) == 8 and all(len(d) == 1 for d in sent.values())
        assert len(st.attempts) > 8
        rows = await pool.fetch("SELECT attempts, last_status FROM deliveries")
        assert all(r["last_status"] in (200, 204) for r in rows) and sum(r["attempts"] for r in rows) > 8
    finally:
        await receiver.close()


async def _bad(receiver: FakeReceiver) -> bool:
    return receiver.state.bad_signatures >= 2


async def _disabled(pool: asyncpg.Pool) -> bool:
    return not await pool.fetchval("SELECT enabled FROM destinations WHERE name = 'bot'")


async def test_backfill_gives_the_body_a_live_delivery_has(pool: asyncpg.Pool, settings: Settings) -> None:
    await add_meta(pool, "live", "http://127.0.0.1:9/hooks", ("message", "status", "account"))
    await add_outbox(pool, "acme:k1", biz_opaque_callback_data="tracker-1", wamid="wamid.T1")
    for payload in PAYLOADS.values():
        await stage(pool, to_bytes(payload))
    st = status_obj("wamid.T1", "read")
    st["biz_opaque_callback_data"] = "acme:k1"
    await stage(pool, to_bytes(statuses_payload(st)))
    await drain(pool, settings)
    await add_meta(pool, "late", "http://127.0.0.1:9/late", ("message", "status", "account"))
    now = datetime.now(UTC)
    hour = timedelta(hours=1)
    b = await backfill(pool, destination="late", since=now - hour, until=now + hour)
    assert b.inserted == len(await bodies(pool, "live"))
    assert await bodies(pool, "late") == await bodies(pool, "live")


async def test_rotating_a_meta_secret_is_a_switch(pool: asyncpg.Pool) -> None:
    await add_meta(pool, "bot", "http://127.0.0.1:9/hooks", ("message",))
    async with pool.acquire() as conn:
        with pytest.raises(actions.Refused, match="grace-h 0"):
            await actions.rotate_secret(conn, ACTOR, "bot", secret="new-app-secret", grace_h=24)
        with pytest.raises(actions.Refused, match="printable"):
            await actions.rotate_secret(conn, ACTOR, "bot", secret=" padded ", grace_h=0)
        rotated = await actions.rotate_secret(conn, ACTOR, "bot", secret="new-app-secret", grace_h=0)
        assert rotated.secret == "new-app-secret"
        generated = await actions.rotate_secret(conn, ACTOR, "bot", grace_h=0)
        assert len(generated.secret) == 32 and not generated.secret.startswith("whsec_")
        [d] = [d for d in await deliveries.list_destinations(conn) if d.name == "bot"]
        assert d.format == "meta" and d.secret == generated.secret and d.previous_secret is None
        # A standard destination keeps its rules: a whsec_ secret, a grace period.
        await deliveries.add_destination(
            conn, name="std", url="http://127.0.0.1:9/std", events=["message"],
            secret=DESTINATION_SECRET, max_in_flight=4, ordered=False,
        )  # fmt: skip
        with pytest.raises(actions.Refused, match="whsec_"):
            await actions.rotate_secret(conn, ACTOR, "std", secret="new-app-secret", grace_h=1)
        # The table refuses a standard destination without a whsec_ secret, and an empty one.
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE destinations SET secret = 'plain' WHERE name = 'std'")
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE destinations SET secret = '' WHERE name = 'bot'")

"""The fake provider itself: Meta and Tenashi send semantics, faults over HTTP, signed webhooks."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.core.signature import verify_meta, verify_tenashi
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.ports import closed_port
from tests.support.config import META_SECRET, TENASHI_SECRET

META_MSG = {"messaging_product": "whatsapp", "to": "4915100000009", "type": "text", "text": {"body": "x"}}
BEARER = {"Authorization": "Bearer t"}


async def meta_send(http: ClientSession, fake: FakeProvider, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(f"{fake.url}/v21.0/1111/messages", json=body, headers=BEARER) as r:
        return r.status, await r.json(content_type=None) if r.content_type == "application/json" else None


async def test_meta_send_shape_and_record(http: ClientSession, fake: FakeProvider) -> None:
    status, body = await meta_send(http, fake, {**META_MSG, "biz_opaque_callback_data": "acme:k"})
    assert status == 200
    assert body["messaging_product"] == "whatsapp"
    assert body["contacts"] == [{"input": "4915100000009", "wa_id": "4915100000009"}]
    wamid = body["messages"][0]["id"]
    assert wamid.startswith("wamid.")
    assert fake.count("acme:k") == 1
    async with http.get(f"{fake.url}/_fake/received") as r:
        got = await r.json()
    assert got[0]["id"] == wamid and got[0]["callback_data"] == "acme:k" and got[0]["to"] == "4915100000009"


async def test_meta_requires_bearer(http: ClientSession, fake: FakeProvider) -> None:
    async with http.post(f"{fake.url}/v21.0/1111/messages", json=META_MSG) as r:
        assert r.status == 401
        assert (await r.json())["error"]["code"] == 190
    assert fake.received == []


@pytest.mark.parametrize(("code", "http_status"), [(131056, 400), (131000, 500), (190, 401), (368, 403)])
async def test_error_codes_in_meta_shape(
    http: ClientSession, fake: FakeProvider, code: int, http_status: int
) -> None:
    async with http.post(
        f"{fake.url}/_fake/faults", json={"action": "error", "code": code, "subcode": 7}
    ) as r:
        assert r.status == 200
    status, body = await meta_send(http, fake, META_MSG)
    assert status == http_status
    err = body["error"]
    assert (err["code"], err["error_subcode"]) == (code, 7)
    assert {"message", "type", "fbtrace_id"} <= set(err)
    assert fake.received == []
    assert (await meta_send(http, fake, META_MSG))[0] == 200  # used once, then gone


async def test_fault_matching_by_recipient_and_count(http: ClientSession, fake: FakeProvider) -> None:
    fake.add_fault("http", to="4915100000001", status=503, times=2)
    assert (await meta_send(http, fake, META_MSG))[0] == 200  # other recipient: untouched
    other = {**META_MSG, "to": "4915100000001"}
    assert [(await meta_send(http, fake, other))[0] for _ in range(3)] == [503, 503, 200]
    async with http.post(f"{fake.url}/_fake/faults", json={"action": "explode"}) as r:
        assert r.status == 400


async def test_signed_status_webhooks_reach_the_gateway(
    http: ClientSession, fake: FakeProvider, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    fake.config.webhook_url = str(gateway.make_url("")).rstrip("/")
    fake.config.duplicates = 1
    fake.config.reorder = True
    await meta_send(http, fake, {**META_MSG, "biz_opaque_callback_data": "acme:k1"})
    fake.add_fault("fail_status", code=131049)
    await meta_send(http, fake, {**META_MSG, "biz_opaque_callback_data": "acme:k2"})
    await fake.drain_webhooks()
    assert all(w["status"] == 200 for w in fake.webhooks)  # the real ingest verified every signature
    bodies = [
        bytes(r["body"]) for r in await pool.fetch("SELECT body FROM webhook_inbox WHERE source = 'meta'")
    ]
    assert len(bodies) == 2 * (3 + 2)  # (sent, delivered, read) + (sent, failed), each twice
    statuses = [orjson.loads(b)["entry"][0]["changes"][0]["value"]["statuses"][0] for b in bodies]
    k1 = [s["status"] for s in statuses if s["biz_opaque_callback_data"] == "acme:k1"]
    assert sorted(k1) == sorted(["sent", "delivered", "read"] * 2)
    failed = [s for s in statuses if s["status"] == "failed"]
    assert failed and failed[0]["errors"][0]["code"] == 131049
    assert all(verify_meta(b, _sig(fake, b), [META_SECRET]) for b in bodies)


def _sig(fake: FakeProvider, body: bytes) -> str:
    from gateway.core.signature import sign_meta

    return sign_meta(body, fake.config.app_secret)


async def test_tenashi_idempotency(http: ClientSession, fake: FakeProvider) -> None:
    url = f"{fake.url}/api/v1/messages"
    body = {"to": "+4915100000009", "text": "x"}  # Tenashi's documented body
    headers = {**BEARER, "Idempotency-Key": "acme:t1"}
    async with http.post(url, json=body) as r:
        assert r.status == 401
    async with http.post(url, json=body, headers=BEARER) as r:
        assert r.status == 400  # no key
    # While the first request runs, a repeat gets 409 idempotency_in_progress. The repeat
    # goes once the fake holds the first (not after a guessed delay), and the first is held
    # long enough for a loaded machine.
    fake.add_fault("latency", latency_ms=2000)
    first = asyncio.ensure_future(http.post(url, json=body, headers=headers))
    async with asyncio.timeout(30):
        while "acme:t1" not in fake.tenashi.keys:
            await asyncio.sleep(0.01)
    async with http.post(url, json=body, headers=headers) as r:
        assert r.status == 409
        assert (await r.json())["error"]["code"] == "idempotency_in_progress"
    async with await first as r:
        assert r.status == 202
        original = await r.read()
    async with http.post(url, json=body, headers=headers) as r:
        assert r.status == 202
        assert r.headers["Idempotent-Replayed"] == "true"
        assert await r.read() == original
    async with http.post(url, json={**body, "to": "+4915100000008"}, headers=headers) as r:
        assert r.status == 422
    # A body other than the documented one is refused.
    bad = {"to": "+4915100000009", "phone_number_id": "1111", "message": {"type": "text"}}
    async with http.post(url, json=bad, headers={**BEARER, "Idempotency-Key": "acme:t9"}) as r:
        assert r.status == 400
    assert len(fake.received) == 1


async def test_tenashi_status_events_are_signed(
    http: ClientSession, fake: FakeProvider, gateway: TestServer, pool: asyncpg.Pool
) -> None:
    fake.config.webhook_url = str(gateway.make_url("")).rstrip("/")
    body = {"to": "+4915100000009", "text": "x"}  # Tenashi's documented body
    async with http.post(
        f"{fake.url}/api/v1/messages", json=body, headers={**BEARER, "Idempotency-Key": "acme:t2"}
    ) as r:
        msg_id = (await r.json())["id"]
    await fake.drain_webhooks()
    rows = await pool.fetch("SELECT body, delivery_id FROM webhook_inbox WHERE source = 'tenashi'")
    assert len(rows) == 3
    for rec in rows:
        event = orjson.loads(rec["body"])
        assert event["type"] == "message.status" and event["id"] == rec["delivery_id"]
        assert event["id"].startswith("evt_") and len(event["id"]) == 4 + 24
        assert event["data"]["idempotency_key"] == "acme:t2" and event["data"]["message_id"] == msg_id
        from gateway.core.signature import sign_tenashi

        assert verify_tenashi(
            bytes(rec["body"]), sign_tenashi(bytes(rec["body"]), TENASHI_SECRET), TENASHI_SECRET
        )


async def test_fake_provider_command_serves(http: ClientSession) -> None:
    port = closed_port()
    env = {**os.environ, "GATEWAY_FAKE_PORT": str(port), "GATEWAY_LOG_LEVEL": "warning"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "fake-provider", env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert f":{port}" in line.decode()
        async with http.post(f"http://127.0.0.1:{port}/v21.0/1/messages", json=META_MSG, headers=BEARER) as r:
            assert r.status == 200
        async with http.get(f"http://127.0.0.1:{port}/_fake/received") as r:
            assert len(await r.json()) == 1
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0

"""The Graph-compatible endpoint over real HTTP, with the sender in the gateway's process or in
another one, against the fake Graph API: Meta's answers, Meta's errors, the outbox's rules."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp import ClientSession
from yarl import URL

from gateway.core.settings import Settings
from gateway.outbound.sender import Sender
from gateway.runtime import services
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support.consume import drain, stage
from tests.support.graph import TO, graph, post, text
from tests.support.http import ACME, GLOBEX
from tests.support.send import send_settings


async def rows(pool: asyncpg.Pool) -> int:
    n: int = await pool.fetchval("SELECT count(*) FROM outbox")
    return n


async def test_a_send_is_answered_with_the_providers_wamid(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    gw = await start_gateway(graph(settings, fake))
    status, _, body = await post(http, gw, text(to="+" + TO, biz_opaque_callback_data="tracker-1"))
    assert status == 200, body
    [sent] = fake.received_by(TO)
    assert body == {"messaging_product": "whatsapp", "contacts": [{"input": "+" + TO, "wa_id": TO}],
                    "messages": [{"id": sent.id}]}  # fmt: skip
    row = await pool.fetchrow("SELECT state, wamid, biz_opaque_callback_data, idem_key FROM outbox")
    assert (row["state"], row["wamid"]) == ("accepted", sent.id)
    assert row["biz_opaque_callback_data"] == "tracker-1"
    # Without an Idempotency-Key each request is its own row: a client retry is a new message.
    assert row["idem_key"].startswith("graph.")
    assert (await post(http, gw, text(to=TO)))[0] == 200
    assert await rows(pool) == 2 and len(fake.received_by(TO)) == 2
    # The final state is readable by the gateway's key.
    async with http.get(gw.make_url(f"/v1/messages/{row['idem_key']}"), headers=ACME) as r:
        assert (await r.json())["wamid"] == sent.id


async def test_a_bsuid_recipient_is_answered_with_its_user_id(
    http: ClientSession, start_gateway: Any, settings: Settings, fake: FakeProvider
) -> None:
    gw = await start_gateway(graph(settings, fake))
    body = {"messaging_product": "whatsapp", "recipient": "US.13491208655302741918", "text": {"body": "hi"}}
    status, _, answer = await post(http, gw, body)  # no "type": text, as at Meta
    assert status == 200, answer
    assert answer["contacts"] == [{"input": "US.13491208655302741918", "user_id": "US.13491208655302741918"}]
    [sent] = fake.received_by("US.13491208655302741918")
    assert {k: v for k, v in sent.message.items() if k != "biz_opaque_callback_data"} == {
        "type": "text", "text": {"body": "hi"}}  # fmt: skip


async def test_an_idempotency_key_sends_once_and_answers_the_same(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    gw = await start_gateway(graph(settings, fake))
    first = await post(http, gw, text(), key="order-1")
    again = await post(http, gw, text(), key="order-1")
    assert first[0] == again[0] == 200 and first[2] == again[2]
    assert again[1].get("Idempotent-Replayed") == "true"
    assert len(fake.received_by(TO)) == 1 and await rows(pool) == 1
    status, _, err = await post(http, gw, text(body="other"), key="order-1")
    assert status == 422 and err["error"]["code"] == 100


async def test_a_refused_send_answers_metas_error(
    http: ClientSession, start_gateway: Any, settings: Settings, fake: FakeProvider
) -> None:
    gw = await start_gateway(graph(settings, fake))
    fake.add_fault("error", to=TO, code=131026)
    status, _, body = await post(http, gw, text())
    assert status == 400
    err = body["error"]
    assert err["code"] == 131026 and err["type"] == "OAuthException" and "fbtrace_id" in err


async def test_past_the_wait_the_answer_parses_and_names_the_key(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    # No sender runs: the outcome never comes within the wait.
    gw = await start_gateway(graph(settings, fake, run_sender=False, graph_compat_wait_ms=300))
    started = time.monotonic()
    status, headers, body = await post(http, gw, text(), key="later-1")
    assert 0.25 < time.monotonic() - started < 2.5
    assert status == 202
    assert body["messages"] == [{"id": "later-1"}] and body["contacts"] == [{"input": TO, "wa_id": TO}]
    assert body["gateway"] == {"key": "later-1", "state": "pending", "location": "/v1/messages/later-1"}
    assert headers["Location"] == "/v1/messages/later-1"
    # A sender in another process picks it up; the same key then answers with the wamid.
    async with services.running(Sender(pool, send_settings(settings, fake, pair_interval_s=0.0))):
        status, _, body = await post(http, gw, text(), key="later-1")
    assert status == 200 and body["messages"][0]["id"].startswith("wamid.")
    assert len(fake.received_by(TO)) == 1


@pytest.mark.citus  # on Citus the sender announces the outcome itself (no trigger there)
async def test_the_wait_ends_on_the_notify_of_a_sender_elsewhere(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    gw = await start_gateway(graph(settings, fake, run_sender=False, graph_compat_wait_ms=20000))
    sender = Sender(pool, send_settings(settings, fake, pair_interval_s=0.0, send_poll_ms=60000))
    request = asyncio.create_task(post(http, gw, text()))
    while await rows(pool) == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not request.done()  # waiting
    # sends and records: the row's NOTIFY (on Citus the sender's own, after its record) wakes
    # the request
    await sender.step()
    recorded = time.monotonic()
    status, _, body = await asyncio.wait_for(request, 5)
    assert status == 200 and body["messages"][0]["id"].startswith("wamid.")
    # woken, not the 20 s wait (timed from the record: on a busy Citus cluster the step itself
    # takes seconds)
    assert time.monotonic() - recorded < 2.0
    await sender.close()


@pytest.mark.parametrize(
    ("path", "body", "auth", "status", "code"),
    [
        ("/v99.0/1111/messages", text(), ACME, 200, None),  # any vNN.N
        ("/v1/1111/messages", text(), ACME, 400, 2500),
        ("/vx/1111/messages", text(), ACME, 400, 2500),
        ("/0/1111/messages", text(), {}, 401, 190),  # no key: nothing said about the path
        ("/v23.0/1111/messages", text(), {}, 401, 190),
        ("/v23.0/1111/messages", text(), {"Authorization": "Bearer nope-nope-nope-nope"}, 401, 190),
        ("/v23.0/2222/messages", text(), ACME, 400, 100),  # another tenant's number
        ("/v23.0/1111/messages", {**text(), "unknown": 1}, ACME, 400, 100),
        ("/v23.0/1111/messages", {**text(), "recipient_type": "group"}, ACME, 400, 100),
        ("/v23.0/1111/messages", {**text(), "type": "carousel"}, ACME, 400, 100),
        ("/v23.0/1111/messages", {**text(), "messaging_product": "sms"}, ACME, 400, 100),
        ("/v23.0/1111/messages", {**text(), "text": {"body": "x" * 5000}}, ACME, 400, 100),
        ("/v23.0/1111/messages", b"{not json", ACME, 400, 100),
        ("/v23.0/1111/messages", b'{"a": "' + b"x" * 70000 + b'"}', ACME, 413, 100),
        ("/v23.0/1111/messages", [text()], ACME, 400, 100),
    ],
)
async def test_bad_input_gets_metas_error_and_enqueues_nothing(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider,
    path: str, body: Any, auth: dict[str, str], status: int, code: int | None,
) -> None:  # fmt: skip
    s = graph(settings, fake, tenant_numbers=(("acme", "1111"), ("globex", "2222")))
    gw = await start_gateway(s)
    got, headers, answer = await post(http, gw, body, path=path, auth=auth)
    assert got == status, answer
    if code is None:
        return
    assert answer["error"]["code"] == code and isinstance(answer["error"]["message"], str)
    assert headers["Content-Type"].startswith("application/json")
    assert await rows(pool) == 0 and fake.received_by(TO) == []


async def test_a_path_with_dot_segments_reaches_no_graph_route(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    gw = await start_gateway(graph(settings, fake))
    paths = ("/v99.0/../1111/messages", "/v23.0/%2e%2e/1111/messages", "/v23.0/..%2F1111/messages",
             "/v23.0/1111%2F..%2F2222/messages", "/v23.0/%2E%2E%2F1111/messages")  # fmt: skip
    for path in paths:
        async with http.post(URL(gw.make_url("/")).with_path(path, encoded=True), data=orjson.dumps(text()),
                             headers=ACME) as r:  # fmt: skip
            assert r.status >= 400, path
            if r.status == 400:
                assert (await r.json())["error"]["code"] == 100  # not a number the tenant may use
    assert await rows(pool) == 0


async def test_a_quoted_reply_takes_the_reply_guard(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.IN1", "hello", sender=TO))))
    await drain(pool, settings)
    gw = await start_gateway(graph(settings, fake))
    reply = text(context={"message_id": "wamid.IN1"})
    assert (await post(http, gw, reply))[0] == 200
    status, _, body = await post(http, gw, reply)  # a second answer to the same message
    assert status == 409 and body["error"]["code"] == 100
    assert "already answered" in body["error"]["error_data"]["details"]
    status, _, body = await post(http, gw, text(context={"message_id": "wamid.NOPE"}))
    assert status == 400 and body["error"]["code"] == 100
    assert len(fake.received_by(TO)) == 1 and await rows(pool) == 1


async def test_mark_as_read_and_typing(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    await stage(pool, to_bytes(messages_payload(message_obj("wamid.IN2", "hello", sender=TO))))
    await drain(pool, settings)
    gw = await start_gateway(graph(settings, fake))
    read = {"messaging_product": "whatsapp", "status": "read", "message_id": "wamid.IN2"}
    status, _, body = await post(http, gw, read)
    assert (status, body) == (200, {"success": True})
    status, _, body = await post(http, gw, {**read, "typing_indicator": {"type": "text"}})
    assert (status, body) == (200, {"success": True})
    status, _, body = await post(http, gw, {**read, "message_id": "wamid.OTHER"})
    assert status == 400 and body["error"]["code"] == 100
    status, _, body = await post(http, gw, {**read, "status": "deleted"})
    assert status == 400 and body["error"]["code"] == 100
    assert await rows(pool) == 0  # read receipts are not queued


async def test_media_pass_through_with_the_numbers_token(
    http: ClientSession, start_gateway: Any, settings: Settings, pool: asyncpg.Pool, fake: FakeProvider
) -> None:
    s = graph(settings, fake, graph_tokens=(("1111", "token-of-1111"),),
              tenant_numbers=(("acme", "1111"), ("globex", "2222")))  # fmt: skip
    fake.config.number_tokens = {"1111": "token-of-1111"}
    gw = await start_gateway(s)
    data = os.urandom(150_000)
    form = aiohttp.FormData()
    form.add_field("messaging_product", "whatsapp")
    form.add_field("type", "image/png")
    form.add_field("file", data, filename="a.png", content_type="image/png")
    async with http.post(gw.make_url("/v23.0/1111/media"), data=form, headers=ACME) as r:
        assert r.status == 200, await r.text()
        media_id = (await r.json())["id"]
    assert fake.media[media_id].data == data
    # Meta's media object, its url back at the gateway (the client's own host), no token needed.
    headers = {**ACME, "X-Forwarded-Proto": "https", "X-Forwarded-Host": "gw.example"}
    async with http.get(gw.make_url(f"/v23.0/{media_id}"), headers=headers) as r:
        assert r.status == 200
        found = await r.json()
    assert found["id"] == media_id and found["mime_type"] == "image/png"
    assert found["url"] == f"https://gw.example/v1/media/{media_id}"
    async with http.get(gw.make_url(f"/v23.0/{media_id}"), headers=ACME) as r:
        url = (await r.json())["url"]
    async with http.get(url, headers=ACME) as r:
        assert r.status == 200 and await r.read() == data
    # Another tenant, an unknown id, another tenant's number: Meta's errors.
    for path, auth, status, code in (
        (f"/v23.0/{media_id}", GLOBEX, 404, 100),
        ("/v23.0/999999", ACME, 404, 100),
        (f"/v23.0/{media_id}", {}, 401, 190),
        (f"/v2/{media_id}", ACME, 400, 2500),
        (f"/x/{media_id}", ACME, 400, 2500),
        (f"/x/{media_id}", {}, 401, 190),
    ):
        async with http.get(gw.make_url(path), headers=auth) as r:
            assert r.status == status, path
            assert (await r.json())["error"]["code"] == code
    form = aiohttp.FormData()
    form.add_field("file", data, filename="a.png", content_type="image/png")
    async with http.post(gw.make_url("/v23.0/2222/media"), data=form, headers=ACME) as r:
        assert r.status == 400 and (await r.json())["error"]["error_subcode"] == 33
    async with http.post(gw.make_url("/v23.0/1111/media"), data=b"not multipart", headers=ACME) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == 100
    # The gateway's own paths keep their answers.
    async with http.get(gw.make_url("/v1/messages"), headers=ACME) as r:
        assert r.status == 405 and "GET" not in r.headers["Allow"]
    async with http.get(gw.make_url("/v1/media"), headers=ACME) as r:
        assert r.status == 405

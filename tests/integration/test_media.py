"""GET /v1/media/{id} and POST /v1/media through the fake Graph API: exact bytes, the tenant's
own numbers only, size limits, slow and lying media hosts."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.outbound.sender import Sender
from gateway.testing.fake_provider import FakeProvider
from gateway.testing.payloads import meta_payload, meta_value, to_bytes
from tests.support.consume import stage
from tests.support.http import ACME, GLOBEX, post_message
from tests.support.send import FakeClock, send_settings

BOUND = (("acme", "1111"), ("globex", "2222"))


def image_message(wamid: str, media_id: str) -> dict[str, Any]:
    return {
        "from": "4915112345678",
        "id": wamid,
        "timestamp": "1764460800",
        "type": "image",
        "image": {"mime_type": "image/jpeg", "sha256": "x", "id": media_id, "caption": "look"},
    }


async def receive_image(pool: asyncpg.Pool, s: Settings, media_id: str, number: str = "1111") -> None:
    value = meta_value(messages=[image_message(f"wamid.{media_id}", media_id)], phone_number_id=number)
    await stage(pool, to_bytes(meta_payload(("messages", value))))
    await Consumer(pool, s).step()


@pytest.fixture
async def served(start_gateway: Any, settings: Settings, fake: FakeProvider) -> tuple[str, Settings]:
    s = dataclasses.replace(
        send_settings(settings, fake, graph_tokens=(("1111", "token-of-1111"),)), tenant_numbers=BOUND
    )
    fake.config.number_tokens = {"1111": "token-of-1111"}
    gw = await start_gateway(s)
    return str(gw.make_url("")).rstrip("/"), s


async def test_inbound_media_streams_the_exact_bytes_to_its_tenant_only(
    http: ClientSession, pool: asyncpg.Pool, fake: FakeProvider, served: tuple[str, Settings]
) -> None:
    base, s = served
    data = os.urandom(3 * 1024 * 1024 + 17)
    media_id = fake.add_media(data, "image/jpeg", "1111")
    await receive_image(pool, s, media_id)
    async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "image/jpeg"
        assert await r.read() == data
    # Another tenant, an unknown id, a hostile id: 404, and the fake never asked.
    for path, auth in (
        (f"/v1/media/{media_id}", GLOBEX),
        ("/v1/media/999999", ACME),
        ("/v1/media/..%2F..%2Fetc", ACME),
    ):
        async with http.get(f"{base}{path}", headers=auth) as r:
            assert r.status == 404, path
    async with http.get(f"{base}/v1/media/{media_id}") as r:
        assert r.status == 401


async def test_upload_then_send_and_download_by_its_id(
    http: ClientSession, pool: asyncpg.Pool, fake: FakeProvider, served: tuple[str, Settings]
) -> None:
    base, s = served
    data = os.urandom(200_000)
    form = aiohttp.FormData()
    form.add_field("phone_number_id", "1111")
    form.add_field("file", data, filename="receipt.pdf", content_type="application/pdf")
    async with http.post(f"{base}/v1/media", data=form, headers=ACME) as r:
        assert r.status == 200, await r.text()
        media_id = (await r.json())["id"]
    assert fake.media[media_id].data == data and fake.media[media_id].mime_type == "application/pdf"
    body = {
        "to": "4915112345678",
        "phone_number_id": "1111",
        "type": "document",
        "document": {"id": media_id},
    }
    assert (await post_message(http, base, body, "d1"))[0] == 202
    sender = Sender(pool, s, clock=FakeClock())
    try:
        await sender.step()
    finally:
        await sender.close()
    (sent,) = fake.received
    assert sent.message["document"] == {"id": media_id} and sent.token == "token-of-1111"
    async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
        assert await r.read() == data
    # globex may not send acme's upload, nor upload for acme's number.
    body2 = {**body, "phone_number_id": "2222"}
    assert (await post_message(http, base, body2, "d2", GLOBEX))[0] == 400
    form2 = aiohttp.FormData()
    form2.add_field("phone_number_id", "1111")
    form2.add_field("file", b"x", filename="a.txt", content_type="text/plain")
    async with http.post(f"{base}/v1/media", data=form2, headers=GLOBEX) as r:
        assert r.status == 403
    assert len(fake.media) == 1


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"file": (b"x", "a.txt", "text/plain")}, 400),  # no phone_number_id
        ({"phone_number_id": "1111"}, 400),  # no file
        ({"phone_number_id": "1111", "file": (b"x", "a.bin", "application/octet-stream")}, 400),
        ({"phone_number_id": "1111", "file": (b"x", "a.bin", "image/svg+xml")}, 400),
        ({"phone_number_id": "1111", "file": (b"x", "a" * 241 + ".txt", "text/plain")}, 400),
    ],
)
async def test_bad_uploads(
    fields: dict[str, Any], status: int, http: ClientSession, fake: FakeProvider, served: tuple[str, Settings]
) -> None:
    base, _s = served
    with aiohttp.MultipartWriter("form-data") as mp:
        for name, value in fields.items():
            if isinstance(value, tuple):
                data, filename, ctype = value
                part = mp.append(data, {"Content-Type": ctype})
                part.set_content_disposition("form-data", name=name, filename=filename)
            else:
                mp.append(value).set_content_disposition("form-data", name=name)
    async with http.post(f"{base}/v1/media", data=mp, headers=ACME) as r:
        assert r.status == status, await r.text()
    assert fake.media == {}


async def test_too_large_media_is_refused_both_ways(
    http: ClientSession,
    pool: asyncpg.Pool,
    fake: FakeProvider,
    served: tuple[str, Settings],
    start_gateway: Any,
) -> None:
    _base, s = served
    small = dataclasses.replace(s, media_max_bytes=100_000)
    base = str((await start_gateway(small)).make_url("")).rstrip("/")
    big = fake.add_media(os.urandom(100_001), "video/mp4", "1111")
    await receive_image(pool, small, big)
    async with http.get(f"{base}/v1/media/{big}", headers=ACME) as r:
        assert r.status == 413
    # A host that announces a small file and sends more is cut off at the limit.
    liar = fake.add_media(os.urandom(300_000), "video/mp4", "1111", declared_size=50_000)
    await receive_image(pool, small, liar)
    async with http.get(f"{base}/v1/media/{liar}", headers=ACME) as r:
        assert r.status == 200
        got = await r.read()
    assert len(got) == 50_000  # only what it announced, as Content-Length says
    form = aiohttp.FormData()
    form.add_field("phone_number_id", "1111")
    form.add_field("file", os.urandom(100_001), filename="v.mp4", content_type="video/mp4")
    async with http.post(f"{base}/v1/media", data=form, headers=ACME) as r:
        assert r.status == 413
    assert set(fake.media) == {big, liar}


async def test_a_slow_or_broken_media_host_cuts_the_download_off(
    http: ClientSession,
    pool: asyncpg.Pool,
    fake: FakeProvider,
    served: tuple[str, Settings],
    start_gateway: Any,
) -> None:
    _base, s = served
    quick = dataclasses.replace(s, media_timeout_s=1.0)
    base = str((await start_gateway(quick)).make_url("")).rstrip("/")
    slow = fake.add_media(os.urandom(200_000), "image/png", "1111", chunk_delay_ms=400)
    short = fake.add_media(os.urandom(100_000), "image/png", "1111", declared_size=150_000)
    for media_id in (slow, short):
        await receive_image(pool, quick, media_id)
        async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()  # never a complete-looking body
    # The gateway is fine afterwards.
    ok = fake.add_media(b"fine", "image/png", "1111")
    await receive_image(pool, quick, ok)
    async with http.get(f"{base}/v1/media/{ok}", headers=ACME) as r:
        assert await r.read() == b"fine"


async def test_a_graph_answer_in_pieces_is_read_whole_and_one_past_the_bound_refused(
    http: ClientSession, pool: asyncpg.Pool, fake: FakeProvider, served: tuple[str, Settings]
) -> None:
    base, s = served
    media_id = fake.add_media(b"whole", "image/png", "1111")
    await receive_image(pool, s, media_id)
    # The media lookup's answer comes in two pieces 50 ms apart.
    fake.add_fault("split", to=media_id, pause_ms=50)
    async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
        assert r.status == 200 and await r.read() == b"whole"
    # A megabyte is no Graph answer: refused, not read to its end.
    fake.add_fault("oversize", to=media_id, size=1024 * 1024)
    async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
        assert r.status == 502
        assert "more than it ever does" in (await r.json())["detail"]


async def test_a_download_url_off_meta_is_not_fetched(
    http: ClientSession, pool: asyncpg.Pool, fake: FakeProvider, served: tuple[str, Settings]
) -> None:
    base, s = served
    media_id = fake.add_media(b"secret", "image/png", "1111")
    await receive_image(pool, s, media_id)
    fake.config.media_url = "https://169.254.169.254/latest/meta-data/"
    async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
        assert r.status == 502
        assert "not one of Meta's media hosts" in (await r.json())["detail"]


async def test_a_redirecting_media_host_is_not_followed(
    http: ClientSession, pool: asyncpg.Pool, fake: FakeProvider, served: tuple[str, Settings]
) -> None:
    base, s = served
    media_id = fake.add_media(b"secret", "image/png", "1111")
    await receive_image(pool, s, media_id)
    # On the Graph host, redirecting to a download that would work: not followed all the same.
    fake.config.media_url = f"{fake.url}/_fake/redirect?to={fake.url}/_fake/media/{media_id}"
    async with http.get(f"{base}/v1/media/{media_id}", headers=ACME) as r:
        assert r.status == 502

"""The public edge under hostile clients: slow drips, unsigned floods, encoded bodies, too many
bytes or connections at once. Real server (the production limits of gateway.web.server) on a
real port; raw sockets where a well-behaved client library would hide what is tested."""

from __future__ import annotations

import asyncio
import gzip
import logging
import selectors
import socket
import time
from pathlib import Path
from typing import cast

import asyncpg
import pytest
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.testing.payloads import message_payload, meta_bytes
from gateway.web.app import WEBHOOKS
from gateway.web.server import Listening
from tests.support.config import META_SECRET, VERIFY_TOKEN, replace

# A header that has the right shape but signs nothing: it gets a request as far as its body.
FORGED = "sha256=" + "ab" * 32
# Bounds on the test itself, not claims about speed: a hang must fail, not block CI.
GIVE_UP_S = 30
# The kernel's cap on a listen backlog (Linux).
_SOMAXCONN = Path("/proc/sys/net/core/somaxconn")
SOMAXCONN = int(_SOMAXCONN.read_text()) if _SOMAXCONN.exists() else 0


async def raw(server: Listening) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


def head(path: str, length: int | None, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(reader: asyncio.StreamReader) -> int:
    async with asyncio.timeout(GIVE_UP_S):
        line = await reader.readline()
    assert line.startswith(b"HTTP/1."), line
    return int(line.split()[1])


async def signed_post(http: ClientSession, server: Listening, wamid: str) -> int:
    body = meta_bytes(message_payload(wamid))
    headers = {"X-Hub-Signature-256": sign_meta(body, META_SECRET), "Content-Type": "application/json"}
    async with http.post(server.make_url("/webhooks/meta"), data=body, headers=headers) as r:
        return r.status


async def stored(pool: asyncpg.Pool) -> list[bytes]:
    return [r["body"] for r in await pool.fetch("SELECT body FROM webhook_inbox ORDER BY id")]


def quiet(caplog: pytest.LogCaptureFixture) -> None:
    """No ERROR and no traceback was logged: client faults are DEBUG lines."""
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]


async def reading_body(server: Listening, *, done: bool = False) -> None:
    """Wait until the server is reading a body that did not come whole with its headers (it
    holds bytes of the in-flight budget), or with ``done`` until no body is being read."""
    budget = server.app[WEBHOOKS].budget
    async with asyncio.timeout(GIVE_UP_S):
        while bool(budget.in_use) == done:
            await asyncio.sleep(0.01)


async def answer_of(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and the rest of an answer, read up to the server's end of the connection."""
    status = await status_of(reader)
    async with asyncio.timeout(GIVE_UP_S):
        return status, await reader.read()


async def test_slow_body_is_cut_off_while_signed_posts_succeed(
    http: ClientSession,
    start_gateway: object,
    settings: Settings,
    pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gw: Listening = await start_gateway(replace(settings, body_timeout_s=1.0))  # type: ignore[operator]
    length = 200
    reader, writer = await raw(gw)
    writer.write(head("/webhooks/meta", length, X_Hub_Signature_256=FORGED))
    # Read as it comes, like a client that sends and reads at once (not after the signed POST
    # below, however long that takes); the drip stops when the server has ended its side.
    answer = asyncio.create_task(answer_of(reader))
    sent = 0

    async def drip() -> None:
        nonlocal sent
        while sent < length and not answer.done():
            writer.write(b" ")
            sent += 1
            await asyncio.sleep(0.1)

    dripping = asyncio.create_task(drip())
    # Meanwhile a signed POST is served as usual.
    assert await signed_post(http, gw, "wamid.during-drip") == 200
    status, rest = await answer
    assert status == 408
    assert b"not received within" in rest
    assert sent < length, "the server waited for the whole slow body"
    dripping.cancel()
    writer.close()
    assert len(await stored(pool)) == 1
    quiet(caplog)


@pytest.mark.parametrize(("header", "status"), [(None, 401), (FORGED, 408)])
async def test_a_client_still_sending_gets_its_early_answer_then_the_end(
    start_gateway: object, settings: Settings, header: str | None, status: int
) -> None:
    """An answer given before the body was read whole: the connection is half-closed after
    it, so a client that keeps sending reads the whole answer and a clean end-of-file (closing
    with its bytes unread would answer them with a reset, which loses the answer); then the
    server closes, however long the client goes on."""
    gw: Listening = await start_gateway(replace(settings, body_timeout_s=1.0))  # type: ignore[operator]
    length = settings.max_body_bytes
    reader, writer = await raw(gw)
    extra = {} if header is None else {"X_Hub_Signature_256": header}
    writer.write(head("/webhooks/meta", length, **extra))
    stop = asyncio.Event()
    sent = 0

    async def flood() -> None:
        nonlocal sent
        while not stop.is_set() and not writer.is_closing() and sent < length - 1:
            writer.write(b" ")  # a byte every turn of the loop: some always unread
            sent += 1
            await asyncio.sleep(0)

    sending = asyncio.create_task(flood())
    try:
        got, rest = await answer_of(reader)
        assert got == status and b"connection: close" in rest.lower()
        assert not sending.done(), "the client was meant to be still sending"
        async with asyncio.timeout(GIVE_UP_S):  # not held open by a client that goes on
            while gw.site.open:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await sending
        writer.close()


async def test_slow_headers_are_cut_off(start_gateway: object, settings: Settings) -> None:
    gw: Listening = await start_gateway(replace(settings, header_timeout_s=1.0))  # type: ignore[operator]
    reader, writer = await raw(gw)
    partial = head("/webhooks/meta", 10, X_Hub_Signature_256=FORGED)[:-4]
    sent = 0
    async with asyncio.timeout(GIVE_UP_S):
        while not reader.at_eof() and sent < len(partial):
            writer.write(partial[sent : sent + 1])
            sent += 1
            try:
                async with asyncio.timeout(0.1):
                    await reader.read(1)
            except TimeoutError:
                pass
    assert reader.at_eof() and sent < len(partial), (
        "the headers were never complete, yet they were waited for"
    )
    writer.close()


@pytest.mark.parametrize("header", [None, "", "sha256=nothex", "sha1=" + "ab" * 20])
async def test_unsigned_body_is_refused_before_it_is_read(
    gateway: Listening, pool: asyncpg.Pool, header: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reader, writer = await raw(gateway)
    extra = {} if header is None else {"X_Hub_Signature_256": header}
    writer.write(head("/webhooks/meta", 3 * 1024 * 1024, **extra))
    # Not one byte of the 3 MB body is sent: the answer cannot have waited for it.
    assert await status_of(reader) == 401
    async with asyncio.timeout(GIVE_UP_S):
        rest = await reader.read()
    assert b"X-Hub-Signature-256" in rest and b"connection: close" in rest.lower()
    writer.close()
    assert await stored(pool) == []
    quiet(caplog)


async def test_declared_length_over_the_limit_is_refused_before_reading(gateway: Listening) -> None:
    reader, writer = await raw(gateway)
    writer.write(head("/webhooks/meta", 4 * 1024 * 1024 + 1, X_Hub_Signature_256=FORGED))
    assert await status_of(reader) == 413
    writer.close()


@pytest.mark.parametrize("signed_over", ["wire", "inflated"])
async def test_encoded_bodies_are_refused_not_inflated(
    http: ClientSession, gateway: Listening, pool: asyncpg.Pool, signed_over: str
) -> None:
    body = meta_bytes(message_payload("wamid.gz"))
    wire = gzip.compress(body)
    sig = sign_meta(wire if signed_over == "wire" else body, META_SECRET)
    headers = {"X-Hub-Signature-256": sig, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with http.post(gateway.make_url("/webhooks/meta"), data=wire, headers=headers) as r:
        assert r.status == 415
    assert await stored(pool) == []


async def test_identity_encoding_and_chunked_bodies_are_signed_over_the_wire_bytes(
    http: ClientSession, gateway: Listening, pool: asyncpg.Pool
) -> None:
    body = meta_bytes(message_payload("wamid.chunked"))
    headers = {"X-Hub-Signature-256": sign_meta(body, META_SECRET), "Content-Encoding": "identity"}

    async def chunks() -> object:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    async with http.post(gateway.make_url("/webhooks/meta"), data=chunks(), headers=headers) as r:
        assert r.status == 200
    assert await stored(pool) == [body]


async def test_bytes_being_read_at_once_are_bounded(
    http: ClientSession, start_gateway: object, settings: Settings, pool: asyncpg.Pool
) -> None:
    big = settings.max_body_bytes
    gw: Listening = await start_gateway(  # type: ignore[operator]
        replace(settings, max_inflight_body_bytes=big + 64 * 1024, body_timeout_s=60.0)
    )
    # A holds nearly the whole budget while its body trickles in.
    a_reader, a_writer = await raw(gw)
    a_writer.write(head("/webhooks/meta", big, X_Hub_Signature_256=FORGED) + b"{")
    await a_writer.drain()
    await reading_body(gw)  # the server has taken A's reservation
    b_reader, b_writer = await raw(gw)
    b_writer.write(head("/webhooks/meta", big, X_Hub_Signature_256=FORGED))
    assert await status_of(b_reader) == 503
    async with asyncio.timeout(GIVE_UP_S):
        assert b"retry-after: 1" in (await b_reader.read()).lower()
    b_writer.close()
    # A small signed POST still fits beside A.
    assert await signed_post(http, gw, "wamid.small") == 200
    # A finishes (its signature is wrong) and gives its bytes back.
    a_writer.write(b" " * (big - 1))
    assert await status_of(a_reader) == 401
    a_writer.close()
    c_reader, c_writer = await raw(gw)
    c_writer.write(head("/webhooks/meta", big, X_Hub_Signature_256=FORGED) + b" " * big)
    assert await status_of(c_reader) == 401  # read in full this time: the budget is free again
    c_writer.close()
    assert len(await stored(pool)) == 1


async def test_connections_past_the_cap_are_refused_at_once(
    http: ClientSession, start_gateway: object, settings: Settings
) -> None:
    gw: Listening = await start_gateway(replace(settings, max_connections=3))  # type: ignore[operator]
    held = [await raw(gw) for _ in range(3)]
    reader, writer = await raw(gw)
    assert await status_of(reader) == 503
    writer.close()
    assert gw.site.refused == 1
    for _, w in held:
        w.close()
    async with asyncio.timeout(GIVE_UP_S):
        while gw.site.open:
            await asyncio.sleep(0.01)
    assert await signed_post(http, gw, "wamid.after-cap") == 200


def handshakes(port: int, n: int, wait_s: float) -> int:
    """How many of ``n`` connections opened at once complete their handshake within
    ``wait_s``, while nothing accepts them (the caller does not yield to its event loop)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            socks.append(s)
        done: set[socket.socket] = set()
        with selectors.DefaultSelector() as sel:
            for s in socks:
                sel.register(s, selectors.EVENT_WRITE)
            deadline = time.monotonic() + wait_s
            while len(done) < n and (left := deadline - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    sock = cast(socket.socket, key.fileobj)
                    sel.unregister(sock)
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        done.add(sock)
        return len(done)
    finally:
        for s in socks:
            s.close()


@pytest.mark.skipif(SOMAXCONN < 512, reason="net.core.somaxconn caps every listen backlog below 512")
async def test_a_burst_of_new_connections_is_queued_not_dropped(
    http: ClientSession, start_gateway: object, settings: Settings
) -> None:
    # 400 clients connect in the same instant while the gateway is busy (here: its event loop
    # does not run). Their handshakes complete in the kernel's accept queue; past the queue
    # the kernel drops a SYN and the client sends it again after its retransmission timeout,
    # 1 s (RFC 6298), so "within half a second" tells queued from dropped.
    gw: Listening = await start_gateway(settings)  # type: ignore[operator]
    assert handshakes(gw.port, 400, 0.5) == 400
    small: Listening = await start_gateway(replace(settings, listen_backlog=16))  # type: ignore[operator]
    assert handshakes(small.port, 400, 0.5) <= 17  # the setting is the queue's length
    async with asyncio.timeout(GIVE_UP_S):
        while gw.site.open or small.site.open:
            await asyncio.sleep(0.01)
    assert await signed_post(http, gw, "wamid.after-burst") == 200


@pytest.mark.parametrize(
    "wire",
    [
        b"POST /webhooks/meta HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /webhooks/meta HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"X-Hub-Signature-256: " + FORGED.encode() + b"\r\n\r\nzz\r\n",
    ],
)
async def test_malformed_requests_are_answered_and_logged_quietly(
    gateway: Listening, wire: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reader, writer = await raw(gateway)
    writer.write(wire)
    assert 400 <= await status_of(reader) < 500
    writer.close()
    await asyncio.sleep(0.05)
    quiet(caplog)


async def test_client_vanishing_mid_body_is_logged_quietly(
    gateway: Listening, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for _ in range(5):
        _reader, writer = await raw(gateway)
        writer.write(head("/webhooks/meta", 1000, X_Hub_Signature_256=FORGED) + b"{" * 10)
        await writer.drain()
        await reading_body(gateway)
        writer.transport.abort()
        await reading_body(gateway, done=True)  # the server saw the client go (and logged it)
    quiet(caplog)
    assert any("body not received" in r.getMessage() for r in caplog.records)


async def test_handshake_forbids_sniffing(http: ClientSession, gateway: Listening) -> None:
    query = {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "<b>hi</b>"}
    async with http.get(gateway.make_url("/webhooks/meta"), params=query) as r:
        assert r.status == 200
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.content_type == "text/plain"


@pytest.mark.parametrize(
    ("header", "length", "first"), [(None, 1000, 401), (FORGED, 8 * 1024 * 1024, 413), (FORGED, 100, 100)]
)
async def test_expect_continue_is_refused_before_the_body_is_invited(
    gateway: Listening, header: str | None, length: int, first: int
) -> None:
    reader, writer = await raw(gateway)
    extra = {"Expect": "100-continue"}
    if header is not None:
        extra["X_Hub_Signature_256"] = header
    writer.write(head("/webhooks/meta", length, **extra))
    assert await status_of(reader) == first
    if first == 100:  # invited: the body follows, and is judged on its signature
        await reader.readline()
        writer.write(b" " * length)
        assert await status_of(reader) == 401
    writer.close()


async def test_chunked_body_over_the_limit_is_refused_whole_or_trickled(
    start_gateway: object, settings: Settings, pool: asyncpg.Pool
) -> None:
    """No declared length: the limit is checked on the bytes, whether the body came whole with
    the headers (taken at once) or is still arriving (read under the body deadline)."""
    gw: Listening = await start_gateway(replace(settings, max_body_bytes=1024))  # type: ignore[operator]
    body = b"x" * 2000
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    lines = ["POST /webhooks/meta HTTP/1.1", "Host: gateway", "Transfer-Encoding: chunked"]
    request_head = ("\r\n".join([*lines, f"X-Hub-Signature-256: {FORGED}"]) + "\r\n\r\n").encode()
    whole_reader, whole_writer = await raw(gw)
    whole_writer.write(request_head + chunked)
    assert await status_of(whole_reader) == 413
    whole_writer.close()
    drip_reader, drip_writer = await raw(gw)
    drip_writer.write(request_head + chunked[:500])  # within the limit so far
    await drip_writer.drain()
    await reading_body(gw)  # the rest arrives while the server reads under the body deadline
    drip_writer.write(chunked[500:])
    assert await status_of(drip_reader) == 413
    drip_writer.close()
    assert await stored(pool) == []

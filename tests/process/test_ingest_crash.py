"""SIGKILL the gateway during a burst: every request that got a 200 has its row."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from yarl import URL

from gateway.core.signature import sign_meta
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.config import META_SECRET
from tests.support.procs import free_port, spawn, wait_healthy

pytestmark = pytest.mark.slow
# A bound on the test, not a claim about speed: a process on a loaded machine is slow.
GIVE_UP_S = 60.0


def spawn_ingest_only(
    dsn: str, window_ms: int, log_path: str | None = None, **env: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`gateway serve` with its workers off, on a free port, /metrics on that port too (a
    scrape's connection is then one of those it counts); returns it and its base URL."""
    port = free_port()
    proc = spawn(
        ["serve"],
        {
            "DATABASE_URL": dsn,
            "GATEWAY_PORT": str(port),
            "GATEWAY_METRICS_PORT": str(port),
            "GATEWAY_META_APP_SECRETS": META_SECRET,
            "GATEWAY_RUN_CONSUMERS": "false",
            "GATEWAY_RUN_SENDER": "false",
            "GATEWAY_COMMIT_WINDOW_MS": str(window_ms),
            **env,
        },
        log_path,
    )
    return proc, f"http://127.0.0.1:{port}"


async def test_sigkill_during_burst_loses_no_acknowledged_event(
    db_dsn: str, pool: asyncpg.Pool, tmp_path: object
) -> None:
    # A wide window keeps many acknowledgements in flight when the kill lands.
    proc, base = spawn_ingest_only(db_dsn, window_ms=5)
    try:
        await wait_healthy(base, proc)
        acked: list[bytes] = []
        failed = 0
        sent = 0

        async def one(http: aiohttp.ClientSession, body: bytes) -> None:
            nonlocal failed
            try:
                async with http.post(
                    f"{base}/webhooks/meta",
                    data=body,
                    headers={"X-Hub-Signature-256": sign_meta(body, META_SECRET)},
                ) as r:
                    await r.read()
                    if r.status == 200:
                        acked.append(body)
                    else:
                        failed += 1
            except (TimeoutError, aiohttp.ClientError):
                failed += 1

        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as http:
            tasks: list[asyncio.Task[None]] = []
            for i in range(20000):
                body = meta_bytes(message_payload(f"wamid.kill{i:06d}"))
                tasks.append(asyncio.create_task(one(http, body)))
                sent += 1
                if i % 64 == 63:
                    await asyncio.sleep(0)
                if len(acked) >= 1500 and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    break
            await asyncio.gather(*tasks)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    stored = {r["body"] for r in await pool.fetch("SELECT body FROM webhook_inbox")}
    # The kill landed mid-burst: some requests were cut off without an answer.
    assert failed > 0
    assert len(acked) >= 1500
    missing = [b for b in acked if b not in stored]
    assert missing == []
    # Rows committed but never acknowledged are allowed (Meta redelivers; dedup absorbs them).
    assert len(stored) >= len(acked)


async def open_connections(base: str) -> float:
    """The server's open HTTP connections (this scrape's own included)."""
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("gateway_http_connections "):
            return float(line.split()[1])
    raise AssertionError("no gateway_http_connections on /metrics")


async def send_whole(base: str, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST ``body`` to the Meta webhook with every byte written before this returns (a raw
    connection: aiohttp's client may still be writing when its task yields)."""
    url = URL(base)
    assert url.host is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.host, url.port)
    head = (
        f"POST /webhooks/meta HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
        f"X-Hub-Signature-256: {sign_meta(body, META_SECRET)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer  # the connection closes once its writer is gone


async def answer_status(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> int:
    """The status of the answer on a ``send_whole`` connection (read to its end)."""
    reader, writer = conn
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


async def test_sigterm_drains_pending_batches(db_dsn: str, pool: asyncpg.Pool, tmp_path: Path) -> None:
    # Rows are uncommitted when SIGTERM arrives: a lock on the table holds their batches (the
    # deadline is far) until every request is in the server and its stop is under way.
    log = tmp_path / "serve.log"
    proc, base = spawn_ingest_only(db_dsn, window_ms=500, log_path=str(log), GATEWAY_ACK_DEADLINE_MS="60000")
    try:
        await wait_healthy(base, proc)
        bodies = [meta_bytes(message_payload(f"wamid.term{i:03d}")) for i in range(50)]
        async with pool.acquire() as blocker:
            held = blocker.transaction()
            await held.start()
            try:
                await blocker.execute("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE")
                async with asyncio.timeout(GIVE_UP_S):
                    conns = await asyncio.gather(*(send_whole(base, b) for b in bodies))
                    # Every connection accepted (this scrape's too): each request's bytes were
                    # in before this scrape's, so the server has read them all when it answers.
                    # (A connection with no request read is closed at once by the stop.)
                    while await open_connections(base) < len(bodies) + 1:
                        await asyncio.sleep(0.02)
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(GIVE_UP_S):
                    while "shutting down" not in log.read_text():
                        await asyncio.sleep(0.02)
            finally:
                await held.rollback()
        async with asyncio.timeout(GIVE_UP_S):
            statuses = await asyncio.gather(*(answer_status(c) for c in conns))
        assert statuses == [200] * 50
        assert proc.wait(timeout=GIVE_UP_S) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stored = {r["body"] for r in await pool.fetch("SELECT body FROM webhook_inbox")}
    assert stored == set(bodies)

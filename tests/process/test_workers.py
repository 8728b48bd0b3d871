"""`gateway serve --workers 2`: two processes answer on one port, /metrics counts both, and
SIGTERM to the parent stops every one of them."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import asyncpg
import psutil
import pytest

from gateway.core.signature import sign_meta
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.config import META_SECRET
from tests.support.procs import free_port, spawn, wait_healthy

pytestmark = pytest.mark.slow


def stored(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if (
            line.startswith("gateway_webhook_requests_total{")
            and 'outcome="stored"' in line
            and "meta" in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_two_workers_share_one_port_and_stop_together(db_dsn: str, pool: asyncpg.Pool) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_RUN_CONSUMERS": "false",
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_RUN_FORWARDER": "false",
    }
    proc = spawn(["serve", "--workers", "2"], env)
    children: list[psutil.Process] = []
    try:
        await wait_healthy(base, proc)
        # A new connection per request: the kernel spreads connections over the two listeners.
        pids: set[int] = set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            deadline = time.monotonic() + 30
            while len(pids) < 2 and time.monotonic() < deadline:
                async with http.get(f"{base}/healthz") as r:
                    pids.add((await r.json())["pid"])
            assert len(pids) == 2, pids
            assert proc.pid not in pids  # the parent only supervises
            children = psutil.Process(proc.pid).children()
            assert {c.pid for c in children} == pids

            bodies = [meta_bytes(message_payload(f"wamid.W{i}")) for i in range(20)]
            for body in bodies:
                headers = {"X-Hub-Signature-256": sign_meta(body, META_SECRET)}
                async with http.post(f"{base}/webhooks/meta", data=body, headers=headers) as r:
                    assert r.status == 200
            # Whichever worker is scraped reports the requests of both.
            seen = set()
            for _ in range(10):
                async with http.get(f"{base}/metrics") as r:
                    seen.add(stored(await r.text()))
            assert seen == {20.0}
        assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 20

        # SO_REUSEPORT would let a second group share the port silently: it is refused.
        second = spawn(["serve", "--workers", "2"], env)
        assert await asyncio.to_thread(second.wait, 30) == 3

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        for c in children:
            assert not c.is_running() or c.status() == psutil.STATUS_ZOMBIE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in children:
            if c.is_running():
                c.kill()

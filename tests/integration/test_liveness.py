"""/healthz answers 503, naming it, while a long-running loop of the process has not beaten
within its bound; 200 again once it beats (or ends on purpose)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession, UnixConnector

from gateway.core.heartbeat import HEARTBEATS
from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.runtime import services
from gateway.web.health import health_socket, metrics_listener
from gateway.web.server import Listening
from tests.support.procs import free_port

# A bound on a wait, not a claim about speed (a loaded machine is slow).
GIVE_UP_S = 60.0


async def test_healthz_is_503_while_a_loop_is_silent(
    http: ClientSession, gateway: Listening, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The registry's clock stands still until the test moves it past the bound: how long this
    # machine takes to answer a request is no part of what is tested.
    now = [time.monotonic()]
    monkeypatch.setattr(HEARTBEATS, "clock", lambda: now[0])
    beat = HEARTBEATS.loop("consumer-7", 0.2)
    try:
        async with http.get(gateway.make_url("/healthz")) as r:
            assert r.status == 200
        now[0] += 0.3
        async with http.get(gateway.make_url("/healthz")) as r:
            body = await r.json()
            assert r.status == 503 and body["status"] == "stuck"
            assert [loop["loop"] for loop in body["loops"]] == ["consumer-7"]
        beat()
        async with http.get(gateway.make_url("/healthz")) as r:
            assert r.status == 200
    finally:
        beat.done()


async def test_the_metrics_listener_and_a_workers_socket_say_the_same(
    http: ClientSession, tmp_path: object
) -> None:
    port = free_port()
    sock = f"{tmp_path}/worker.sock"
    beat = HEARTBEATS.loop("sender-0", 0.1)
    try:
        await asyncio.sleep(0.2)
        async with metrics_listener("127.0.0.1", port), health_socket(sock):
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 503
            async with ClientSession(connector=UnixConnector(path=sock)) as local:
                async with local.get("http://worker/healthz") as r:
                    assert r.status == 503
                beat.done()
                async with local.get("http://worker/healthz") as r:
                    assert r.status == 200
    finally:
        beat.done()


async def test_every_long_running_loop_of_the_services_beats(pool: asyncpg.Pool, settings: Settings) -> None:
    s = dataclasses.replace(settings, consumer_concurrency=2, send_loops=2)
    built = services.build(pool, s, services.Roles(consumers=True, sender=True, forwarder=True))
    before = set(HEARTBEATS.names.values())
    async with services.running(*built.all()):
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            loops = Counter(HEARTBEATS.names.values())
            want = {"consumer": 2, "sender": 2, "forwarder": 1, "LISTEN webhook_inbox": 1, "LISTEN outbox": 1}
            if all(loops[k] - (k in before) >= n for k, n in want.items()):
                break
            assert time.monotonic() < deadline, loops
            await asyncio.sleep(0.05)
        assert {"maintenance: retention", "maintenance: reconciler"} <= set(loops)
        assert HEARTBEATS.stale() == []
    # A loop that ended on purpose is not a silent one.
    assert set(HEARTBEATS.names.values()) <= before


async def test_a_stuck_consumer_makes_healthz_503(
    http: ClientSession, start_gateway: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer whose batch never returns (a lock it waits for forever, say)."""
    forever = asyncio.Event()

    async def stuck(self: Consumer) -> int:
        await forever.wait()
        return 0

    monkeypatch.setattr(Consumer, "step", stuck)
    s = dataclasses.replace(
        settings, run_consumers=True, consumer_concurrency=1, liveness_s=0.5, fault_backoff_max_ms=100
    )
    gw = await start_gateway(s)
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        async with http.get(gw.make_url("/healthz")) as r:
            if r.status == 503:
                body = await r.json()
                break
        assert time.monotonic() < deadline, "a stuck consumer went unnoticed"
        await asyncio.sleep(0.2)
    assert "consumer" in [loop["loop"] for loop in body["loops"]]
    forever.set()

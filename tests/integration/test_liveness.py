"""/healthz answers 503, naming it, while a long-running loop of the process has not beaten
within its bound; 200 again once it beats (or ends on purpose)."""

from __future__ import annotations

import asyncio

from aiohttp import ClientSession, UnixConnector

from gateway.core.heartbeat import HEARTBEATS
from gateway.web.health import health_socket, metrics_listener
from gateway.web.server import Listening
from tests.support.procs import free_port


async def test_healthz_is_503_while_a_loop_is_silent(http: ClientSession, gateway: Listening) -> None:
    beat = HEARTBEATS.loop("consumer-7", 0.2)
    try:
        async with http.get(gateway.make_url("/healthz")) as r:
            assert r.status == 200
        await asyncio.sleep(0.3)
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

"""Metrics, readiness, access log and the gauge leader against a real gateway and PostgreSQL."""

from __future__ import annotations

import asyncio
import gzip
import logging
import uuid

import asyncpg
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from gateway import metrics
from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.maintenance.gauges import GaugeLeader
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.config import META_SECRET, public_metrics, replace
from tests.support.http import ACME, post_message
from tests.support.procs import free_port

MESSAGE = {"to": "4915100000001", "phone_number_id": "1111", "type": "text", "text": {"body": "hi"}}


async def test_metrics_negotiates_openmetrics_and_gzip(
    http: ClientSession, start_gateway: object, settings: Settings
) -> None:
    port = free_port()
    await start_gateway(replace(settings, metrics_port=port))  # type: ignore[operator]
    url = f"http://127.0.0.1:{port}/metrics"
    async with http.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await r.text()
    assert text.rstrip().endswith("# EOF")
    async with http.get(url, headers={"Accept-Encoding": "gzip"}, auto_decompress=False) as r:
        assert r.headers.get("Content-Encoding") == "gzip"
        plain = gzip.decompress(await r.read()).decode()
    assert r.headers["Content-Type"].startswith("text/plain")
    # Series exist from the start (alerts need them; here earlier tests may have counted some),
    # no _created series, and the build is named.
    assert 'gateway_webhook_requests_total{outcome="closed",source="tenashi"} ' in plain
    assert 'gateway_sends_total{code="",outcome="unknown",provider="tenashi"} ' in plain
    assert "_created" not in plain
    assert 'gateway_build_info{python="' in plain


async def test_api_requests_are_counted_by_route(http: ClientSession, gateway: TestServer) -> None:
    def sample(route: str, method: str, status: str) -> float:
        labels = {"route": route, "method": method, "status": status}
        return REGISTRY.get_sample_value("gateway_api_requests_total", labels) or 0.0

    before_202 = sample("/v1/messages", "POST", "202")
    before_404 = sample("/v1/messages/{key}", "GET", "404")
    before_unmatched = sample("unmatched", "other", "404")
    key = uuid.uuid4().hex
    assert (await post_message(http, gateway, MESSAGE, key))[0] == 202
    async with http.get(gateway.make_url("/v1/messages/nope-" + key), headers=ACME) as r:
        assert r.status == 404
    async with http.request("PROPFIND", gateway.make_url("/v1/nothing-here")) as r:
        assert r.status in (404, 405)
    assert sample("/v1/messages", "POST", "202") == before_202 + 1
    # The key is not a label: one series per route template, whatever the keys.
    assert sample("/v1/messages/{key}", "GET", "404") == before_404 + 1
    assert sample("unmatched", "other", "404") + sample("unmatched", "other", "405") >= before_unmatched + 1


async def test_access_log_has_request_id_source_outcome_latency(
    http: ClientSession, gateway: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    body = meta_bytes(message_payload(f"wamid.{uuid.uuid4().hex}"))
    headers = {"X-Hub-Signature-256": sign_meta(body, META_SECRET), "X-Request-Id": "req-abc.123"}
    async with http.post(gateway.make_url("/webhooks/meta"), data=body, headers=headers) as r:
        assert r.status == 200
        assert r.headers["X-Request-Id"] == "req-abc.123"
    # A request id that could forge log lines is replaced, not echoed.
    async with http.post(
        gateway.make_url("/webhooks/meta"), data=body, headers={"X-Request-Id": "a b\tc"}
    ) as r:
        assert r.status == 401
        generated = r.headers["X-Request-Id"]
    assert generated != "a b\tc" and len(generated) == 16
    async with http.get(
        gateway.make_url("/webhooks/meta"),
        params={"hub.mode": "subscribe", "hub.verify_token": "wrong-token-123", "hub.challenge": "1"},
    ) as r:
        assert r.status == 403
    records = [r for r in caplog.records if r.name == "gateway.access"]
    by_id = {r.request_id: r for r in records}  # type: ignore[attr-defined]
    stored = by_id["req-abc.123"]
    assert (stored.source, stored.outcome, stored.status) == ("meta", "stored", 200)  # type: ignore[attr-defined]
    assert stored.latency_ms >= 0  # type: ignore[attr-defined]
    assert by_id[generated].outcome == "bad_signature"  # type: ignore[attr-defined]
    # The query string (Meta's verify token) is never logged.
    assert all("wrong-token-123" not in r.getMessage() for r in records)
    assert any(r.outcome == "refused" for r in records)  # type: ignore[attr-defined]


async def test_metrics_are_never_on_the_public_port_unless_asked_for(
    http: ClientSession, start_gateway: object, settings: Settings
) -> None:
    """/metrics names destinations and phone-number ids: by default (GATEWAY_METRICS_PORT unset)
    the public port does not serve it; with a metrics port, that listener does; with the
    metrics port set to GATEWAY_PORT itself, the public port does."""
    assert settings.metrics_port == 0
    plain: TestServer = await start_gateway(settings)  # type: ignore[operator]
    async with http.get(plain.make_url("/metrics")) as r:
        assert r.status == 404
    port = free_port()
    gw: TestServer = await start_gateway(replace(settings, metrics_port=port))  # type: ignore[operator]
    async with http.get(gw.make_url("/metrics")) as r:
        assert r.status == 404  # not on the public port
    async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        assert "gateway_ack_latency_seconds" in await r.text()
    async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
        assert r.status == 200
    public: TestServer = await start_gateway(public_metrics(settings))  # type: ignore[operator]
    async with http.get(public.make_url("/metrics")) as r:
        assert r.status == 200 and "gateway_ack_latency_seconds" in await r.text()


async def test_readyz_and_metrics_do_not_queue_on_a_starved_pool(
    http: ClientSession, start_gateway: object, settings: Settings
) -> None:
    starved = replace(public_metrics(settings), db_pool_min=1, db_pool_max=2)
    gw: TestServer = await start_gateway(starved)  # type: ignore[operator]
    from gateway.web.app import POOL

    pool: asyncpg.Pool = gw.app[POOL]
    held = [await pool.acquire() for _ in range(2)]
    try:
        # A flood while every pooled connection is busy: answered from the cached probe and
        # the registry, none waits for a connection (the old handlers waited up to 2 s each).
        urls = [gw.make_url("/readyz")] * 100 + [gw.make_url("/metrics")] * 20

        async def get(url: object) -> int:
            async with http.get(url) as r:  # type: ignore[arg-type]
                await r.read()
                return r.status

        statuses = await asyncio.wait_for(asyncio.gather(*(get(u) for u in urls)), timeout=30)
        assert set(statuses) == {200}
    finally:
        for conn in held:
            await pool.release(conn)


async def test_one_process_exports_the_database_wide_gauges(db_dsn: str, pool: asyncpg.Pool) -> None:
    await pool.execute("INSERT INTO webhook_inbox (source, body) VALUES ($1, $2), ($1, $2)", "meta", b"{}")
    lock_id = 0x7E57_0000 + uuid.uuid4().int % 10_000  # this test's own lock: other tests may lead
    first = GaugeLeader(db_dsn, lock_id=lock_id)
    second = GaugeLeader(db_dsn, lock_id=lock_id)
    try:
        assert await first.run_once() is True
        assert await second.run_once() is False
        assert REGISTRY.get_sample_value("gateway_inbox_depth") == 2
        assert REGISTRY.get_sample_value("gateway_gauge_leader") == 1
        # The leader goes away: the lock goes with its session and the other one takes over.
        await first.close()
        assert REGISTRY.get_sample_value("gateway_inbox_depth") is None  # withdrawn
        assert await second.run_once() is True
        assert REGISTRY.get_sample_value("gateway_inbox_depth") == 2
    finally:
        await first.close()
        await second.close()
        metrics.db_gauges_withdrawn()

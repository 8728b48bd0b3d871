"""OpenTelemetry spans (the optional [otel] extra) through a real gateway, consumer and sender."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway import tracing
from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.config import META_SECRET

sdk = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def spans() -> Iterator[Any]:
    exporter = sdk.InMemorySpanExporter()
    assert tracing.configure({}, exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def test_off_without_configuration() -> None:
    assert tracing.configure({}) is False  # no exporter named, no endpoint: nothing recorded
    assert tracing.configure({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}) is False
    with tracing.span("anything", rows=1) as s:
        assert s is None
    assert tracing.current_context() is None


async def test_webhook_span_through_its_group_commit(
    http: ClientSession, start_gateway: Any, settings: Settings, spans: Any
) -> None:
    gw: TestServer = await start_gateway(settings)
    body = meta_bytes(message_payload(f"wamid.{uuid.uuid4().hex}"))
    headers = {
        "X-Hub-Signature-256": sign_meta(body, META_SECRET),
        "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
    }
    async with http.post(gw.make_url("/webhooks/meta"), data=body, headers=headers) as r:
        assert r.status == 200
    tracing._provider.force_flush()
    finished = {s.name: s for s in spans.get_finished_spans()}
    request = finished["POST /webhooks/meta"]
    commit_wait = finished["webhook.commit"]
    batch = finished["inbox.group_commit"]
    # The caller's trace is continued; the commit wait is the request's child; the batch
    # written links back to the request that was in it.
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert commit_wait.parent.span_id == request.context.span_id
    assert batch.attributes["rows"] == 1
    assert [link.context.span_id for link in batch.links] == [commit_wait.context.span_id]
    assert request.attributes["http.response.status_code"] == 200


async def test_consumer_batch_and_sender_spans(pool: Any, settings: Settings, fake: Any, spans: Any) -> None:
    from gateway.outbound.sender import Sender
    from tests.support.consume import drain, stage
    from tests.support.send import enqueue, send_settings

    await stage(pool, meta_bytes(message_payload(f"wamid.{uuid.uuid4().hex}")))
    await drain(pool, settings)
    await enqueue(pool, "traced-1")
    sender = Sender(pool, send_settings(settings, fake))
    try:
        assert await sender.step() == 1
    finally:
        await sender.close()
    tracing._provider.force_flush()
    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}
    assert by_name["consumer.batch"].attributes["rows"] == 1
    batch, send = by_name["sender.batch"], by_name["provider.send"]
    assert send.parent.span_id == batch.context.span_id
    assert send.attributes["provider"] == "meta" and send.attributes["outcome"] == "accepted"
    assert len(fake.received) == 1

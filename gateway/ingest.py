"""The ingest edge: Meta's handshake and signed POSTs, and Tenashi's POSTs.

A POST is answered 200 only after its raw bytes are committed to ``webhook_inbox``.
"""

from __future__ import annotations

import hmac
import logging
import time

from aiohttp import web

from gateway import metrics
from gateway.appkeys import COMMITTER, SETTINGS
from gateway.groupcommit import Unavailable
from gateway.signature import verify_meta, verify_tenashi

log = logging.getLogger(__name__)

MAX_DELIVERY_ID = 200
SOURCES = ("meta", "tenashi")
# Label lookups resolved once: they are on the hot path of every acknowledgement.
_ACK = {src: metrics.ACK_LATENCY.labels(src) for src in SOURCES}
_STORED = {src: metrics.WEBHOOK_REQUESTS.labels(src, "stored") for src in SOURCES}


def _problem(status: int, title: str, **extra: str) -> web.Response:
    headers = dict(extra)
    return web.json_response(
        {"type": "about:blank", "title": title, "status": status},
        status=status,
        content_type="application/problem+json",
        headers=headers,
    )


async def meta_verify(request: web.Request) -> web.Response:
    """GET handshake: echo hub.challenge when the verify token matches."""
    settings = request.app[SETTINGS]
    mode = request.query.get("hub.mode", "")
    token = request.query.get("hub.verify_token", "")
    challenge = request.query.get("hub.challenge", "")
    expected = settings.meta_verify_token
    ok = (
        mode == "subscribe"
        and bool(expected)
        and hmac.compare_digest(token.encode(), expected.encode())
        and 0 < len(challenge) <= 256
    )
    if not ok:
        log.info("webhook verification refused (mode=%r)", mode[:20])
        return _problem(403, "verification failed")
    return web.Response(text=challenge, content_type="text/plain")


async def _stage(request: web.Request, source: str, body: bytes, delivery_id: str | None) -> web.Response:
    started = time.perf_counter()
    try:
        # The committer enforces GATEWAY_ACK_DEADLINE_MS and raises Unavailable past it.
        await request.app[COMMITTER].stage(source, body, delivery_id)
    except Unavailable as exc:
        metrics.WEBHOOK_REQUESTS.labels(source, exc.reason).inc()
        return _problem(503, "not stored, retry later", **{"Retry-After": "5"})
    _ACK[source].observe(time.perf_counter() - started)
    _STORED[source].inc()
    return web.Response(body=b"OK", content_type="text/plain")


async def _read_body(request: web.Request, source: str) -> bytes | web.Response:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.WEBHOOK_REQUESTS.labels(source, "too_large").inc()
        limit = request.app[SETTINGS].max_body_bytes
        return _problem(413, f"body larger than {limit} bytes")


async def meta_post(request: web.Request) -> web.Response:
    body = await _read_body(request, "meta")
    if isinstance(body, web.Response):
        return body
    header = request.headers.get("X-Hub-Signature-256")
    if not verify_meta(body, header, request.app[SETTINGS].meta_app_secrets):
        metrics.WEBHOOK_REQUESTS.labels("meta", "bad_signature").inc()
        return _problem(401, "missing or invalid X-Hub-Signature-256")
    return await _stage(request, "meta", body, None)


async def tenashi_post(request: web.Request) -> web.Response:
    body = await _read_body(request, "tenashi")
    if isinstance(body, web.Response):
        return body
    s = request.app[SETTINGS]
    header = request.headers.get(s.tenashi_signature_header)
    if not verify_tenashi(
        body, header, s.tenashi_secret, s.tenashi_signature_scheme, s.tenashi_signature_prefix
    ):
        metrics.WEBHOOK_REQUESTS.labels("tenashi", "bad_signature").inc()
        return _problem(401, f"missing or invalid {s.tenashi_signature_header}")
    delivery_id = request.headers.get("X-Tenashi-Delivery")
    if delivery_id is not None:
        delivery_id = delivery_id.strip()[:MAX_DELIVERY_ID] or None
    return await _stage(request, "tenashi", body, delivery_id)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/webhooks/meta", meta_verify)
    app.router.add_post("/webhooks/meta", meta_post)
    app.router.add_post("/webhooks/tenashi", tenashi_post)

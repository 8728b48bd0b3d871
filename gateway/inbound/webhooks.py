"""The ingest edge: Meta's handshake and signed POSTs, and Tenashi's POSTs.

A POST is answered 200 only after its raw bytes are committed to ``webhook_inbox``.
"""

from __future__ import annotations

import hmac
import logging
import time

from aiohttp import web

from gateway import metrics
from gateway.core.enums import Source
from gateway.core.settings import Settings
from gateway.core.signature import verify_meta, verify_tenashi
from gateway.httpkit import problem
from gateway.inbound.groupcommit import GroupCommitter, Unavailable

log = logging.getLogger(__name__)

MAX_DELIVERY_ID = 200
# Label lookups resolved once: they are on the hot path of every acknowledgement.
_ACK = {src: metrics.ACK_LATENCY.labels(src.value) for src in Source}
_STORED = {src: metrics.WEBHOOK_REQUESTS.labels(src.value, "stored") for src in Source}


class Webhooks:
    """The webhook routes; ``committer`` is set once the app's database is up."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.committer: GroupCommitter | None = None

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/webhooks/meta", self.meta_verify),
            web.post("/webhooks/meta", self.meta_post),
            web.post("/webhooks/tenashi", self.tenashi_post),
        ]

    async def meta_verify(self, request: web.Request) -> web.Response:
        """GET handshake: echo hub.challenge when the verify token matches."""
        mode = request.query.get("hub.mode", "")
        token = request.query.get("hub.verify_token", "")
        challenge = request.query.get("hub.challenge", "")
        expected = self.settings.meta_verify_token
        ok = (
            mode == "subscribe"
            and bool(expected)
            and hmac.compare_digest(token.encode(), expected.encode())
            and 0 < len(challenge) <= 256
        )
        if not ok:
            log.info("webhook verification refused (mode=%r)", mode[:20])
            return problem(403, "verification failed")
        return web.Response(text=challenge, content_type="text/plain")

    async def _stage(self, source: Source, body: bytes, delivery_id: str | None) -> web.Response:
        started = time.perf_counter()
        committer = self.committer
        try:
            if committer is None:
                raise Unavailable("starting")
            # The committer enforces GATEWAY_ACK_DEADLINE_MS and raises Unavailable past it.
            await committer.stage(source, body, delivery_id)
        except Unavailable as exc:
            metrics.WEBHOOK_REQUESTS.labels(source.value, exc.reason).inc()
            return problem(503, "not stored, retry later", headers={"Retry-After": "5"})
        _ACK[source].observe(time.perf_counter() - started)
        _STORED[source].inc()
        return web.Response(body=b"OK", content_type="text/plain")

    async def _read_body(self, request: web.Request, source: Source) -> bytes | web.Response:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            metrics.WEBHOOK_REQUESTS.labels(source.value, "too_large").inc()
            return problem(413, f"body larger than {self.settings.max_body_bytes} bytes")

    async def meta_post(self, request: web.Request) -> web.Response:
        body = await self._read_body(request, Source.META)
        if isinstance(body, web.Response):
            return body
        header = request.headers.get("X-Hub-Signature-256")
        if not verify_meta(body, header, self.settings.meta_app_secrets):
            metrics.WEBHOOK_REQUESTS.labels("meta", "bad_signature").inc()
            return problem(401, "missing or invalid X-Hub-Signature-256")
        return await self._stage(Source.META, body, None)

    async def tenashi_post(self, request: web.Request) -> web.Response:
        body = await self._read_body(request, Source.TENASHI)
        if isinstance(body, web.Response):
            return body
        s = self.settings
        header = request.headers.get(s.tenashi_signature_header)
        if not verify_tenashi(
            body, header, s.tenashi_secret, s.tenashi_signature_scheme, s.tenashi_signature_prefix
        ):
            metrics.WEBHOOK_REQUESTS.labels("tenashi", "bad_signature").inc()
            return problem(401, f"missing or invalid {s.tenashi_signature_header}")
        delivery_id = request.headers.get("X-Tenashi-Delivery")
        if delivery_id is not None:
            delivery_id = delivery_id.strip()[:MAX_DELIVERY_ID] or None
        return await self._stage(Source.TENASHI, body, delivery_id)

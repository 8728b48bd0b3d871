"""The ingest edge: Meta's handshake and signed POSTs, and Tenashi's POSTs.

A POST is answered 200 only after its raw bytes are committed to ``webhook_inbox``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from gateway import metrics, tracing
from gateway.core.enums import Source
from gateway.core.limits import ByteBudget
from gateway.core.settings import Settings
from gateway.core.signature import (
    meta_digest,
    meta_digest_matches,
    meta_header_ok,
    tenashi_header_ok,
    verify_tenashi,
)
from gateway.httpkit import problem
from gateway.inbound.groupcommit import GroupCommitter, Unavailable

log = logging.getLogger(__name__)

MAX_DELIVERY_ID = 200
META_HEADER = "X-Hub-Signature-256"


class Webhooks:
    """The webhook routes, staging bodies through ``committer``."""

    def __init__(self, settings: Settings, committer: GroupCommitter) -> None:
        self.settings = settings
        self.committer = committer
        # Bytes of bodies being read right now, across requests.
        self.budget = ByteBudget(settings.max_inflight_body_bytes)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/webhooks/meta", self.meta_verify),
            web.post("/webhooks/meta", self.meta_post, expect_handler=self._expect(Source.META)),
            web.post("/webhooks/tenashi", self.tenashi_post, expect_handler=self._expect(Source.TENASHI)),
        ]

    def _signed(self, request: web.Request, source: Source) -> bool:
        """The signature header has a valid shape and a secret is configured."""
        s = self.settings
        if source is Source.META:
            return meta_header_ok(request.headers.get(META_HEADER)) and bool(s.meta_app_secrets)
        header = request.headers.get(s.tenashi_signature_header)
        ok = tenashi_header_ok(header, s.tenashi_signature_scheme, s.tenashi_signature_prefix)
        return ok and bool(s.tenashi_secret)

    def _expect(self, source: Source) -> Callable[[web.Request], Awaitable[web.Response | None]]:
        """``Expect: 100-continue``: refuse (no "100 Continue", so the body is never sent) when
        a check that needs no body fails; otherwise aiohttp's default answer."""

        async def expect(request: web.Request) -> web.Response | None:
            early = self._early(request, source)
            if early is not None:
                return early
            # aiohttp's own answer: "100 Continue", or 417 for another expectation.
            await _default_expect_handler(request)
            return None

        return expect

    def _early(self, request: web.Request, source: Source, signed: bool | None = None) -> web.Response | None:
        """Every refusal that needs no body: a signature header that is missing or malformed
        (401), an encoded body (415: a signature covers the bytes sent, and inflating costs
        CPU), a declared length over the limit (413). ``signed``: the first check, when the
        caller has made it already."""
        if not (self._signed(request, source) if signed is None else signed):
            name = META_HEADER if source is Source.META else self.settings.tenashi_signature_header
            return self._refuse(source, "bad_signature", 401, f"missing or malformed {name}")
        encoding = request.headers.get("Content-Encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            return self._refuse(
                source, "encoded", 415, "Content-Encoding is not supported: send the body as is"
            )
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            return self._refuse(
                source, "too_large", 413, f"body larger than {self.settings.max_body_bytes} bytes"
            )
        return None

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
        # The challenge is echoed as given: never let a browser sniff it into HTML.
        return web.Response(
            text=challenge, content_type="text/plain", headers={"X-Content-Type-Options": "nosniff"}
        )

    async def _stage(
        self, request: web.Request, source: Source, body: bytes, delivery_id: str | None
    ) -> web.Response:
        """200 once ``body`` is committed; 503 when it was not (GATEWAY_ACK_DEADLINE_MS, which
        the committer enforces, or the database). The committer counts what it stored."""
        committer = self.committer
        client = id(request.protocol)  # the connection: its rows never wait for each other
        try:
            if tracing.enabled:
                with tracing.span("webhook.commit", source=source.value):
                    await committer.stage(source, body, delivery_id, client)
            else:  # the ack path, untraced: not even a null context manager
                await committer.stage(source, body, delivery_id, client)
        except Unavailable as exc:
            metrics.WEBHOOK_REQUESTS.labels(source.value, exc.reason).inc()
            return problem(503, "not stored, retry later", headers={"Retry-After": "5"})
        return web.Response(body=b"OK", content_type="text/plain")

    def _refuse(self, source: Source, outcome: str, status: int, title: str, **headers: str) -> web.Response:
        """An answer given without reading the body: the connection is closed after it, with a
        lingering close (``httpkit.ClosingResponse``), so the client sees this, not a reset."""
        metrics.WEBHOOK_REQUESTS.labels(source.value, outcome).inc()
        return problem(status, title, headers=headers or None, close=True)

    async def _read_body(
        self, request: web.Request, source: Source, signed: bool | None = None
    ) -> bytes | web.Response:
        """The raw body, read only once the request could be valid, within the time and byte limits.

        The refusals that need no body come first (``_early``; ``signed``: its signature check,
        made by the caller). A body that arrived whole with the headers is taken as is;
        otherwise the bytes already being read by other requests are checked (503) and the body
        is read under ``GATEWAY_BODY_TIMEOUT_S`` (408).
        """
        s = self.settings
        early = self._early(request, source, signed)
        if early is not None:
            return early
        limit = s.max_body_bytes
        content = request.content
        if content.is_eof() and content.exception() is None:
            # The whole body came with the headers (the usual webhook): it is in memory already,
            # so neither the byte budget nor a timer has anything to bound.
            body = content.read_nowait()
            if len(body) > limit:
                return self._refuse(source, "too_large", 413, f"body larger than {limit} bytes")
            return body
        length = request.content_length
        # A chunked body has no declared length: reserve the most it may be.
        reserve = length if length is not None else limit
        if not self.budget.take(reserve):
            return self._refuse(
                source, "busy", 503, "too many bodies being read, retry later", **{"Retry-After": "1"}
            )
        metrics.WEBHOOK_BODY_BYTES_INFLIGHT.set(self.budget.in_use)
        try:
            async with asyncio.timeout(s.body_timeout_s):
                return await _read_raw(request, limit)
        except _TooLarge:
            return self._refuse(source, "too_large", 413, f"body larger than {limit} bytes")
        except TimeoutError:
            return self._refuse(source, "slow", 408, f"body not received within {s.body_timeout_s:g} s")
        except CLIENT_GONE as exc:
            # Nobody is left to answer; not an error of ours.
            log.debug("webhook body not received: %s", type(exc).__name__)
            return self._refuse(source, "aborted", 400, "body not received")
        finally:
            self.budget.release(reserve)
            metrics.WEBHOOK_BODY_BYTES_INFLIGHT.set(self.budget.in_use)

    async def meta_post(self, request: web.Request) -> web.Response:
        secrets = self.settings.meta_app_secrets
        # The signature header is parsed once: its shape is checked before the body is read.
        expected = meta_digest(request.headers.get(META_HEADER))
        body = await self._read_body(request, Source.META, expected is not None and bool(secrets))
        if isinstance(body, web.Response):
            return body
        assert expected is not None  # _read_body refused the request otherwise
        if not meta_digest_matches(expected, body, secrets):
            metrics.WEBHOOK_REQUESTS.labels("meta", "bad_signature").inc()
            return problem(401, "missing or invalid X-Hub-Signature-256")
        return await self._stage(request, Source.META, body, None)

    async def tenashi_post(self, request: web.Request) -> web.Response:
        s = self.settings
        header = request.headers.get(s.tenashi_signature_header)
        body = await self._read_body(request, Source.TENASHI)
        if isinstance(body, web.Response):
            return body
        if not verify_tenashi(
            body, header, s.tenashi_secret, s.tenashi_signature_scheme, s.tenashi_signature_prefix
        ):
            metrics.WEBHOOK_REQUESTS.labels("tenashi", "bad_signature").inc()
            return problem(401, f"missing or invalid {s.tenashi_signature_header}")
        delivery_id = request.headers.get("X-Tenashi-Delivery")
        if delivery_id is not None:
            delivery_id = delivery_id.strip()[:MAX_DELIVERY_ID] or None
        return await self._stage(request, Source.TENASHI, body, delivery_id)


class _TooLarge(Exception):
    pass


# The client closed the connection or sent a broken body (a truncated chunk, say).
CLIENT_GONE = (ConnectionError, web.RequestPayloadError, asyncio.IncompleteReadError)


async def _read_raw(request: web.Request, limit: int) -> bytes:
    """The body exactly as received (the server does not inflate it), at most ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)

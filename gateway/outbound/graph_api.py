"""The Graph-compatible endpoint: a bot written against Meta's Graph API (pywa, heyoo, plain
HTTP) sends through the gateway by changing its Graph base URL and its token (a gateway API key).

- ``POST /{version}/{phone_number_id}/messages``: Meta's body, into the outbox with every
  guarantee of ``POST /v1/messages`` (``gateway.outbound.enqueue``: the tenant must own the
  number, the Idempotency-Key when one is sent, the reply guard for ``context.message_id``); the
  answer waits for the sender's outcome (``gateway.outbound.outcomes``) up to
  ``GATEWAY_GRAPH_COMPAT_WAIT_MS`` and is Meta's own: 200 with the wamid, Meta's error object
  and status when the provider refused for good, or 202 in Meta's shape with the gateway's key
  as ``messages[0].id`` when the outcome is not known yet. A read receipt body marks the
  message read at once.
- ``POST /{version}/{phone_number_id}/media``: an upload, with the number's token.
- ``GET /{version}/{media_id}``: Meta's media object, its ``url`` pointing back at the gateway
  (``GET /v1/media/{media_id}``, the same Bearer key).

Every refusal is Meta's error object with the code Meta uses (``gateway.core.graphcompat``),
and nothing is enqueued.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.core import graphcompat, tenancy
from gateway.core.messages import SendRequest, fingerprint
from gateway.core.settings import Settings
from gateway.httpkit import bearer_tenant
from gateway.outbound.enqueue import Batch, Enqueuer, Refused, location, provider_problems
from gateway.outbound.graph import GraphError
from gateway.outbound.media_api import MediaApi
from gateway.outbound.outcomes import OutboxOutcome, OutcomeWaiter
from gateway.outbound.send_api import MAX_BODY, key_problem, openapi_bytes
from gateway.outbound.validation import BodyValidator, RequestValidator
from gateway.store import replies
from gateway.store.database import Database
from gateway.store.db import DB_ERRORS

log = logging.getLogger(__name__)

# Any version segment reaches the handlers, which answer an unknown one with Meta's error (not
# the router's 404). The two-segment GET leaves the gateway's own first segments alone: /v1/...
# (GET /v1/messages stays a 405) and /webhooks/... .
_V = "{version}"
_V_GET = "{version:(?!(?:v1|webhooks)/)[^/]+}"


def _answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _error(found: tuple[int, dict[str, Any]], headers: dict[str, str] | None = None) -> web.Response:
    return _answer(found[0], found[1], headers)


def _trace() -> str:
    return secrets.token_urlsafe(12)


def _too_large(trace: str) -> web.Response:
    return _error((413, graphcompat.error(100, "Invalid parameter", details=f"At most {MAX_BODY} bytes.",
                                          trace=trace)))  # fmt: skip


def _unavailable(trace: str) -> web.Response:
    return _error(graphcompat.refusal("unavailable", "database unavailable", trace), {"Retry-After": "5"})


class GraphApi:
    """The Graph-compatible routes, on ``db`` (open while the app runs). ``batch``: see
    ``Enqueuer``."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        media_api: MediaApi,
        waiter: OutcomeWaiter,
        wake: Callable[[], None] | None = None,
        batch: Batch | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.media_api = media_api
        self.waiter = waiter
        self.enqueuer = Enqueuer(settings, db, wake, batch)
        doc = orjson.loads(openapi_bytes())
        self.validator = RequestValidator(doc, "GraphSendRequest")
        self.read_validator = BodyValidator(doc, "GraphReadRequest")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"/{_V}/{{phone_number_id}}/messages", self.post_messages),
            web.post(f"/{_V}/{{phone_number_id}}/media", self.post_media),
            web.get(f"/{_V_GET}/{{media_id}}", self.get_media),
        ]

    def _tenant(self, request: web.Request, trace: str) -> str | web.Response:
        # The key first: a caller without one learns nothing, not even which paths exist.
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return _error(graphcompat.bad_token(trace), {"WWW-Authenticate": 'Bearer realm="gateway"'})
        if not graphcompat.version_ok(request.match_info["version"]):
            return _error(graphcompat.unknown_path(request.path, trace))
        return tenant

    # -- messages --------------------------------------------------------------------------

    async def post_messages(self, request: web.Request) -> web.Response:
        trace = _trace()
        tenant = self._tenant(request, trace)
        if isinstance(tenant, web.Response):
            return tenant
        number = request.match_info["phone_number_id"]
        if not graphcompat.number_ok(number):  # e.g. "../x" decoded from "..%2Fx": never into a URL
            return _error(graphcompat.no_such_object(number, trace=trace))
        key = request.headers.get("Idempotency-Key")
        if key is not None and (bad := key_problem(key)) is not None:
            return _error(graphcompat.refusal("invalid", f"Idempotency-Key: {bad}", trace))
        if request.content_length is not None and request.content_length > MAX_BODY:
            return _too_large(trace)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raw = b"x" * (MAX_BODY + 1)
        if len(raw) > MAX_BODY:
            return _too_large(trace)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(graphcompat.refusal("invalid", "body: not JSON", trace))
        if not tenancy.may_send_from(self.settings, tenant, number):
            # As Meta answers for a number the token may not use: whether it exists is not said.
            return _error(graphcompat.no_such_object(number, trace=trace))
        if graphcompat.is_read_receipt(body):
            return await self._read(body, number, trace)
        body = graphcompat.with_default_type(body)
        errors = self.validator.errors(body)
        if errors:
            return _error(graphcompat.refusal("invalid", "; ".join(errors), trace))
        message = graphcompat.message_of(body, number)
        provider = tenancy.provider_for(self.settings, tenant)
        unsendable = provider_problems(provider, message)
        if unsendable:
            return _error(graphcompat.refusal("invalid", "; ".join(unsendable), trace))
        req = SendRequest(
            tenant, key or graphcompat.KEYLESS_PREFIX + uuid.uuid4().hex, fingerprint(body), provider, message
        )
        try:
            await self.waiter.ready()  # listening before the row exists: its outcome is heard
            problems = await self.enqueuer.refused(req)
            if problems:
                return _error(graphcompat.refusal("invalid", "; ".join(problems), trace))
            done = await self.enqueuer.submit(req, keyless=key is None, notify_outcome=True)
            row = done.row
            if row is None:  # a replayed key whose row retention already purged
                return _error(graphcompat.refusal("reused", "Idempotency-Key: its message is gone", trace))
            known = OutboxOutcome(row["state"], row["wamid"]) if done.fresh else None
            wait_s = self.settings.graph_compat_wait_ms / 1000
            outcome = await self.waiter.wait(row["id"], wait_s, lambda: self._read_state(row["id"]), known)
        except Refused as exc:
            return _error(graphcompat.refusal(exc.kind, exc.detail or exc.title, trace), exc.headers)
        except DB_ERRORS as exc:
            log.warning("graph-compatible send not accepted: database %s", type(exc).__name__)
            return _unavailable(trace)
        headers = {"Idempotent-Replayed": "true"} if done.replayed else None
        return await self._outcome(body, req.key, row["id"], outcome, trace, headers)

    async def _read_state(self, row_id: int) -> OutboxOutcome | None:
        r = await self.db.pool.fetchrow("SELECT state, wamid FROM outbox WHERE id = $1", row_id)
        return None if r is None else OutboxOutcome(r["state"], r["wamid"])

    async def _outcome(
        self,
        body: dict[str, Any],
        key: str,
        row_id: int,
        outcome: OutboxOutcome | None,
        trace: str,
        headers: dict[str, str] | None,
    ) -> web.Response:
        if outcome is not None and outcome.state == "accepted" and outcome.wamid:
            return _answer(200, graphcompat.sent(body, outcome.wamid), headers)
        if outcome is not None and outcome.state in ("failed", "cancelled"):
            r = await self.db.pool.fetchrow(
                "SELECT provider_error, last_error_code, last_error FROM outbox WHERE id = $1", row_id
            )
            if outcome.state == "cancelled" or r is None:
                return _error(graphcompat.refusal("answered", "cancelled before it was sent", trace), headers)
            refused = graphcompat.provider_refusal(
                r["provider_error"], r["last_error_code"], r["last_error"], trace
            )
            return _error(refused, headers)
        state = outcome.state if outcome is not None else "pending"
        where = location(key)
        return _answer(
            202, graphcompat.queued(body, key, state, where), {**(headers or {}), "Location": where}
        )

    async def _read(self, body: Any, number: str, trace: str) -> web.Response:
        """Meta's "mark as read" (with the typing indicator when asked): at once, from the number
        the path names, for a message received on it."""
        errors = self.read_validator.errors(body)
        if errors:
            return _error(graphcompat.refusal("invalid", "; ".join(errors), trace))
        wamid = body["message_id"]
        try:
            async with self.db.pool.acquire() as conn:
                numbers = await replies.received_on(conn, inbound_wamid=wamid)
        except DB_ERRORS:
            return _unavailable(trace)
        if number not in numbers:
            why = f"message_id: no message {wamid[:80]!r} came to this number"
            return _error(graphcompat.refusal("invalid", why, trace))
        try:
            await self.media_api.graph.mark_read(number, wamid, typing="typing_indicator" in body)
        except GraphError as exc:
            return _error(graphcompat.provider_refusal(None, exc.code, str(exc), trace))
        return _answer(200, {"success": True})

    # -- media -----------------------------------------------------------------------------

    async def post_media(self, request: web.Request) -> web.Response:
        trace = _trace()
        tenant = self._tenant(request, trace)
        if isinstance(tenant, web.Response):
            return tenant
        number = request.match_info["phone_number_id"]
        if not graphcompat.number_ok(number) or not tenancy.may_send_from(self.settings, tenant, number):
            return _error(graphcompat.no_such_object(number, trace=trace))
        return await self._meta_shaped(await self.media_api.upload(request, tenant, number), trace)

    async def get_media(self, request: web.Request) -> web.Response:
        trace = _trace()
        tenant = self._tenant(request, trace)
        if isinstance(tenant, web.Response):
            return tenant
        media_id = request.match_info["media_id"]
        url = f"{_origin(request)}/v1/media/{media_id}"
        return await self._meta_shaped(await self.media_api.media_object(tenant, media_id, url), trace)

    @staticmethod
    async def _meta_shaped(resp: web.Response, trace: str) -> web.Response:
        """The media endpoints' problem documents as Meta's errors; their answers as they are."""
        if resp.status < 400:
            return resp
        try:
            found = orjson.loads(resp.body) if isinstance(resp.body, bytes) else {}
        except orjson.JSONDecodeError:
            found = {}
        return _error(graphcompat.from_problem(resp.status, found if isinstance(found, dict) else {}, trace))


def _origin(request: web.Request) -> str:
    """Where the client reached the gateway (behind a proxy: what it forwarded). The URL goes back
    to the client that sent these headers, so they can only mislead that client."""
    proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    host = request.headers.get("X-Forwarded-Host", "").split(",")[0].strip()
    scheme = proto if proto in ("http", "https") else request.scheme
    if not host or any(c in host for c in "/\\@ ") or len(host) > 255:
        host = request.host
    return f"{scheme}://{host}"

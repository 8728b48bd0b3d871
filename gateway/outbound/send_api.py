"""The send API: ``POST /v1/messages`` with an Idempotency-Key, ``GET`` and ``DELETE
/v1/messages/{key}``. What a request does to the outbox (keys, rows, the reply guard) is
``gateway.outbound.enqueue``; this module speaks HTTP and RFC 9457 problems.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.core import tenancy
from gateway.core.enums import OutboxState
from gateway.core.messages import Invalid, SendRequest, fingerprint
from gateway.core.settings import Settings
from gateway.httpkit import bearer_tenant, problem, unauthorized
from gateway.outbound.enqueue import Enqueuer, Refused, invalid, location, provider_problems
from gateway.outbound.validation import RequestValidator
from gateway.store import idempotency, outbox
from gateway.store.database import Database
from gateway.store.db import DB_ERRORS

log = logging.getLogger(__name__)

MAX_KEY = 255
RESERVED_KEY = "read"  # /v1/messages/read is the read-receipt endpoint, not a message
MAX_BODY = 64 * 1024
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: safe in headers, logs and URLs (fullmatch)
OPENAPI_PATH = Path(__file__).with_name("openapi.json")


def key_problem(key: str) -> str | None:
    """What is wrong with a given Idempotency-Key (None: nothing)."""
    if key == "":
        return "required: send a unique key per business event"
    if len(key) > MAX_KEY:
        return f"too long: at most {MAX_KEY} characters"
    if not _KEY_CHARS.fullmatch(key):
        return "invalid: visible ASCII characters only, no spaces"
    if key == RESERVED_KEY:
        return f"invalid: {key!r} is reserved (POST /v1/messages/read)"
    return None


def _key_problem(key: str | None) -> web.Response | None:
    if key is None or key == "":
        return problem(400, "Idempotency-Key header required", "Send a unique key per business event.")
    why = key_problem(key)
    if why is None:
        return None
    title, _, detail = why.partition(": ")
    return problem(400, f"Idempotency-Key {title}", detail[0].upper() + detail[1:] + ".")


def _invalid(errors: list[str]) -> web.Response:
    return rendered(invalid(errors))


def rendered(exc: Refused) -> web.Response:
    """A refusal as a problem document."""
    return problem(exc.status, exc.title, exc.detail, headers=exc.headers, **exc.extra)


def _replay(stored: idempotency.StoredKey) -> web.Response:
    headers = dict(stored.response_headers or {})
    headers["Idempotent-Replayed"] = "true"
    return web.Response(body=stored.response_body, status=stored.response_status or 200, headers=headers)


def _ts(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


@cache
def openapi_bytes() -> bytes:
    """The document in the repo, loaded once and served as is."""
    data = OPENAPI_PATH.read_bytes()
    json.loads(data)  # fail at startup, not at the first request, if it is broken
    return data


@cache
def request_validator() -> RequestValidator:
    """The request-body validator built from the served document's own schema."""
    return RequestValidator(orjson.loads(openapi_bytes()))


class SendApi:
    """The send API's routes, on ``db`` (open while the app runs)."""

    def __init__(self, settings: Settings, db: Database, wake: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.db = db
        self.validator = request_validator()
        self.enqueuer = Enqueuer(settings, db, wake)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.post_message),
            # "read" is POST /v1/messages/read (a read receipt), never a key.
            web.get("/v1/messages/{key:(?!read$).+}", self.get_message),
            web.delete("/v1/messages/{key:(?!read$).+}", self.delete_message),
            web.get("/v1/openapi.json", self.get_openapi),
        ]

    async def post_message(self, request: web.Request) -> web.Response:
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        key = request.headers.get("Idempotency-Key")
        bad = _key_problem(key)
        if bad is not None:
            return bad
        assert key is not None
        if request.content_length is not None and request.content_length > MAX_BODY:
            return problem(413, "body too large", f"At most {MAX_BODY} bytes.")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raw = b"x" * (MAX_BODY + 1)
        if len(raw) > MAX_BODY:
            return problem(413, "body too large", f"At most {MAX_BODY} bytes.")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return problem(400, "body is not JSON")
        try:
            message = self.validator.validate(body)
        except Invalid as exc:
            return _invalid(exc.errors)
        if not tenancy.may_send_from(self.settings, tenant, message.phone_number_id):
            return problem(403, "phone_number_id not allowed", "This tenant may not send from this number.")
        provider = tenancy.provider_for(self.settings, tenant)
        unsendable = provider_problems(provider, message)
        if unsendable:
            return _invalid(unsendable)
        return await self._submit(SendRequest(tenant, key, fingerprint(body), provider, message))

    async def _submit(self, req: SendRequest) -> web.Response:
        try:
            errors = await self.enqueuer.refused(req)
            if errors:
                return _invalid(errors)
            done = await self.enqueuer.submit(req)
        except Refused as exc:
            return rendered(exc)
        except DB_ERRORS as exc:
            log.warning("send request not accepted: database %s", type(exc).__name__)
            return problem(503, "not accepted, retry later", headers={"Retry-After": "5"})
        if done.stored is not None:
            return _replay(done.stored)
        row = done.row
        body = orjson.dumps({"key": req.key, "state": row["state"], "provider": row["provider"]})
        headers = {"Content-Type": "application/json", "Location": location(req.key)}
        if done.replayed:
            headers["Idempotent-Replayed"] = "true"
        return web.Response(body=body, status=202, headers=headers)

    async def get_message(self, request: web.Request) -> web.Response:
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        key = request.match_info["key"]
        bad = _key_problem(key)  # e.g. a%00b: PostgreSQL text cannot even hold it
        if bad is not None:
            return bad
        try:
            row = await outbox.get(self.db.pool, tenant=tenant, key=key)
        except DB_ERRORS as exc:
            log.warning("message state not read: database %s", type(exc).__name__)
            return problem(503, "database unavailable, retry later", headers={"Retry-After": "5"})
        if row is None:
            return problem(404, "no message with this key")
        return web.json_response(
            {
                "key": key,
                "state": row["state"],
                "provider": row["provider"],
                "recipient": row["recipient"],
                "type": row["payload"].get("type"),
                "in_reply_to": (row["payload"].get("context") or {}).get("message_id"),
                "biz_opaque_callback_data": row["biz_opaque_callback_data"],
                "wamid": row["wamid"],
                "delivery_status": row["delivery_status"],
                "delivery_errors": row["delivery_errors"],
                "attempts": row["attempts"],
                "last_error": row["last_error"],
                "last_error_code": row["last_error_code"],
                "created_at": _ts(row["created_at"]),
                "updated_at": _ts(row["updated_at"]),
                "accepted_at": _ts(row["accepted_at"]),
            },
            dumps=lambda v: orjson.dumps(v).decode(),
        )

    async def delete_message(self, request: web.Request) -> web.Response:
        """Cancel a message that has not gone to the provider yet (``pending``)."""
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        key = request.match_info["key"]
        bad = _key_problem(key)
        if bad is not None:
            return bad
        try:
            async with self.db.pool.acquire() as conn:
                found = await outbox.cancel_pending(conn, tenant=tenant, key=key)
        except DB_ERRORS as exc:
            log.warning("message not cancelled: database %s", type(exc).__name__)
            return problem(503, "database unavailable, retry later", headers={"Retry-After": "5"})
        if found is None:
            return problem(404, "no message with this key")
        state, _now = found
        if state != OutboxState.CANCELLED:
            return problem(
                409,
                "the message may have reached the provider",
                f"It is {state}: only a pending message can be cancelled.",
                state=str(state),
            )
        return web.json_response({"key": key, "state": str(state)})

    async def get_openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=openapi_bytes(), content_type="application/json")

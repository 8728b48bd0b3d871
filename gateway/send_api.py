"""The send API: ``POST /v1/messages`` with an Idempotency-Key, ``GET /v1/messages/{key}``.

A key is claimed with one atomic INSERT and committed as ``in_progress`` before any work, so a
concurrent request with the same key sees it (409) instead of waiting. The outbox row and the
stored first response are then written in one transaction: a crash between the two steps
leaves at most a stale claim, which a retry with the same body takes over after a lease.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import orjson
from aiohttp import web

from gateway import outbox
from gateway.appkeys import POOL, SETTINGS
from gateway.settings import Settings
from gateway.sqlfiles import q

log = logging.getLogger(__name__)

MAX_KEY = 255
MAX_BODY = 64 * 1024
# A claim still in_progress after this long belongs to a request that died.
CLAIM_LEASE_S = 30.0
RETRY_AFTER_S = "1"
_KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII: safe in headers, logs and URLs
_PHONE = re.compile(r"^\+?[0-9]{5,20}$")
_NUMBER_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")
REPLAYED_HEADERS = ("Content-Type", "Location")
OPENAPI_PATH = Path(__file__).with_name("openapi.json")


class Invalid(Exception):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


def problem(
    status: int,
    title: str,
    detail: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An RFC 9457 problem document."""
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/problem+json", headers=headers
    )


def tenant_for(settings: Settings, authorization: str | None) -> str | None:
    """The tenant whose key is the bearer token; every key is compared, in constant time."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    given = token.strip().encode()
    found: str | None = None
    for tenant, key in settings.api_keys:
        if hmac.compare_digest(given, key.encode()) and found is None:
            found = tenant
    return found


def fingerprint(body: Any) -> str:
    """sha256 of the canonical JSON body: key order and whitespace do not matter."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def validate(body: Any) -> tuple[str, str, dict[str, Any], str]:
    """(to, phone_number_id, message, unknown_policy) or Invalid listing every problem."""
    if not isinstance(body, dict):
        raise Invalid(["body must be a JSON object"])
    errors: list[str] = []
    allowed = {"to", "phone_number_id", "type", "text", "template", "unknown_policy"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        errors.append(f"unknown fields: {', '.join(unknown)}")
    to = body.get("to")
    if not isinstance(to, str) or not _PHONE.match(to):
        errors.append("to: a phone number in international format, digits only (e.g. 4915112345678)")
    number = body.get("phone_number_id")
    if not isinstance(number, str) or not _NUMBER_ID.match(number):
        errors.append("phone_number_id: the sending number's id (1-64 letters, digits, _ or -)")
    policy = body.get("unknown_policy", "review")
    if policy not in outbox.POLICIES:
        errors.append("unknown_policy: resend or review")
    kind = body.get("type")
    message: dict[str, Any] = {}
    if kind == "text":
        text = body.get("text")
        if not isinstance(text, dict) or not isinstance(text.get("body"), str) or not text["body"]:
            errors.append('text: {"body": "<1-4096 characters>"} required for type text')
        elif len(text["body"]) > 4096:
            errors.append("text.body: at most 4096 characters")
        elif set(text) - {"body", "preview_url"}:
            errors.append("text: only body and preview_url are allowed")
        else:
            message = {"type": "text", "text": text}
        if "template" in body:
            errors.append("template: not allowed with type text")
    elif kind == "template":
        template = body.get("template")
        if (
            not isinstance(template, dict)
            or not isinstance(template.get("name"), str)
            or not template["name"]
            or not isinstance(template.get("language"), dict)
            or not isinstance(template["language"].get("code"), str)
        ):
            errors.append('template: {"name": ..., "language": {"code": ...}, "components": [...]} required')
        elif "components" in template and not isinstance(template["components"], list):
            errors.append("template.components: must be a list")
        else:
            message = {"type": "template", "template": template}
        if "text" in body:
            errors.append("text: not allowed with type template")
    else:
        errors.append("type: text or template")
    if errors:
        raise Invalid(errors)
    assert isinstance(to, str) and isinstance(number, str) and isinstance(policy, str)
    return to.lstrip("+"), number, message, policy


def _key_problem(key: str | None) -> web.Response | None:
    if key is None or key == "":
        return problem(400, "Idempotency-Key header required", "Send a unique key per business event.")
    if len(key) > MAX_KEY:
        return problem(400, "Idempotency-Key too long", f"At most {MAX_KEY} characters.")
    if not _KEY_CHARS.match(key):
        return problem(400, "Idempotency-Key invalid", "Visible ASCII characters only, no spaces.")
    return None


def _location(key: str) -> str:
    return "/v1/messages/" + quote(key, safe="")


def _replay(stored: Any) -> web.Response:
    headers = dict(stored["response_headers"] or {})
    headers["Idempotent-Replayed"] = "true"
    body = bytes(stored["response_body"])
    return web.Response(body=body, status=stored["response_status"], headers=headers)


async def post_message(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    tenant = tenant_for(settings, request.headers.get("Authorization"))
    if tenant is None:
        return problem(
            401, "missing or invalid API key", headers={"WWW-Authenticate": 'Bearer realm="gateway"'}
        )
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
        to, number, message, policy = validate(body)
    except Invalid as exc:
        return problem(400, "invalid message", "; ".join(exc.errors), errors=exc.errors)

    fp = fingerprint(body)
    try:
        return await _claim_and_answer(request, tenant, key, fp, to, number, message, policy)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("send request not accepted: database %s", type(exc).__name__)
        return problem(503, "not accepted, retry later", headers={"Retry-After": "5"})


async def _claim_and_answer(
    request: web.Request,
    tenant: str,
    key: str,
    fp: str,
    to: str,
    number: str,
    message: dict[str, Any],
    policy: str,
) -> web.Response:
    settings = request.app[SETTINGS]
    pool = request.app[POOL]
    for _ in range(3):
        claimed = await pool.fetchval(
            q("idem_claim"), tenant, key, fp, settings.idempotency_ttl_h, CLAIM_LEASE_S
        )
        if claimed:
            break
        stored = await pool.fetchrow(q("idem_get"), tenant, key)
        if stored is None:
            continue  # expired and purged between the two statements: claim again
        if stored["fingerprint"] != fp:
            return problem(
                422, "Idempotency-Key reused with a different body", "Use a new key for a new message."
            )
        if stored["state"] != "done":
            return problem(
                409,
                "a request with this Idempotency-Key is in progress",
                "Retry after the first request completes.",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        return _replay(stored)
    else:
        return problem(503, "could not claim the Idempotency-Key", headers={"Retry-After": RETRY_AFTER_S})

    try:
        return await _first_request(request, tenant, key, fp, to, number, message, policy)
    except Exception:
        log.exception("send request failed; releasing its idempotency key")
        try:
            await pool.execute(q("idem_release"), tenant, key, fp)
        except Exception:
            log.warning("could not release the key; it will be taken over after %ss", CLAIM_LEASE_S)
        return problem(503, "not accepted, retry later", headers={"Retry-After": "5"})


async def _first_request(
    request: web.Request,
    tenant: str,
    key: str,
    fp: str,
    to: str,
    number: str,
    message: dict[str, Any],
    policy: str,
) -> web.Response:
    settings = request.app[SETTINGS]
    new = outbox.NewMessage(
        tenant=tenant,
        key=key,
        provider=settings.provider_for(tenant),
        phone_number_id=number,
        recipient=to,
        payload=message,
        unknown_policy=policy,
    )
    async with request.app[POOL].acquire() as conn, conn.transaction():
        _created, row = await outbox.enqueue(conn, new)
        body = orjson.dumps({"key": key, "state": row["state"], "provider": row["provider"]})
        headers = {"Content-Type": "application/json", "Location": _location(key)}
        await conn.execute(q("idem_complete"), tenant, key, fp, 202, headers, body)
    return web.Response(body=body, status=202, headers=headers)


def _ts(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


async def get_message(request: web.Request) -> web.Response:
    tenant = tenant_for(request.app[SETTINGS], request.headers.get("Authorization"))
    if tenant is None:
        return problem(
            401, "missing or invalid API key", headers={"WWW-Authenticate": 'Bearer realm="gateway"'}
        )
    key = request.match_info["key"]
    row = await outbox.get(request.app[POOL], tenant, key)
    if row is None:
        return problem(404, "no message with this key")
    return web.json_response(
        {
            "key": key,
            "state": row["state"],
            "provider": row["provider"],
            "recipient": row["recipient"],
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


@cache
def openapi_bytes() -> bytes:
    """The document in the repo, loaded once and served as is."""
    data = OPENAPI_PATH.read_bytes()
    json.loads(data)  # fail at startup, not at the first request, if it is broken
    return data


async def get_openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_bytes(), content_type="application/json")


def add_routes(app: web.Application) -> None:
    openapi_bytes()
    app.router.add_post("/v1/messages", post_message)
    app.router.add_get("/v1/messages/{key:.+}", get_message)
    app.router.add_get("/v1/openapi.json", get_openapi)

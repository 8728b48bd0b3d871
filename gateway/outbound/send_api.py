"""The send API: ``POST /v1/messages`` with an Idempotency-Key, ``GET`` and ``DELETE
/v1/messages/{key}``.

A key is claimed with one atomic INSERT and committed as ``in_progress`` before any work, so a
concurrent request with the same key sees it (409) instead of waiting. The outbox row and the
stored first response are then written in one transaction: a crash between the two steps
leaves at most a stale claim, which a retry with the same body takes over after a lease.

A key stays bound to its body for as long as its outbox row exists, even after the key's own
record expired: another body gets 422, never a 2xx that sends nothing. A send the provider
refused for good (the row is ``failed``: nothing was sent) frees its key: the same key with a
corrected body is a new send of the same row.

A reply (``in_reply_to``) must name a message received on one of the tenant's numbers (404
otherwise) and claims the right to answer it in ``reply_claims`` in that same transaction (the
rule is ``gateway.store.replies``'): of any number of concurrent replies exactly one commits;
the others get 409 (naming the first reply's key when it is the same tenant's), and their
Idempotency-Keys are released.
"""

from __future__ import annotations

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

from gateway import metrics
from gateway.core.enums import OutboxState, Provider
from gateway.core.identity import is_bsuid
from gateway.core.media import media_ids
from gateway.core.messages import Invalid, SendRequest, fingerprint
from gateway.core.settings import Settings
from gateway.httpkit import bearer_tenant, problem, unauthorized
from gateway.outbound.validation import RequestValidator
from gateway.store import idempotency, media, outbox, replies
from gateway.store.db import DB_ERRORS

log = logging.getLogger(__name__)

MAX_KEY = 255
RESERVED_KEY = "read"  # /v1/messages/read is the read-receipt endpoint, not a message
MAX_BODY = 64 * 1024
# A claim still in_progress after this long belongs to a request that died.
CLAIM_LEASE_S = 30.0
RETRY_AFTER_S = "1"
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: safe in headers, logs and URLs (fullmatch)
OPENAPI_PATH = Path(__file__).with_name("openapi.json")


def _key_problem(key: str | None) -> web.Response | None:
    if key is None or key == "":
        return problem(400, "Idempotency-Key header required", "Send a unique key per business event.")
    if len(key) > MAX_KEY:
        return problem(400, "Idempotency-Key too long", f"At most {MAX_KEY} characters.")
    if not _KEY_CHARS.fullmatch(key):
        return problem(400, "Idempotency-Key invalid", "Visible ASCII characters only, no spaces.")
    if key == RESERVED_KEY:
        return problem(400, "Idempotency-Key invalid", f"{key!r} is reserved (POST /v1/messages/read).")
    return None


def _invalid(errors: list[str]) -> web.Response:
    return problem(400, "invalid message", "; ".join(errors), errors=errors)


def _location(key: str) -> str:
    return "/v1/messages/" + quote(key, safe="")


def _replay(stored: idempotency.StoredKey) -> web.Response:
    headers = dict(stored.response_headers or {})
    headers["Idempotent-Replayed"] = "true"
    return web.Response(body=stored.response_body, status=stored.response_status or 200, headers=headers)


def _reused() -> web.Response:
    return problem(422, "Idempotency-Key reused with a different body", "Use a new key for a new message.")


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


class _Refused(Exception):
    """Raised inside the enqueue transaction to roll it back: answered with ``response``, and
    the key is released (it stays free rather than bound to a refusal)."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


def _already_answered(req: SendRequest, first: replies.Claim) -> web.Response:
    m = req.body
    what = f"inbound message {m.in_reply_to!r} was already answered"
    if first.tenant != req.tenant or first.key is None:
        # Claimed by another tenant or by a handler: there is no key of yours to name.
        return problem(409, "this message was already answered", what + ".")
    return problem(
        409,
        "this message was already answered",
        f"{what} by bot {first.bot!r} with Idempotency-Key {first.key!r}.",
        first_key=first.key,
        first_location=_location(first.key),
    )


class SendApi:
    """The send API's routes; ``pool`` is set once the app's database is up."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pool: asyncpg.Pool | None = None
        self.validator = request_validator()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.post_message),
            # "read" is POST /v1/messages/read (a read receipt), never a key.
            web.get("/v1/messages/{key:(?!read$).+}", self.get_message),
            web.delete("/v1/messages/{key:(?!read$).+}", self.delete_message),
            web.get("/v1/openapi.json", self.get_openapi),
        ]

    def _pool(self) -> asyncpg.Pool:
        assert self.pool is not None, "the send API is served only after the database is up"
        return self.pool

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
        if not self.settings.may_send_from(tenant, message.phone_number_id):
            return problem(403, "phone_number_id not allowed", "This tenant may not send from this number.")
        provider = self.settings.provider_for(tenant)
        if provider is Provider.TENASHI:
            # Tenashi's documented API takes {"to", "text"}: nothing else could be sent as asked.
            tenashi = []
            if message.message.get("type") != "text":
                tenashi.append("type: Tenashi sends text messages only")
            if is_bsuid(message.to):
                tenashi.append("recipient: Tenashi sends go to a phone number (to)")
            if tenashi:
                return _invalid(tenashi)
        req = SendRequest(tenant, key, fingerprint(body), provider, message)
        try:
            refused = await self._refused(req)
            if refused is not None:
                return refused
            return await self._claim_and_answer(req)
        except DB_ERRORS as exc:
            log.warning("send request not accepted: database %s", type(exc).__name__)
            return problem(503, "not accepted, retry later", headers={"Retry-After": "5"})

    async def _refused(self, req: SendRequest) -> web.Response | None:
        """What the database shows is wrong with the message (400), before its key is claimed: a
        media id of a number the tenant does not own (or, where tenants are bound to numbers, one
        the gateway has not seen: upload it with POST /v1/media), or a reply addressed to another
        customer than the one who wrote the message it answers."""
        m = req.body
        ids = sorted(set(media_ids(m.message)))
        if not ids and m.in_reply_to is None:
            return None
        errors = []
        async with self._pool().acquire() as conn:
            if ids:
                owners = await media.numbers(conn, ids)
                bound = self.settings.numbers_of(req.tenant) is not None
                for media_id in ids:
                    number = owners.get(media_id)
                    if (number is None and bound) or (
                        number is not None and not self.settings.may_send_from(req.tenant, number)
                    ):
                        kind = m.message["type"]
                        errors.append(f"{kind}: media id {media_id[:40]!r} is not of your numbers")
            if m.in_reply_to is not None:
                found = await replies.recipient_matches(conn, inbound_wamid=m.in_reply_to, recipient=m.to)
                # Another tenant's message is not said to exist (the reply guard answers 404).
                ours = found is not None and self.settings.may_send_from(req.tenant, found[0] or "")
                if ours and found is not None and not found[1]:
                    field = "recipient" if is_bsuid(m.to) else "to"
                    errors.append(f"{field}: not the customer who wrote the message in_reply_to names")
        return _invalid(errors) if errors else None

    async def _claim_and_answer(self, req: SendRequest) -> web.Response:
        pool = self._pool()
        ident = {"tenant": req.tenant, "key": req.key}
        for _ in range(3):
            claimed = await idempotency.claim(
                pool,
                **ident,
                fingerprint=req.fingerprint,
                ttl_h=self.settings.idempotency_ttl_h,
                lease_s=CLAIM_LEASE_S,
            )
            if claimed:
                break
            stored = await idempotency.get(pool, **ident)
            if stored is None:
                continue  # expired and purged between the two statements: claim again
            if stored.fingerprint != req.fingerprint:
                return _reused()
            if not stored.done:
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
            return await self._first_request(req)
        except Exception:
            log.exception("send request failed; releasing its idempotency key")
            try:
                await idempotency.release(pool, **ident, fingerprint=req.fingerprint)
            except Exception:
                log.warning("could not release the key; it will be taken over after %ss", CLAIM_LEASE_S)
            return problem(503, "not accepted, retry later", headers={"Retry-After": "5"})

    async def _first_request(self, req: SendRequest) -> web.Response:
        m = req.body
        payload = m.message
        if m.in_reply_to is not None:
            # Meta threads the reply under the customer's message (Cloud API "context" object).
            payload = {**payload, "context": {"message_id": m.in_reply_to}}
        new = outbox.NewMessage(
            tenant=req.tenant,
            key=req.key,
            provider=req.provider,
            phone_number_id=m.phone_number_id,
            recipient=m.to,
            payload=payload,
            unknown_policy=m.unknown_policy,
            biz_opaque_callback_data=m.biz_opaque_callback_data,
            fingerprint=req.fingerprint,
        )
        try:
            return await self._enqueue(req, new)
        except _Refused as exc:
            # Nothing was written; the key is free again so it is not bound to a refusal.
            await idempotency.release(
                self._pool(), tenant=req.tenant, key=req.key, fingerprint=req.fingerprint
            )
            return exc.response

    async def _enqueue(self, req: SendRequest, new: outbox.NewMessage) -> web.Response:
        m = req.body
        replayed = False
        async with self._pool().acquire() as conn, conn.transaction():
            created, row = await outbox.enqueue(conn, new)
            if not created and row["state"] != "failed":
                # The key's record expired (or was purged) but its row lives: it is still bound
                # to the body it was made from.
                if row["fingerprint"] != req.fingerprint:
                    raise _Refused(_reused())
                replayed = True
            elif not created:
                renewed = await outbox.renew(conn, new, generation=row["generation"])
                if renewed is None:
                    raise RuntimeError("failed outbox row changed while it was renewed")
                row = renewed
                await replies.release_key(conn, tenant=req.tenant, key=req.key)
            if m.in_reply_to is not None and not replayed:
                await self._claim_reply(conn, req, m.in_reply_to)
            body = orjson.dumps({"key": req.key, "state": row["state"], "provider": row["provider"]})
            headers = {"Content-Type": "application/json", "Location": _location(req.key)}
            await idempotency.complete(
                conn,
                tenant=req.tenant,
                key=req.key,
                fingerprint=req.fingerprint,
                status=202,
                headers=headers,
                body=body,
            )
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return web.Response(body=body, status=202, headers=headers)

    async def _claim_reply(self, conn: Any, req: SendRequest, wamid: str) -> None:
        """Claim the right to answer ``wamid`` in the enqueue transaction, or raise _Refused:
        404 when it was not received on one of the tenant's numbers, 409 when it was answered."""
        numbers = await replies.received_on(conn, inbound_wamid=wamid)
        if not any(n is not None and self.settings.may_send_from(req.tenant, n) for n in numbers):
            raise _Refused(
                problem(
                    404,
                    "no such inbound message",
                    f"in_reply_to {wamid!r} names no message received on one of your numbers.",
                )
            )
        first = await replies.claim(
            conn,
            inbound_wamid=wamid,
            bot=req.body.bot,
            tenant=req.tenant,
            key=req.key,
            per_bot=self.settings.reply_per_bot(req.tenant),
        )
        if first is not None:
            metrics.REPLIES_REFUSED.labels("api").inc()
            raise _Refused(_already_answered(req, first))

    async def get_message(self, request: web.Request) -> web.Response:
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        key = request.match_info["key"]
        bad = _key_problem(key)  # e.g. a%00b: PostgreSQL text cannot even hold it
        if bad is not None:
            return bad
        try:
            row = await outbox.get(self._pool(), tenant=tenant, key=key)
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
            async with self._pool().acquire() as conn:
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

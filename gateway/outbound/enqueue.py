"""One send request into the outbox, for every front end (``POST /v1/messages`` and the
Graph-compatible endpoint): the checks the database answers, the Idempotency-Key, the outbox
row and the reply guard. Each front end renders the outcome its own way (RFC 9457 problems, or
Meta's error objects).

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

Without a key of the caller's (``keyless``, the Graph-compatible endpoint without an
Idempotency-Key), the request is one outbox row under a fresh key: nothing is claimed or stored
for it, and a retry is a new message, as at Meta.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from gateway import metrics
from gateway.core import tenancy
from gateway.core.enums import Provider
from gateway.core.identity import is_bsuid
from gateway.core.media import media_ids
from gateway.core.messages import Message, SendRequest
from gateway.core.settings import Settings
from gateway.store import idempotency, media, outbox, replies
from gateway.store.database import Database

log = logging.getLogger(__name__)

# A claim still in_progress after this long belongs to a request that died.
CLAIM_LEASE_S = 30.0
RETRY_AFTER_S = "1"


def location(key: str) -> str:
    return "/v1/messages/" + quote(key, safe="")


class Refused(Exception):
    """The request is not taken (nothing enqueued, its key free). ``kind`` names why for a front
    end that speaks another error vocabulary; the rest is the problem document's."""

    def __init__(
        self,
        kind: str,
        status: int,
        title: str,
        detail: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail or title)
        self.kind = kind
        self.status = status
        self.title = title
        self.detail = detail
        self.headers = headers
        self.extra = extra


def provider_problems(provider: Provider, message: Message) -> list[str]:
    """What the tenant's provider cannot send as asked: Tenashi's documented API takes
    ``{"to", "text"}`` only."""
    if provider is not Provider.TENASHI:
        return []
    out = []
    if message.message.get("type") != "text":
        out.append("type: Tenashi sends text messages only")
    if is_bsuid(message.to):
        out.append("recipient: Tenashi sends go to a phone number (to)")
    return out


def invalid(errors: list[str]) -> Refused:
    return Refused("invalid", 400, "invalid message", "; ".join(errors), errors=errors)


def unavailable() -> Refused:
    return Refused("unavailable", 503, "not accepted, retry later", headers={"Retry-After": "5"})


def _reused() -> Refused:
    return Refused(
        "reused", 422, "Idempotency-Key reused with a different body", "Use a new key for a new message."
    )


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The request's outbox row. ``replayed``: the key's first request made it (nothing new was
    enqueued); ``stored``: that first request's answer, to be replayed as it was."""

    row: Any
    replayed: bool = False
    stored: idempotency.StoredKey | None = None
    fresh: bool = False  # this request created the row: its state is the row's as returned


# Writes one keyless request's row with those of concurrent ones; its row once committed.
Batch = Callable[[outbox.NewMessage], Awaitable[outbox.OutboxRow]]


class Enqueuer:
    """Takes send requests into the outbox, on ``db`` (open while the app runs); ``wake()`` is
    called once a new row is committed (``gateway.outbound.wake``); ``batch``, when given,
    writes the rows of keyless requests with those of concurrent ones and wakes the senders
    itself (``gateway.outbound.enqueue_batch``)."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        wake: Callable[[], None] | None = None,
        batch: Batch | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.wake = wake
        self.batch = batch

    async def refused(self, req: SendRequest) -> list[str]:
        """What the database shows is wrong with the message, before its key is claimed: a
        media id of a number the tenant does not own (or, where tenants are bound to numbers,
        one the gateway has not seen: upload it first), or a reply addressed to another
        customer than the one who wrote the message it answers."""
        m = req.body
        ids = sorted(set(media_ids(m.message)))
        if not ids and m.in_reply_to is None:
            return []
        errors = []
        async with self.db.pool.acquire() as conn:
            if ids:
                owners = await media.numbers(conn, ids)
                bound = tenancy.numbers_of(self.settings, req.tenant) is not None
                for media_id in ids:
                    number = owners.get(media_id)
                    if (number is None and bound) or (
                        number is not None and not tenancy.may_send_from(self.settings, req.tenant, number)
                    ):
                        kind = m.message["type"]
                        errors.append(f"{kind}: media id {media_id[:40]!r} is not of your numbers")
            if m.in_reply_to is not None:
                found = await replies.recipient_matches(conn, inbound_wamid=m.in_reply_to, recipient=m.to)
                # Another tenant's message is not said to exist (the reply guard answers 404).
                ours = found is not None and tenancy.may_send_from(self.settings, req.tenant, found[0] or "")
                if ours and found is not None and not found[1]:
                    field = "recipient" if is_bsuid(m.to) else "to"
                    errors.append(f"{field}: not the customer who wrote the message in_reply_to names")
        return errors

    async def submit(
        self, req: SendRequest, *, keyless: bool = False, notify_outcome: bool = False
    ) -> Enqueued:
        """Enqueue ``req`` (or find what its key already made); raises Refused. ``keyless``:
        the key is fresh and the caller's (nothing is claimed or stored for it)."""
        if keyless:
            return await self._first_request(req, keyless=True, notify_outcome=notify_outcome)
        pool = self.db.pool
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
                raise _reused()
            if not stored.done:
                raise Refused(
                    "in_progress",
                    409,
                    "a request with this Idempotency-Key is in progress",
                    "Retry after the first request completes.",
                    headers={"Retry-After": RETRY_AFTER_S},
                )
            return Enqueued(await outbox.get(pool, **ident), replayed=True, stored=stored)
        else:
            raise Refused(
                "unavailable",
                503,
                "could not claim the Idempotency-Key",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        try:
            return await self._first_request(req, keyless=False, notify_outcome=notify_outcome)
        except Refused:
            raise
        except Exception:
            log.exception("send request failed; releasing its idempotency key")
            try:
                await idempotency.release(pool, **ident, fingerprint=req.fingerprint)
            except Exception:
                log.warning("could not release the key; it will be taken over after %ss", CLAIM_LEASE_S)
            raise unavailable() from None

    async def _first_request(self, req: SendRequest, *, keyless: bool, notify_outcome: bool) -> Enqueued:
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
            notify_outcome=notify_outcome,
        )
        if keyless and m.in_reply_to is None and self.batch is not None:
            # A fresh key, nothing else to write with it: a share of one statement, whose
            # commit wakes the senders once for the whole batch.
            return Enqueued(await self.batch(new), fresh=True)
        try:
            done = await self._enqueue(req, new, keyless=keyless)
            if not done.replayed and self.wake is not None:
                self.wake()
            return done
        except Refused:
            if not keyless:
                # Nothing was written; the key is free again so it is not bound to a refusal.
                await idempotency.release(
                    self.db.pool, tenant=req.tenant, key=req.key, fingerprint=req.fingerprint
                )
            raise

    async def _enqueue(self, req: SendRequest, new: outbox.NewMessage, *, keyless: bool) -> Enqueued:
        m = req.body
        if keyless and m.in_reply_to is None:
            # A fresh key, nothing else to write with it: one statement, its own transaction.
            created, row = await outbox.enqueue(self.db.pool, new)
            if not created:
                raise RuntimeError("a fresh key found a row")
            return Enqueued(row, fresh=True)
        replayed = False
        async with self.db.pool.acquire() as conn, conn.transaction():
            created, row = await outbox.enqueue(conn, new)
            if not created and row["state"] != "failed":
                # The key's record expired (or was purged) but its row lives: it is still bound
                # to the body it was made from.
                if row["fingerprint"] != req.fingerprint:
                    raise _reused()
                replayed = True
            elif not created:
                renewed = await outbox.renew(conn, new, generation=row["generation"])
                if renewed is None:
                    raise RuntimeError("failed outbox row changed while it was renewed")
                row = renewed
                await replies.release_key(conn, tenant=req.tenant, key=req.key)
            if m.in_reply_to is not None and not replayed:
                await self._claim_reply(conn, req, m.in_reply_to)
            if not keyless:
                body = orjson.dumps({"key": req.key, "state": row["state"], "provider": row["provider"]})
                headers = {"Content-Type": "application/json", "Location": location(req.key)}
                await idempotency.complete(
                    conn,
                    tenant=req.tenant,
                    key=req.key,
                    fingerprint=req.fingerprint,
                    status=202,
                    headers=headers,
                    body=body,
                )
        return Enqueued(row, replayed=replayed, fresh=created)

    async def _claim_reply(self, conn: Any, req: SendRequest, wamid: str) -> None:
        """Claim the right to answer ``wamid`` in the enqueue transaction, or raise Refused:
        404 when it was not received on one of the tenant's numbers, 409 when it was answered."""
        numbers = await replies.received_on(conn, inbound_wamid=wamid)
        if not any(n is not None and tenancy.may_send_from(self.settings, req.tenant, n) for n in numbers):
            raise Refused(
                "no_inbound",
                404,
                "no such inbound message",
                f"in_reply_to {wamid!r} names no message received on one of your numbers.",
            )
        first = await replies.claim(
            conn,
            inbound_wamid=wamid,
            bot=req.body.bot,
            tenant=req.tenant,
            key=req.key,
            per_bot=tenancy.reply_per_bot(self.settings, req.tenant),
        )
        if first is not None:
            metrics.REPLIES_REFUSED.labels("api").inc()
            raise _already_answered(req, first)


def _already_answered(req: SendRequest, first: replies.Claim) -> Refused:
    m = req.body
    what = f"inbound message {m.in_reply_to!r} was already answered"
    if first.tenant != req.tenant or first.key is None:
        # Claimed by another tenant or by a handler: there is no key of yours to name.
        return Refused("answered", 409, "this message was already answered", what + ".")
    return Refused(
        "answered",
        409,
        "this message was already answered",
        f"{what} by bot {first.bot!r} with Idempotency-Key {first.key!r}.",
        first_key=first.key,
        first_location=location(first.key),
    )

"""Outbound messages as the send API accepts them: validation, fingerprints, callback keys. Pure.

Bodies are validated against the request schema of the send API's own OpenAPI document (so the
document and the checks cannot drift apart) with ``openapi-schema-validator``: the OpenAPI 3.0
schema dialect (``nullable``, ``discriminator``, ...) on top of ``jsonschema``, with its
``ecma-regex`` extra so ``pattern`` means what the OpenAPI/JSON Schema specs say (ECMA-262: ``$``
is the end of the string; Python's ``re`` would also let ``"4915112345678\\n"`` through).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.enums import Provider, UnknownPolicy

# Tenashi takes it as an Idempotency-Key (Stripe's limit: 255); Meta allows 512.
MAX_CALLBACK_DATA = 255
POLICIES = tuple(p.value for p in UnknownPolicy)
DEFAULT_BOT = "default"
# Error texts quote at most this much of what the client sent.


class Invalid(Exception):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


# The message types of Meta's Cloud API message object the send API takes (one object each).
MESSAGE_TYPES = (
    "text",
    "image",
    "audio",
    "video",
    "document",
    "sticker",
    "location",
    "contacts",
    "interactive",
    "reaction",
    "template",
)


@dataclass(frozen=True, slots=True)
class Message:
    """A validated request body."""

    to: str  # the customer: a phone number (digits), or a BSUID or parent BSUID
    phone_number_id: str
    message: dict[str, Any]  # {"type": t, t: {...}} exactly as the caller gave it
    unknown_policy: UnknownPolicy
    # The inbound message this answers (Meta's context.message_id), and the bot answering it.
    in_reply_to: str | None = None
    bot: str = DEFAULT_BOT
    # The caller's own value, returned with the message's statuses.
    biz_opaque_callback_data: str | None = None


@dataclass(frozen=True, slots=True)
class SendRequest:
    """One accepted ``POST /v1/messages``: who asks, under which key, for what."""

    tenant: str
    key: str
    fingerprint: str
    provider: Provider
    body: Message


def callback_data(tenant: str, key: str, generation: int = 0) -> str:
    """Globally unique and opaque: ``<tenant>:<key>``, or a hash of both when that is too long.

    Tenants never contain ':' (GATEWAY_API_KEYS splits on the first one), so the plain form
    cannot collide across tenants. A key used again after its send was refused for good
    (``generation`` > 0) gets a hash of tenant, key and generation: keys never contain NUL, so
    no other tenant, key or generation hashes the same input.
    """
    plain = f"{tenant}:{key}"
    if generation == 0 and len(plain) <= MAX_CALLBACK_DATA:
        return plain
    parts = [tenant.encode(), key.encode()] + ([str(generation).encode()] if generation else [])
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return f"sha256:{digest}"


def fingerprint(body: Any) -> str:
    """sha256 of the canonical JSON body: key order and whitespace do not matter."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

"""Outbound messages as the send API accepts them: validation, fingerprints, callback keys. Pure."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.enums import Provider, UnknownPolicy

# Tenashi takes it as an Idempotency-Key (Stripe's limit: 255); Meta allows 512.
MAX_CALLBACK_DATA = 255
POLICIES = tuple(p.value for p in UnknownPolicy)
_PHONE = re.compile(r"^\+?[0-9]{5,20}$")
_NUMBER_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


class Invalid(Exception):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


@dataclass(frozen=True, slots=True)
class Message:
    """A validated request body."""

    to: str
    phone_number_id: str
    message: dict[str, Any]
    unknown_policy: UnknownPolicy


@dataclass(frozen=True, slots=True)
class SendRequest:
    """One accepted ``POST /v1/messages``: who asks, under which key, for what."""

    tenant: str
    key: str
    fingerprint: str
    provider: Provider
    body: Message


def callback_data(tenant: str, key: str) -> str:
    """Globally unique and opaque: ``<tenant>:<key>``, or a hash of both when that is too long.

    Tenants never contain ':' (GATEWAY_API_KEYS splits on the first one), so the plain form
    cannot collide across tenants.
    """
    plain = f"{tenant}:{key}"
    if len(plain) <= MAX_CALLBACK_DATA:
        return plain
    digest = hashlib.sha256(tenant.encode() + b"\0" + key.encode()).hexdigest()
    return f"sha256:{digest}"


def fingerprint(body: Any) -> str:
    """sha256 of the canonical JSON body: key order and whitespace do not matter."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def validate(body: Any) -> Message:
    """The message a request body asks for, or Invalid listing every problem."""
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
    if policy not in POLICIES:
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
    return Message(to.lstrip("+"), number, message, UnknownPolicy(policy))

"""Destinations, without I/O: which destinations want an event (its kind, its conversation,
its business number), and what a destination's name, URL, secret and filters may be.

Whether a destination's host may be connected to is ``gateway.core.addresses``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from urllib.parse import urlsplit

from gateway.core import stdwebhooks
from gateway.core.events import AccountError, Event, InboundMessage, Status

EVENT_KINDS = ("message", "status", "account")
# standard: the Standard Webhooks envelope (docs/forwarding.md); meta: each event as its own
# Meta webhook body, signed X-Hub-Signature-256 (a bot written against Meta's webhooks).
FORMATS = ("standard", "meta")
MAX_META_SECRET = 512
MAX_NAME = 63
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_NUMBER = re.compile(r"[0-9A-Za-z_-]{1,64}")
MAX_URL = 2000


# --- which destinations want an event --------------------------------------------------------


def kind_of(ev: Event) -> str:
    """The ``--events`` filter an event matches: message, status or account."""
    if isinstance(ev, InboundMessage):
        return "message"
    if isinstance(ev, Status):
        return "status"
    return "account"


def conversation_of(ev: Event) -> str:
    """The customer (messages: the sender; statuses: the recipient): the phone number, else the
    BSUID, else the parent BSUID; '' when none.

    Destinations with ordering keep one delivery in flight per conversation.
    """
    if isinstance(ev, InboundMessage):
        return ev.sender or ev.user_id or ev.parent_user_id or ""
    if isinstance(ev, Status):
        return ev.recipient or ev.recipient_user_id or ev.recipient_parent_user_id or ""
    return ""


def number_of(ev: Event) -> str | None:
    """The business number an event came to or went from (destinations limited to numbers get
    only their numbers' events); None when it names none (most account-level changes)."""
    if isinstance(ev, InboundMessage | Status | AccountError):
        return ev.phone_number_id
    value = ev.value
    metadata = value.get("metadata") if isinstance(value, dict) else None
    number = metadata.get("phone_number_id") if isinstance(metadata, dict) else None
    return number if isinstance(number, str) else None


def parse_numbers(raw: str) -> list[str]:
    """``--numbers 1111,2222``: phone_number_ids, each once."""
    numbers = [n.strip() for n in raw.split(",") if n.strip()]
    if not numbers:
        raise ValueError("--numbers needs at least one phone_number_id")
    for n in numbers:
        if not _NUMBER.fullmatch(n):
            raise ValueError(f"--numbers: {n[:40]!r} is not a phone_number_id")
    return sorted(set(numbers))


def parse_events(raw: str | Iterable[str]) -> list[str]:
    """``message,status,account`` (any non-empty subset) into a sorted list."""
    items = [p.strip() for p in raw.split(",")] if isinstance(raw, str) else [p.strip() for p in raw]
    items = [p for p in items if p]
    if not items:
        raise ValueError(f"--events needs at least one of {', '.join(EVENT_KINDS)}")
    unknown = sorted(set(items) - set(EVENT_KINDS))
    if unknown:
        raise ValueError(f"unknown event kind(s) {', '.join(unknown)}; use {', '.join(EVENT_KINDS)}")
    return sorted(set(items))


# --- what a destination is -------------------------------------------------------------------


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(
            "a destination name is 1..63 of a-z, 0-9, '_' and '-', starting with a letter or digit"
        )
    return name


def check_url(url: str) -> str:
    """An absolute http(s) URL with a host, no credentials, no fragment."""
    if len(url) > MAX_URL or any(c.isspace() or ord(c) < 0x20 for c in url):
        raise ValueError("a destination URL must be at most 2000 characters without spaces")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("a destination URL must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("a destination URL must name a host")
    if parts.username or parts.password:
        raise ValueError("a destination URL must not carry credentials (the signature authenticates)")
    if parts.fragment:
        raise ValueError("a destination URL must not have a #fragment")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError("a destination URL has an invalid port") from None
    return url


def check_secret(format: str, secret: str) -> str:
    """A destination's secret for its format: a ``whsec_`` secret (standard), or any non-empty
    string of printable characters (meta: the bot's Meta app secret). The message never echoes
    the secret."""
    if format not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}")
    if format == "standard":
        stdwebhooks.secret_key(secret)
        return secret
    if not secret or len(secret) > MAX_META_SECRET or not secret.isprintable() or secret != secret.strip():
        raise ValueError(
            f"a Meta-format secret (the bot's app secret) is 1..{MAX_META_SECRET} printable characters, "
            "without leading or trailing spaces"
        )
    return secret


def new_secret(format: str) -> str:
    """A fresh random secret for the format (meta: 32 hex digits, the shape of a Meta app secret)."""
    return stdwebhooks.generate_secret() if format == "standard" else secrets.token_hex(16)


def mask_secret(format: str, secret: str) -> str:
    """What the CLI and logs may show of a destination's secret."""
    if format == "standard":
        return stdwebhooks.mask_secret(secret)
    return f"…{secret[-4:]}" if len(secret) >= 16 else "…"

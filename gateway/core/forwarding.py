"""Forwarding to downstream HTTP endpoints, without I/O: the envelope of an event, which
destinations want it, what an attempt's answer means, and destination validation.

The envelope (documented in docs/forwarding.md) is the same bytes for every attempt and
every destination of one event; only the ``webhook-*`` headers differ.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from gateway.core import stdwebhooks
from gateway.core.events import AccountError, AccountUpdate, Event, InboundMessage, Status

ENVELOPE_VERSION = 1
EVENT_KINDS = ("message", "status", "account")
# standard: the Standard Webhooks envelope (docs/forwarding.md); meta: each event as its own
# Meta webhook body, signed X-Hub-Signature-256 (a bot written against Meta's webhooks).
FORMATS = ("standard", "meta")
MAX_META_SECRET = 512
MAX_NAME = 63
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_NUMBER = re.compile(r"[0-9A-Za-z_-]{1,64}")
MAX_URL = 2000
# Retry-After larger than this is clamped: a receiver must not park deliveries for days.
MAX_RETRY_AFTER_S = 3600.0


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERING = "delivering"
    DELIVERED = "delivered"
    FAILED = "failed"


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


BREAKER_GAUGE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


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


def _iso(ts: int | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def envelope(ev: Event, source: str) -> dict[str, Any]:
    """The JSON body forwarded for one event: normalised fields in ``data``, the provider's
    own fragment untouched in ``raw``."""
    data: dict[str, Any]
    raw: Any
    ts: int | None = None
    if isinstance(ev, InboundMessage):
        typ = "message.received"
        ts = ev.timestamp
        data = {
            "wamid": ev.wamid,
            "phone_number_id": ev.phone_number_id,
            "display_phone_number": ev.display_phone_number,
            "waba_id": ev.waba_id,
            "from": ev.sender,
            "from_user_id": ev.user_id,
            "from_parent_user_id": ev.parent_user_id,
            "username": ev.username,
            "type": ev.type,
            "contact_name": ev.contact_name,
            "contact": ev.contact,
        }
        raw = ev.message
    elif isinstance(ev, Status):
        typ = "message.status"
        ts = ev.timestamp
        data = {
            "wamid": ev.wamid,
            "status": ev.status,
            "phone_number_id": ev.phone_number_id,
            "display_phone_number": ev.display_phone_number,
            "waba_id": ev.waba_id,
            "recipient_id": ev.recipient,
            "recipient_user_id": ev.recipient_user_id,
            "recipient_parent_user_id": ev.recipient_parent_user_id,
            "recipient_username": ev.recipient_username,
            "participant": ev.participant or None,
            "callback_data": ev.callback_data,
            "biz_opaque_callback_data": ev.biz_opaque_callback_data,
            "errors": ev.errors,
            "contact": ev.contact,
        }
        raw = ev.raw
    elif isinstance(ev, AccountError):
        typ = "account.error"
        data = {
            "waba_id": ev.waba_id,
            "phone_number_id": ev.phone_number_id,
            "field": ev.field,
            "errors": ev.errors,
        }
        raw = ev.raw
    else:
        assert isinstance(ev, AccountUpdate)
        typ = "account.update"
        data = {"waba_id": ev.waba_id, "field": ev.field}
        raw = ev.value
    return {
        "v": ENVELOPE_VERSION,
        "type": typ,
        "event_key": ev.key,
        "source": source,
        "timestamp": _iso(ts),
        "data": data,
        "raw": raw,
    }


def forward_row(ev: Event, source: str, inbox_id: int) -> dict[str, Any]:
    """What the consumer's batch statement needs to fan one event out to destinations (a
    Meta-format destination's body is rendered from the envelope there, by meta_webhook)."""
    return {
        "key": ev.key,
        "kind": kind_of(ev),
        "conversation": conversation_of(ev),
        "envelope": envelope(ev, source),
        "inbox_id": inbox_id,
        "callback": ev.callback_data if isinstance(ev, Status) else None,
        "number": number_of(ev),
    }


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


# --- rebuilding events from the side-effect tables (backfill) ---------------------------------


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def message_from_row(row: dict[str, Any], key: str) -> InboundMessage:
    """An ``inbound_messages`` row back into the event the consumer saw."""
    return InboundMessage(
        key=key,
        wamid=row["wamid"],
        phone_number_id=row["phone_number_id"],
        sender=row["sender"],
        type=row["type"],
        timestamp=_unix(row["timestamp"]),
        contact_name=row["contact_name"],
        message=row["message"],
        user_id=row["user_id"],
        parent_user_id=row["parent_user_id"],
        username=row["username"],
        waba_id=row["waba_id"],
        display_phone_number=row["display_phone_number"],
        contact=row["contact"],
    )


def status_from_row(row: dict[str, Any]) -> Status:
    return Status(
        key=row["event_key"],
        wamid=row["wamid"],
        status=row["status"],
        participant=row["participant"],
        recipient=row["recipient"],
        timestamp=_unix(row["timestamp"]),
        callback_data=row["callback_data"],
        errors=row["errors"],
        raw=row["raw"],
        recipient_user_id=row["recipient_user_id"],
        recipient_parent_user_id=row["recipient_parent_user_id"],
        recipient_username=row["recipient_username"],
        phone_number_id=row["phone_number_id"],
        waba_id=row["waba_id"],
        display_phone_number=row["display_phone_number"],
        contact=row["contact"],
        biz_opaque_callback_data=row["biz_opaque_callback_data"],
    )


def account_error_from_row(row: dict[str, Any]) -> AccountError:
    return AccountError(
        key=row["event_key"],
        waba_id=row["waba_id"],
        phone_number_id=row["phone_number_id"],
        field=row["field"],
        errors=row["errors"],
        raw=row["raw"],
    )


def account_update_from_row(row: dict[str, Any]) -> AccountUpdate:
    return AccountUpdate(key=row["event_key"], waba_id=row["waba_id"], field=row["field"], value=row["value"])


# --- destinations -----------------------------------------------------------------------------


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


# IPv6 prefixes that carry an IPv4 address a packet may end up at (the guard judges that one):
# NAT64's well-known prefix (RFC 6052: the last 32 bits), 6to4 (RFC 3056: bits 16-47), Teredo
# (RFC 4380: server and client), SIIT's IPv4-translated ::ffff:0:0:0/96 (RFC 2765), and the
# deprecated IPv4-compatible ::/96 (RFC 4291); IPv4-mapped ::ffff:0:0/96 too.
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
# RFC 8215's local-use NAT64 prefix: where the IPv4 address sits depends on the operator's
# prefix length, and the prefix is never global, so every address in it is refused.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
SIIT_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and a NAT64, 6to4 or Teredo relay, or the
    host's own stack, would deliver to); empty for a plain IPv6 address."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in NAT64_WELL_KNOWN or ip in SIIT_TRANSLATED:
        return [low32]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in IPV4_COMPATIBLE and int(ip) > 1:  # not :: nor ::1
        return [low32]
    return []


def address_refused(address: str) -> str | None:
    """Why the forwarder must not connect to ``address`` unless private destinations are
    allowed (None: a global unicast address, fine). Loopback, link-local (cloud metadata
    endpoints live at 169.254.169.254), private, shared, reserved and multicast ranges, also
    when carried inside an IPv6 address (IPv4-mapped, NAT64, 6to4, Teredo: ``embedded_ipv4``):
    a destination URL must not reach into our own network."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id names no range
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL_USE:
            return f"{address} is a local-use NAT64 address (RFC 8215)"
        for inner in embedded_ipv4(ip):
            why = _range_refused(inner)
            if why is not None:
                return f"{address} carries {inner}, a {why} address"
    why = _range_refused(ip)
    return None if why is None else f"{address} is a {why} address"


def _range_refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    for why, hit in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
        ("private", not ip.is_global),
    ):
        if hit:
            return why
    return None


def host_refused(host: str) -> str | None:
    """Why a URL's host is refused before any lookup (an IP literal outside the global
    ranges, or a localhost name), or None: a name is judged by what it resolves to."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return address_refused(host)


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


# --- what an attempt's answer means -----------------------------------------------------------


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    # 410 Gone: the endpoint says it is gone for good. The destination is disabled (an
    # operator re-enables it); the delivery waits, pending, like the rest of its backlog.
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    state: DeliveryState
    delay_s: float | None  # seconds until the next attempt (RETRY only)
    error: str | None


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from ``Retry-After`` (delta-seconds or an HTTP-date), clamped; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER_S)


def decide(
    *,
    status: int | None,
    error: str | None,
    retry_after: str | None,
    now: float,
    first_attempt_at: float,
    backoff_s: float,
    retry_window_s: float,
) -> Decision:
    """2xx: delivered. 410: gone (the destination is disabled, the delivery waits for it to be
    enabled again, due at once). Anything else (another status, a timeout, a refused
    connection): retry after ``backoff_s`` (or the receiver's Retry-After on 429/503, whichever
    is later), unless that falls past ``first_attempt_at + retry_window_s``: then failed, kept
    for replay."""
    if status is not None and 200 <= status < 300:
        return Decision(Outcome.DELIVERED, DeliveryState.DELIVERED, None, None)
    why = error if status is None else f"HTTP {status}" + (f": {error}" if error else "")
    if status == 410:
        return Decision(Outcome.GONE, DeliveryState.PENDING, 0.0, why)
    delay = backoff_s
    if status in (429, 503):
        asked = parse_retry_after(retry_after, now)
        if asked is not None:
            delay = max(delay, asked)
    if now + delay > first_attempt_at + retry_window_s:
        return Decision(Outcome.FAILED, DeliveryState.FAILED, None, why)
    return Decision(Outcome.RETRY, DeliveryState.PENDING, delay, why)


def breaker_tally(successes: Sequence[bool]) -> tuple[bool, int]:
    """From one destination's outcomes in completion order: (any success, failures after the
    last success). The breaker statement resets its count on a success and adds the rest."""
    saw_success = False
    failures = 0
    for ok in successes:
        if ok:
            saw_success = True
            failures = 0
        else:
            failures += 1
    return saw_success, failures


def merge_tallies(
    earlier: Sequence[tuple[int, bool, int]], later: Sequence[tuple[int, bool, int]]
) -> list[tuple[int, bool, int]]:
    """Breaker tallies (destination, any success, failures after the last success) of two
    rounds, as if their outcomes had been counted in one (a failed round's are written with
    the next)."""
    out = {dest: (ok, fails) for dest, ok, fails in earlier}
    for dest, ok, fails in later:
        if dest in out and not ok:
            ok, fails = out[dest][0], out[dest][1] + fails
        out[dest] = (ok, fails)
    return [(dest, ok, fails) for dest, (ok, fails) in out.items()]

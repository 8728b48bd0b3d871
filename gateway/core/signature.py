"""Webhook signature checks over raw bytes, in constant time. Pure: no I/O."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable

META_PREFIX = "sha256="


def _digest(secret: str, body: bytes) -> bytes:
    # hmac.digest: OpenSSL's one-shot HMAC (the forwarder signs every Meta-format delivery).
    return hmac.digest(secret.encode(), body, hashlib.sha256)


def sign_meta(body: bytes, secret: str) -> str:
    """The ``X-Hub-Signature-256`` value Meta would send for ``body``."""
    return META_PREFIX + _digest(secret, body).hex()


def _parse_hex(value: str, prefix: str) -> bytes | None:
    if not value.startswith(prefix):
        return None
    hexpart = value[len(prefix) :]
    if len(hexpart) != 64:
        return None
    try:
        return bytes.fromhex(hexpart)
    except ValueError:
        return None


def _parse_b64(value: str, prefix: str) -> bytes | None:
    if not value.startswith(prefix):
        return None
    try:
        raw = base64.b64decode(value[len(prefix) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


def _matches_any(expected: bytes, body: bytes, secrets: Iterable[str]) -> bool:
    ok = False
    # Check every secret (no early exit) so timing does not reveal which one matched.
    for secret in secrets:
        ok |= hmac.compare_digest(_digest(secret, body), expected)
    return ok


def meta_header_ok(header: str | None) -> bool:
    """True when ``header`` has the shape of Meta's signature (``sha256=`` + 64 hex digits).

    Checked before the body is read: a request that cannot be valid costs no body bytes.
    """
    return meta_digest(header) is not None


def meta_digest(header: str | None) -> bytes | None:
    """The digest Meta's signature header carries (``sha256=`` + 64 hex digits), or None when
    it has not that shape. Parsed once, before the body is read, and checked against the body
    with ``meta_digest_matches``."""
    if header is None:
        return None
    return _parse_hex(header.strip().lower(), META_PREFIX)


def meta_digest_matches(expected: bytes, body: bytes, secrets: Iterable[str]) -> bool:
    """True when ``expected`` (from ``meta_digest``) is the HMAC of ``body`` under any secret."""
    return _matches_any(expected, body, secrets)


def tenashi_header_ok(header: str | None, scheme: str = "hmac-sha256-hex", prefix: str = "sha256=") -> bool:
    """True when ``header`` has the shape of a Tenashi signature under ``scheme``/``prefix``."""
    if not header:
        return False
    value = header.strip()
    if scheme == "hmac-sha256-base64":
        return _parse_b64(value, prefix) is not None
    return _parse_hex(value.lower(), prefix.lower()) is not None


def verify_meta(body: bytes, header: str | None, secrets: Iterable[str]) -> bool:
    """True when ``header`` is a valid ``sha256=<hex>`` HMAC of ``body`` under any secret."""
    expected = meta_digest(header) if header else None
    if expected is None:
        return False
    return _matches_any(expected, body, secrets)


def sign_tenashi(body: bytes, secret: str, scheme: str = "hmac-sha256-hex", prefix: str = "sha256=") -> str:
    digest = _digest(secret, body)
    if scheme == "hmac-sha256-base64":
        return prefix + base64.b64encode(digest).decode()
    return prefix + digest.hex()


def verify_tenashi(
    body: bytes, header: str | None, secret: str, scheme: str = "hmac-sha256-hex", prefix: str = "sha256="
) -> bool:
    """Tenashi's scheme is unpublished: HMAC-SHA256 of the raw body, hex or base64, configurable."""
    if not header or not secret:
        return False
    value = header.strip()
    if scheme == "hmac-sha256-base64":
        expected = _parse_b64(value, prefix)
    else:
        expected = _parse_hex(value.lower(), prefix.lower())
    if expected is None:
        return False
    return _matches_any(expected, body, (secret,))

"""Standard Webhooks signing (symmetric, ``v1``), as the forwarder sends it. Pure: no I/O.

The Standard Webhooks specification (standardwebhooks.com, spec/standard-webhooks.md in
github.com/standard-webhooks/standard-webhooks): the signed content is
``{webhook-id}.{webhook-timestamp}.{body}``, the MAC is HMAC-SHA256 keyed with the bytes of
the base64 part of a ``whsec_`` secret, and the ``webhook-signature`` header is
``v1,<base64 MAC>`` (several space-separated during a secret rotation). Secrets are random,
between 24 and 64 bytes. Ids must not contain ``.``: ours are ``wh_`` plus hex.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
DEFAULT_SECRET_BYTES = 32
_ID = re.compile(r"[A-Za-z0-9_\-:]{1,200}")


class BadSecret(ValueError):
    """A secret that is not ``whsec_`` + base64 of 24..64 bytes (the message never echoes it)."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret: its base64 part, decoded."""
    if not secret.startswith(SECRET_PREFIX):
        raise BadSecret(f"a secret must start with {SECRET_PREFIX!r}")
    b64 = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadSecret("the part after whsec_ must be standard base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise BadSecret(
            f"a secret must decode to {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes, got {len(key)}"
        )
    return key


def generate_secret(nbytes: int = DEFAULT_SECRET_BYTES) -> str:
    """A fresh random ``whsec_`` secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(nbytes)).decode()


def mask_secret(secret: str) -> str:
    """What the CLI and logs may show of a secret: the prefix and its last four characters."""
    return f"{SECRET_PREFIX}…{secret[-4:]}" if len(secret) > len(SECRET_PREFIX) + 8 else f"{SECRET_PREFIX}…"


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``{msg_id}.{timestamp}.{body}``."""
    if not _ID.fullmatch(msg_id):
        raise ValueError("webhook id must be 1..200 characters of [A-Za-z0-9_-:] (no '.')")
    if timestamp < 0:
        raise ValueError("timestamp must be a non-negative Unix time")
    # hmac.digest: OpenSSL's one-shot HMAC, several times cheaper than hmac.new(...).digest().
    mac = hmac.digest(key, b"%s.%d.%s" % (msg_id.encode(), timestamp, body), "sha256")
    return "v1," + base64.b64encode(mac).decode()


def headers(
    key: bytes, msg_id: str, timestamp: int, body: bytes, previous_key: bytes | None = None
) -> dict[str, str]:
    """The three ``webhook-*`` headers of one attempt. With ``previous_key`` (a secret being
    rotated out) the signature header carries both, space-separated, the new one first: a
    receiver accepts the request when any of them verifies with the secret it has."""
    sig = signature(key, msg_id, timestamp, body)
    if previous_key is not None:
        sig += " " + signature(previous_key, msg_id, timestamp, body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": sig}


def verify(key: bytes, header_value: str, msg_id: str, timestamp: int, body: bytes) -> bool:
    """True when any ``v1`` signature in the header matches (constant-time compare)."""
    expected = signature(key, msg_id, timestamp, body).encode()
    return any(hmac.compare_digest(expected, part.encode()) for part in header_value.split(" ") if part)


def webhook_id(destination: str, event_key: str) -> str:
    """The stable ``webhook-id`` of one event to one destination.

    ``sql/queries/deliveries.sql`` computes the same in SQL; a destination name never holds a
    ``/``, so the hashed text names the pair unambiguously.
    """
    digest = hashlib.sha256(f"{destination}/{event_key}".encode()).hexdigest()
    return "wh_" + digest[:32]

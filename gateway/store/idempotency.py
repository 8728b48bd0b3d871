"""``idempotency_keys``: the send API's claims and stored first responses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.store.db import Conn
from gateway.store.sqlfiles import q


@dataclass(frozen=True, slots=True)
class StoredKey:
    fingerprint: str
    done: bool
    response_status: int | None
    response_headers: dict[str, str] | None
    response_body: bytes | None


async def claim(conn: Conn, *, tenant: str, key: str, fingerprint: str, ttl_h: int, lease_s: float) -> bool:
    """Atomic claim; takes over an expired key or a stale in-progress claim with the same body."""
    return bool(await conn.fetchval(q("idempotency_keys_claim"), tenant, key, fingerprint, ttl_h, lease_s))


async def get(conn: Conn, *, tenant: str, key: str) -> StoredKey | None:
    r = await conn.fetchrow(q("idempotency_keys_get"), tenant, key)
    if r is None:
        return None
    body = r["response_body"]
    return StoredKey(
        r["fingerprint"],
        r["state"] == "done",
        r["response_status"],
        r["response_headers"],
        bytes(body) if body is not None else None,
    )


async def complete(
    conn: Conn, *, tenant: str, key: str, fingerprint: str, status: int, headers: dict[str, Any], body: bytes
) -> None:
    """Store the first response, to be replayed for the key's lifetime."""
    await conn.execute(q("idempotency_keys_complete"), tenant, key, fingerprint, status, headers, body)


async def release(conn: Conn, *, tenant: str, key: str, fingerprint: str) -> None:
    """Give up an in-progress claim (the request failed before it was answered)."""
    await conn.execute(q("idempotency_keys_release"), tenant, key, fingerprint)


async def purge_expired(conn: Conn, *, limit: int) -> int:
    """Delete at most ``limit`` expired keys; rows deleted."""
    return affected(await conn.execute(q("idempotency_keys_purge_expired"), limit))


def affected(tag: str) -> int:
    """Rows affected, from a command tag such as ``DELETE 5000``."""
    return int(tag.rsplit(" ", 1)[-1])

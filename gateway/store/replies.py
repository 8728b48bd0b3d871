"""``reply_claims``: the reply guard, one reply per inbound message per bot."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.store.db import Conn
from gateway.store.sqlfiles import q


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds the right to answer one inbound message as one bot."""

    inbound_wamid: str
    bot: str
    tenant: str | None  # None: claimed with claim_reply() in SQL, not through the send API
    key: str | None


async def claim(conn: Conn, *, inbound_wamid: str, bot: str, tenant: str, key: str) -> bool:
    """True if this (wamid, bot) was free and is now ours. Call inside the enqueueing transaction."""
    return await conn.fetchval(q("reply_claims_claim"), inbound_wamid, bot, tenant, key) is not None


async def get(conn: Conn, *, inbound_wamid: str, bot: str) -> Claim | None:
    r = await conn.fetchrow(q("reply_claims_get"), inbound_wamid, bot)
    if r is None:
        return None
    return Claim(r["inbound_wamid"], r["claimed_by"], r["tenant"], r["idem_key"])


async def recipient_matches(conn: Conn, *, inbound_wamid: str, recipient: str) -> bool | None:
    """Whether ``recipient`` (a phone number, BSUID or parent BSUID) is the customer who wrote
    ``inbound_wamid``; None when the gateway does not know that message."""
    r = await conn.fetchrow(q("reply_recipient_matches"), inbound_wamid, recipient)
    return None if r is None else bool(r["matches"])


async def inbound_number(conn: Conn, *, inbound_wamid: str) -> str | None:
    """The business number an inbound message came to; None when the gateway does not know it."""
    number: str | None = await conn.fetchval(q("inbound_number"), inbound_wamid)
    return number

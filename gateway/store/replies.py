"""``reply_claims``: the reply guard, one reply per inbound message (or per bot, for tenants
that opted in), whoever answers: the send API's ``in_reply_to`` and handlers' ``reply()``."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.store.db import Conn
from gateway.store.sqlfiles import q


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds the right to answer one inbound message."""

    inbound_wamid: str
    bot: str
    tenant: str | None  # None: claimed with claim_reply() in SQL, not through the send API
    key: str | None


async def claim(
    conn: Conn, *, inbound_wamid: str, bot: str, tenant: str, key: str, per_bot: bool
) -> Claim | None:
    """Claim the right to answer ``inbound_wamid``; None if it is now ours, else the claim in
    the way. Call inside the enqueueing transaction (the claim commits or rolls back with it).

    ``per_bot``: the tenant may answer once per bot (otherwise once per message); a message
    another tenant answered is never ours."""
    r = await conn.fetchrow(q("reply_claims_claim"), inbound_wamid, bot, tenant, key, per_bot)
    if r is None:
        return None
    return Claim(inbound_wamid, r["holder_bot"], r["holder_tenant"], r["holder_key"])


async def release_key(conn: Conn, *, tenant: str, key: str) -> None:
    """Drop the claims a key holds (it is used again for a new send)."""
    await conn.execute(q("reply_claims_release_key"), tenant, key)


async def received_on(conn: Conn, *, inbound_wamid: str) -> set[str | None]:
    """The numbers ``inbound_wamid`` was received on (empty: never received, or purged)."""
    return {r[0] for r in await conn.fetch(q("reply_claims_received_on"), inbound_wamid)}


async def recipient_matches(
    conn: Conn, *, inbound_wamid: str, recipient: str
) -> tuple[str | None, bool] | None:
    """(the number ``inbound_wamid`` came to, whether ``recipient`` (a phone number, BSUID or
    parent BSUID) is the customer who wrote it); None when the gateway does not know that
    message."""
    r = await conn.fetchrow(q("reply_recipient_matches"), inbound_wamid, recipient)
    return None if r is None else (r["phone_number_id"], bool(r["matches"]))

"""The providers' send endpoints: the request for one outbox row, and what its answer means.

Meta's Graph API (``POST /<phone_number_id>/messages``, ``biz_opaque_callback_data`` set to the
row's callback key) and Tenashi's API (``POST /api/v1/messages`` with the callback key as its
``Idempotency-Key`` and the body its documentation shows, ``{"to": "+<E.164>", "text": "..."}``:
Tenashi sends from the number linked to the token, so no number is named). Classification is
``gateway.core.classify``; this module does the I/O.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway.core import tenancy
from gateway.core.classify import Classified, SendOutcome, Transport, classify_response, classify_transport
from gateway.core.enums import Provider
from gateway.core.identity import recipient_field
from gateway.core.settings import Settings
from gateway.outbound.answers import read_answer


def build_request(settings: Settings, row: Any) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one send, for the row's provider."""
    payload = row["payload"]
    if row["provider"] == Provider.TENASHI:
        body = {"to": "+" + str(row["recipient"]).lstrip("+"), "text": tenashi_text(payload)}
        headers = {
            "Authorization": f"Bearer {settings.tenashi_token}",
            # The key makes a retry of an ambiguous send safe: Tenashi replays, it does not resend.
            "Idempotency-Key": row["callback_data"],
            "Content-Type": "application/json",
        }
        return f"{settings.tenashi_url}/api/v1/messages", headers, orjson.dumps(body)
    # A phone number goes in "to", a BSUID or parent BSUID in "recipient" (Meta's 2026 API).
    body = {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        recipient_field(row["recipient"]): row["recipient"],
        **payload,
        "biz_opaque_callback_data": row["callback_data"],
    }
    token = tenancy.graph_token_for(settings, row["phone_number_id"])
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return f"{settings.graph_url}/{row['phone_number_id']}/messages", headers, orjson.dumps(body)


def tenashi_text(payload: Any) -> str:
    """The text of a text message, the one kind Tenashi's documented API sends; ValueError for
    anything else (the send API refuses other types for Tenashi tenants)."""
    text = payload.get("text") if isinstance(payload, dict) and payload.get("type") == "text" else None
    body = text.get("body") if isinstance(text, dict) else None
    if not isinstance(body, str) or not body:
        raise ValueError("Tenashi sends text messages only")
    return body


def client_timeout(settings: Settings) -> aiohttp.ClientTimeout:
    """sock_connect bounds "never reached"; sock_read bounds the wait for an answer; total is a
    backstop against a trickling answer (and, with a minute's slack, the ``sending`` lease)."""
    connect_s = settings.send_connect_timeout_ms / 1000
    read_s = settings.send_read_timeout_ms / 1000
    return aiohttp.ClientTimeout(total=connect_s + 2 * read_s, sock_connect=connect_s, sock_read=read_s)


async def send(session: aiohttp.ClientSession, settings: Settings, row: Any) -> Classified:
    """POST one row to its provider and classify the outcome; never raises for the network."""
    try:
        url, headers, body = build_request(settings, row)
    except ValueError as exc:
        # Nothing to send that the provider would take: refused here, nothing sent.
        return Classified(SendOutcome.FAILED, error=str(exc), reached=False)
    provider = row["provider"]
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            # An answer past the bound is no answer: as one that is not JSON, the HTTP status
            # decides (a 2xx without a message id is unknown, reconciled by its statuses).
            raw = await read_answer(resp) or b""
            status = resp.status
    except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError):
        return classify_transport(Transport.CONNECT_FAILED, provider)
    except (aiohttp.ServerTimeoutError, TimeoutError):
        return classify_transport(Transport.READ_TIMEOUT, provider)
    except aiohttp.ClientError:
        # The request may have been written: disconnects, resets, truncated answers.
        return classify_transport(Transport.CONNECTION_LOST, provider)
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = None
    return classify_response(provider, status, parsed)

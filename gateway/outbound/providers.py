"""The providers' send endpoints: the request for one outbox row, and what its answer means.

Meta's Graph API (``POST /<phone_number_id>/messages``, ``biz_opaque_callback_data`` set to the
row's callback key) and Tenashi's API (``POST /api/v1/messages`` with the callback key as its
``Idempotency-Key``). Classification is ``gateway.core.classify``; this module does the I/O.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway.core.classify import Classified, Transport, classify_response, classify_transport
from gateway.core.enums import Provider
from gateway.core.identity import recipient_field
from gateway.core.settings import Settings


def build_request(settings: Settings, row: Any) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one send, for the row's provider."""
    payload = row["payload"]
    if row["provider"] == Provider.TENASHI:
        body = {"to": row["recipient"], "phone_number_id": row["phone_number_id"], "message": payload}
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
    token = settings.graph_token_for(row["phone_number_id"])
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return f"{settings.graph_url}/{row['phone_number_id']}/messages", headers, orjson.dumps(body)


def client_timeout(settings: Settings) -> aiohttp.ClientTimeout:
    """sock_connect bounds "never reached"; sock_read bounds the wait for an answer; total is a
    backstop against a trickling answer (and, with a minute's slack, the ``sending`` lease)."""
    connect_s = settings.send_connect_timeout_ms / 1000
    read_s = settings.send_read_timeout_ms / 1000
    return aiohttp.ClientTimeout(total=connect_s + 2 * read_s, sock_connect=connect_s, sock_read=read_s)


async def send(session: aiohttp.ClientSession, settings: Settings, row: Any) -> Classified:
    """POST one row to its provider and classify the outcome; never raises for the network."""
    url, headers, body = build_request(settings, row)
    provider = row["provider"]
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            raw = await resp.read()
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

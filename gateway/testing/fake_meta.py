"""The fake's Graph API: ``POST /<version>/<phone_number_id>/messages`` as Meta answers it, and
the signed status webhooks Meta posts back."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from typing import Any

import orjson
from aiohttp import web

from gateway.core.signature import sign_meta
from gateway.testing import payloads
from gateway.testing.fake_faults import drop
from gateway.testing.fake_hub import Hub, Received, Webhook

# HTTP status Meta answers with per error code (our reading of the docs; the gateway
# classifies by code, never by status).
META_ERRORS: dict[int, tuple[int, str, str]] = {
    2: (503, "OAuthException", "Service temporarily unavailable"),
    4: (400, "OAuthException", "Application request limit reached"),
    100: (400, "OAuthException", "Invalid parameter"),
    190: (401, "OAuthException", "Access token has expired"),
    368: (403, "OAuthException", "Temporarily blocked for policies violations"),
    80007: (400, "OAuthException", "Rate limit issues"),
    130429: (400, "OAuthException", "Rate limit hit"),
    131000: (500, "OAuthException", "Something went wrong"),
    131016: (503, "OAuthException", "Service unavailable"),
    131026: (400, "OAuthException", "Message undeliverable"),
    131047: (400, "OAuthException", "Re-engagement message"),
    131048: (400, "OAuthException", "Spam rate limit hit"),
    131049: (400, "OAuthException", "Meta chose not to deliver"),
    131050: (400, "OAuthException", "User has stopped marketing messages"),
    131056: (400, "OAuthException", "(Business Account, Consumer Account) pair rate limit hit"),
    131057: (500, "OAuthException", "Account in maintenance mode"),
    133004: (503, "OAuthException", "Server temporarily unavailable"),
    133010: (400, "OAuthException", "Phone number not registered"),
}


def meta_error_body(code: int, subcode: int | None = None) -> tuple[int, bytes]:
    status, typ, message = META_ERRORS.get(code, (400, "OAuthException", "Error"))
    err: dict[str, Any] = {
        "message": f"(#{code}) {message}",
        "type": typ,
        "code": code,
        "error_data": {"messaging_product": "whatsapp", "details": message},
        "fbtrace_id": "A" + secrets.token_hex(11),
    }
    if subcode is not None:
        err["error_subcode"] = subcode
    return status, orjson.dumps({"error": err})


def meta_error(code: int, subcode: int | None = None) -> web.Response:
    status, body = meta_error_body(code, subcode)
    return web.Response(body=body, status=status, content_type="application/json")


class MetaGraph:
    """The Graph API part of the fake."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/{version}/{phone_number_id}/messages", self.send)]

    def authorized(self, request: web.Request) -> bool:
        token = request.headers.get("Authorization", "")
        want = self.hub.config.graph_token
        return token.startswith("Bearer ") and (
            not want or hmac.compare_digest(token[7:].encode(), want.encode())
        )

    async def send(self, request: web.Request) -> web.Response:
        hub = self.hub
        hub.requests += 1
        if not self.authorized(request):
            return meta_error(190)
        try:
            msg = orjson.loads(await request.read())
            to = msg["to"]
            if msg.get("messaging_product") != "whatsapp" or not isinstance(to, str) or "type" not in msg:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return meta_error(100)
        number = request.match_info["phone_number_id"]
        fault = hub.take_fault(to)
        if fault is not None:
            if fault.action == "latency":
                await asyncio.sleep(fault.latency_ms / 1000)
            elif fault.action == "http":
                return web.Response(status=fault.status, text="upstream error")
            elif fault.action == "error":
                return meta_error(fault.code, fault.subcode)
            elif fault.action == "drop":
                return drop(request)
        wamid = hub.next_id(to)
        callback = msg.get("biz_opaque_callback_data")
        message = {k: v for k, v in msg.items() if k not in ("to", "messaging_product", "recipient_type")}
        hub.received.append(Received("meta", number, to, message, wamid, callback, time.time()))
        hub.post(self._statuses(number, to, wamid, callback, None if fault is None else fault.failed_code))
        if fault is not None and fault.action == "hang":
            await hub.hang(fault)
        body = orjson.dumps(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": wamid}],
            }
        )
        return web.Response(body=body, content_type="application/json")

    def _statuses(
        self, number: str, to: str, wamid: str, callback: str | None, failed_code: int | None
    ) -> list[Webhook]:
        events = []
        for status in self.hub.status_list(failed_code):
            st: dict[str, Any] = {
                "id": wamid,
                "status": status,
                "timestamp": str(int(time.time())),
                "recipient_id": to,
            }
            if callback is not None:
                st["biz_opaque_callback_data"] = callback
            if status == "failed" and failed_code is not None:
                _s, _t, title = META_ERRORS.get(failed_code, (400, "", "Error"))
                st["errors"] = [
                    {"code": failed_code, "title": title, "message": title, "error_data": {"details": title}}
                ]
            elif status != "failed":
                st["conversation"] = {"id": secrets.token_hex(16), "origin": {"type": "utility"}}
                st["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "utility"}
            value = payloads.meta_value(statuses=[st], phone_number_id=number, display="15550000000")
            events.append(self.webhook(payloads.meta_envelope([("fake-waba", [("messages", value)])])))
        return events

    def webhook(self, payload: dict[str, Any]) -> Webhook:
        """A Meta webhook POST of ``payload``, signed over exactly the bytes sent (Meta escapes
        non-ASCII)."""
        body = payloads.meta_bytes(payload)
        headers = {"Content-Type": "application/json"}
        if self.hub.config.app_secret:
            headers["X-Hub-Signature-256"] = sign_meta(body, self.hub.config.app_secret)
        return ("/webhooks/meta", body, headers)

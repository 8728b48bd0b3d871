"""The fake's Graph API: ``POST /<version>/<phone_number_id>/messages`` as Meta answers it, and
the signed status webhooks Meta posts back."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import BodyPartReader, web

from gateway.core.messages import MESSAGE_TYPES
from gateway.core.signature import sign_meta
from gateway.testing import fake_faults, payloads
from gateway.testing.fake_faults import drop
from gateway.testing.fake_hub import Hub, ReadReceipt, Received, Webhook

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


# The Graph API's version segment (v21.0, v23.0, ...).
_VERSION = "{version:v[0-9]+[.][0-9]+}"
# Request fields that address the message rather than make it.
_ENVELOPE = ("to", "recipient", "messaging_product", "recipient_type")


def _address(msg: dict[str, Any]) -> tuple[str, str]:
    """The address of a send and the field that named it; with both, ``to`` wins (as at Meta)."""
    for field in ("to", "recipient"):
        value = msg.get(field)
        if isinstance(value, str) and value:
            return value, field
    raise ValueError("neither to nor recipient")


@dataclass(frozen=True, slots=True)
class Sent:
    """One accepted send, as its status webhooks need it."""

    number: str
    to: str
    field: str
    wamid: str
    callback: str | None


class MetaGraph:
    """The Graph API part of the fake."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"/{_VERSION}/{{phone_number_id}}/messages", self.send),
            web.post(f"/{_VERSION}/{{phone_number_id}}/media", self.upload),
            web.get(f"/{_VERSION}/{{media_id}}", self.media_url),
            web.get("/_fake/media/{media_id}", self.download),
            # A media host that redirects elsewhere (the gateway must not follow it).
            web.get("/_fake/redirect", self.redirect),
        ]

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query.get("to", "http://169.254.169.254/latest/meta-data/"))

    # -- media (Meta's "Media" reference: upload, URL lookup, download) ----------------------

    async def upload(self, request: web.Request) -> web.Response:
        number = request.match_info["phone_number_id"]
        if not self.authorized(request, number):
            return meta_error(190)
        fields: dict[str, Any] = {}
        async for part in await request.multipart():
            if isinstance(part, BodyPartReader) and part.name:
                data = await part.read()
                fields[part.name] = (data, part.headers.get("Content-Type", ""))
        if "file" not in fields or fields.get("messaging_product", (b"",))[0] != b"whatsapp":
            return meta_error(100)
        data, mime = fields["file"]
        return web.json_response({"id": self.hub.add_media(bytes(data), mime, number)})

    async def media_url(self, request: web.Request) -> web.StreamResponse:
        media_id = request.match_info["media_id"]
        stored = self.hub.media.get(media_id)
        if stored is None:
            return meta_error(100)
        if not self.authorized(request, stored.phone_number_id):
            return meta_error(190)
        base = f"{request.scheme}://{request.host}"
        found = {
            "messaging_product": "whatsapp",
            "url": self.hub.config.media_url or f"{base}/_fake/media/{media_id}",
            "mime_type": stored.mime_type,
            "sha256": hashlib.sha256(stored.data).hexdigest(),
            "file_size": stored.declared_size if stored.declared_size is not None else len(stored.data),
            "id": media_id,
        }
        # A rule for the media id as its ``to`` shapes this answer (split, oversize).
        return await fake_faults.answer(request, self.hub.take_fault(media_id), orjson.dumps(found))

    async def download(self, request: web.Request) -> web.StreamResponse:
        stored = self.hub.media.get(request.match_info["media_id"])
        if stored is None:
            return web.Response(status=404)
        if not self.authorized(request, stored.phone_number_id):
            return web.Response(status=401)
        out = web.StreamResponse(headers={"Content-Type": stored.mime_type})
        out.content_length = stored.declared_size if stored.declared_size is not None else len(stored.data)
        await out.prepare(request)
        for i in range(0, len(stored.data), 16 * 1024):
            if stored.chunk_delay_ms:
                await asyncio.sleep(stored.chunk_delay_ms / 1000)
            await out.write(stored.data[i : i + 16 * 1024])
        if stored.declared_size is not None and stored.declared_size != len(stored.data):
            if request.transport is not None:
                request.transport.abort()  # the announced size never comes
            return out
        await out.write_eof()
        return out

    def authorized(self, request: web.Request, number: str | None = None) -> bool:
        """The bearer token is the number's own (``number_tokens``), else the configured one (any,
        when none is configured)."""
        token = request.headers.get("Authorization", "")
        want = self.hub.config.number_tokens.get(number or "") or self.hub.config.graph_token
        return token.startswith("Bearer ") and (
            not want or hmac.compare_digest(token[7:].encode(), want.encode())
        )

    async def send(self, request: web.Request) -> web.StreamResponse:
        hub = self.hub
        hub.requests += 1
        if not self.authorized(request, request.match_info["phone_number_id"]):
            return meta_error(190)
        number = request.match_info["phone_number_id"]
        try:
            msg = orjson.loads(await request.read())
            if msg.get("messaging_product") != "whatsapp":
                raise ValueError
            if msg.get("status") == "read":
                return self._read(number, msg)
            to, field = _address(msg)
            kind = msg.get("type")
            # Meta refuses a type it does not know, or one whose object is missing.
            if kind not in MESSAGE_TYPES or not isinstance(msg.get(kind), dict | list):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            return meta_error(100)
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
        message = {k: v for k, v in msg.items() if k not in _ENVELOPE}
        token = request.headers["Authorization"][7:]
        hub.received.append(Received("meta", number, to, message, wamid, callback, time.time(), field, token))
        sent = Sent(number, to, field, wamid, callback)
        hub.post(self._statuses(sent, None if fault is None else fault.failed_code))
        if fault is not None and fault.action == "hang":
            await hub.hang(fault)
        customer = hub.customer(to)
        # Meta answers with whom it resolved the address to: the phone number, or the BSUID.
        contact = {"input": to, "wa_id": to} if field == "to" else {"input": to, "user_id": customer.user_id}
        body = orjson.dumps(
            {"messaging_product": "whatsapp", "contacts": [contact], "messages": [{"id": wamid}]}
        )
        return await fake_faults.answer(request, fault, body)

    def _read(self, number: str, msg: dict[str, Any]) -> web.Response:
        """Mark as read (with the typing indicator when asked): Meta answers success."""
        message_id = msg.get("message_id")
        typing = msg.get("typing_indicator")
        if not isinstance(message_id, str) or (typing is not None and typing != {"type": "text"}):
            return meta_error(100)
        self.hub.read_receipts.append(ReadReceipt(number, message_id, typing is not None))
        return web.json_response({"success": True})

    def _statuses(self, sent: Sent, failed_code: int | None) -> list[Webhook]:
        """Meta's status webhooks of one send, with the 2026 identity fields: the recipient's
        BSUID always, its phone number when the send named one or Meta may share it, the
        username on delivered and read; no contacts on ``failed`` (nor the BSUID, when the send
        named a phone number)."""
        customer = self.hub.customer(sent.to)
        events = []
        for status in self.hub.status_list(failed_code):
            failed = status == "failed"
            st: dict[str, Any] = {"id": sent.wamid, "status": status, "timestamp": str(int(time.time()))}
            if sent.field == "to":
                st["recipient_id"] = sent.to
            elif customer.wa_id and customer.share_phone:
                st["recipient_id"] = customer.wa_id
            if not (failed and sent.field == "to"):
                st["recipient_user_id"] = customer.user_id
                if customer.parent_user_id:
                    st["recipient_parent_user_id"] = customer.parent_user_id
            if sent.callback is not None:
                st["biz_opaque_callback_data"] = sent.callback
            if failed and failed_code is not None:
                _s, _t, title = META_ERRORS.get(failed_code, (400, "", "Error"))
                st["errors"] = [
                    {"code": failed_code, "title": title, "message": title, "error_data": {"details": title}}
                ]
            elif not failed:
                st["conversation"] = {"id": secrets.token_hex(16), "origin": {"type": "utility"}}
                st["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "utility"}
            contacts = None if failed else [customer.contact(with_username=status in ("delivered", "read"))]
            value = payloads.meta_value(
                statuses=[st], contacts=contacts, phone_number_id=sent.number, display="15550000000"
            )
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

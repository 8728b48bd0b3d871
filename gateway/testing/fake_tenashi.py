"""The fake's Tenashi API: ``POST /api/v1/messages`` with an Idempotency-Key honoured for 24 h
(a repeat replays the first answer and sends nothing), and its signed status webhooks."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from gateway.core.signature import sign_tenashi
from gateway.testing.fake_faults import drop
from gateway.testing.fake_hub import Hub, Received, Webhook

TENASHI_REPLAY_S = 24 * 3600


@dataclass
class _Key:
    fingerprint: str
    state: str  # in_progress | done
    status: int = 0
    body: bytes = b""
    at: float = field(default_factory=time.monotonic)


class TenashiApi:
    """The Tenashi part of the fake."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.keys: dict[str, _Key] = {}

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/api/v1/messages", self.send)]

    def reset(self) -> None:
        self.keys.clear()

    async def send(self, request: web.Request) -> web.Response:
        hub = self.hub
        hub.requests += 1
        token = request.headers.get("Authorization", "")
        want = hub.config.tenashi_token
        if not token.startswith("Bearer ") or (
            want and not hmac.compare_digest(token[7:].encode(), want.encode())
        ):
            return web.json_response({"error": {"code": "unauthorized"}}, status=401)
        key = request.headers.get("Idempotency-Key")
        if not key or len(key) > 255:
            return web.json_response({"error": {"code": "idempotency_key_required"}}, status=400)
        raw = await request.read()
        try:
            # The documented body: {"to": "+<E.164>", "text": "..."} (the number is the token's).
            msg = orjson.loads(raw)
            to, text = msg["to"], msg["text"]
            if set(msg) != {"to", "text"} or not isinstance(to, str) or not to.startswith("+"):
                raise ValueError
            if not isinstance(text, str) or not text:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": {"code": "invalid_request"}}, status=400)
        to, number, message = to[1:], "", {"type": "text", "text": {"body": text}}
        fp = hashlib.sha256(raw).hexdigest()
        now = time.monotonic()
        held = self.keys.get(key)
        if held is not None and now - held.at < TENASHI_REPLAY_S:
            if held.fingerprint != fp:
                return web.json_response({"error": {"code": "idempotency_key_reused"}}, status=422)
            if held.state == "in_progress":
                return web.json_response({"error": {"code": "idempotency_in_progress"}}, status=409)
            return web.Response(
                body=held.body,
                status=held.status,
                content_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        entry = self.keys[key] = _Key(fp, "in_progress", at=now)
        fault = hub.take_fault(to)
        if fault is not None:
            if fault.action == "latency":
                await asyncio.sleep(fault.latency_ms / 1000)
            elif fault.action in ("http", "error", "drop"):
                # Not stored: Tenashi says to retry server errors with the same key.
                del self.keys[key]
                if fault.action == "drop":
                    return drop(request)
                status = fault.status if fault.action == "http" else 400
                return web.json_response({"error": {"code": f"error_{fault.code}"}}, status=status)
        msg_id = "msg_" + secrets.token_hex(12)
        hub.received.append(Received("tenashi", str(number), to, message, msg_id, key, time.time()))
        entry.state, entry.status = "done", 202
        entry.body = orjson.dumps({"id": msg_id, "status": "accepted"})
        hub.post(self._statuses(to, msg_id, key, None if fault is None else fault.failed_code))
        if fault is not None and fault.action == "hang":
            await hub.hang(fault)
        return web.Response(body=entry.body, status=202, content_type="application/json")

    def _statuses(self, to: str, msg_id: str, key: str, failed_code: int | None) -> list[Webhook]:
        events = []
        for status in self.hub.status_list(failed_code):
            evt_id = "evt_" + secrets.token_hex(12)
            errors = [{"code": failed_code}] if status == "failed" else []
            body = orjson.dumps(
                {
                    "id": evt_id,
                    "type": "message.status",
                    "created": int(time.time()),
                    "data": {
                        "message_id": msg_id,
                        "status": status,
                        "idempotency_key": key,
                        "recipient": to,
                        "errors": errors,
                    },
                }
            )
            headers = {"Content-Type": "application/json", "X-Tenashi-Delivery": evt_id}
            if self.hub.config.tenashi_secret:
                headers["X-Tenashi-Signature"] = sign_tenashi(body, self.hub.config.tenashi_secret)
            events.append(("/webhooks/tenashi", body, headers))
        return events

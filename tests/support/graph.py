"""Helpers for the Graph-compatible endpoint's tests: Meta's text body, a POST as a bot sends
it, and settings with a sender and no pacing wait."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.testing.fake_provider import FakeProvider
from tests.support.send import send_settings

ACME = {"Authorization": "Bearer acme-api-key-0123456789"}
GLOBEX = {"Authorization": "Bearer globex-api-key-0123456789"}
TO = "4915112345678"


def text(to: str = TO, body: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to, "type": "text",
            "text": {"body": body}, **extra}  # fmt: skip


async def post(
    http: ClientSession,
    base: Any,
    body: Any,
    *,
    path: str = "/v23.0/1111/messages",
    auth: dict[str, str] = ACME,
    key: str | None = None,
) -> tuple[int, dict[str, str], Any]:
    headers = dict(auth)
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(base.make_url(path), data=data, headers=headers) as r:
        raw = await r.read()
        return r.status, dict(r.headers), orjson.loads(raw) if raw else None


def graph(settings: Settings, fake: FakeProvider, **changes: Any) -> Settings:
    base: dict[str, Any] = {"pair_interval_s": 0.0, "run_sender": True, "graph_compat_wait_ms": 3000}
    base.update(changes)
    return send_settings(settings, fake, **base)

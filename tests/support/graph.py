"""Helpers for the Graph-compatible endpoint's tests: Meta's text body, a POST as a bot sends
it, and settings with a sender and no pacing wait."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientSession

from gateway.core.settings import Settings
from gateway.testing.fake_provider import FakeProvider
from tests.support.http import ACME, post_message_json
from tests.support.send import send_settings

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
    return await post_message_json(http, base, body, key, auth, path=path)


def graph(settings: Settings, fake: FakeProvider, **changes: Any) -> Settings:
    base: dict[str, Any] = {"pair_interval_s": 0.0, "run_sender": True, "graph_compat_wait_ms": 3000}
    base.update(changes)
    return send_settings(settings, fake, **base)

"""HTTP as the tests speak it: the tenants' API keys as headers, a POST to the send API
(``/v1/messages``) or of a signed Meta webhook (``/webhooks/meta``), and a small server that
records the POSTs it gets (a stand-in for a peer whose requests a test wants to read)."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson
from aiohttp import ClientSession, web
from yarl import URL

from gateway.core.signature import sign_meta
from tests.support.config import API_KEYS, META_SECRET


def bearer(tenant: str) -> dict[str, str]:
    """The ``Authorization`` header of ``tenant``'s API key (GATEWAY_API_KEYS of the test settings)."""
    return {"Authorization": f"Bearer {dict(API_KEYS)[tenant]}"}


ACME = bearer("acme")
GLOBEX = bearer("globex")


class Server(Protocol):
    """A started gateway: aiohttp's TestServer, or gateway.web.server's Listening."""

    def make_url(self, path: str) -> URL: ...


def url(base: Server | str, path: str) -> str:
    """``path`` on a started gateway, or on a base URL (``http://host:port``)."""
    return f"{base}{path}" if isinstance(base, str) else str(base.make_url(path))


async def post_message(
    http: ClientSession,
    base: Server | str,
    body: Any,
    key: str | None = "k1",
    auth: dict[str, str] = ACME,
    *,
    path: str = "/v1/messages",
) -> tuple[int, dict[str, str], bytes]:
    """A send as a tenant makes it (``body``: bytes as they are, else JSON), with
    ``Idempotency-Key: key`` unless None: (status, headers, the answer's bytes)."""
    headers = dict(auth)
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(url(base, path), data=data, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def post_message_json(
    http: ClientSession,
    base: Server | str,
    body: Any,
    key: str | None = "k1",
    auth: dict[str, str] = ACME,
    *,
    path: str = "/v1/messages",
) -> tuple[int, dict[str, str], Any]:
    """``post_message`` with the answer parsed (None when it is empty)."""
    status, headers, raw = await post_message(http, base, body, key, auth, path=path)
    return status, headers, orjson.loads(raw) if raw else None


class _Signed(enum.Enum):
    SIGNED = "signed"


SIGNED = _Signed.SIGNED


async def post_meta(
    http: ClientSession,
    base: Server | str,
    body: bytes,
    signature: str | Literal[_Signed.SIGNED] | None = SIGNED,
) -> tuple[int, str]:
    """A webhook as Meta posts it, signed with the test settings' app secret unless
    ``signature`` says otherwise (None: no signature header): (status, the answer's text)."""
    headers = {"Content-Type": "application/json"}
    if signature is SIGNED:
        headers["X-Hub-Signature-256"] = sign_meta(body, META_SECRET)
    elif signature is not None:
        headers["X-Hub-Signature-256"] = signature
    async with http.post(url(base, "/webhooks/meta"), data=body, headers=headers) as r:
        return r.status, await r.text()


@dataclass(frozen=True, slots=True)
class Posted:
    path: str  # with its query string
    headers: dict[str, str]
    body: bytes


@contextlib.asynccontextmanager
async def recorder(
    answer: Callable[[], web.Response], path: str = "/{tail:.*}"
) -> AsyncIterator[tuple[str, list[Posted]]]:
    """A server on 127.0.0.1 for the block: its base URL, and the POSTs to ``path`` so far."""
    seen: list[Posted] = []

    async def keep(request: web.Request) -> web.Response:
        seen.append(Posted(request.path_qs, dict(request.headers), await request.read()))
        return answer()

    app = web.Application()
    app.router.add_post(path, keep)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()

"""Calls to the Graph API outside the outbox: read receipts and media, with the number's token.

A read receipt is ``POST /<phone_number_id>/messages`` with ``{"status": "read", "message_id":
..., "typing_indicator": {"type": "text"}}`` (Meta's "Mark messages as read" guide); marking a
message read twice is harmless, so it is sent at once rather than queued. Media: ``GET
/<media_id>`` answers a short-lived download URL (``gateway.core.media`` says which URLs may be
fetched), ``POST /<phone_number_id>/media`` uploads a file (multipart, ``messaging_product``,
``type``, ``file``) and answers its id.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

import aiohttp
import orjson

from gateway.core import tenancy
from gateway.core.media import Target, download_target
from gateway.core.settings import Settings
from gateway.outbound.answers import read_answer
from gateway.outbound.egress import GuardedResolver


class GraphError(Exception):
    """Graph refused, or could not be reached (``status`` 0), or answered nonsense."""

    def __init__(self, status: int, detail: str, code: int | None = None) -> None:
        self.status = status
        self.code = code
        super().__init__(detail)


@dataclass(frozen=True, slots=True)
class MediaInfo:
    target: Target
    mime_type: str | None
    file_size: int | None


def _error(status: int, raw: bytes) -> GraphError:
    """Meta's error object, ``{"error": {"code", "message", ...}}``, as a GraphError."""
    try:
        err = orjson.loads(raw).get("error") if raw else None
    except (orjson.JSONDecodeError, AttributeError):
        err = None
    if isinstance(err, dict):
        code = err.get("code") if isinstance(err.get("code"), int) else None
        message = str(err.get("message") or "")[:300]
        return GraphError(status, f"Graph API error {code}: {message}", code)
    return GraphError(status, f"Graph API answered HTTP {status}")


class Graph:
    """One client for the gateway's direct Graph calls; ``close()`` when the app stops."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        connect_s = settings.send_connect_timeout_ms / 1000
        read_s = settings.send_read_timeout_ms / 1000
        self.timeout = aiohttp.ClientTimeout(
            total=connect_s + 2 * read_s, sock_connect=connect_s, sock_read=read_s
        )
        self.media_timeout = aiohttp.ClientTimeout(
            total=settings.media_timeout_s, sock_connect=connect_s, sock_read=read_s
        )
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    def _session(self, trusted: bool = True) -> aiohttp.ClientSession:
        """Sessions to the configured Graph host, and, with the private-address guard, to
        Meta's media hosts."""
        if trusted not in self._sessions:
            connector = aiohttp.TCPConnector(limit=64, resolver=None if trusted else GuardedResolver())
            self._sessions[trusted] = aiohttp.ClientSession(connector=connector)
        return self._sessions[trusted]

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    def _auth(self, phone_number_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {tenancy.graph_token_for(self.settings, phone_number_id)}"}

    async def _json(
        self,
        method: str,
        url: str,
        phone_number_id: str,
        *,
        body: dict[str, Any] | None = None,
        form: aiohttp.FormData | None = None,
        params: dict[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> Any:
        """One Graph call with the number's token; its JSON answer, or GraphError."""
        headers = self._auth(phone_number_id)
        data: Any = form
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = orjson.dumps(body)
        try:
            async with self._session().request(
                method, url, headers=headers, data=data, params=params, timeout=timeout or self.timeout
            ) as resp:
                raw = await read_answer(resp)
                if resp.status >= 300:
                    raise _error(resp.status, raw or b"")
                if raw is None:
                    raise GraphError(502, "Graph API answered more than it ever does")
        except aiohttp.ClientError as exc:
            raise GraphError(0, f"Graph API not reached: {type(exc).__name__}") from exc
        except TimeoutError as exc:
            raise GraphError(0, "Graph API did not answer in time") from exc
        try:
            return orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            raise GraphError(502, "Graph API answered something that is not JSON") from None

    async def mark_read(self, phone_number_id: str, wamid: str, *, typing: bool) -> None:
        body: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read", "message_id": wamid}
        if typing:
            body["typing_indicator"] = {"type": "text"}
        await self._json(
            "POST", f"{self.settings.graph_url}/{phone_number_id}/messages", phone_number_id, body=body
        )

    async def media_object(self, media_id: str, phone_number_id: str) -> dict[str, Any]:
        """Meta's media object: ``url`` (expires within minutes), ``mime_type``, ``sha256``, ..."""
        url = f"{self.settings.graph_url}/{media_id}"
        info = await self._json("GET", url, phone_number_id, params={"phone_number_id": phone_number_id})
        if not isinstance(info, dict):
            raise GraphError(502, "Graph API answered no media object")
        return info

    async def media_info(self, media_id: str, phone_number_id: str) -> MediaInfo:
        """Where to download a media file from (a URL that expires within minutes)."""
        info = await self.media_object(media_id, phone_number_id)
        target = download_target(info.get("url"), self.settings.graph_url)
        if isinstance(target, str):
            raise GraphError(502, target)
        size = str(info.get("file_size"))
        mime = info.get("mime_type")
        return MediaInfo(
            target,
            mime if isinstance(mime, str) else None,
            int(size) if size.isascii() and size.isdigit() else None,
        )

    @contextlib.asynccontextmanager
    async def download(self, info: MediaInfo, phone_number_id: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """The open download response (status checked, redirects refused)."""
        try:
            async with self._session(info.target.trusted).get(
                info.target.url,
                headers=self._auth(phone_number_id),
                timeout=self.media_timeout,
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    raise _error(resp.status, await read_answer(resp) or b"")
                yield resp
        except aiohttp.ClientError as exc:
            raise GraphError(0, f"media host not reached: {type(exc).__name__}") from exc

    async def upload(self, phone_number_id: str, *, file: IO[bytes], filename: str, mime_type: str) -> str:
        """Upload a file for ``phone_number_id``; Meta's media id."""
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime_type)
        form.add_field("file", file, filename=filename, content_type=mime_type)
        url = f"{self.settings.graph_url}/{phone_number_id}/media"
        found = await self._json("POST", url, phone_number_id, form=form, timeout=self.media_timeout)
        media_id = found.get("id") if isinstance(found, dict) else None
        if not isinstance(media_id, str) or not media_id:
            raise GraphError(502, "Graph API answered no media id")
        return media_id

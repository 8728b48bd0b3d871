"""The send API's direct Graph calls: ``POST /v1/messages/read`` (a read receipt, optionally with
the typing indicator), ``GET /v1/media/{media_id}`` (stream an inbound or uploaded file) and
``POST /v1/media`` (upload a file for a number, answering Meta's media id).

A tenant reaches only media and messages of the numbers bound to it (GATEWAY_TENANT_NUMBERS);
anything else is 404, whether it exists or not. Downloads stream: at most
``GATEWAY_MEDIA_MAX_BYTES`` pass, in chunks, within ``GATEWAY_MEDIA_TIMEOUT_S``; a transfer that
breaks after its first byte is cut off (the client sees a short body, never a complete-looking
wrong one).
"""

from __future__ import annotations

import logging
import re
import tempfile
from typing import Any

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.core import tenancy
from gateway.core.media import upload_limit
from gateway.core.settings import Settings
from gateway.httpkit import bearer_tenant, problem, unauthorized
from gateway.outbound.graph import Graph, GraphError
from gateway.outbound.send_api import openapi_bytes
from gateway.outbound.validation import BodyValidator
from gateway.store import media, replies
from gateway.store.database import Database
from gateway.store.db import DB_ERRORS

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
_MEDIA_ID = re.compile(r"[0-9A-Za-z_.:-]{1,128}")
_MIME = re.compile(r"[a-z0-9.+-]{1,40}/[a-z0-9.+-]{1,80}(; ?[a-z0-9._-]{1,40}=[a-z0-9._-]{1,80})?")
_FILENAME_MAX = 240
_OCTETS = "application/octet-stream"
# Kept in memory up to this size; a larger upload spills to a temporary file.
_SPOOL = 1024 * 1024


def _graph_problem(exc: GraphError) -> web.Response:
    """A Graph failure as the client's problem: Meta has no such media (404), Meta was not
    reached in time (504), or anything else Meta refused (502, with its code)."""
    if exc.status == 0:
        return problem(504 if "in time" in str(exc) else 502, "the Graph API was not reached", str(exc))
    if exc.status == 404 or exc.code == 100:
        return problem(404, "Meta has no such item", str(exc), code=exc.code)
    return problem(502, "the Graph API refused", str(exc), code=exc.code)


class MediaApi:
    """Routes that call the Graph API directly, on ``db`` (open while the app runs)."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.graph = Graph(settings)
        self.read_validator = BodyValidator(orjson.loads(openapi_bytes()), "ReadRequest")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages/read", self.post_read),
            web.get("/v1/media/{media_id}", self.get_media),
            web.post("/v1/media", self.post_media),
        ]

    async def close(self, _app: web.Application | None = None) -> None:
        await self.graph.close()

    def _allowed(self, tenant: str, number: str | None) -> bool:
        return number is not None and tenancy.may_send_from(self.settings, tenant, number)

    # -- read receipts ---------------------------------------------------------------------

    async def post_read(self, request: web.Request) -> web.Response:
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return problem(400, "body is not JSON")
        errors = self.read_validator.errors(body)
        if errors:
            return problem(400, "invalid request", "; ".join(errors), errors=errors)
        wamid = body["message_id"]
        try:
            async with self.db.pool.acquire() as conn:
                numbers = await replies.received_on(conn, inbound_wamid=wamid)
        except DB_ERRORS:
            return problem(503, "database unavailable, retry later", headers={"Retry-After": "5"})
        number = min((n for n in numbers if n is not None and self._allowed(tenant, n)), default=None)
        if number is None:
            return problem(404, "no inbound message with this id on your numbers")
        try:
            await self.graph.mark_read(number, wamid, typing="typing_indicator" in body)
        except GraphError as exc:
            return _graph_problem(exc)
        return web.json_response({"success": True})

    # -- media -----------------------------------------------------------------------------

    async def media_number(self, tenant: str, media_id: str) -> str | web.Response:
        """The number a media id belongs to, when the tenant may use it; else the 404 (or 503)."""
        if _MEDIA_ID.fullmatch(media_id) is None:
            return problem(404, "no media with this id")
        try:
            async with self.db.pool.acquire() as conn:
                row = await media.get(conn, media_id)
        except DB_ERRORS:
            return problem(503, "database unavailable, retry later", headers={"Retry-After": "5"})
        number = row["phone_number_id"] if row is not None else None
        if number is None or not self._allowed(tenant, number):
            return problem(404, "no media with this id")
        return str(number)

    async def media_object(self, tenant: str, media_id: str, url: str) -> web.Response:
        """Meta's media object (``GET /<media_id>``) with its ``url`` replaced by ``url``: the
        download goes through the gateway, with the number's token."""
        number = await self.media_number(tenant, media_id)
        if isinstance(number, web.Response):
            return number
        try:
            found = await self.graph.media_object(media_id, number)
        except GraphError as exc:
            return _graph_problem(exc)
        kept = {k: found[k] for k in ("messaging_product", "mime_type", "sha256", "file_size") if k in found}
        return web.json_response({**kept, "url": url, "id": media_id})

    async def get_media(self, request: web.Request) -> web.StreamResponse:
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        media_id = request.match_info["media_id"]
        number = await self.media_number(tenant, media_id)
        if isinstance(number, web.Response):
            return number
        limit = self.settings.media_max_bytes
        try:
            info = await self.graph.media_info(media_id, number)
            if info.file_size is not None and info.file_size > limit:
                return _too_large(limit)
            async with self.graph.download(info, number) as resp:
                if resp.content_length is not None and resp.content_length > limit:
                    return _too_large(limit)
                mime = info.mime_type or resp.headers.get("Content-Type") or ""
                return await self._stream(request, resp, mime if _MIME.fullmatch(mime) else _OCTETS)
        except GraphError as exc:
            return _graph_problem(exc)
        except TimeoutError:
            return problem(504, "the media host did not answer in time")

    async def _stream(self, request: web.Request, resp: Any, mime: str) -> web.StreamResponse:
        """Copy the download to the client chunk by chunk, within the size limit."""
        limit = self.settings.media_max_bytes
        out = web.StreamResponse(
            headers={
                "Content-Type": mime,
                "Content-Disposition": "attachment",
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "private, no-store",
            }
        )
        expected = resp.content_length
        if expected is not None:
            out.content_length = expected
        await out.prepare(request)
        sent = 0
        try:
            async for chunk in resp.content.iter_chunked(CHUNK):
                sent += len(chunk)
                if sent > limit:
                    raise _Cut(f"more than {limit} bytes")
                await out.write(chunk)
            if expected is not None and sent != expected:
                raise _Cut(f"{sent} of {expected} bytes")
        except Exception as exc:  # any break (a cut, a timeout, a lost host) cuts the answer off
            log.warning("media download cut off after %d bytes: %s", sent, type(exc).__name__)
            if request.transport is not None:
                request.transport.abort()
            return out
        await out.write_eof()
        return out

    async def post_media(self, request: web.Request) -> web.Response:
        tenant = bearer_tenant(self.settings.api_keys, request.headers.get("Authorization"))
        if tenant is None:
            return unauthorized()
        return await self.upload(request, tenant)

    async def upload(self, request: web.Request, tenant: str, number: str | None = None) -> web.Response:
        """Upload the multipart body's ``file`` for ``number`` (None: the body's
        ``phone_number_id`` field; the Graph-compatible path names it instead)."""
        from_path = number is not None
        if not request.content_type.startswith("multipart/form-data"):
            return problem(400, "invalid upload", "Send multipart/form-data with phone_number_id and file.")
        limit = self.settings.media_max_bytes
        upload: tuple[Any, str, str] | None = None
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as spool:
            try:
                reader = await request.multipart()
                async for part in reader:
                    if not isinstance(part, BodyPartReader):
                        continue
                    if part.name == "phone_number_id" and number is None and not from_path:
                        number = await _small(part, 65)
                    elif part.name == "file" and upload is None:
                        if not await _spool(part, spool, limit):
                            return _too_large(limit)
                        mime = (part.headers.get("Content-Type") or "").lower()
                        upload = (spool, part.filename or "file", mime)
                    else:
                        await part.release()
            except (ValueError, HttpProcessingError):
                return problem(400, "invalid upload", "The multipart body is malformed.")
            problems = _upload_problems(number, upload)
            if problems:
                return problem(400, "invalid upload", "; ".join(problems), errors=problems)
            assert number is not None and upload is not None
            if not tenancy.may_send_from(self.settings, tenant, number):
                return problem(403, "phone_number_id not allowed", "This tenant may not use this number.")
            file, filename, mime = upload
            size = file.tell()
            type_limit = upload_limit(mime) or 0
            if size > type_limit:
                return _too_large(type_limit, f"WhatsApp takes {mime} files up to {type_limit} bytes.")
            file.seek(0)
            try:
                media_id = await self.graph.upload(number, file=file, filename=filename, mime_type=mime)
            except GraphError as exc:
                return _graph_problem(exc)
        try:
            async with self.db.pool.acquire() as conn:
                await media.record_upload(
                    conn, media_id=media_id, phone_number_id=number, tenant=tenant, mime_type=mime
                )
        except DB_ERRORS:
            # Uploaded but not recorded: this tenant could not send or fetch it; say so.
            log.warning("uploaded media %s not recorded: database unavailable", media_id[:40])
            return problem(503, "uploaded, but not recorded: upload again", headers={"Retry-After": "5"})
        return web.json_response({"id": media_id})


class _Cut(Exception):
    pass


def _too_large(limit: int, detail: str | None = None) -> web.Response:
    return problem(413, "media too large", detail or f"At most {limit} bytes (GATEWAY_MEDIA_MAX_BYTES).")


async def _small(part: BodyPartReader, limit: int) -> str:
    """A short text field (at most ``limit`` bytes are kept; the rest is read and dropped)."""
    kept = b""
    while chunk := await part.read_chunk(CHUNK):
        kept = (kept + chunk)[:limit]
    return kept.decode("utf-8", "replace").strip()


async def _spool(part: BodyPartReader, spool: Any, limit: int) -> bool:
    """Copy a file part into ``spool``; False once it passes ``limit`` bytes."""
    size = 0
    while chunk := await part.read_chunk(CHUNK):
        size += len(chunk)
        if size > limit:
            return False
        spool.write(chunk)
    return True


def _upload_problems(number: str | None, upload: tuple[Any, str, str] | None) -> list[str]:
    out = []
    if not number or re.fullmatch(r"[0-9A-Za-z_-]{1,64}", number) is None:
        out.append("phone_number_id: required, the sending number's id")
    if upload is None:
        out.append("file: required")
    else:
        _file, filename, mime = upload
        if _MIME.fullmatch(mime) is None:
            out.append("file: needs its Content-Type (e.g. image/jpeg)")
        elif upload_limit(mime) is None:
            out.append(f"file: WhatsApp does not take {mime} files")
        if len(filename) > _FILENAME_MAX or any(ord(c) < 0x20 for c in filename):
            out.append(f"file: a filename of at most {_FILENAME_MAX} printable characters")
    return out

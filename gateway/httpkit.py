"""What every HTTP handler shares: RFC 9457 problem documents, bearer-key auth, and the
middleware that answers every error of the app (404, 405, 500, ...) as a problem document."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.typedefs import Handler

PROBLEM_JSON = "application/problem+json"
# Headers of an aiohttp HTTPException that describe its own (plain-text) body, not the error.
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})

log = logging.getLogger(__name__)


class ClosingResponse(web.Response):
    """An answer after which the connection is closed, given before the request's body was
    read whole (an early refusal).

    Closing a socket that still has unread bytes makes the kernel answer them with a reset, and
    a client still sending its body (most send all of it before they read) can then lose the
    answer. So the connection is half-closed right after the answer's last byte (the "lingering
    close" of RFC 9112, section 9.6): the client sees the answer and end-of-file at once, while
    aiohttp reads and discards what still comes for at most its ``lingering_time``
    (gateway.web.server.LINGER_S), then closes.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.force_close()
        self._closing: web.BaseRequest | None = None

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        self._closing = request
        return await super().prepare(request)

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(data)
        transport = self._closing.transport if self._closing is not None else None
        self._closing = None
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            transport.write_eof()


def problem(
    status: int,
    title: str,
    detail: str | None = None,
    headers: dict[str, str] | None = None,
    *,
    close: bool = False,
    **extra: Any,
) -> web.Response:
    """An RFC 9457 problem document; ``close``: a ``ClosingResponse``."""
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    cls = ClosingResponse if close else web.Response
    return cls(body=orjson.dumps(body), status=status, content_type=PROBLEM_JSON, headers=headers)


def bearer_tenant(api_keys: Iterable[tuple[str, str]], authorization: str | None) -> str | None:
    """The tenant whose key is the bearer token; every key is compared, in constant time."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    given = token.strip().encode()
    found: str | None = None
    for tenant, key in api_keys:
        if hmac.compare_digest(given, key.encode()) and found is None:
            found = tenant
    return found


def unauthorized() -> web.Response:
    return problem(401, "missing or invalid API key", headers={"WWW-Authenticate": 'Bearer realm="gateway"'})


@web.middleware
async def problem_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Routing errors and raised HTTP errors become problem documents; so does a crash (500).

    A handler's own answers pass through untouched: only what it (or the router) raises is
    rewritten, keeping its status and headers such as ``Allow`` on a 405. The gateway's access
    middleware calls it directly (one middleware layer less on every request).
    """
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are not errors
        return raised_problem(exc)
    except Exception:
        return crash_problem(request)


def raised_problem(exc: web.HTTPException) -> web.Response:
    """The problem document of a raised HTTP error (status >= 400), its headers kept."""
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
    return problem(exc.status, exc.reason, headers=headers)


def crash_problem(request: web.Request) -> web.Response:
    """A 500 for the exception being handled; its traceback goes to the log, not the client."""
    log.exception("unhandled error answering %s %s", request.method, request.rel_url.path)
    return problem(500, "internal server error")

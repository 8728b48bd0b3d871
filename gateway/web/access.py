"""Access log, request ids, send-API request metrics and problem answers for raised errors:
one middleware around every route.

Each webhook and API request gets one access-log line (logger ``gateway.access``) with its
request id (``X-Request-Id`` honoured when it is sane, generated otherwise, and echoed in the
response), source, outcome, status and latency. Above ``rate`` lines a second the lines are
sampled (a token bucket) so a flood cannot turn into a logging bottleneck; 5xx lines are always
written, and the next written line says how many were left out. The query string is never
logged (Meta's verification handshake carries its token there).
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import os
import re
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway import metrics, tracing
from gateway.httpkit import crash_problem, raised_problem

log = logging.getLogger("gateway.access")

# The current request's id, for every log line written while handling it.
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_SANE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_WEBHOOK_OUTCOME = {
    200: "stored",
    400: "aborted",
    401: "bad_signature",
    403: "refused",
    408: "slow",
    413: "too_large",
    415: "encoded",
    503: "unavailable",
}
MAX_PATH = 200


def source_of(path: str) -> str:
    """Who is calling, from the path: meta, tenashi, api or ops (health and metrics)."""
    if path.startswith("/webhooks/"):
        return "tenashi" if path.startswith("/webhooks/tenashi") else "meta"
    if path.startswith("/v1/"):
        return "api"
    return "ops"


def outcome_of(source: str, status: int, method: str = "POST") -> str:
    if source in ("meta", "tenashi") and method == "GET":  # Meta's subscription handshake
        return "verified" if status == 200 else "refused"
    if source in ("meta", "tenashi") and status in _WEBHOOK_OUTCOME:
        return _WEBHOOK_OUTCOME[status]
    if status < 400:
        return "ok"
    if status == 503:
        return "unavailable"
    return "rejected" if status < 500 else "error"


# Generated ids: a random per-process prefix and a counter (os.urandom per request is a
# system call on the ack path); unique across processes and restarts in practice.
_ID_PREFIX = os.urandom(4).hex()
_ids = itertools.count(1)


def request_id(given: str | None) -> str:
    if given is not None and _SANE_ID.fullmatch(given):
        return given
    return _new_id()


def _new_id() -> str:
    return f"{_ID_PREFIX}{next(_ids) & 0xFFFFFFFF:08x}"


class Sampler:
    """Token bucket: ``rate`` lines a second on average, bursts up to one second's worth."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = max(rate, 1.0)
        self.tokens = self.capacity
        self.clock = clock
        self.last = clock()
        self.dropped = 0

    def take(self, force: bool = False) -> int | None:
        """None: leave this line out; else the number of lines left out since the last one written."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0 or force:
            self.tokens = max(0.0, self.tokens - 1.0)
            dropped, self.dropped = self.dropped, 0
            return dropped
        self.dropped += 1
        return None


def _route(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info is not None else None
    return resource.canonical if resource is not None else "unmatched"


def middleware(rate: float) -> Middleware:
    """The middleware; ``rate`` is access-log lines a second before sampling (0: no access log).

    It also answers what a handler or the router raises as a problem document (as
    ``httpkit.problem_errors`` does), so that every request goes through one layer, not two.
    Untraced, it is one coroutine: a webhook waits for its commit inside it, and every frame
    between the handler and the event loop is suspended and resumed around that wait. With
    tracing on when the app is built (``tracing.configure`` first), a server span wraps it.
    """
    sampler = Sampler(rate) if rate > 0 else None

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("X-Request-Id")
        rid = given if given is not None and _SANE_ID.fullmatch(given) else _new_id()
        token = REQUEST_ID.set(rid)
        started = time.perf_counter()
        status = 500
        try:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                if exc.status < 400:  # redirects and the like are not errors
                    status = exc.status
                    exc.headers["X-Request-Id"] = rid
                    raise
                response = raised_problem(exc)
            except Exception:
                response = crash_problem(request)
            status = response.status
            response.headers["X-Request-Id"] = rid
            return response
        finally:
            REQUEST_ID.reset(token)
            _account(request, rid, status, time.perf_counter() - started, sampler)

    if not tracing.enabled:
        return access

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        with tracing.server_span(request.method, _route(request), request.headers) as span:
            status = 500
            try:
                response = await access(request, handler)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                if span is not None:  # None once tracing has been shut down
                    span.set_attribute("http.response.status_code", status)

    return traced


def _account(request: web.Request, rid: str, status: int, elapsed: float, sampler: Sampler | None) -> None:
    """Send-API metrics and the (sampled) access-log line of one finished request."""
    source = source_of(request.path)
    if source == "api":
        method = request.method if request.method in _METHODS else "other"
        route = _route(request)
        metrics.API_REQUESTS.labels(route, method, str(status)).inc()
        metrics.API_LATENCY.labels(route, method).observe(elapsed)
    if sampler is None or not log.isEnabledFor(logging.DEBUG if source == "ops" else logging.INFO):
        return  # no line would be written: nothing to sample or format
    dropped = sampler.take(force=status >= 500)
    if dropped is not None:
        _write(request, rid, source, status, elapsed, dropped)


def _write(request: web.Request, rid: str, source: str, status: int, elapsed: float, dropped: int) -> None:
    path = request.path[:MAX_PATH]
    outcome = outcome_of(source, status, request.method)
    ms = round(elapsed * 1000, 2)
    level = logging.DEBUG if source == "ops" else logging.INFO
    log.log(
        level,
        "%s %s %d %s %.2fms rid=%s%s",
        request.method[:10],
        path,
        status,
        outcome,
        ms,
        rid,
        f" (+{dropped} lines sampled out)" if dropped else "",
        extra={
            "request_id": rid,
            "source": source,
            "method": request.method[:10],
            "path": path,
            "status": status,
            "outcome": outcome,
            "latency_ms": ms,
            "sampled_out": dropped,
            "remote": request.remote,
        },
    )

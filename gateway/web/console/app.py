"""The operator console: a server-rendered aiohttp app on its own listener
(GATEWAY_CONSOLE_HOST:GATEWAY_CONSOLE_PORT), never on the public webhook port.

Templates are Jinja2 through aiohttp-jinja2, autoescaped: every value, a webhook's bytes
included, is rendered as text. Pages carry no script at all, and a strict
Content-Security-Policy says so to the browser; the one stylesheet is served from the
package. Its database pool is its own (a slow console query never takes a connection the
ingest path needs), with a statement timeout.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import AsyncIterator
from datetime import UTC
from pathlib import Path
from typing import Any

import aiohttp_jinja2
import asyncpg
import jinja2
from aiohttp import web

from gateway.core.settings import Settings
from gateway.store.db import DB_ERRORS, create_pool
from gateway.web import server
from gateway.web.console import acts, auth, pages
from gateway.web.health import ListenError

log = logging.getLogger("gateway.console")

HERE = Path(__file__).parent
LISTEN_ERRNOS = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)
SETTINGS = web.AppKey("console_settings", Settings)
POOL = pages.POOL

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # not no-referrer: then browsers send "Origin: null"
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@web.middleware
async def security_headers(request: web.Request, handler: auth.Handler) -> web.StreamResponse:
    """On every answer, errors and redirects included; pages are never cached (they show
    customers' data), the stylesheet may be."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _apply(request, exc)
        raise
    _apply(request, response)
    return response


@web.middleware
async def database_down(request: web.Request, handler: auth.Handler) -> web.StreamResponse:
    """The database failing or a page over its statement timeout: a 503 page that says so. A
    statement the database refuses as not supported (SQLSTATE 0A000: on a Citus coordinator, the
    pages docs/scaling.md lists as not running there) is no outage: a 501 page that says so."""
    try:
        return await handler(request)
    except asyncpg.FeatureNotSupportedError:
        log.warning("console: %s %s: not supported by this database", request.method, request.path)
        context: dict[str, Any] = {
            "title": "Not available on this database",
            "why": "the database does not support this page's statement: on a Citus cluster some "
            "console pages do not run (docs/scaling.md, Past one machine: Citus); the command line "
            "(gateway deliveries list) does",
        }
        status, retry = 501, None
    except DB_ERRORS as exc:
        log.warning(
            "console: %s %s: database unavailable: %s", request.method, request.path, type(exc).__name__
        )
        context = {"title": "Database unavailable", "why": "the database did not answer"}
        status, retry = 503, "5"
    context |= {"login": request.get(auth.LOGIN), "csrf": request.get(auth.CSRF), "path": request.path}
    response = aiohttp_jinja2.render_template("error.html", request, context)
    response.set_status(status)
    if retry is not None:
        response.headers["Retry-After"] = retry
    return response


def _apply(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"
    if auth.secure(request):
        response.headers["Strict-Transport-Security"] = "max-age=31536000"


async def _context(request: web.Request) -> dict[str, Any]:
    return {"login": request.get(auth.LOGIN), "csrf": request.get(auth.CSRF), "path": request.path}


def _when(value: Any) -> str:
    if value is None:
        return "-"
    return str(value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"))


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:,}".replace(",", " ")


def build_console_app(settings: Settings) -> web.Application:
    app = web.Application(
        middlewares=[security_headers, database_down, auth.middleware], client_max_size=256 * 1024
    )
    app[SETTINGS] = settings
    app[auth.SESSIONS] = auth.Sessions(settings)
    app[pages.HANDLERS] = settings.handlers
    app[pages.WINDOW_S] = float(settings.reconcile_window_s)
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        context_processors=[_context],
        filters={"when": _when, "number": _number},
    )
    env.globals.pop("app", None)  # templates see what a handler gives them, not the settings
    app.router.add_static("/static", HERE / "static", show_index=False)
    app.router.add_get("/login", auth.login_page)
    app.router.add_post("/login", auth.login)
    app.router.add_post("/logout", auth.logout)
    app.router.add_routes(pages.routes())
    app.router.add_routes(acts.routes())
    app.cleanup_ctx.append(_pool)
    return app


async def _pool(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    assert s.database_url
    app[POOL] = await create_pool(
        s.database_url,
        1,
        4,
        timeout=s.db_connect_timeout_s,
        server_settings={"application_name": "gateway-console", "statement_timeout": "15s"},
    )
    yield
    await app[POOL].close()


@contextlib.asynccontextmanager
async def console_listener(settings: Settings) -> AsyncIterator[server.Listening]:
    """The console on GATEWAY_CONSOLE_HOST:GATEWAY_CONSOLE_PORT for the duration of the block."""
    try:
        listening = await server.listen(
            build_console_app(settings), settings, settings.console_host, settings.console_port
        )
    except OSError as exc:
        if exc.errno not in LISTEN_ERRNOS:  # e.g. the database refused its pool
            raise
        raise ListenError(exc, settings.console_host, settings.console_port, "GATEWAY_CONSOLE_PORT") from exc
    log.info("operator console on http://%s:%d", settings.console_host, listening.port)
    try:
        yield listening
    finally:
        await listening.close()

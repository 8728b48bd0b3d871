"""Console logins: a token from GATEWAY_CONSOLE_TOKENS, a signed session cookie, a CSRF token
per session, and the middleware that lets nobody past the login page without a session.

The cookie is signed with itsdangerous (HMAC-SHA256, with its time) under a key derived from
every configured token: every console with the same configuration accepts it, and changing
the tokens ends every session. It carries the login's name, a fingerprint of its token (so a
changed or removed token ends that login's sessions) and a random session id, from which the
CSRF token of the session's forms is derived.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
from aiohttp import web
from itsdangerous import BadSignature, URLSafeTimedSerializer

from gateway.core import console
from gateway.core.settings import Settings

log = logging.getLogger("gateway.console")

COOKIE = "gw_console"
LOGIN_COOKIE = "gw_console_login"  # the login form's own CSRF nonce, before there is a session
LOGIN_S = 600

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Sessions:
    """Signing, reading and checking sessions for one configuration."""

    def __init__(self, settings: Settings) -> None:
        self.tokens = settings.console_tokens
        self.max_age_s = int(settings.console_session_h * 3600)
        self.key = console.session_key(self.tokens)
        self._signer = URLSafeTimedSerializer(self.key, salt="gateway-console-session")
        self._login = URLSafeTimedSerializer(self.key, salt="gateway-console-login")
        self.limit = console.FailureLimit()

    def issue(self, login: console.Login) -> str:
        return self._signer.dumps({"n": login.name, "f": login.fingerprint, "s": secrets.token_urlsafe(16)})

    def read(self, cookie: str | None) -> tuple[console.Login, str] | None:
        """The login and session id of a cookie that is signed, unexpired and whose token is
        still configured unchanged; else None."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            data: Any = self._signer.loads(cookie, max_age=self.max_age_s)
        except BadSignature:  # also expired (SignatureExpired is one)
            return None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in "nfs"):
            return None
        for name, token, role in self.tokens:
            if name == data["n"] and hmac.compare_digest(console.fingerprint(token), data["f"]):
                return console.Login(name, role == "ro", data["f"]), data["s"]
        return None

    def csrf(self, sid: str) -> str:
        return hmac.new(self.key, b"csrf\0" + sid.encode(), hashlib.sha256).hexdigest()

    def login_nonce(self, cookie: str | None) -> tuple[str, str]:
        """(the form's nonce, the cookie that vouches for it): the cookie's own while it is
        valid, so that a second login page (another tab, a request the browser makes on its
        own) does not make the first one's form stale."""
        nonce = self._nonce(cookie)
        if nonce is not None and cookie is not None:
            return nonce, cookie
        nonce = secrets.token_urlsafe(16)
        return nonce, self._login.dumps(nonce)

    def _nonce(self, cookie: str | None) -> str | None:
        if not cookie or len(cookie) > 200:
            return None
        try:
            signed: Any = self._login.loads(cookie, max_age=LOGIN_S // 2)
        except BadSignature:
            return None
        return signed if isinstance(signed, str) else None

    def login_nonce_ok(self, form_nonce: str, cookie: str | None) -> bool:
        try:
            signed: Any = self._login.loads(cookie or "", max_age=LOGIN_S)
        except BadSignature:
            return False
        return isinstance(signed, str) and hmac.compare_digest(signed, form_nonce)


SESSIONS = web.AppKey("console_sessions", Sessions)
LOGIN = "console_login"  # request keys: the login and its CSRF token
CSRF = "console_csrf"


def secure(request: web.Request) -> bool:
    """Behind TLS: served over https, or a proxy in front says it terminated TLS."""
    proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or proto == "https"


def set_cookie(
    response: web.StreamResponse, request: web.Request, name: str, value: str, max_age: int
) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", httponly=True, samesite="Strict", secure=secure(request)
    )


def _same_origin(request: web.Request) -> bool:
    """A state-changing request came from this console's own pages: SameSite=Strict already
    keeps the cookie off other sites' requests; this refuses them outright as well."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:  # not sent by every client; the CSRF token still has to match
        return True
    return origin.partition("://")[2] == request.host


def forbidden(request: web.Request, why: str) -> web.Response:
    # Rendered by the middleware, before the template context is filled in: given here.
    context = {"title": "Refused", "why": why, "login": request.get(LOGIN), "csrf": request.get(CSRF)}
    response = aiohttp_jinja2.render_template("error.html", request, {**context, "path": request.path})
    response.set_status(403)
    return response


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every page but the login page needs a session; every POST but the login's needs the
    session's CSRF token, a same-origin request, and a login that may act."""
    sessions = request.app[SESSIONS]
    if request.path == "/login" or request.path.startswith("/static/"):
        return await handler(request)
    if request.path == "/favicon.ico":  # asked for by browsers on their own: nothing to log in for
        raise web.HTTPNotFound()
    found = sessions.read(request.cookies.get(COOKIE))
    if found is None:
        if request.method in ("GET", "HEAD"):
            raise web.HTTPSeeOther(f"/login?{_next_query(request)}")
        return forbidden(request, "log in first")
    login, sid = found
    request[LOGIN] = login
    request[CSRF] = sessions.csrf(sid)
    if request.method not in ("GET", "HEAD"):
        if not _same_origin(request):
            log.warning(
                "console: %s %s from another origin refused (%s)", request.method, request.path, login.name
            )
            return forbidden(request, "a request from another site")
        form = await request.post()
        given = form.get("_csrf")
        if not isinstance(given, str) or not hmac.compare_digest(given, request[CSRF]):
            log.warning(
                "console: %s %s without a valid CSRF token refused (%s)",
                request.method,
                request.path,
                login.name,
            )
            return forbidden(request, "the form is stale or forged: reload the page and try again")
        if login.read_only and request.path != "/logout":
            log.warning("console: read-only login %s refused %s", login.name, request.path)
            return forbidden(request, f"{login.name} is a read-only login")
    return await handler(request)


def _next_query(request: web.Request) -> str:
    return urlencode({"next": request.path_qs})


async def login_page(request: web.Request) -> web.StreamResponse:
    return _login_response(request, None, 200)


def _login_response(request: web.Request, error: str | None, status: int) -> web.Response:
    """The login form, with a fresh nonce in it and in its cookie."""
    nonce, signed = request.app[SESSIONS].login_nonce(request.cookies.get(LOGIN_COOKIE))
    nxt = console.safe_next(request.query.get("next"))
    response = aiohttp_jinja2.render_template(
        "login.html", request, {"nonce": nonce, "next": nxt, "error": error}
    )
    response.set_status(status)
    set_cookie(response, request, LOGIN_COOKIE, signed, LOGIN_S)
    return response


def _too_many(request: web.Request, wait: float, why: str) -> web.Response:
    log.warning("console: login from %s refused: %s", request.remote, why)
    response = _login_response(request, "too many failed logins: wait and try again", 429)
    response.headers["Retry-After"] = str(int(wait) + 1)
    return response


async def login(request: web.Request) -> web.StreamResponse:
    """A token for a session. Failures are limited per source and per presented token
    (``console.FailureLimit``): a source over its limit waits before its form is even read; a
    token over its limit (it can only be a wrong one) is not compared."""
    sessions = request.app[SESSIONS]
    client = request.remote or "?"
    source = console.source_of(request.remote)
    now = time.monotonic()
    wait = sessions.limit.check_source(source, now)
    if wait > 0:
        return _too_many(request, wait, f"too many failed logins from {source}")
    sessions.limit.begin(source, now)  # a failure until it logs in
    form = await request.post()
    token, nonce = form.get("token"), form.get("_nonce")
    if not isinstance(nonce, str) or not sessions.login_nonce_ok(nonce, request.cookies.get(LOGIN_COOKIE)):
        return forbidden(request, "the login form is stale or forged: reload it and try again")
    if not _same_origin(request):
        return forbidden(request, "a request from another site")
    given = token if isinstance(token, str) else ""
    key = console.token_key(given)
    wait = sessions.limit.check_token(key, now)
    if wait > 0:
        return _too_many(request, wait, "a token that failed too often")
    who = console.who(given, sessions.tokens)
    if who is None:
        sessions.limit.failed(key, now)
        log.warning("console: failed login from %s", client)
        return _login_response(request, "unknown token", 401)
    sessions.limit.succeeded(source)
    log.info("console: %s logged in from %s%s", who.name, client, " (read-only)" if who.read_only else "")
    nxt = form.get("next")
    response = web.HTTPSeeOther(console.safe_next(nxt if isinstance(nxt, str) else None))
    set_cookie(response, request, COOKIE, sessions.issue(who), sessions.max_age_s)
    response.del_cookie(LOGIN_COOKIE, path="/")
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response

"""What every HTTP handler shares: RFC 9457 problem documents and bearer-key auth."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web

PROBLEM_JSON = "application/problem+json"


def problem(
    status: int,
    title: str,
    detail: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    """An RFC 9457 problem document."""
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return web.Response(body=orjson.dumps(body), status=status, content_type=PROBLEM_JSON, headers=headers)


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

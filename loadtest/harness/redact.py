"""Secrets kept out of everything a report writes: values under secret-looking names,
passwords in connection strings (found by the gateway's own rules, gateway.core.dsn), and
any of those values found again elsewhere (an argv, a log line, a warning)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gateway.core import dsn

REDACTED = dsn.REDACTED
_SECRET_NAME = re.compile(r"secret|token|password|passwd|api_?keys?|dsn|database_url", re.IGNORECASE)
# A connection string in free text: a URL runs to the next white space.
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S*")
# NAME=VALUE where NAME looks secret (gateway_env entries such as GATEWAY_META_APP_SECRETS=...)
_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.+)$", re.DOTALL)
# Values this short are not worth hiding and would mangle unrelated text if replaced everywhere.
_MIN_SECRET_LEN = 4


def _passwords(text: str) -> list[str]:
    """The passwords of the connection strings in ``text``: its URLs, or libpq keywords."""
    urls = _URL.findall(text)
    return [p for u in urls for p in dsn.passwords(u)] if urls else dsn.passwords(text)


def secret_values(obj: Any, under_secret: bool = False) -> set[str]:
    """Every string held under a secret-looking name, and every password in a connection string."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            found |= secret_values(v, under_secret or bool(_SECRET_NAME.search(str(k))))
    elif isinstance(obj, list | tuple):
        for v in obj:
            found |= secret_values(v, under_secret)
    elif isinstance(obj, str):
        found.update(_passwords(obj))
        m = _ASSIGNMENT.match(obj)
        if m and _SECRET_NAME.search(m.group("name")):
            found.update(p.strip() for p in m.group("value").split(","))
        elif under_secret and "://" not in obj:
            found.update(p.strip() for p in obj.split(","))
    return {s for s in found if len(s) >= _MIN_SECRET_LEN and s != REDACTED}


def redact_text(text: str, values: Iterable[str] = ()) -> str:
    """Passwords in connection strings, then every known secret value wherever it appears."""
    # URLs one by one; text without one may hold libpq keywords
    text = _URL.sub(lambda m: dsn.redact(m.group()), text) if _URL.search(text) else dsn.redact(text)
    for v in sorted(values, key=len, reverse=True):  # longest first: a secret may contain another
        text = text.replace(v, REDACTED)
    return text


def redact(obj: Any, values: Iterable[str] | None = None) -> Any:
    """A copy with secrets replaced by ``***``: values under secret-looking keys (``meta_secret``,
    ``tenashi_secret``, ``*_token``, ...), passwords in URLs (``database_url``), and any of those
    values found again elsewhere (an argv, a log line, a warning)."""
    found = set(values) if values is not None else secret_values(obj)

    def walk(x: Any, under_secret: bool) -> Any:
        if isinstance(x, dict):
            return {k: walk(v, under_secret or bool(_SECRET_NAME.search(str(k)))) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [walk(v, under_secret) for v in x]
        if isinstance(x, str):
            if under_secret and x and "://" not in x:
                return REDACTED
            m = _ASSIGNMENT.match(x)
            if m and _SECRET_NAME.search(m.group("name")):
                return f"{m.group('name')}={REDACTED}"
            return redact_text(x, found)
        return x

    return walk(obj, False)

"""PostgreSQL connection strings that are safe to show: the password hidden, whichever of
libpq's forms carries it (``scheme://user:password@host``, ``?password=`` in the query, or a
keyword string ``host=db password=...``)."""

from __future__ import annotations

import re

REDACTED = "***"

# A password given as a query parameter (``?password=``, ``sslpassword=``) or as a libpq
# keyword (``password=... host=...``): the value runs to the next separator, or is quoted.
_PASSWORD_PARAM = re.compile(r"(?i)((?:^|[?&;\s])[a-z_]*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&;\s#]*)")


def redact(dsn: str) -> str:
    """The DSN with every password replaced by ``***``; over-redacts rather than leak."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:  # libpq keyword form (``host=db password=...``) or something unknown
        return _PASSWORD_PARAM.sub(rf"\1{REDACTED}", dsn)
    creds, at, hostpart = rest.rpartition("@")
    if at:
        user, colon, password = creds.partition(":")
        rest = f"{user}{colon}{REDACTED if password else ''}@{hostpart}"
    else:
        netloc, end = _netloc(rest)
        host, colon, port = netloc.rpartition(":")
        if _mangled(netloc, colon, port):
            rest = f"{host}:{REDACTED}{rest[end:]}"
    return scheme + "://" + _PASSWORD_PARAM.sub(rf"\1{REDACTED}", rest)


def passwords(dsn: str) -> list[str]:
    """Every password in ``dsn`` as written there (what ``redact`` hides), to scrub it from
    other text."""
    found = [m.group(2).strip("'") for m in _PASSWORD_PARAM.finditer(dsn)]
    _scheme, sep, rest = dsn.partition("://")
    if sep:
        creds, at, _host = rest.rpartition("@")
        if at:
            found.append(creds.partition(":")[2])
        else:
            netloc, _end = _netloc(rest)
            _h, colon, port = netloc.rpartition(":")
            if _mangled(netloc, colon, port):
                found.append(port)
    return [p for p in found if p and p != REDACTED]


def _netloc(rest: str) -> tuple[str, int]:
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return rest[:end], end


def _mangled(netloc: str, colon: str, port: str) -> bool:
    """No userinfo, but a ``host:port`` whose "port" is not a number: a ``user:password``
    whose ``@`` was forgotten."""
    return bool(colon) and not port.isdigit() and not netloc.endswith("]")


def per_host(dsn: str) -> list[str]:
    """A multi-host URL (``postgresql://u:p@h1:5432,h2:5432/db?...``, libpq's form for a
    primary and its standbys) as one URL per host, in order, each keeping the user, password,
    database and every parameter (``target_session_attrs`` included); any other DSN as itself."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return [dsn]
    creds, at, hostpart = rest.rpartition("@")
    netloc, end = _netloc(hostpart)
    hosts = netloc.split(",")
    if len(hosts) < 2:
        return [dsn]
    tail = hostpart[end:]
    return [f"{scheme}://{creds}{at}{h}{tail}" for h in hosts if h]


def host_of(dsn: str) -> str:
    """The ``host:port`` part of a URL (``?host=`` for a socket), to name a server in logs."""
    _scheme, sep, rest = dsn.partition("://")
    if not sep:
        return "?"
    netloc, _end = _netloc(rest.rpartition("@")[2])
    if netloc:
        return netloc
    query = rest[rest.find("?") + 1 :] if "?" in rest else ""
    for part in query.split("&"):
        key, _eq, value = part.partition("=")
        if key == "host":
            return value
    return "localhost"

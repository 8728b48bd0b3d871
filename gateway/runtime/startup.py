"""Start-up that waits: the database may come up after the gateway (compose, a restart), and
its schema after it too when another process applies the migrations (``gateway migrate`` as a
one-shot beside the other processes, GATEWAY_MIGRATE_ON_START=false).

An unreachable database, or a schema older than this code's, is retried with backoff for
``GATEWAY_DB_WAIT_S``, one log line per try; then, like a wrong password, a malformed DSN or a
busy port, the command ends with one clear line (``StartupError``) and a non-zero exit code
instead of a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import urllib.parse

import asyncpg

from gateway.core.backoff import backoff_delay
from gateway.core.errors import one_line
from gateway.store.db import MIGRATION_LOCK_ID, connect, functions_absent, latest_version, schema_version

log = logging.getLogger("gateway")

EXIT_STARTUP = 3

# Worth waiting for: the server is not there yet, still starting, or full for a moment.
RETRYABLE = (
    OSError,
    TimeoutError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.PostgresConnectionError,
    asyncpg.InvalidCatalogNameError,
)


class StartupError(Exception):
    """A one-line reason the process cannot start."""


def where(dsn: str) -> str:
    """``host:port/database`` of a DSN, without credentials (for messages)."""
    try:
        parts = urllib.parse.urlsplit(dsn)
        host = parts.hostname or urllib.parse.parse_qs(parts.query).get("host", ["localhost"])[0]
        return f"{host}:{parts.port or 5432}{parts.path or '/'}"
    except ValueError:
        return "<malformed DSN>"


async def wait_for_database(dsn: str, *, wait_s: float, connect_timeout_s: float) -> None:
    """Return once a connection to ``dsn`` opens; raise ``StartupError`` when it cannot."""
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        attempt += 1
        try:
            conn = await connect(dsn, timeout=connect_timeout_s)
        except RETRYABLE as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StartupError(
                    f"database at {where(dsn)} unreachable after {wait_s:g}s "
                    f"({attempt} tries; GATEWAY_DB_WAIT_S): {one_line(exc)}"
                ) from None
            delay = min(backoff_delay(attempt, 0.25, 5.0), left)
            log.warning(
                "database at %s not reachable (try %d: %s); retrying in %.1fs, giving up in %.0fs",
                where(dsn),
                attempt,
                one_line(exc),
                delay,
                left,
            )
            await asyncio.sleep(delay)
        except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as exc:
            raise StartupError(f"database at {where(dsn)} refused the credentials: {one_line(exc)}") from None
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            raise StartupError(f"DATABASE_URL is malformed: {one_line(exc)}") from None
        except asyncpg.PostgresError as exc:
            raise StartupError(f"database at {where(dsn)}: {one_line(exc)}") from None
        else:
            await conn.close()
            if attempt > 1:
                log.info("database at %s reachable after %d tries", where(dsn), attempt)
            return



async def _not_ready(dsn: str, want: int, connect_timeout_s: float) -> str | None:
    """Why the schema is not ready for this code yet; None once it is."""
    conn = await connect(dsn, timeout=connect_timeout_s)
    try:
        try:
            have = await schema_version(conn)
        except asyncpg.UndefinedTableError:
            have = 0  # nothing migrated yet
        if have < want:
            return f"schema at version {have}, this gateway needs {want}"
        # `gateway migrate` applies the SQL functions after the last migration, still under its
        # lock: until it lets go, the functions may be older than this code. Probed in shared
        # mode: sibling processes starting together probe at once, and an exclusive probe would
        # take a sibling's for a running migration.
        if not await conn.fetchval("SELECT pg_try_advisory_lock_shared($1)", MIGRATION_LOCK_ID):
            return f"schema at version {have}, a migration still running"
        # A release may add functions without a migration: its code calls them.
        absent = await functions_absent(conn)
        if absent:
            more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
            return f"schema at version {have} without the SQL functions {', '.join(absent[:3])}{more}"
        return None
    finally:
        await conn.close()  # also releases the lock, if taken


async def wait_for_schema(dsn: str, *, wait_s: float, connect_timeout_s: float) -> None:
    """Return once the schema is at this code's version or later (a newer one is another
    replica's rolling upgrade) and no migration is running; raise ``StartupError`` when that is
    not so within ``wait_s``.

    A database that goes away meanwhile is waited for within the same time."""
    want = latest_version()
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        attempt += 1
        try:
            why = await _not_ready(dsn, want, connect_timeout_s)
        except RETRYABLE as exc:
            why = f"database not reachable ({one_line(exc)})"
        if why is None:
            if attempt > 1:
                log.info("schema at %s is ready: starting", where(dsn))
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise StartupError(
                f"database at {where(dsn)}: {why} after waiting {wait_s:g}s (GATEWAY_DB_WAIT_S); "
                "run `gateway migrate`, or set GATEWAY_MIGRATE_ON_START=true"
            )
        delay = min(backoff_delay(attempt, 0.25, 2.0), left)
        log.warning(
            "database at %s: %s; waiting for `gateway migrate` (GATEWAY_MIGRATE_ON_START=false), "
            "retrying in %.1fs, giving up in %.0fs",
            where(dsn),
            why,
            delay,
            left,
        )
        await asyncio.sleep(delay)


LISTEN_ERRNOS = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)


def listen_error(exc: OSError, host: str, port: int, variable: str = "GATEWAY_PORT") -> StartupError:
    if exc.errno == errno.EADDRINUSE:
        why = "address already in use (another gateway or program listens there)"
    elif exc.errno == errno.EACCES:
        why = "permission denied (ports below 1024 need privileges)"
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = "address not available on this machine (check GATEWAY_HOST)"
    else:
        why = exc.strerror or str(exc)
    return StartupError(f"cannot listen on {host}:{port} ({variable}): {why}")

"""asyncpg pool with orjson codecs, connections that follow the writable primary, and the
migration runner."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from gateway.core import dsn as dsns
from gateway.store.sqlfiles import Function, citus_layout, functions, migrations, q

log = logging.getLogger(__name__)

# Arbitrary but fixed: serialises migrations across replicas starting at once.
MIGRATION_LOCK_ID = 0x6761_7465_7761_79  # "gateway"
# What a database that is down, restarting or unreachable raises. InternalClientError comes
# from a connection terminated by the server while asyncpg was mid-operation on it.
DB_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

Pool = asyncpg.Pool
# What a store function runs on: a connection, a pool, or a pool's connection.
Conn = asyncpg.Connection | asyncpg.Pool | PoolConnectionProxy


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip the RESET ALL round trip on release: for pools whose users never change session state."""


# Told of what connecting finds (gateway.metrics, a layer above, counts it): ("primary",
# "host:port") when new connections go to another server than the last ones did,
# ("no_primary", reason) when none of the hosts would do, and by gateway.store.listen,
# ("listen_up" | "listen_down", channel).
Observer = Callable[[str, str], None]
observers: list[Observer] = []
_primary: str | None = None
# How soon a host that refused for being a standby is asked again while another is silent.
STANDBY_RETRY_S = 0.5
# asyncpg keeps a query's prepared statement on a connection (and so PostgreSQL its plan) only
# when the query's text is at most this long (its max_cacheable_statement_size, 15 KiB by
# default); a longer one is parsed and planned again at every call: the consumers' batch
# statement, ~15 000 characters with its comments, planned at every batch, costs PostgreSQL
# ~2 ms a batch more. connect_any sets it for every connection, pooled or not; every named
# query fits under it (tests/unit/test_sqlfiles.py).
STATEMENT_CACHE_MAX_CHARS = 64 * 1024


def observe(event: str, detail: str) -> None:
    for fn in observers:
        fn(event, detail)


async def _connect_one(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """One host, each with its own ``timeout`` (an asyncpg timeout covers all of a multi-host
    DSN's hosts in turn: one that accepts TCP but never answers, frozen or cut off, would use
    all of it, and the writable primary after it would never be tried)."""
    conn: asyncpg.Connection = await asyncpg.connect(dsn, **kwargs)
    return conn


async def connect_any(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """A connection to ``dsn``; with several hosts (``h1:5432,h2:5432``) to the first of them,
    tried all at once, that accepts it and meets its ``target_session_attrs`` (asyncpg checks
    it per host): with ``read-write``, the primary of the moment, whichever host it is now.
    While a host has not answered yet (frozen, cut off, or slow), one that refused for being a
    standby is asked again every ``STANDBY_RETRY_S``: it may be promoted meanwhile, and the
    silent one could hold the attempt for its whole timeout. Raises the hosts' error when none
    will do. (The signature of asyncpg's ``connect``: the pools' ``connect``.)"""
    kwargs.pop("loop", None)
    kwargs.setdefault("max_cacheable_statement_size", STATEMENT_CACHE_MAX_CHARS)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + float(kwargs.get("timeout", 60))
    tasks = {asyncio.ensure_future(_connect_one(h, **kwargs)): h for h in dsns.per_host(dsn)}
    errors: list[BaseException] = []
    winner: asyncpg.Connection | None = None
    try:
        pending = set(tasks)
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = t.exception()
                if exc is None:
                    if winner is None:
                        winner = t.result()
                        _note_primary(dsns.host_of(tasks[t]))
                    continue
                errors.append(exc)
                standby = isinstance(exc, asyncpg.TargetServerAttributeNotMatched)
                if standby and pending and loop.time() + STANDBY_RETRY_S < give_up:
                    again = asyncio.ensure_future(_connect_later(STANDBY_RETRY_S, tasks[t], kwargs))
                    tasks[again] = tasks[t]
                    pending.add(again)
    finally:
        for t in tasks:
            t.cancel()
            # One that answers after the winner (or after a cancellation) is closed, not leaked.
            t.add_done_callback(_terminate_unless(winner))
    if winner is not None:
        return winner
    unmatched = [e for e in errors if isinstance(e, asyncpg.TargetServerAttributeNotMatched)]
    observe("no_primary", "no host writable" if unmatched else "no host reachable")
    raise (unmatched or errors)[0]


async def _connect_later(delay_s: float, dsn: str, kwargs: dict[str, Any]) -> asyncpg.Connection:
    await asyncio.sleep(delay_s)
    return await _connect_one(dsn, **kwargs)


def _terminate_unless(keep: asyncpg.Connection | None) -> Callable[[asyncio.Future[Any]], None]:
    def done(t: asyncio.Future[Any]) -> None:
        if t.cancelled() or t.exception() is not None:
            return
        conn = t.result()
        if conn is not keep:
            conn.terminate()

    return done


def _note_primary(host: str) -> None:
    """Log (once per change) and report the server new connections go to."""
    global _primary
    if host == _primary:
        return
    if _primary is not None:
        log.warning("database: new connections go to %s now (they went to %s)", host, _primary)
        observe("primary", host)
    _primary = host


async def create_pool(
    dsn: str,
    min_size: int = 2,
    max_size: int = 10,
    timeout: float = 5.0,
    *,
    stateless: bool = False,
    server_settings: dict[str, str] | None = None,
) -> Pool:
    pool = await asyncpg.create_pool(
        dsn,
        connect=cast(Any, connect_any),  # asyncpg.connect's signature, typed loosely
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        timeout=timeout,
        command_timeout=60,
        reset=_no_reset if stateless else None,
        server_settings=server_settings,
    )
    assert pool is not None
    return pool


async def connect(dsn: str, timeout: float = 5.0) -> asyncpg.Connection:
    conn = await connect_any(dsn, timeout=timeout)
    await init_connection(conn)
    return conn


# What sql/citus/layout.sql raises when the database is not ready to be distributed.
CITUS_NOT_READY = "GWC01"


class CitusLayoutError(RuntimeError):
    """``migrate`` was asked for a layout the database cannot take or must not get silently."""


async def citus_state(conn: Conn) -> tuple[bool, bool]:
    """(the citus extension is installed in this database, the gateway's tables are distributed)."""
    if not await conn.fetchval(q("citus_installed")):
        return False, False
    return True, bool(await conn.fetchval(q("citus_distributed")))


async def migrate(conn: asyncpg.Connection, *, upto: int | None = None, citus: bool = False) -> list[int]:
    """Apply pending migrations (up to ``upto``, default all), each in its own transaction,
    then, once the schema is current, every SQL function whose source changed
    (``apply_functions``); returns the migration versions applied.

    On a Citus coordinator (the extension installed) the tables are distributed by
    ``sql/citus/layout.sql`` once the schema is current: with ``citus``, or by itself once they
    have been (each run re-checks the layout: a migration or function may have brought back
    what it changes). A coordinator whose tables are not distributed yet is refused without
    ``citus``: distributing is an operator's decision (it copies every row to the workers,
    docs/scaling.md), and tables left on the coordinator would take the traffic silently. With
    ``citus`` and no extension, nothing is applied."""
    applied: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
    try:
        installed, distributed = await citus_state(conn)
        if citus and not installed:
            raise CitusLayoutError(
                "--citus: this database has no citus extension (install Citus on the coordinator and "
                "the workers, CREATE EXTENSION citus in this database on each, and add the workers "
                "with citus_add_node; docs/scaling.md)"
            )
        if installed and not citus and not distributed:
            raise CitusLayoutError(
                "this database has the citus extension but the gateway's tables are not distributed: "
                "run `gateway migrate --citus` to distribute them (docs/scaling.md), or drop the "
                "extension to use it as one PostgreSQL"
            )
        if installed:
            # Citus refuses triggers on distributed tables (and tables with triggers) without it:
            # the gateway's triggers are checked by sql/citus/layout.sql.
            await conn.execute("SELECT set_config('citus.enable_unsafe_triggers', 'on', false)")
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for m in migrations():
            if m.version in done or (upto is not None and m.version > upto):
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name
                )
            log.info("applied migration %04d_%s", m.version, m.name)
            applied.append(m.version)
        if upto is None or upto >= latest_version():
            await _apply_functions(conn, functions())
            if installed:
                try:
                    async with conn.transaction():
                        await conn.execute(citus_layout())
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate == CITUS_NOT_READY:
                        raise CitusLayoutError(str(exc)) from exc
                    raise
                if not distributed and not await conn.fetchval(q("citus_lanes_restart")):
                    raise CitusLayoutError("the lanes' cursors could not be set on every worker")
                log.info("applied the Citus layout (sql/citus/layout.sql)")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
    return applied


async def apply_functions(conn: asyncpg.Connection, sources: Iterable[Function]) -> list[str]:
    """Apply each function source whose checksum differs from the one applied last, each in
    its own transaction, under the migration lock; returns their names."""
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)
    try:
        return await _apply_functions(conn, sources)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)


async def _apply_functions(conn: asyncpg.Connection, sources: Iterable[Function]) -> list[str]:
    await conn.execute(
        """CREATE TABLE IF NOT EXISTS schema_functions (
               name       text PRIMARY KEY,
               checksum   text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    rows = await conn.fetch("SELECT name, checksum FROM schema_functions")
    current: dict[str, str] = {r["name"]: r["checksum"] for r in rows}
    applied: list[str] = []
    for f in sources:
        if current.get(f.name) == f.checksum:
            continue
        async with conn.transaction():
            # As pg_dump does: a body that calls another function need not wait for it.
            await conn.execute("SET LOCAL check_function_bodies = off")
            await conn.execute(f.sql)
            await conn.execute(
                """INSERT INTO schema_functions (name, checksum) VALUES ($1, $2)
                   ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now()""",
                f.name,
                f.checksum,
            )
        log.info("applied function %s", f.name)
        applied.append(f.name)
    return applied


async def functions_absent(conn: Conn) -> list[str]:
    """This code's SQL functions (``sql/functions/``) never applied to this database, by name."""
    names = [f.name for f in functions()]
    try:
        absent: list[str] = await conn.fetchval(q("schema_functions_absent"), names)
    except asyncpg.UndefinedTableError:  # no `gateway migrate` ever ran here
        return names
    return absent


async def schema_version(conn: Conn) -> int:
    """The highest migration applied (0: none)."""
    v: int = await conn.fetchval(q("schema_migrations_version"))
    return v


async def readiness(conn: Conn) -> tuple[int, bool]:
    """(the highest migration applied, whether the server takes writes)."""
    row = await conn.fetchrow(q("schema_readiness"))
    assert row is not None
    return int(row["version"]), bool(row["writable"])


def latest_version() -> int:
    ms = migrations()
    return ms[-1].version if ms else 0


async def migrate_dsn(dsn: str, timeout: float = 5.0) -> list[int]:
    """Open a connection, apply pending migrations, close it."""
    conn = await connect(dsn, timeout=timeout)
    try:
        return await migrate(conn)
    finally:
        await conn.close()


def with_database(dsn: str, name: str) -> str:
    """``dsn`` pointing at database ``name`` (socket DSNs keep their ``?host=``)."""
    scheme, _, rest = dsn.partition("://")
    authority, _, path = rest.partition("/")
    _, mark, query = path.partition("?")
    return f"{scheme}://{authority}/{name}{mark}{query}"


def database_name(dsn: str) -> str:
    return dsn.partition("://")[2].partition("/")[2].partition("?")[0]

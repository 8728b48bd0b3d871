"""The PostgreSQL a command runs on: the one DATABASE_URL names, or an embedded server in a
temporary directory; and how to name the database of a gateway started by ``make run``."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def server(prefix: str) -> Iterator[tuple[str, bool]]:
    """(DSN of a maintenance database, whether it is our own embedded server): DATABASE_URL's
    server, or an embedded PostgreSQL in a temporary directory, deleted with it afterwards.
    Benchmarks work in a scratch database on it (gateway.testing.scratch)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url, False
        return
    from gateway.runtime import embedded

    with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as tmp:
        pg, _dsn = embedded.start(Path(tmp), cleanup="delete")
        try:
            yield pg.get_uri(), True
        finally:
            pg.cleanup()


def embedded_dsn(data_dir: Path) -> str:
    """The address of the database ``gateway serve`` runs on when it starts its embedded
    PostgreSQL under ``data_dir`` (GATEWAY_DATA_DIR, ./var for ``make run``): a Unix socket in
    ``<data_dir>/pgdata``, database ``gateway``, user ``postgres``."""
    return f"postgresql://postgres@/gateway?host={data_dir.expanduser().resolve() / 'pgdata'}"


def no_database_hint() -> str:
    """What to say when a --url run cannot be verified: how to name the database."""
    var = Path(os.environ.get("GATEWAY_DATA_DIR", "./var"))
    hint = (
        "not verified: no database given. To verify, pass --database-url (or set DATABASE_URL) to "
        "the gateway's database"
    )
    if (var / "pgdata" / "postmaster.pid").exists():
        return hint + f"; for the embedded one under {var}: --database-url '{embedded_dsn(var)}'"
    return hint + (
        "; a gateway on its embedded PostgreSQL (make run) listens on a Unix socket: "
        f"--database-url '{embedded_dsn(var)}' (GATEWAY_DATA_DIR/pgdata)"
    )

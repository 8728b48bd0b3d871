"""Is the system failing, or is this event bad? Pure: no I/O, no driver imports.

The consumer triages a failure by *where* it came from first: anything raised while parsing,
planning or applying one event is that event's, whatever its type (a ``ValueError`` from a
parser, a serializer's recursion limit, a constraint or trigger that rejects a value, a
handler that raises or times out). Only errors the database itself reports as systemic can
pause the pipeline, and only once a probe (the same statement for a harmless event of the
same kind, rolled back) fails too. So:

- ``SYSTEM``: the database, or the link to it, reports a systemic failure: lost connection,
  disk full, out of memory, shutdown, statement or lock timeout, serialization failure or
  deadlock, read-only, missing privileges or schema objects, a day without its partition.
  The consumer probes; if the probe fails too, the rows are put off with capped backoff, no
  attempt counted, and the lag shows it. If the probe succeeds, it is the event's.
- ``EVENT``: everything else, including the data errors the database reports (SQLSTATE
  classes 22 data exception, 23 integrity constraint violation other than a dedup key race,
  54 program limit exceeded such as an index row too large, 2F/38/39/P0 raised by functions
  and triggers): an attempt is counted; dead, with its bytes, after ``max_attempts``.
- ``BAD``: the event can never be processed (a fragment we cannot parse): dead at once.

PostgreSQL's SQLSTATE classes are listed in its manual, appendix A "PostgreSQL Error Codes".
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.core.backoff import backoff_delay
from gateway.core.errors import last_line


class Fault(enum.Enum):
    SYSTEM = "system"
    EVENT = "event"
    BAD = "bad"


class Verdict(enum.Enum):
    DEFER = "defer"  # retry later, no attempt counted
    ATTEMPT = "attempt"  # count an attempt; dead after max_attempts
    DEAD = "dead"  # park now


# SQLSTATE classes (first two characters) the database uses for systemic failures.
SYSTEM_CLASSES: dict[str, str] = {
    "08": "connection exception",
    "25": "invalid transaction state (e.g. 25006 read-only transaction)",
    "28": "invalid authorization",
    "3D": "invalid catalog name",
    "40": "transaction rollback (serialization failure, deadlock)",
    "53": "insufficient resources (disk full, out of memory, too many connections)",
    "55": "object not in prerequisite state (lock not available)",
    "57": "operator intervention (statement timeout, admin shutdown, cannot connect now)",
    "58": "system error (I/O error)",
    "F0": "configuration file error",
    "HV": "foreign data wrapper error",
    "XX": "internal error (data corrupted, index corrupted)",
}
# Single codes of other classes that are the system's, not the event's.
SYSTEM_CODES: dict[str, str] = {
    "42501": "insufficient privilege (a revoked grant)",
    "42P01": "undefined table (schema older or newer than the code)",
    "42703": "undefined column",
    "42883": "undefined function",
    "0A000": "feature not supported",
}
# Exceptions raised below SQL: the link to the database, not the event.
SYSTEM_EXCEPTIONS = ("ConnectionError", "OSError", "InterfaceError", "ConnectionDoesNotExistError")
# A row routed to a day that has no partition (23514, like a CHECK): the schema's, fixed by
# creating the partition, never the event's.
NO_PARTITION = "no partition of relation"
# The dedup key's own unique index: a conflict on it is a race between two consumers (the
# insert is ON CONFLICT DO NOTHING), not the event's fault.
DEDUP_TABLE = "processed_webhook_events"


class BadEvent(Exception):
    """An event that can never be processed (raised by the consumer for a bad fragment)."""


class HandlerError(Exception):
    """A downstream handler raised or timed out; ``cause`` is what it raised."""

    def __init__(self, handler: str, cause: BaseException) -> None:
        self.handler = handler
        self.cause = cause
        what = "timed out" if isinstance(cause, TimeoutError) else last_line(cause)
        super().__init__(f"handler {handler}: {what}")


def missing_partition(exc: BaseException) -> str | None:
    """The table a row found no partition in (from the error), or None."""
    if getattr(exc, "sqlstate", None) != "23514" or not str(exc).startswith(NO_PARTITION):
        return None
    table = getattr(exc, "table_name", None)
    if isinstance(table, str) and table:
        return table
    rest = str(exc)[len(NO_PARTITION) :].strip()
    return rest.split('"')[1] if rest.count('"') >= 2 else None


# Citus's WARNING when a participant's COMMIT (or COMMIT PREPARED) got no confirmation: the
# coordinator commits anyway, so the client is told success. Citus ships no translations, so
# the text is this whatever lc_messages says (src/backend/distributed/transaction/
# remote_transaction.c in the Citus sources, FinishRemoteTransactionCommit).
CITUS_COMMIT_FAILED = "failed to commit transaction on "


def commit_in_doubt(severity: str | None, message: str) -> bool:
    """Whether a notice received while a statement committed says part of it may not have."""
    return severity == "WARNING" and message.startswith(CITUS_COMMIT_FAILED)


# inbox_advance's error: the lanes a batch read were taken over, or their cursors moved.
FENCED = "GWL01"


def fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says the lanes a batch read are no longer this consumer's as it read them."""
    return getattr(exc, "sqlstate", None) == FENCED


def classify(exc: BaseException) -> Fault:
    """Which kind of failure ``exc``, raised while one event was applied, is."""
    if isinstance(exc, BadEvent):
        return Fault.BAD
    if isinstance(exc, HandlerError):
        # A handler's own bug or slowness is its event's; the database failing under it (a
        # lost connection, a statement timeout) is classified like any database error.
        if isinstance(exc.cause, TimeoutError | HandlerError):
            return Fault.EVENT
        return classify(exc.cause)
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and len(sqlstate) == 5:
        if sqlstate in SYSTEM_CODES or sqlstate[:2] in SYSTEM_CLASSES or missing_partition(exc):
            return Fault.SYSTEM
        constraint = getattr(exc, "constraint_name", None) or ""
        if sqlstate == "23505" and isinstance(constraint, str) and constraint.startswith(DEDUP_TABLE):
            return Fault.SYSTEM
        return Fault.EVENT
    if isinstance(exc, ValueError):
        return Fault.EVENT  # the driver refused a value of this event's (e.g. out of range)
    names = {t.__name__ for t in type(exc).__mro__}
    if names & set(SYSTEM_EXCEPTIONS):
        return Fault.SYSTEM
    return Fault.EVENT


def verdict(fault: Fault, *, probe_failed: bool) -> Verdict:
    """What to do with a failed event; ``probe_failed``: a harmless event failed too."""
    if fault is Fault.BAD:
        return Verdict.DEAD
    if fault is Fault.SYSTEM and probe_failed:
        return Verdict.DEFER
    return Verdict.ATTEMPT


def kind_of(key: str | None) -> str:
    """The family an event key belongs to (its prefix: msg, status, evt...)."""
    return (key or "").partition(":")[0]


# A row first in this many claims in a row that committed nothing is taken alone.
STALL_CLAIMS = 3


@dataclass
class ConsumerHealth:
    """What this process's consumers have seen lately: system faults in a row (for their
    backoff), and claims that committed nothing, by the row that headed them.

    A row that heads claim after claim without any of them committing (its batch kills the
    connection, or fails where nothing can be recorded) is *stalled*: the consumers then take
    it alone, and count its attempts where they can (``gateway.inbound.consumer``). One per
    process, shared by its consumers: evidence stays local, and costs no statement.
    """

    clock: Callable[[], float]
    fault_streak: int = 0
    heads: dict[int, int] = field(default_factory=dict)  # head row id -> uncommitted claims

    def succeeded(self, rows: Iterable[int] = ()) -> None:
        self.fault_streak = 0
        for r in rows:
            self.heads.pop(r, None)

    def system_fault(self) -> int:
        self.fault_streak += 1
        return self.fault_streak

    def uncommitted(self, head: int) -> None:
        """A claim headed by ``head`` committed nothing (the others' counts are forgotten)."""
        n = self.heads.get(head, 0) + 1
        self.heads = {head: n}

    def stalled(self) -> int | None:
        """A row that headed ``STALL_CLAIMS`` claims in a row that committed nothing."""
        return next((r for r, n in self.heads.items() if n >= STALL_CLAIMS), None)


def fault_delay(streak: int, base_s: float, cap_s: float, rand: Callable[[], float]) -> float:
    """Capped backoff while the system is failing (``streak`` >= 1)."""
    return backoff_delay(max(streak, 1), base_s, cap_s, rand)

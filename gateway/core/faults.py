"""Is the system failing, or is this event bad? Pure: no I/O, no driver imports.

A consumer failure is one of three things, and the difference decides whether an
acknowledged webhook can ever end up dead:

- ``SYSTEM``: the database (or the link to it) is failing: lost connection, disk full,
  statement timeout, serialization failure or deadlock, too many connections, read-only,
  missing privileges or schema objects. Such an error hits every event alike, so it says
  nothing about the event: retry indefinitely with capped backoff, count no attempt, and
  let the lag show it.
- ``BAD``: the event itself cannot be processed and never will (a fragment we cannot
  parse): park it dead at once, bytes intact.
- ``SUSPECT``: anything else (a constraint or trigger that rejects a value, a data error,
  a handler that raises or times out). It may be this event, or it may be a fault that
  hits every event of its kind (a CHECK added by a newer replica, a trigger raising for a
  while). It counts as an attempt only when the same kind of event was processed
  successfully since the last such failure (``Health``): then the event is the odd one out.
  Otherwise it is treated as the system failing.

PostgreSQL's SQLSTATE classes are listed in its manual, appendix A "PostgreSQL Error Codes".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core.backoff import backoff_delay


class Fault(enum.Enum):
    SYSTEM = "system"
    SUSPECT = "suspect"
    BAD = "bad"


class Verdict(enum.Enum):
    DEFER = "defer"  # retry later, no attempt counted
    ATTEMPT = "attempt"  # count an attempt; dead after max_attempts
    DEAD = "dead"  # park now


# SQLSTATE classes (first two characters) whose errors hit every row alike.
SYSTEM_CLASSES: dict[str, str] = {
    "08": "connection exception",
    "25": "invalid transaction state (e.g. 25006 read-only transaction)",
    "28": "invalid authorization",
    "3D": "invalid catalog name",
    "40": "transaction rollback (serialization failure, deadlock)",
    "53": "insufficient resources (disk full, out of memory, too many connections)",
    "54": "program limit exceeded",
    "55": "object not in prerequisite state (lock not available)",
    "57": "operator intervention (statement timeout, admin shutdown, cannot connect now)",
    "58": "system error (I/O error)",
    "F0": "configuration file error",
    "HV": "foreign data wrapper error",
    "XX": "internal error (data corrupted, index corrupted)",
}
# Single codes of other classes that are the system's fault, not the event's.
SYSTEM_CODES: dict[str, str] = {
    "42501": "insufficient privilege (a revoked grant)",
    "42P01": "undefined table (schema older or newer than the code)",
    "42703": "undefined column",
    "42883": "undefined function",
    "0A000": "feature not supported",
}
# Exceptions raised below SQL: the link to the database, not the event.
SYSTEM_EXCEPTIONS = ("ConnectionError", "OSError", "InterfaceError", "ConnectionDoesNotExistError")


class BadEvent(Exception):
    """An event that can never be processed (raised by the consumer for a bad fragment)."""


class HandlerError(Exception):
    """A downstream handler raised or timed out; ``cause`` is what it raised."""

    def __init__(self, handler: str, cause: BaseException) -> None:
        self.handler = handler
        self.cause = cause
        what = "timed out" if isinstance(cause, TimeoutError) else last_line(cause)
        super().__init__(f"handler {handler}: {what}")


def last_line(exc: BaseException) -> str:
    """The last line of ``exc``'s traceback: ``Type: message``."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def classify(exc: BaseException) -> Fault:
    """Which kind of failure ``exc`` is (by SQLSTATE when it has one, else by type)."""
    if isinstance(exc, BadEvent):
        return Fault.BAD
    if isinstance(exc, HandlerError):
        # A handler's own bug or slowness is its event's problem; the database failing
        # under it (a lost connection, a statement timeout) is still the system's.
        if isinstance(exc.cause, TimeoutError | HandlerError):
            return Fault.SUSPECT
        return classify(exc.cause)
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and len(sqlstate) == 5:
        if sqlstate in SYSTEM_CODES or sqlstate[:2] in SYSTEM_CLASSES:
            return Fault.SYSTEM
        return Fault.SUSPECT
    names = {t.__name__ for t in type(exc).__mro__}
    if names & set(SYSTEM_EXCEPTIONS):
        return Fault.SYSTEM
    if type(exc).__module__.startswith("asyncpg") and not isinstance(exc, UnicodeError):
        return Fault.SYSTEM  # a driver error without a SQLSTATE is about the connection
    return Fault.SUSPECT


def verdict(fault: Fault, *, isolated: bool) -> Verdict:
    """What to do with a failed event; ``isolated``: others of its kind succeed meanwhile."""
    if fault is Fault.BAD:
        return Verdict.DEAD
    if fault is Fault.SUSPECT and isolated:
        return Verdict.ATTEMPT
    return Verdict.DEFER


def kind_of(key: str | None) -> str:
    """The family an event key belongs to for ``Health`` (its prefix: msg, status, evt...)."""
    return (key or "").partition(":")[0]


@dataclass
class Health:
    """What this process has seen lately: when each kind of event last committed and last
    failed, and how many system faults in a row (for the consumers' own backoff).

    One per process, shared by its consumers. Evidence is local on purpose: it needs no
    extra statement, and a fault that hits every event of a kind shows as no success of
    that kind since its previous failure.
    """

    clock: Callable[[], float]
    last_ok: dict[str, float] = field(default_factory=dict)
    last_fail: dict[str, float] = field(default_factory=dict)
    fault_streak: int = 0

    def succeeded(self, kinds: set[str]) -> None:
        now = self.clock()
        for k in kinds:
            self.last_ok[k] = now
        if kinds:
            self.fault_streak = 0

    def isolated(self, kind: str, *, in_batch: bool) -> bool:
        """True if ``kind`` committed in this batch, or since its last suspect failure here."""
        if in_batch:
            return True
        return self.last_ok.get(kind, -math.inf) > self.last_fail.get(kind, -math.inf)

    def failed(self, kind: str) -> None:
        self.last_fail[kind] = self.clock()

    def system_fault(self) -> int:
        self.fault_streak += 1
        return self.fault_streak

    def system_ok(self) -> None:
        self.fault_streak = 0


def fault_delay(streak: int, base_s: float, cap_s: float, rand: Callable[[], float]) -> float:
    """Capped backoff while the system is failing (``streak`` >= 1)."""
    return backoff_delay(max(streak, 1), base_s, cap_s, rand)

"""Which failures are the system's and which are the event's (table-driven)."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.core.faults import (
    BadEvent,
    Fault,
    HandlerError,
    Health,
    Verdict,
    classify,
    kind_of,
    verdict,
)


class Sql(Exception):
    """Any exception carrying a SQLSTATE, as the driver's do."""

    def __init__(self, sqlstate: str) -> None:
        self.sqlstate = sqlstate
        super().__init__(sqlstate)


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        # The system: every row would fail alike.
        (Sql("08006"), Fault.SYSTEM),  # connection failure
        (Sql("53100"), Fault.SYSTEM),  # disk full
        (Sql("53300"), Fault.SYSTEM),  # too many connections
        (Sql("57014"), Fault.SYSTEM),  # statement timeout (query canceled)
        (Sql("57P01"), Fault.SYSTEM),  # admin shutdown
        (Sql("40001"), Fault.SYSTEM),  # serialization failure
        (Sql("40P01"), Fault.SYSTEM),  # deadlock
        (Sql("25006"), Fault.SYSTEM),  # read-only transaction
        (Sql("55P03"), Fault.SYSTEM),  # lock not available
        (Sql("58030"), Fault.SYSTEM),  # I/O error
        (Sql("XX001"), Fault.SYSTEM),  # data corrupted
        (Sql("42501"), Fault.SYSTEM),  # a revoked privilege
        (Sql("42P01"), Fault.SYSTEM),  # a table missing
        (Sql("42703"), Fault.SYSTEM),  # a column missing
        (asyncpg.exceptions.DiskFullError("full"), Fault.SYSTEM),
        (asyncpg.exceptions.QueryCanceledError("timeout"), Fault.SYSTEM),
        (asyncpg.exceptions.ConnectionDoesNotExistError("gone"), Fault.SYSTEM),
        (asyncpg.exceptions.InterfaceError("connection is closed"), Fault.SYSTEM),
        (ConnectionResetError(), Fault.SYSTEM),
        (OSError("network unreachable"), Fault.SYSTEM),
        # Maybe this event, maybe everyone's: decided by what else succeeds.
        (Sql("P0001"), Fault.SUSPECT),  # RAISE EXCEPTION in a trigger
        (Sql("23514"), Fault.SUSPECT),  # check violation
        (Sql("23505"), Fault.SUSPECT),  # unique violation
        (Sql("22P05"), Fault.SUSPECT),  # untranslatable character
        (Sql("22003"), Fault.SUSPECT),  # numeric out of range
        (asyncpg.exceptions.CheckViolationError("newer"), Fault.SUSPECT),
        (ValueError("handler bug"), Fault.SUSPECT),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), Fault.SUSPECT),
        # A handler: its own bug or slowness is suspect; the database under it is the system.
        (HandlerError("h", KeyError("x")), Fault.SUSPECT),
        (HandlerError("h", TimeoutError()), Fault.SUSPECT),
        (HandlerError("h", Sql("53100")), Fault.SYSTEM),
        (HandlerError("h", Sql("23505")), Fault.SUSPECT),
        # Never an event.
        (BadEvent("no id"), Fault.BAD),
    ],
)
def test_classify(exc: BaseException, fault: Fault) -> None:
    assert classify(exc) is fault


@pytest.mark.parametrize(
    ("fault", "isolated", "expected"),
    [
        (Fault.SYSTEM, True, Verdict.DEFER),
        (Fault.SYSTEM, False, Verdict.DEFER),
        (Fault.SUSPECT, True, Verdict.ATTEMPT),
        (Fault.SUSPECT, False, Verdict.DEFER),
        (Fault.BAD, True, Verdict.DEAD),
        (Fault.BAD, False, Verdict.DEAD),
    ],
)
def test_verdict(fault: Fault, isolated: bool, expected: Verdict) -> None:
    assert verdict(fault, isolated=isolated) is expected


def test_health_counts_one_attempt_per_fault_onset_then_defers() -> None:
    t = [0.0]
    h = Health(lambda: t[0])
    # Nothing known: a failure is not proof that the event is bad.
    assert not h.isolated("msg", in_batch=False)
    assert h.isolated("msg", in_batch=True)
    h.succeeded({"msg"})
    t[0] = 1
    assert h.isolated("msg", in_batch=False)  # messages worked before: the first failure counts
    h.failed("msg")
    t[0] = 2
    assert not h.isolated("msg", in_batch=False)  # no message since: the system, not the event
    assert not h.isolated("status", in_batch=False)
    h.succeeded({"status"})
    assert not h.isolated("msg", in_batch=False)  # other kinds do not vouch for messages
    t[0] = 3
    h.succeeded({"msg"})
    assert h.isolated("msg", in_batch=False)  # messages flow again: a failure is the event's own


def test_fault_streak_resets_on_success() -> None:
    h = Health(lambda: 0.0)
    assert [h.system_fault() for _ in range(3)] == [1, 2, 3]
    h.succeeded({"msg"})
    assert h.system_fault() == 1


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("msg:wamid.A", "msg"),
        ("status:w:sent:", "status"),
        ("evt:1", "evt"),
        ("acct-error:ab", "acct-error"),
        (None, ""),
    ],
)
def test_kind_of(key: str | None, kind: str) -> None:
    assert kind_of(key) == kind

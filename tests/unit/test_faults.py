"""Which failures are the system's and which are the event's (table-driven)."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.core.faults import (
    STALL_CLAIMS,
    BadEvent,
    ConsumerHealth,
    Fault,
    HandlerError,
    Verdict,
    classify,
    commit_in_doubt,
    kind_of,
    missing_partition,
    verdict,
)


class Sql(Exception):
    """Any exception carrying a SQLSTATE, as the driver's do."""

    def __init__(self, sqlstate: str, message: str = "", **fields: str) -> None:
        self.sqlstate = sqlstate
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(message or sqlstate)


NO_PARTITION = Sql(
    "23514", 'no partition of relation "inbound_messages" found for row', table_name="inbound_messages"
)


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        # What the database reports as systemic (the consumer still asks a probe).
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
        (NO_PARTITION, Fault.SYSTEM),  # a day without its partition: 23514, but the schema's
        # The dedup key's own index: a race between consumers, not the event.
        (Sql("23505", constraint_name="processed_webhook_events_p20260101_pkey"), Fault.SYSTEM),
        (asyncpg.exceptions.DiskFullError("full"), Fault.SYSTEM),
        (asyncpg.exceptions.QueryCanceledError("timeout"), Fault.SYSTEM),
        (asyncpg.exceptions.ConnectionDoesNotExistError("gone"), Fault.SYSTEM),
        (asyncpg.exceptions.InterfaceError("connection is closed"), Fault.SYSTEM),
        (ConnectionResetError(), Fault.SYSTEM),
        (OSError("network unreachable"), Fault.SYSTEM),
        # The event's: data errors the database reports, and whatever our code raises for it.
        (Sql("54000"), Fault.EVENT),  # index row size exceeds the maximum
        (Sql("54001"), Fault.EVENT),  # statement too complex
        (Sql("P0001"), Fault.EVENT),  # RAISE EXCEPTION in a trigger
        (Sql("23514"), Fault.EVENT),  # check violation
        (Sql("23505", constraint_name="inbound_messages_pkey"), Fault.EVENT),  # another unique key
        (Sql("22P05"), Fault.EVENT),  # untranslatable character
        (Sql("22003"), Fault.EVENT),  # numeric out of range
        (Sql("22021"), Fault.EVENT),  # invalid byte sequence
        (Sql("42601"), Fault.EVENT),  # syntax error (a query built from the event's values)
        (asyncpg.exceptions.CheckViolationError("newer"), Fault.EVENT),
        (asyncpg.exceptions.DataError("invalid input for query argument $1"), Fault.EVENT),
        (ValueError("invalid literal for int() with base 10: '²'"), Fault.EVENT),
        (TypeError("Recursion limit reached"), Fault.EVENT),
        (RecursionError(), Fault.EVENT),
        (KeyError("x"), Fault.EVENT),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), Fault.EVENT),
        # A handler: its own bug or slowness is its event's; the database under it as usual.
        (HandlerError("h", KeyError("x")), Fault.EVENT),
        (HandlerError("h", TimeoutError()), Fault.EVENT),
        (HandlerError("h", Sql("53100")), Fault.SYSTEM),
        (HandlerError("h", Sql("23505")), Fault.EVENT),
        # Never an event.
        (BadEvent("no id"), Fault.BAD),
    ],
)
def test_classify(exc: BaseException, fault: Fault) -> None:
    assert classify(exc) is fault


@pytest.mark.parametrize(
    ("fault", "probe_failed", "expected"),
    [
        (Fault.SYSTEM, True, Verdict.DEFER),
        (Fault.SYSTEM, False, Verdict.ATTEMPT),  # the probe went through: the event's own
        (Fault.EVENT, False, Verdict.ATTEMPT),
        (Fault.BAD, False, Verdict.DEAD),
        (Fault.BAD, True, Verdict.DEAD),
    ],
)
def test_verdict(fault: Fault, probe_failed: bool, expected: Verdict) -> None:
    assert verdict(fault, probe_failed=probe_failed) is expected


@pytest.mark.parametrize(
    ("severity", "message", "doubt"),
    [
        # Citus: a worker lost during its COMMIT; the coordinator commits anyway
        ("WARNING", "failed to commit transaction on 10.0.0.7:5432", True),
        # the connection's own WARNING before it: not by itself a verdict on the commit
        ("WARNING", "server closed the connection unexpectedly", False),
        # wraparound warnings come with every transaction near the limit: never a failure
        ("WARNING", 'database "gateway" must be vacuumed within 9999999 transactions', False),
        ("NOTICE", "failed to commit transaction on 10.0.0.7:5432", False),
        (None, "failed to commit transaction on 10.0.0.7:5432", False),
    ],
)
def test_commit_in_doubt(severity: str | None, message: str, doubt: bool) -> None:
    assert commit_in_doubt(severity, message) is doubt


def test_missing_partition_names_the_table() -> None:
    assert missing_partition(NO_PARTITION) == "inbound_messages"
    bare = Sql("23514", 'no partition of relation "webhook_inbox" found for row')
    assert missing_partition(bare) == "webhook_inbox"
    assert missing_partition(Sql("23514", "new row violates check constraint")) is None
    assert missing_partition(ValueError("no partition of relation")) is None


def test_a_row_heading_claims_that_commit_nothing_is_stalled_after_three() -> None:
    h = ConsumerHealth(lambda: 0.0)
    for _ in range(STALL_CLAIMS - 1):
        h.uncommitted(7)
    assert h.stalled() is None
    h.uncommitted(8)  # another head: the count starts again
    for _ in range(STALL_CLAIMS - 1):
        h.uncommitted(7)
    assert h.stalled() is None
    h.uncommitted(7)
    assert h.stalled() == 7
    h.succeeded([7])  # it committed (or was dealt with alone)
    assert h.stalled() is None


def test_fault_streak_resets_on_success() -> None:
    h = ConsumerHealth(lambda: 0.0)
    assert [h.system_fault() for _ in range(3)] == [1, 2, 3]
    h.succeeded()
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

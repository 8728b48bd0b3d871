"""What one batch of staged rows asks of the database, built without I/O.

The consumer hands the plan to ``gateway.store.inbox.apply_plan``, which runs it as one
statement; this module only parses bodies and sorts events into rows per table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.core.events import (
    AccountError,
    AccountUpdate,
    Event,
    InboundMessage,
    PayloadError,
    Status,
    parse,
)

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class StagedRow:
    """A claimed ``webhook_inbox`` row: the raw bytes and what came with them."""

    id: int
    source: str
    body: bytes
    delivery_id: str | None
    attempts: int = 0


@dataclass
class Plan:
    """Keys to insert, rows per side-effect table, and the staged rows to finish or park."""

    keys: list[str] = field(default_factory=list)
    key_inbox: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    account_errors: list[dict[str, Any]] = field(default_factory=list)
    account_updates: list[dict[str, Any]] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    parked_why: list[str] = field(default_factory=list)
    duplicates_in_batch: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    def rows_for(self, ev: Event) -> list[dict[str, Any]]:
        """The list an event's side-effect row belongs in."""
        if isinstance(ev, InboundMessage):
            return self.messages
        if isinstance(ev, Status):
            return self.statuses
        if isinstance(ev, AccountError):
            return self.account_errors
        assert isinstance(ev, AccountUpdate)
        return self.account_updates

    def add(self, ev: Event, inbox_id: int, source: str) -> None:
        self.keys.append(ev.key)
        self.key_inbox.append(inbox_id)
        self.kinds[ev.kind] += 1
        self.rows_for(ev).append(ev.to_row(inbox_id, source))


def describe(exc: BaseException) -> str:
    """One bounded line for ``last_error`` and logs."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def plan_batch(rows: Iterable[StagedRow]) -> Plan:
    """Parse every row; park the unparseable; keep the first occurrence of each key."""
    plan = Plan()
    seen: set[str] = set()
    for row in rows:
        inbox_id = row.id
        try:
            events = parse(row.source, row.body, row.delivery_id)
        except PayloadError as exc:
            plan.parked.append(inbox_id)
            plan.parked_why.append(describe(exc))
            continue
        plan.done.append(inbox_id)
        for ev in events:
            if ev.key in seen:
                plan.duplicates_in_batch += 1
                continue
            seen.add(ev.key)
            plan.add(ev, inbox_id, row.source)
    return plan

"""What one batch of staged rows asks of the database, built without I/O.

The consumer hands the plan to ``gateway.store.inbox.apply_plan``, which runs it as one
statement; this module only parses bodies and sorts events into rows per table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from gateway.core.events import (
    AccountError,
    AccountUpdate,
    Event,
    InboundMessage,
    Item,
    PayloadError,
    Status,
    event_day,
    subject_of,
)
from gateway.core.forwarding import forward_row
from gateway.core.identity import Who, ident, links
from gateway.core.parsing import parse_items
from gateway.core.settings import MIN_DEDUP_RETENTION_DAYS

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class StagedRow:
    """A claimed ``webhook_inbox`` row: the raw bytes and what came with them."""

    id: int
    source: str
    body: bytes
    delivery_id: str | None
    attempts: int = 0


# Event kinds, each with its side-effect table (the plan's rows per kind).
KINDS = (InboundMessage.kind, Status.kind, AccountError.kind, AccountUpdate.kind)


@dataclass
class Plan:
    """Keys to insert, side-effect rows per event kind, and the staged rows to finish or park."""

    keys: list[str] = field(default_factory=list)
    key_inbox: list[int] = field(default_factory=list)
    key_days: list[date] = field(default_factory=list)  # each key's partition (events.event_day)
    key_subjects: list[str] = field(default_factory=list)  # each key's subject (events.subject_of)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in KINDS})
    # One row per event for the destinations that want it: kind, conversation, envelope.
    forwards: list[dict[str, Any]] = field(default_factory=list)
    # Phone number <-> BSUID pairs the events show, per business number (customer_ids).
    links: list[dict[str, Any]] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    parked_why: list[str] = field(default_factory=list)
    duplicates_in_batch: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    # Not parameters of the batch statement: what the consumer needs around it.
    events: list[tuple[Event, StagedRow, Item]] = field(default_factory=list)  # planned, in order
    bad: list[tuple[StagedRow, Item]] = field(default_factory=list)  # fragments that are no event
    parsed: list[tuple[StagedRow, list[Item]]] = field(default_factory=list)  # rows in ``done``

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.rows[InboundMessage.kind]

    @property
    def statuses(self) -> list[dict[str, Any]]:
        return self.rows[Status.kind]

    @property
    def account_errors(self) -> list[dict[str, Any]]:
        return self.rows[AccountError.kind]

    @property
    def account_updates(self) -> list[dict[str, Any]]:
        return self.rows[AccountUpdate.kind]

    def add(self, ev: Event, inbox_id: int, source: str, day: date) -> None:
        self.keys.append(ev.key)
        self.key_inbox.append(inbox_id)
        self.key_days.append(day)
        self.key_subjects.append(subject_of(ev.key))
        self.kinds[ev.kind] += 1
        self.rows[ev.kind].append(ev.to_row(inbox_id, source))
        self.forwards.append(forward_row(ev, source, inbox_id))
        self.links.extend(identity_links(ev))


def identity_links(ev: Event) -> list[dict[str, Any]]:
    """The phone/BSUID pairs one event shows, each with the business number it came to: the
    customer of a message or status, a ``system`` message's new identifiers (the user changed
    number or BSUID), and the ``contacts`` of other changes (calls, user_preferences,
    user_id_update, ...)."""
    number: str | None
    found: list[dict[str, Any]] = []
    if isinstance(ev, InboundMessage | Status):
        number = ev.phone_number_id
        pair = ev.who.link()
        found = [pair] if pair is not None else []
        system = ev.message.get("system") if isinstance(ev, InboundMessage) else None
        if isinstance(system, dict):
            pair = Who(
                ident(system.get("wa_id")), ident(system.get("user_id")), ident(system.get("parent_user_id"))
            ).link()
            found += [pair] if pair is not None else []
    elif isinstance(ev, AccountUpdate) and isinstance(ev.value, dict):
        metadata = ev.value.get("metadata")
        raw = metadata.get("phone_number_id") if isinstance(metadata, dict) else None
        number = raw if isinstance(raw, str) else None
        contacts = ev.value.get("contacts")
        found = links(contacts) if isinstance(contacts, list) else []
    else:
        return []
    if not number:
        return []
    return [{"phone_number_id": number, **pair} for pair in found]


def describe(exc: BaseException) -> str:
    """One bounded line for ``last_error`` and logs."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def plan_batch(
    rows: Iterable[StagedRow], *, today: date | None = None, window_days: int = MIN_DEDUP_RETENTION_DAYS
) -> Plan:
    """Parse every row; park the unparseable; keep the first occurrence of each key.

    A malformed fragment inside a valid body is listed in ``bad`` (the consumer records it
    as a dead item) and the rest of the body is planned as usual. ``today`` (UTC, default:
    now) and ``window_days`` (the dedup retention) fix each key's event day
    (``events.event_day``)."""
    today = datetime.now(UTC).date() if today is None else today
    plan = Plan()
    seen: set[str] = set()
    for row in rows:
        inbox_id = row.id
        try:
            items = parse_items(row.source, row.body, row.delivery_id)
        except PayloadError as exc:
            plan.parked.append(inbox_id)
            plan.parked_why.append(describe(exc))
            continue
        plan.done.append(inbox_id)
        plan.parsed.append((row, items))
        for item in items:
            if item.error is not None:
                plan.bad.append((row, item))
            for ev in item.events:
                if ev.key in seen:
                    plan.duplicates_in_batch += 1
                    continue
                seen.add(ev.key)
                plan.add(
                    ev, inbox_id, row.source, event_day(ev, row.source, today=today, window_days=window_days)
                )
                plan.events.append((ev, row, item))
    return plan


def plan_event(
    ev: Event,
    inbox_id: int,
    source: str,
    *,
    today: date | None = None,
    window_days: int = MIN_DEDUP_RETENTION_DAYS,
) -> Plan:
    """A plan of one event and nothing else (the per-event path runs one per savepoint)."""
    today = datetime.now(UTC).date() if today is None else today
    plan = Plan()
    plan.add(ev, inbox_id, source, event_day(ev, source, today=today, window_days=window_days))
    return plan


def plan_rows(done: list[int]) -> Plan:
    """A plan that only marks rows done (after their events went one by one)."""
    return Plan(done=list(done))

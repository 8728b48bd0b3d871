"""What one batch of staged rows asks of the database, built without I/O.

The consumer hands the plan to ``gateway.store.inbox.apply_plan``, which runs it as one
statement; this module only parses bodies and sorts events into rows per table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

from gateway.core.envelope import forward_row
from gateway.core.errors import describe
from gateway.core.events import (
    UNTIMED_DAY,
    AccountError,
    AccountUpdate,
    Event,
    InboundMessage,
    Item,
    Status,
    event_day,
    subject_of,
)
from gateway.core.identity import Who, ident, links
from gateway.core.parsing import parse_items
from gateway.core.records import record

# The most bytes of an event key. The key and its subject (most of the key again) are one
# entry of processed_webhook_events' primary key, and a btree entry holds at most 2704 bytes
# (PostgreSQL's limit with its default 8 kB pages): a key much past this could never be
# stored, and Meta's ids are tens of characters. Refused by the planner, such an event is a
# dead item at once instead of after its attempts.
MAX_KEY_BYTES = 1024


@record
class StagedRow:
    """A claimed ``webhook_inbox`` row: the raw bytes and what came with them."""

    id: int
    source: str
    body: bytes
    delivery_id: str | None
    attempts: int = 0
    txid: int = 0  # the transaction that wrote it, and its lane (gateway/core/lanes.py)
    lane: int = 0


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
    # One row per event for the destinations that want it: kind, conversation, envelope or
    # bodies (``bodies``: rendered here, gateway.core.envelope.forward_row). Without
    # ``forwarding`` none is built, and the statement refuses the batch if a destination is
    # enabled (the consumer then plans it again with them: gateway.inbound.applier).
    forwards: list[dict[str, Any]] = field(default_factory=list)
    bodies: bool = False
    forwarding: bool = True
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
        """Plan ``ev``; all or nothing (whatever raises leaves the plan as it was)."""
        size = len(ev.key.encode())
        if size > MAX_KEY_BYTES:
            raise ValueError(f"its key is {size} bytes, at most {MAX_KEY_BYTES} can be indexed")
        subject = subject_of(ev.key)
        row = ev.to_row(inbox_id, source)
        forward = forward_row(ev, source, inbox_id, bodies=self.bodies) if self.forwarding else None
        links = identity_links(ev)
        self.keys.append(ev.key)
        self.key_inbox.append(inbox_id)
        self.key_days.append(day)
        self.key_subjects.append(subject)
        self.kinds[ev.kind] += 1
        self.rows[ev.kind].append(row)
        if forward is not None:
            self.forwards.append(forward)
        self.links.extend(links)


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


def plan_batch(rows: Iterable[StagedRow], *, bodies: bool = False, forwarding: bool = True) -> Plan:
    """Parse every row; park the unparseable; keep the first occurrence of each key. Never
    raises: whatever a row's bytes make the parser or the planner raise is that row's or that
    event's fault, recorded in the plan, never the batch's.

    A malformed fragment inside a valid body (or an event that cannot be planned) is listed in
    ``bad`` (the consumer records it as a dead item) and the rest of the body is planned as
    usual. Each key's partition day is ``events.event_day``, a pure function of the event.
    ``bodies``: render the events' bodies for destinations (Plan.forwards); without
    ``forwarding``, nothing for destinations."""
    plan = Plan(bodies=bodies, forwarding=forwarding)
    seen: set[str] = set()
    for row in rows:
        inbox_id = row.id
        try:
            items = parse_items(row.source, row.body, row.delivery_id)
        except Exception as exc:  # PayloadError, or anything the bytes made the parser raise
            plan.parked.append(inbox_id)
            plan.parked_why.append(describe(exc))
            continue
        plan.done.append(inbox_id)
        kept: list[Item] = []
        for item in items:
            if item.error is not None:
                plan.bad.append((row, item))
            for ev in item.events:
                if ev.key in seen:
                    plan.duplicates_in_batch += 1
                    continue
                try:
                    plan.add(ev, inbox_id, row.source, event_day(ev, row.source))
                except Exception as exc:
                    item = replace(item, events=(), error=f"cannot plan {ev.key[:200]}: {describe(exc)}")
                    plan.bad.append((row, item))
                    break
                seen.add(ev.key)
                plan.events.append((ev, row, item))
            kept.append(item)
        plan.parsed.append((row, kept))
    return plan


def plan_event(ev: Event, inbox_id: int, source: str) -> Plan:
    """A plan of one event and nothing else (a dead item's retry runs one per savepoint)."""
    plan = Plan()
    plan.add(ev, inbox_id, source, event_day(ev, source))
    return plan


# Harmless events, one per kind: what the consumer applies (and rolls back) to learn whether
# the database fails any event of that kind, or only the one that failed.
PROBE_PREFIX = "probe:"


def probe_event(kind: str, tag: str) -> Event:
    """A harmless event of ``kind`` (its key and ids start with ``probe:``, ``tag`` makes
    them unique; it names no outbox row and carries no timestamp)."""
    key = f"{PROBE_PREFIX}{kind}:{tag}"
    if kind == Status.kind:
        return Status(key, key, "sent", "", None, None, None, None, {})
    if kind == AccountError.kind:
        return AccountError(key, None, None, "messages", [{"code": 0}], {})
    if kind == AccountUpdate.kind:
        return AccountUpdate(key, None, "probe", {})
    return InboundMessage(key, key, None, None, "text", None, None, {"id": key})


def probe_plan(kinds: Iterable[str], source: str, tag: str) -> Plan:
    """One harmless event per kind, planned like any other."""
    plan = Plan()
    for kind in sorted(set(kinds)):
        plan.add(probe_event(kind, tag), 0, source, UNTIMED_DAY)
    return plan

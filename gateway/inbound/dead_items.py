"""Dead items: events parked on their own (``dead_events``) with their exact bytes, and how
they are rebuilt from those bytes when retried."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import describe, last_line
from gateway.core.events import Event, Item
from gateway.core.faults import BadEvent, Fault, HandlerError, Verdict
from gateway.core.jsonspan import Spans, pointer
from gateway.core.parsing import parse_fragment
from gateway.core.planning import StagedRow
from gateway.store import dead_events


@dataclass
class Failure:
    """An event that failed in its own savepoint, with what failed it."""

    row: StagedRow
    item: Item
    event: Event
    exc: BaseException
    fault: Fault


def bad_item(row: StagedRow, item: Item) -> dead_events.NewItem:
    """A fragment that can never be an event: dead at once, with its bytes."""
    return dead_events.NewItem(
        inbox_id=row.id,
        position=item.position,
        path=pointer(item.path),
        event_key=None,
        kind="bad",
        source=row.source,
        unit=item.unit,
        context=item.context,
        fragment=raw_fragment(row, item),
        state=dead_events.DEAD,
        attempts=1,
        deferrals=0,
        delay_s=0.0,
        error=item.error or "malformed",
    )


def failed_item(
    f: Failure, v: Verdict, *, max_attempts: int, delay: Callable[[Verdict, int, int], float]
) -> dead_events.NewItem:
    """An event that failed in its own savepoint: retried on its own, or dead."""
    attempts = int(v is Verdict.ATTEMPT)
    dead = v is Verdict.DEAD or attempts >= max_attempts
    return dead_events.NewItem(
        inbox_id=f.row.id,
        position=f.item.position,
        path=pointer(f.item.path),
        event_key=f.event.key,
        kind=f.event.kind,
        source=f.row.source,
        unit=f.item.unit,
        context=f.item.context,
        fragment=raw_fragment(f.row, f.item),
        state=dead_events.DEAD if dead else dead_events.RETRY,
        attempts=attempts,
        deferrals=int(v is Verdict.DEFER),
        delay_s=delay(v, attempts, 1),
        error=error_text(f.exc),
    )


@functools.lru_cache(maxsize=1)
def _spans(body: bytes) -> Spans:
    # The fragments of a body's events are asked for one after another (its malformed
    # fragments, its failed or escaped events): the last body's spans serve them all, and it
    # is scanned once, not once per event. One body at most is kept.
    return Spans(body)


def raw_fragment(row: StagedRow, item: Item) -> bytes:
    """The fragment's bytes exactly as sent (the whole body if it cannot be located)."""
    found = _spans(row.body).fragment(item.path)
    return row.body if found is None else found


def _parse(it: dead_events.Claimed) -> list[Event]:
    try:
        return parse_fragment(it.source, it.unit, it.fragment, it.context)
    except Exception as exc:  # PayloadError, or whatever these bytes make the parser raise
        raise BadEvent(describe(exc)) from exc


class Rebuilder:
    """Dead items' events, from their own bytes (BadEvent if they are no event), for the items
    of one claim taken in (inbox_id, path) order: a fragment is parsed once for the items next
    to each other that share it. A group status listing n participants is one fragment with an
    item per participant; parsed per item, its retries cost n² events (44 ms an item at 10 000
    participants, on the consumer's event loop). Each event is handed out once: a second item
    of one key gets a fresh parse, never an event a handler was given (and may have changed)
    before."""

    def __init__(self) -> None:
        self._of: tuple[str, str, bytes, dict[str, Any]] | None = None
        self._left: dict[str, list[Event]] = {}
        self._given: set[str] = set()
        self._error: str | None = None  # why the fragment is no event (BadEvent)

    def __call__(self, it: dead_events.Claimed) -> list[Event]:
        key = it.event_key
        if key is None:  # a fragment that is no event: all it parses to, if anything
            events = _parse(it)
            if not events:
                raise BadEvent("fragment has no event None")
            return events
        of = (it.source, it.unit, it.fragment, it.context)
        if of != self._of or key in self._given:
            self._parse(of, it)
        if self._error is not None:
            raise BadEvent(self._error)
        events = self._left.pop(key, [])
        if not events:
            raise BadEvent(f"fragment has no event {key!r}")
        self._given.add(key)
        return events

    def _parse(self, of: tuple[str, str, bytes, dict[str, Any]], it: dead_events.Claimed) -> None:
        self._of, self._left, self._given, self._error = of, {}, set(), None
        try:
            events = _parse(it)
        except BadEvent as exc:
            self._error = str(exc)
            return
        for ev in events:
            self._left.setdefault(ev.key, []).append(ev)


def error_text(exc: BaseException) -> str:
    """What an operator sees: a handler's last traceback line, or the error in one line."""
    if isinstance(exc, HandlerError):
        return str(exc)
    return describe(exc) if str(exc) else last_line(exc)

"""Narrowing a failed batch down to the events at fault, without I/O.

A batch whose statement or handlers failed is applied again in parts, each part in a savepoint
of its own: a part that goes through is done, a part that fails is split again, and an event
that fails alone is that event's fault. Halving finds one bad event among 1 000 in about 20
statements where applying each event alone takes 1 000. Parts of at most ``ONE_BY_ONE``
events are applied one event at a time, which bounds the worst case (every event bad) at
about 1.25 statements per event, against one per event for going one by one from the start.
"""

from __future__ import annotations

# A range of a failed group's events to apply together next: [start, end).
Part = tuple[int, int]
# A failed group of at most this many events is applied one event at a time.
ONE_BY_ONE = 8


def narrow(n: int, failed_at: int | None = None) -> tuple[int | None, list[Part]]:
    """After a group of ``n`` events failed together: the event now known to be at fault (or
    None) and the parts to try next, in order.

    ``failed_at``: the event the failure is known to belong to (a handler raised on it after
    the group's statement had applied every event). It is at fault; the events before it went
    through and are tried again as one part, the events after it are unknown and are tried as
    one part, or as two halves when more than ``ONE_BY_ONE``. Otherwise a group of one is at
    fault, a small group goes one by one, and a larger group is halved."""
    if n < 1:
        raise ValueError("a failed group holds at least one event")
    if failed_at is not None:
        if not 0 <= failed_at < n:
            raise ValueError(f"failed_at {failed_at} is not one of {n} events")
        before = [(0, failed_at)] if failed_at else []
        return failed_at, before + _halves(failed_at + 1, n)
    if n == 1:
        return 0, []
    if n <= ONE_BY_ONE:
        return None, [(i, i + 1) for i in range(n)]
    return None, _halves(0, n)


def _halves(start: int, end: int) -> list[Part]:
    if end - start <= ONE_BY_ONE:
        return [(start, end)] if start < end else []
    mid = (start + end) // 2
    return [(start, mid), (mid, end)]

"""What a delivery attempt's answer means, without I/O: delivered, retry (and when), failed or
gone (``decide``), and the circuit breaker's count of one round's outcomes per destination
(``breaker_tally``, ``merge_tallies``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from enum import StrEnum

# Retry-After larger than this is clamped: a receiver must not park deliveries for days.
MAX_RETRY_AFTER_S = 3600.0


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERING = "delivering"
    DELIVERED = "delivered"
    FAILED = "failed"


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


BREAKER_GAUGE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class DeliveryOutcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    # 410 Gone: the endpoint says it is gone for good. The destination is disabled (an
    # operator re-enables it); the delivery waits, pending, like the rest of its backlog.
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: DeliveryOutcome
    state: DeliveryState
    delay_s: float | None  # seconds until the next attempt (RETRY only)
    error: str | None


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from ``Retry-After`` (delta-seconds or an HTTP-date), clamped; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now), MAX_RETRY_AFTER_S)


def decide(
    *,
    status: int | None,
    error: str | None,
    retry_after: str | None,
    now: float,
    first_attempt_at: float,
    backoff_s: float,
    retry_window_s: float,
) -> Decision:
    """2xx: delivered. 410: gone (the destination is disabled, the delivery waits for it to be
    enabled again, due at once). Anything else (another status, a timeout, a refused
    connection): retry after ``backoff_s`` (or the receiver's Retry-After on 429/503, whichever
    is later), unless that falls past ``first_attempt_at + retry_window_s``: then failed, kept
    for replay."""
    if status is not None and 200 <= status < 300:
        return Decision(DeliveryOutcome.DELIVERED, DeliveryState.DELIVERED, None, None)
    why = error if status is None else f"HTTP {status}" + (f": {error}" if error else "")
    if status == 410:
        return Decision(DeliveryOutcome.GONE, DeliveryState.PENDING, 0.0, why)
    delay = backoff_s
    if status in (429, 503):
        asked = parse_retry_after(retry_after, now)
        if asked is not None:
            delay = max(delay, asked)
    if now + delay > first_attempt_at + retry_window_s:
        return Decision(DeliveryOutcome.FAILED, DeliveryState.FAILED, None, why)
    return Decision(DeliveryOutcome.RETRY, DeliveryState.PENDING, delay, why)


def breaker_tally(successes: Sequence[bool]) -> tuple[bool, int]:
    """From one destination's outcomes in completion order: (any success, failures after the
    last success). The breaker statement resets its count on a success and adds the rest."""
    saw_success = False
    failures = 0
    for ok in successes:
        if ok:
            saw_success = True
            failures = 0
        else:
            failures += 1
    return saw_success, failures


def merge_tallies(
    earlier: Sequence[tuple[int, bool, int]], later: Sequence[tuple[int, bool, int]]
) -> list[tuple[int, bool, int]]:
    """Breaker tallies (destination, any success, failures after the last success) of two
    rounds, as if their outcomes had been counted in one (a failed round's are written with
    the next)."""
    out = {dest: (ok, fails) for dest, ok, fails in earlier}
    for dest, ok, fails in later:
        if dest in out and not ok:
            ok, fails = out[dest][0], out[dest][1] + fails
        out[dest] = (ok, fails)
    return [(dest, ok, fails) for dest, (ok, fails) in out.items()]

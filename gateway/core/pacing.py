"""Send pacing and circuit breakers, decided for one claim. Pure: the caller passes the state
it read from the database (under a lock per key) and the time, and writes back what this
returns, in the same transaction as the claim. So any number of senders share one pace.

Limits, per provider (``Limits``):
- a (number, person) pair gets at most one message per ``pair_interval_s`` (Meta's pair rate
  limit, about one message per 6 s to one user; error 131056 beyond it);
- a sending number gets at most ``1 / number_interval_s`` messages per second, with bursts of
  ``number_burst`` (GCRA: the key holds the number's theoretical arrival time). Meta: 80
  messages/s per number by default (``GATEWAY_NUMBER_RATE_PER_S``); Tenashi paces itself at
  one message every 4-12 s per number, so we send no faster than its slowest pace
  (``GATEWAY_TENASHI_NUMBER_INTERVAL_S``) and nothing queues where we cannot see or cancel it.

Work-conserving: a row waits only for its own limits. A row its pair holds back books nothing
of its number: only sends (and rows the number itself holds back, spread at its rate) use the
number's capacity, so one customer's wait never delays another customer.

Per-customer order: a pair's messages leave in outbox order (id). A row waits while an earlier
row of its pair may still be sent (``Candidate.ahead``: pending, in flight, or unknown with a
resend to come), and the pair has at most one message in flight. Within a claim a pair's rows
are taken in id order whatever the claim's order.

Rows a breaker or a limit holds back are not claimed: they stay ``pending`` with a later
``next_attempt_at`` (the earliest instant their limits allow, so the next claims find them
due when they may go). Rows whose keys another sender holds are left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gateway.core.enums import Provider
from gateway.core.settings import Settings


@dataclass(frozen=True, slots=True)
class Limits:
    pair_interval_s: float
    number_interval_s: float  # 1 / rate
    number_burst: float = 1.0

    @property
    def tolerance_s(self) -> float:
        """How far ahead of now a number's arrival time may run (the burst)."""
        return max(0.0, self.number_burst - 1.0) * self.number_interval_s


def limits_for(settings: Settings) -> Callable[[str], Limits]:
    """Each provider's limits from the settings."""
    meta = Limits(
        settings.pair_interval_s,
        1.0 / settings.number_rate_per_s,
        max(1.0, settings.number_rate_per_s),
    )
    tenashi = Limits(settings.pair_interval_s, settings.tenashi_number_interval_s, 1.0)
    return lambda provider: tenashi if provider == Provider.TENASHI else meta


def pair_key(provider: str, number: str, recipient: str) -> str:
    return f"pair:{provider}:{number}:{recipient}"


def number_key(provider: str, number: str) -> str:
    return f"num:{provider}:{number}"


@dataclass(frozen=True, slots=True)
class Ahead:
    """The nearest earlier row of a candidate's pair that may still be sent: the candidate waits
    for it (per-customer order)."""

    id: int
    state: str  # pending | sending | unknown (an unknown row whose resend may come)
    due: float = 0.0  # pending: its next_attempt_at


@dataclass(frozen=True, slots=True)
class Candidate:
    """A due pending row, as the claim sees it."""

    id: int
    provider: str
    number: str
    recipient: str
    tenant: str
    # Whom ``recipient`` names (the BSUID its phone number was last seen with): one pace for the
    # phone number and the BSUID of one customer. Empty: the recipient itself.
    person: str = ""
    # Which access token the send uses (its token breaker's key); empty: the tenant's.
    token: str = ""
    # The pair's nearest earlier row that may still be sent, whether or not this claim holds it.
    ahead: Ahead | None = None

    @property
    def keys(self) -> tuple[str, str]:
        who = self.person or self.recipient
        return number_key(self.provider, self.number), pair_key(self.provider, self.number, who)

    @property
    def breakers(self) -> tuple[BreakerId, BreakerId]:
        token = BreakerId("token", self.provider, self.token or self.tenant)
        return BreakerId("number", self.provider, self.number), token


@dataclass(frozen=True, slots=True, order=True)
class BreakerId:
    scope: str  # number | token
    provider: str
    key: str  # phone_number_id | the token's key (tenancy.token_key)

    @property
    def lock_key(self) -> str:
        return f"brk:{self.scope}:{self.provider}:{self.key}"


@dataclass(frozen=True, slots=True)
class Breaker:
    """A breaker's stored state (closed breakers need no row)."""

    state: str  # closed | open | half_open
    failures: int = 0
    retry_at: float = 0.0  # open: when a probe may go; half_open: when the probe counts as lost
    code: int | None = None
    error: str | None = None
    probe_id: int | None = None


CLOSED = Breaker("closed")


@dataclass
class Plan:
    go: list[int] = field(default_factory=list)
    defer: dict[int, float] = field(default_factory=dict)  # id -> next_attempt_at
    pacing: dict[str, float] = field(default_factory=dict)  # key -> new value to store
    breakers: dict[BreakerId, Breaker] = field(default_factory=dict)  # changed breakers (probes)
    # Rows put off behind a row that goes now, directly or behind another of them: that row's id
    # -> (those rows, the earliest its pair allows the next). Once the send is done they are due
    # then (not a recheck later), and the next claim takes them in order.
    behind: dict[int, tuple[list[int], float]] = field(default_factory=dict)


def plan_claim(
    candidates: Iterable[Candidate],
    *,
    locked: set[str],
    pacing: Mapping[str, float],
    breakers: Mapping[BreakerId, Breaker],
    limits: Callable[[str], Limits],
    now: float,
    limit: int,
    probe_lease_s: float,
    recheck_s: float,
) -> Plan:
    """Which candidates go now (at most ``limit``), which wait until when, and the state to store.

    ``candidates`` in claim order; ``locked`` the pacing and breaker keys this claim holds (rows
    needing another key are skipped untouched); ``pacing`` the stored value of locked keys;
    ``recheck_s`` how long a row behind one in flight waits before it is looked at again.
    """
    plan = Plan()
    cands = [
        c
        for c in candidates
        if all(k in locked for k in c.keys) and all(b.lock_key in locked for b in c.breakers)
    ]
    pace = _Pace(pacing, now)
    brk = dict(breakers)
    previous = _previous_in_claim(cands)
    in_claim = {c.id for c in cands}
    decided: dict[int, float] = {}  # id -> when it goes (now: it goes now)
    waiting: list[Candidate] = []  # behind a row of this claim not decided yet
    for c in cands:
        if len(plan.go) >= limit:
            break
        lim = limits(c.provider)
        ahead = _nearest(c, previous.get(c.id))
        if ahead is not None and ahead.id in in_claim and ahead.id not in decided:
            waiting.append(c)
            continue
        # Breakers: open → wait for the probe time; due → this row is the probe; half-open → wait.
        held_until = 0.0
        probe: BreakerId | None = None
        for b_id in c.breakers:
            b = brk.get(b_id, CLOSED)
            if b.state == "open" and b.retry_at > now:
                held_until = max(held_until, b.retry_at)
            elif b.state == "half_open" and b.retry_at > now:
                # Until the probe's lease ends; its success makes them due at once (wake_rows).
                held_until = max(held_until, b.retry_at)
            elif b.state in ("open", "half_open"):
                probe = b_id if probe is None else probe
        if ahead is not None:
            held_until = max(held_until, _behind(ahead, decided, pace, c, lim, now, recheck_s))
            _note_behind(plan, ahead, c, pace, lim)
        if held_until > 0:
            plan.defer[c.id] = decided[c.id] = held_until
            continue
        at = pace.earliest(c, lim)
        if at > now:
            plan.defer[c.id] = decided[c.id] = at
            pace.queue(c, lim, at)
            continue
        plan.go.append(c.id)
        decided[c.id] = now
        plan.pacing.update(pace.send(c, lim))
        if probe is not None:
            # One probe per breaker; both of the row's breakers wait for its outcome.
            for b_id in c.breakers:
                b = brk.get(b_id, CLOSED)
                if b.state != "closed":
                    brk[b_id] = plan.breakers[b_id] = Breaker(
                        "half_open", b.failures, now + probe_lease_s, b.code, b.error, c.id
                    )
    # Rows behind a row of this claim that came later in its order: its decision is known now
    # (in id order, so a chain of them resolves); behind one the claim never reached, untouched.
    for c in sorted(waiting, key=lambda c: c.id):
        ahead = _nearest(c, previous.get(c.id))
        if ahead is not None and ahead.id in decided:
            lim = limits(c.provider)
            plan.defer[c.id] = decided[c.id] = _behind(ahead, decided, pace, c, lim, now, recheck_s)
            _note_behind(plan, ahead, c, pace, lim)
    return plan


def _note_behind(plan: Plan, ahead: Ahead, c: Candidate, pace: _Pace, lim: Limits) -> None:
    if ahead.id in plan.go:
        plan.behind[ahead.id] = ([c.id], pace.pair_at(c, lim))
        return
    for rows, _at in plan.behind.values():
        if ahead.id in rows:
            rows.append(c.id)
            return


def _previous_in_claim(cands: list[Candidate]) -> dict[int, int]:
    """Each candidate's previous candidate (by id) of the same pair in this claim."""
    by_pair: dict[str, list[int]] = {}
    for c in cands:
        by_pair.setdefault(c.keys[1], []).append(c.id)
    previous: dict[int, int] = {}
    for ids in by_pair.values():
        ids.sort()
        previous.update(zip(ids[1:], ids[:-1], strict=True))
    return previous


def _nearest(c: Candidate, previous_id: int | None) -> Ahead | None:
    """The nearer of the pair's previous row in this claim and the earlier row the database saw."""
    if previous_id is not None and (c.ahead is None or previous_id >= c.ahead.id):
        return Ahead(previous_id, "pending")
    return c.ahead


def _behind(
    ahead: Ahead,
    decided: Mapping[int, float],
    pace: _Pace,
    c: Candidate,
    lim: Limits,
    now: float,
    recheck_s: float,
) -> float:
    """When a row behind ``ahead`` is worth looking at again: once ``ahead`` has gone and its
    pair interval passed (at least ``recheck_s`` after it went: one message in flight per pair)."""
    gap = max(lim.pair_interval_s, recheck_s)
    if ahead.id in decided:
        at = decided[ahead.id] + gap
    elif ahead.state == "pending":
        at = max(ahead.due, now) + gap
    elif ahead.state == "sending":
        at = now + recheck_s
    else:  # unknown: its status webhook (or its resend) settles it
        at = now + gap
    return max(at, pace.pair_at(c, lim))


class _Pace:
    """The claim's view of the pacing keys: ``real`` is what sends booked (stored back), ``queued``
    adds the slots of rows their number holds back (so those are spread at its rate)."""

    def __init__(self, stored: Mapping[str, float], now: float) -> None:
        self.now = now
        self.stored = stored
        self.real: dict[str, float] = {}
        self.queued: dict[str, float] = {}

    def _get(self, state: Mapping[str, float], key: str, horizon_s: float) -> float:
        if key in state:
            return state[key]
        # A stored time further ahead than a send can book was written by a clock ahead of ours
        # (or ours stepped back since): capped, so it holds for one interval, not for the step.
        return min(self.stored.get(key, self.now), self.now + horizon_s)

    def pair_at(self, c: Candidate, lim: Limits) -> float:
        return self._get(self.real, c.keys[1], lim.pair_interval_s)

    def _num(self, state: Mapping[str, float], c: Candidate, lim: Limits) -> float:
        return self._get(state, c.keys[0], lim.tolerance_s + lim.number_interval_s)

    def earliest(self, c: Candidate, lim: Limits) -> float:
        return max(self.now, self.pair_at(c, lim), self._num(self.queued, c, lim) - lim.tolerance_s)

    def queue(self, c: Candidate, lim: Limits, at: float) -> None:
        """A row held back until ``at``: if its number holds it (not its pair), it takes the
        number's slot at ``at``, so the rows after it are spread at the rate."""
        if self._num(self.queued, c, lim) - lim.tolerance_s >= self.pair_at(c, lim):
            self.queued[c.keys[0]] = max(self._num(self.queued, c, lim), at) + lim.number_interval_s

    def send(self, c: Candidate, lim: Limits) -> dict[str, float]:
        """A row goes now: book its number and pair; returns the keys to store."""
        num_k, pair_k = c.keys
        self.real[num_k] = max(self._num(self.real, c, lim), self.now) + lim.number_interval_s
        self.queued[num_k] = max(self._num(self.queued, c, lim), self.now) + lim.number_interval_s
        booked = {num_k: self.real[num_k]}
        if lim.pair_interval_s > 0:
            self.real[pair_k] = booked[pair_k] = self.now + lim.pair_interval_s
        return booked


# --- breakers: what an outcome does to them ---------------------------------------------------


def breaker_backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """Seconds an open breaker waits before its next probe: base, doubling per failed probe, capped."""
    return float(min(cap_s, base_s * 2 ** max(0, failures - 1)))


def trip(
    b: Breaker, *, code: int | None, error: str | None, now: float, base_s: float, cap_s: float
) -> Breaker:
    """An account-level error: open (or reopen with a longer backoff).

    An error from a send that started before the breaker opened does not count again.
    """
    if b.state == "open" and b.retry_at > now:
        return b
    failures = b.failures + 1
    return Breaker("open", failures, now + breaker_backoff_s(failures, base_s, cap_s), code, error)


def settle_probe(b: Breaker, *, row_id: int, reached: bool, now: float, base_s: float) -> Breaker:
    """A send that was not account-level rejected: the probe proves the account works (closed).

    A probe that never reached the provider proves nothing: open again, without counting.
    A send that was not the probe (it started before the breaker opened) changes nothing.
    """
    if b.state == "closed" or b.probe_id != row_id:
        return b
    if not reached:
        return Breaker("open", b.failures, now + base_s, b.code, b.error)
    return CLOSED

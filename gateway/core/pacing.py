"""Send pacing and circuit breakers, decided for one claim. Pure: the caller passes the state
it read from the database (under a lock per key) and the time, and writes back what this
returns, in the same transaction as the claim. So any number of senders share one pace.

Limits, per provider (``Limits``):
- a (number, recipient) pair gets at most one message per ``pair_interval_s`` (Meta's pair
  rate limit, about one message per 6 s to one user; error 131056 beyond it);
- a sending number gets at most ``1 / number_interval_s`` messages per second, with bursts of
  ``number_burst`` (GCRA: the key holds the number's theoretical arrival time). Meta: 80
  messages/s per number by default (``GATEWAY_NUMBER_RATE_PER_S``); Tenashi paces itself at
  one message every 4-12 s per number, so we send no faster than its slowest pace
  (``GATEWAY_TENASHI_NUMBER_INTERVAL_S``) and nothing queues where we cannot see or cancel it.

Rows a breaker or a limit holds back are not claimed: they stay ``pending`` with a later
``next_attempt_at`` (spread as if sent at the limit, so the next claims find about as many due
as may go). Rows whose keys another sender holds are left alone.
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
    key: str  # phone_number_id | the token's key (Settings.token_key)

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
) -> Plan:
    """Which candidates go now (at most ``limit``), which wait until when, and the state to store.

    ``candidates`` in claim order; ``locked`` the pacing and breaker keys this claim holds (rows
    needing another key are skipped untouched); ``pacing`` the stored value of locked keys.
    """
    plan = Plan()
    real = dict(pacing)  # what is booked by sends
    virtual = dict(pacing)  # real plus the slots deferred rows are given
    brk = dict(breakers)
    for c in candidates:
        if len(plan.go) >= limit:
            break
        num_k, pair_k = c.keys
        ids = c.breakers
        if not (num_k in locked and pair_k in locked and all(b.lock_key in locked for b in ids)):
            continue
        lim = limits(c.provider)
        # Breakers: open → wait for the probe time; due → this row is the probe; half-open → wait.
        held_until = 0.0
        probe: BreakerId | None = None
        for b_id in ids:
            b = brk.get(b_id, CLOSED)
            if b.state == "open" and b.retry_at > now:
                held_until = max(held_until, b.retry_at)
            elif b.state == "half_open" and b.retry_at > now:
                # Until the probe's lease ends; its success makes them due at once (wake_rows).
                held_until = max(held_until, b.retry_at)
            elif b.state in ("open", "half_open"):
                probe = b_id if probe is None else probe
        if held_until > 0:
            plan.defer[c.id] = held_until
            continue
        at = _earliest(virtual, num_k, pair_k, lim, now)
        if at > now:
            plan.defer[c.id] = at
            _book(virtual, num_k, pair_k, lim, at)
            continue
        plan.go.append(c.id)
        _book(real, num_k, pair_k, lim, now)
        _book(virtual, num_k, pair_k, lim, now)
        plan.pacing[num_k] = real[num_k]
        if lim.pair_interval_s > 0:
            plan.pacing[pair_k] = real[pair_k]
        if probe is not None:
            # One probe per breaker; both of the row's breakers wait for its outcome.
            for b_id in ids:
                b = brk.get(b_id, CLOSED)
                if b.state != "closed":
                    brk[b_id] = plan.breakers[b_id] = Breaker(
                        "half_open", b.failures, now + probe_lease_s, b.code, b.error, c.id
                    )
    return plan


def _earliest(state: Mapping[str, float], num_k: str, pair_k: str, lim: Limits, now: float) -> float:
    pair_at = state.get(pair_k, now)
    num_at = state.get(num_k, now) - lim.tolerance_s
    return max(now, pair_at, num_at)


def _book(state: dict[str, float], num_k: str, pair_k: str, lim: Limits, at: float) -> None:
    state[num_k] = max(state.get(num_k, at), at) + lim.number_interval_s
    if lim.pair_interval_s > 0:
        state[pair_k] = at + lim.pair_interval_s


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

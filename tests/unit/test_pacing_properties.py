"""Pacing over random claims (hypothesis): claims of ``plan_claim`` replayed as the sender runs
them, with random arrivals, customers, limits, claim times and retried sends. Checked on what was
sent: no send earlier than its limits allow, no customer's messages out of order, and no row put
off past the earliest instant its limits (and its customer's order) allow given what was sent
before it, i.e. it goes in the first claim from that instant on.

The model: a send's outcome is known at once (accepted, or a retry after a backoff); a row
behind one of its customer's rows goes at the earliest ``max(pair interval, recheck)`` after
that row's send (one message in flight per pair: the sender looks again ``recheck_s`` later).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from hypothesis import given, note, settings
from hypothesis import strategies as st

from gateway.core.pacing import Ahead, Candidate, Limits, plan_claim

EPS = 1e-9
NUMBERS = ("n1", "n2")


@dataclass
class Row:
    id: int
    ready: float  # enqueued
    tenant: str
    number: str
    to: str
    fails: list[float]  # the backoff after each failed attempt, in order
    due: float = 0.0
    done: bool = False
    attempts: list[float] = field(default_factory=list)

    @property
    def pair(self) -> tuple[str, str]:
        return (self.number, self.to)

    def candidate(self, ahead: Ahead | None) -> Candidate:
        return Candidate(self.id, "meta", self.number, self.to, self.tenant, ahead=ahead)


@dataclass(frozen=True)
class Scenario:
    rows: list[Row]
    lim: Limits
    recheck_s: float
    gaps: list[float]  # between claims
    limit: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    pair = draw(st.sampled_from([0.0, 0.5, 2.0, 6.0]))
    rate = draw(st.sampled_from([2.0, 5.0, 50.0, 1e6]))
    burst = draw(st.sampled_from([1.0, 3.0, rate]))
    n = draw(st.integers(1, 30))
    # Arrivals on a 10 ms grid: a claim either sees a row or does not (no rounding in between).
    arrivals = sorted(t / 100 for t in draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n)))
    rows = [
        Row(
            i + 1,
            t,
            draw(st.sampled_from(["t", "t", "u"])),
            draw(st.sampled_from(NUMBERS)),
            draw(st.sampled_from(["a", "b", "c", "d", "e"])),
            draw(st.lists(st.sampled_from([0.3, 1.0, 7.0]), max_size=2)),
        )
        for i, t in enumerate(arrivals)
    ]
    for r in rows:
        r.due = r.ready
    gaps = draw(
        st.lists(st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.3]), min_size=1, max_size=20).filter(
            lambda g: sum(g) / len(g) >= 0.05  # at most a few thousand claims per case
        )
    )
    return Scenario(
        rows, Limits(pair, 1 / rate, burst), draw(st.sampled_from([0.05, 0.2])), gaps, draw(st.integers(1, 5))
    )


def ahead_of(r: Row, rows: list[Row]) -> Ahead | None:
    """What the claim's look-up finds: the nearest earlier open row of the same number and
    recipient, whichever tenant's (here every open row is pending: outcomes are known at once)."""
    earlier = [e for e in rows if e.id < r.id and e.pair == r.pair and not e.done]
    if not earlier:
        return None
    e = max(earlier, key=lambda e: e.id)
    return Ahead(e.id, "pending", e.due)


def simulate(sc: Scenario) -> tuple[list[float], list[tuple[float, Row]]]:
    """Run claims until every row is accepted; returns the claim times and the sends in order."""
    rows, lim = sc.rows, sc.lim
    state: dict[str, float] = {}
    claims: list[float] = []
    sends: list[tuple[float, Row]] = []
    now = 0.0
    for step in itertools.count():
        assert step < 20000, "the claims never drained the rows"
        if all(r.done for r in rows):
            break
        claims.append(now)
        known = [r for r in rows if r.ready <= now]
        due = sorted((r for r in known if not r.done and r.due <= now), key=lambda r: (r.due, r.id))
        cands = [r.candidate(ahead_of(r, known)) for r in due]
        plan = plan_claim(
            cands,
            locked={k for c in cands for k in c.keys} | {b.lock_key for c in cands for b in c.breakers},
            pacing=state,
            breakers={},
            limits=lambda _p: lim,
            now=now,
            limit=sc.limit,
            probe_lease_s=90.0,
            recheck_s=sc.recheck_s,
        )
        state.update(plan.pacing)
        by_id = {r.id: r for r in rows}
        for i, at in plan.defer.items():
            assert at >= now - EPS
            by_id[i].due = at
        for i in plan.go:
            r = by_id[i]
            r.attempts.append(now)
            sends.append((now, r))
            if len(r.attempts) > len(r.fails):
                r.done = True
            else:
                r.due = now + r.fails[len(r.attempts) - 1]
        if len(plan.go) < sc.limit:  # a full claim is followed at once by the next
            now += sc.gaps[step % len(sc.gaps)]
    return claims, sends


def earliest(sends: list[tuple[float, Row]], k: int, sc: Scenario) -> tuple[float, float]:
    """The earliest instant the k-th send could have gone, given the sends before it: by its
    limits alone, and with an earlier row of its customer taken as in flight for the recheck."""
    t, r = sends[k]
    lim = sc.lim
    n = r.attempts.index(t)
    at = r.ready if n == 0 else r.attempts[n - 1] + r.fails[n - 1]
    tat: dict[str, float] = {}
    behind = 0.0
    for u, s in sends[:k]:
        tat[s.number] = max(tat.get(s.number, u), u) + lim.number_interval_s
        if s.pair == r.pair:  # every tenant's sends to the pair
            at = max(at, u + lim.pair_interval_s)
        if s.pair == r.pair and s.id < r.id:  # an earlier row to the customer
            behind = max(behind, u + max(lim.pair_interval_s, sc.recheck_s))
    if r.number in tat:
        at = max(at, tat[r.number] - lim.tolerance_s)
    return at, max(at, behind)


@settings(max_examples=200, deadline=None)  # 4 000 pass too: a few seconds here
@given(scenarios())
def test_pacing_over_random_claims(sc: Scenario) -> None:
    note(repr(sc))
    claims, sends = simulate(sc)
    lim = sc.lim

    # The number's rate is never exceeded (GCRA over the sends in order).
    tat: dict[str, float] = {}
    for t, r in sends:
        assert t >= tat.get(r.number, t) - lim.tolerance_s - EPS
        tat[r.number] = max(tat.get(r.number, t), t) + lim.number_interval_s

    # A pair gets one message per interval, whichever tenant sends it.
    pairs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for t, r in sends:
        pairs[r.pair].append(t)
    for times in pairs.values():
        assert all(b - a >= lim.pair_interval_s - EPS for a, b in itertools.pairwise(times))

    # A customer's messages go in outbox order: a row's first attempt comes after the earlier
    # row's last (accepted) one.
    position = {(r.id, t): i for i, (t, r) in enumerate(sends)}
    rows = sorted(sc.rows, key=lambda r: r.id)
    for a, b in itertools.combinations(rows, 2):
        if a.pair == b.pair:
            assert position[(b.id, b.attempts[0])] > position[(a.id, a.attempts[-1])]

    # Work-conserving: each send went in the first claim at or after its earliest instant.
    for k, (t, _r) in enumerate(sends):
        lo, hi = earliest(sends, k, sc)
        assert t >= lo - EPS  # (the limits again)
        if t > hi + EPS:
            # (A claim a rounding error before the instant may have found it not yet due.)
            later = sorted({c for c in claims if c >= hi - EPS})
            first = later[1] if later[0] < hi and len(later) > 1 else later[0]
            assert t <= first + EPS, f"send {k} at {t} waited past {first} (earliest {hi})"

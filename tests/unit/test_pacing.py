"""Cluster-wide pacing and breakers, decided per claim (gateway.core.pacing): table tests."""

import itertools

import pytest

from gateway.core.pacing import (
    CLOSED,
    Ahead,
    Breaker,
    BreakerId,
    Candidate,
    Limits,
    Plan,
    breaker_backoff_s,
    number_key,
    pair_key,
    plan_claim,
    settle_probe,
    trip,
)

META = Limits(pair_interval_s=6.0, number_interval_s=1 / 80, number_burst=80)
RECHECK = 0.2


def cand(
    i: int,
    to: str = "a",
    number: str = "n",
    provider: str = "meta",
    tenant: str = "t",
    ahead: Ahead | None = None,
) -> Candidate:
    return Candidate(i, provider, number, to, tenant, ahead=ahead)


def plan(
    cands: list[Candidate],
    *,
    now: float = 100.0,
    pacing: dict[str, float] | None = None,
    breakers: dict[BreakerId, Breaker] | None = None,
    limits: Limits = META,
    limit: int = 100,
    locked: set[str] | None = None,
) -> Plan:
    if locked is None:
        locked = {k for c in cands for k in c.keys} | {b.lock_key for c in cands for b in c.breakers}
    return plan_claim(
        cands,
        locked=locked,
        pacing=pacing or {},
        breakers=breakers or {},
        limits=lambda _p: limits,
        now=now,
        limit=limit,
        probe_lease_s=90.0,
        recheck_s=RECHECK,
    )


PAIR = pair_key("meta", "n", "a")
NUM = number_key("meta", "n")
TOKEN = BreakerId("token", "meta", "t")
NUMBER = BreakerId("number", "meta", "n")


@pytest.mark.parametrize(
    ("name", "cands", "pacing", "go", "defer"),
    [
        ("free", [cand(1)], {}, [1], {}),
        ("same pair in one claim: the second waits 6 s", [cand(1), cand(2)], {}, [1], {2: 106.0}),
        ("third to the pair: 12 s", [cand(1), cand(2), cand(3)], {}, [1], {2: 106.0, 3: 112.0}),
        ("other recipient", [cand(1), cand(2, "b")], {}, [1, 2], {}),
        ("other number: other pair", [cand(1), cand(2, number="m")], {}, [1, 2], {}),
        ("pair booked by another sender", [cand(1)], {PAIR: 103.0}, [], {1: 103.0}),
        ("pair time passed", [cand(1)], {PAIR: 100.0}, [1], {}),
        ("number within its burst", [cand(1)], {NUM: 100.5}, [1], {}),
        # The burst used up by a send at 100: the next slot is one interval on.
        ("number past its burst", [cand(1)], {NUM: 101.0}, [], {1: pytest.approx(100.0125)}),
        # Further ahead than a send can book: written by a clock ahead of ours (ours stepped
        # back since). It holds for one interval, not for the step.
        ("a clock stepped back: the pair holds one interval", [cand(1)], {PAIR: 3700.0}, [], {1: 106.0}),
        (
            "a clock stepped back: the number holds one slot",
            [cand(1)],
            {NUM: 3700.0},
            [],
            {1: pytest.approx(100.0125)},
        ),
    ],
)
def test_plan_table(
    name: str, cands: list[Candidate], pacing: dict[str, float], go: list[int], defer: dict[int, float]
) -> None:
    p = plan(cands, pacing=pacing)
    assert p.go == go
    assert p.defer == defer


def test_rate_of_a_number_with_burst_two() -> None:
    lim = Limits(0.0, 0.5, 2)  # 2 messages/s, bursts of 2
    p = plan([cand(i, f"r{i}") for i in range(5)], limits=lim)
    assert p.go == [0, 1]
    assert p.defer == {2: 100.5, 3: 101.0, 4: 101.5}  # spread at the rate, not all at once
    assert p.pacing[NUM] == 101.0


def test_tenashi_one_message_per_interval_per_number() -> None:
    lim = Limits(6.0, 12.0, 1)
    p = plan([cand(1, "a"), cand(2, "b")], limits=lim)
    assert (p.go, p.defer) == ([1], {2: 112.0})


def test_unlocked_keys_are_left_alone() -> None:
    c = [cand(1), cand(2, "b", number="m")]
    locked = {k for k in c[1].keys} | {b.lock_key for b in c[1].breakers}
    p = plan(c, locked=locked)
    assert (p.go, p.defer) == ([2], {})


def test_limit_stops_the_claim() -> None:
    p = plan([cand(i, f"r{i}") for i in range(10)], limit=3)
    assert (p.go, p.defer) == ([0, 1, 2], {})


def test_pair_interval_zero_books_no_pair_key_and_keeps_one_in_flight() -> None:
    p = plan([cand(1), cand(2), cand(3, "b")], limits=Limits(0.0, 1e-6, 1e6))
    assert (p.go, p.defer) == ([1, 3], {2: 100.0 + RECHECK})
    assert PAIR not in p.pacing


# --- work-conserving, per-customer order ------------------------------------------------------


def issue_claim() -> list[Candidate]:
    """P#1 P#2 Q#1 Q#2 R#1 on one number, due together (three customers)."""
    return [cand(1, "P"), cand(2, "P"), cand(3, "Q"), cand(4, "Q"), cand(5, "R")]


def test_a_row_held_by_its_pair_holds_nobody_else() -> None:
    """Before: P#2 held by its pair booked the number at 106, so Q#1 waited until ~105 and R#1
    until ~110. A customer's first message goes now, whoever waits."""
    p = plan(issue_claim())
    assert (p.go, p.defer) == ([1, 3, 5], {2: 106.0, 4: 106.0})
    assert p.pacing[NUM] == pytest.approx(100.0 + 3 / 80)  # three sends, nothing for the waits


def test_a_later_claim_keeps_the_customers_order() -> None:
    """Before: Q#1 was put off in the first claim; Q#3, enqueued just after it, found Q's pair
    free (the put-off slot was never stored) and went first."""
    first = plan([cand(1, "P"), cand(2, "P"), cand(3, "Q")], pacing={NUM: 101.0})
    assert first.go == [] and first.defer == pytest.approx({1: 100.0125, 2: 106.0125, 3: 100.025})
    # Q#3 due in the next claim, Q#1 (pending, due at its slot) is not among its candidates.
    later = plan([cand(6, "Q", ahead=Ahead(3, "pending", first.defer[3]))], now=100.001)
    assert later.go == [] and later.defer == pytest.approx({6: 106.025})


@pytest.mark.parametrize(
    ("name", "ahead", "pacing", "defer"),
    [
        ("earlier row waits for a backoff: after it, one interval on", Ahead(9, "pending", 130.0), {}, 136.0),
        (
            "earlier row due but not in this claim: one interval from now",
            Ahead(9, "pending", 50.0),
            {},
            106.0,
        ),
        ("earlier row in flight: look again shortly", Ahead(9, "sending", 99.0), {}, 100.0 + RECHECK),
        (
            "earlier row in flight, its pair booked: at the pair's time",
            Ahead(9, "sending", 99.0),
            {PAIR: 105.0},
            105.0,
        ),
        ("earlier row unknown, its resend may come: one interval on", Ahead(9, "unknown", 40.0), {}, 106.0),
    ],
)
def test_a_row_waits_for_an_earlier_row_of_its_customer(
    name: str, ahead: Ahead, pacing: dict[str, float], defer: float
) -> None:
    p = plan([cand(10, ahead=ahead), cand(11, "b")], pacing=pacing)
    assert (p.go, p.defer) == ([11], {10: defer})


def test_a_row_behind_a_send_of_this_claim_is_noted_to_go_when_it_is_done() -> None:
    p = plan(
        [cand(1), cand(2), cand(3, ahead=Ahead(2, "pending")), cand(4, "b")], limits=Limits(0.0, 1e-6, 1e6)
    )
    assert (p.go, p.defer) == ([1, 4], {2: 100.0 + RECHECK, 3: 100.0 + 2 * RECHECK})
    assert p.behind == {1: ([2, 3], 100.0)}  # 3 behind 2 behind 1


def test_within_a_claim_a_customers_rows_go_in_id_order() -> None:
    """The claim's order is by due time: a retried row comes after a later one of its customer."""
    p = plan([cand(7), cand(3), cand(5)])
    assert (p.go, p.defer) == ([3], {5: 106.0, 7: 112.0})


def test_the_order_is_per_pair_whichever_tenant_enqueued() -> None:
    """Two tenants sending from one number to one person: one pace and one order (the customer
    sees one business number)."""
    token_t = BreakerId("token", "meta", "t")
    held = plan([cand(1), cand(2, tenant="u")], breakers={token_t: Breaker("open", 1, 130.0)})
    assert (held.go, held.defer) == ([], {1: 130.0, 2: 136.0})
    paced = plan([cand(1), cand(2, tenant="u")])
    assert (paced.go, paced.defer) == ([1], {2: 106.0})


def test_rows_behind_a_row_a_breaker_holds_wait_for_its_probe_and_an_interval() -> None:
    p = plan([cand(1), cand(2)], breakers={NUMBER: Breaker("open", 1, 130.0)})
    assert (p.go, p.defer) == ([], {1: 130.0, 2: 136.0})


def test_a_row_behind_one_the_claim_did_not_reach_is_left_alone() -> None:
    p = plan([cand(1, "b"), cand(3), cand(2)], limit=1)  # claim order: 1, 3 (behind 2), 2
    assert (p.go, p.defer) == ([1], {})


def test_a_day_of_claims_never_breaks_the_pair_interval() -> None:
    """Claims every 0.5 s over 30 messages to one recipient and 200 to others: sends to the
    recipient are >= 6 s apart, the number never exceeds its rate over any second."""
    lim = Limits(6.0, 0.1, 3)  # 10/s, bursts of 3
    pending = [cand(i, "a" if i % 8 == 0 else f"r{i}") for i in range(230)]
    due = {c.id: 0.0 for c in pending}
    state: dict[str, float] = {}
    sent: list[tuple[float, Candidate]] = []
    for step in range(2000):
        now = step * 0.5
        ready = [c for c in pending if due[c.id] <= now]
        p = plan(ready, now=now, pacing=state, limits=lim, limit=50)
        state.update(p.pacing)
        due.update(p.defer)
        for c in ready:
            if c.id in p.go:
                sent.append((now, c))
        pending = [c for c in pending if c.id not in p.go]
    assert not pending
    to_a = [t for t, c in sent if c.recipient == "a"]
    assert min(b - a for a, b in itertools.pairwise(to_a)) >= 6.0
    times = [t for t, _ in sent]
    for t in times:
        assert sum(1 for u in times if t <= u < t + 1.0) <= 10 + 3


# --- breakers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "breakers", "go", "defer", "probe"),
    [
        ("closed", {}, [1, 2], {}, None),
        (
            "open: every row waits for the probe time",
            {NUMBER: Breaker("open", 1, 130.0)},
            [],
            {1: 130.0, 2: 130.0},
            None,
        ),
        ("token open", {TOKEN: Breaker("open", 1, 130.0)}, [], {1: 130.0, 2: 130.0}, None),
        ("probe due: one row goes, the rest wait", {NUMBER: Breaker("open", 1, 99.0)}, [1], {2: 190.0}, 1),
        (
            "half-open with a live probe",
            {NUMBER: Breaker("half_open", 1, 150.0, probe_id=7)},
            [],
            {1: 150.0, 2: 150.0},
            None,
        ),
        (
            "half-open, probe lost: probe again",
            {NUMBER: Breaker("half_open", 1, 99.0, probe_id=7)},
            [1],
            {2: 190.0},
            1,
        ),
    ],
)
def test_breakers_in_the_claim(
    name: str, breakers: dict[BreakerId, Breaker], go: list[int], defer: dict[int, float], probe: int | None
) -> None:
    p = plan([cand(1, "a"), cand(2, "b")], breakers=breakers)
    assert (p.go, p.defer) == (go, defer)
    if probe is None:
        assert not p.breakers
    else:
        (b,) = p.breakers.values()
        assert (b.state, b.probe_id, b.retry_at) == ("half_open", probe, 190.0)


@pytest.mark.parametrize(
    ("failures", "expected"), [(1, 30.0), (2, 60.0), (3, 120.0), (7, 1800.0), (50, 1800.0)]
)
def test_breaker_backoff_doubles_to_a_cap(failures: int, expected: float) -> None:
    assert breaker_backoff_s(failures, 30.0, 1800.0) == expected


def test_trip_settle_cycle() -> None:
    b = trip(CLOSED, code=190, error="expired", now=0.0, base_s=30, cap_s=1800)
    assert (b.state, b.failures, b.retry_at, b.code) == ("open", 1, 30.0, 190)
    assert trip(b, code=190, error="x", now=10.0, base_s=30, cap_s=1800) == b  # in-flight sends don't count
    probing = Breaker("half_open", 1, 120.0, 190, "expired", probe_id=5)
    again = trip(probing, code=190, error="x", now=31.0, base_s=30, cap_s=1800)
    assert (again.state, again.failures, again.retry_at) == ("open", 2, 91.0)
    assert settle_probe(probing, row_id=5, reached=True, now=31.0, base_s=30) == CLOSED
    assert settle_probe(probing, row_id=6, reached=True, now=31.0, base_s=30) == probing  # not the probe
    lost = settle_probe(probing, row_id=5, reached=False, now=31.0, base_s=30)
    assert (lost.state, lost.failures, lost.retry_at) == ("open", 1, 61.0)  # proves nothing, no count

"""The open-model schedule: profiles keep their rate, the pacer follows a (fake) clock, lag is
flagged when the generator falls behind, and the plan mixes redeliveries as asked. Pure."""

from __future__ import annotations

import inspect
import math
from collections import Counter

import pytest

from loadtest import cli
from loadtest.harness import plan
from loadtest.harness.payloads import PayloadFactory, Secrets
from loadtest.harness.scenarios import scenario
from loadtest.harness.schedule import LagMonitor, Pacer, Profile, Segment, arrivals, constant, parse_profile
from loadtest.harness.stats import percentile

SECRETS = Secrets(meta="m" * 10, tenashi="t" * 10)


@pytest.mark.parametrize(
    ("spec", "segments"),
    [
        ("const:200:30", [(200, 200, 30)]),
        ("ramp:0:500:10", [(0, 500, 10)]),
        ("steps:100:5,200:5,400:5", [(100, 100, 5), (200, 200, 5), (400, 400, 5)]),
        ("ramp:10:100:5+const:100:20", [(10, 100, 5), (100, 100, 20)]),
    ],
)
def test_parse_profile(spec: str, segments: list[tuple[float, float, float]]) -> None:
    assert parse_profile(spec) == Profile(tuple(Segment(*s) for s in segments))


@pytest.mark.parametrize(
    "spec", ["const:200", "ramp:1:2", "wave:1:2", "const:x:3", "const:0:5", "const:5:0", ""]
)
def test_parse_profile_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_profile(spec)


@pytest.mark.parametrize("rate", [1, 7.5, 100, 1000, 4321])
def test_constant_rate_is_kept_in_every_second(rate: float) -> None:
    offs = list(arrivals(constant(rate, 10)))
    assert len(offs) == pytest.approx(rate * 10, abs=1)
    assert offs == sorted(offs) and offs[0] >= 0 and offs[-1] < 10
    per_second = Counter(int(t) for t in offs)
    for s in range(10):
        assert per_second[s] == pytest.approx(rate, abs=1)


@pytest.mark.parametrize("spec", ["ramp:0:1000:10", "ramp:800:100:8", "steps:50:3,500:3,100:3"])
def test_ramps_and_steps_follow_the_instantaneous_rate(spec: str) -> None:
    prof = parse_profile(spec)
    offs = list(arrivals(prof))
    assert len(offs) == pytest.approx(prof.expected_count(), abs=len(prof.segments))
    per_second = Counter(int(t) for t in offs)
    for s in range(int(prof.duration)):
        # Arrivals in [s, s+1) equal the integral of the rate over that second.
        want = sum(prof.rate_at(s + (i + 0.5) / 100) for i in range(100)) / 100
        assert per_second[s] == pytest.approx(want, abs=2)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0


def drive(rate: float, seconds: float, cost_per_send: float) -> tuple[list[float], LagMonitor]:
    """The driver's loop on a fake clock; each dispatch costs ``cost_per_send`` seconds."""
    clock = FakeClock()
    pacer = Pacer(arrivals(constant(rate, seconds)), lambda t: t)
    lag = LagMonitor(warn_after_s=0.010)
    sent_at: list[float] = []
    while not pacer.done:
        for intended in pacer.due(clock.now):
            lag.record(intended, clock.now)
            sent_at.append(clock.now)
            clock.now += cost_per_send
        wait = pacer.sleep_for(clock.now)
        clock.now += wait or 0.0
    return sent_at, lag


def test_pacer_keeps_the_rate_on_a_fake_clock() -> None:
    sent, lag = drive(rate=500, seconds=4, cost_per_send=0.0002)
    per_second = Counter(int(t) for t in sent)
    assert [per_second[s] for s in range(4)] == [500, 500, 500, 500]
    assert lag.late == 0 and lag.max < 0.001
    assert lag.behind(lag.take_window()) is None


def test_a_slow_generator_is_flagged() -> None:
    # Each send costs 1.5 slots: the generator can only do 2/3 of the rate.
    sent, lag = drive(rate=200, seconds=3, cost_per_send=1.5 / 200)
    assert len(sent) == 600  # it still sends everything, late
    assert lag.late > 300 and lag.max > 0.9
    assert lag.behind(lag.take_window()) is not None


def test_plan_mixes_redeliveries_and_bad_signatures_as_asked() -> None:
    f = PayloadFactory(SECRETS, seed=2, run_tag="plan")
    mix = plan.Mix(immediate=0.05, delayed=0.05, concurrent=0.05, bad_signature=0.05, delay_s=1.0)
    shots = list(plan.build(arrivals(constant(2000, 10)), scenario("mixed", f), f, mix, seed=4))
    assert len(shots) == 20000
    kinds = Counter(s.kind for s in shots)
    for k in ("immediate", "delayed", "concurrent", "bad_signature"):
        assert kinds[k] / len(shots) == pytest.approx(0.05, abs=0.01), k
    first: dict[bytes, float] = {}
    for s in shots:
        if s.kind in ("new", "bad_signature"):
            assert s.delivery.body not in first  # fresh bodies
            first[s.delivery.body] = s.t
            continue
        t0 = first[s.delivery.body]  # a redelivery repeats an earlier body exactly
        if s.kind == "concurrent":
            assert s.t == t0
        elif s.kind == "delayed":
            assert s.t >= t0 + 1.0
        else:
            assert t0 < s.t < t0 + 0.01
    assert all(not s.delivery.signed_ok for s in shots if s.kind == "bad_signature")
    times = [s.t for s in shots]
    assert times == sorted(times) and math.isclose(times[-1], 10, abs_tol=0.01)


def test_mix_rejects_impossible_shares() -> None:
    with pytest.raises(ValueError):
        plan.Mix(immediate=0.5, delayed=0.5)
    with pytest.raises(ValueError):
        plan.Mix(bad_signature=-0.1)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 50, None),  # no samples: NaN, not an error
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 3.0),  # nearest rank
        ([4.0, 3.0, 2.0, 1.0], 99, 4.0),  # unsorted input
        ([float(i) for i in range(1, 101)], 99, 100.0),
    ],
)
def test_percentile_of_small_samples(values: list[float], p: float, expected: float | None) -> None:
    got = percentile(values, p)
    assert math.isnan(got) if expected is None else got == expected


def test_every_command_registers_the_same_way() -> None:
    parser = cli.build_parser()
    for name in cli.COMMANDS:
        module = cli.command(name)
        assert module.HELP and inspect.iscoroutinefunction(module.main), name
        required = {"render": ["x.json"], "verify": ["--database-url", "postgresql:///x"]}
        assert parser.parse_args([name, *required.get(name, [])]).main is module.main

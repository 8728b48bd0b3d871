"""The pure parts of `chaos --failover`: a round's verdicts, the write probe's gap, and the fake's
status webhooks entered in the ledger (each try sent, a 200 acknowledged, keys by the parser)."""

import math

import pytest

from gateway.testing.payloads import meta_bytes, status_obj, statuses_payload
from loadtest.harness.chaoskit import ledger_webhooks
from loadtest.harness.failover import RECOVERED, TARGET, FailoverRound, WriteProbe, round_checks
from loadtest.harness.payloads import status_key_of
from loadtest.harness.stats import Ledger

NAN = float("nan")


def fr(n: int, first_200_s: float, notes: tuple[str, ...] = ()) -> FailoverRound:
    return FailoverRound(n, "kill", first_200_s=first_200_s, notes=list(notes))


@pytest.mark.parametrize(
    ("rounds", "failing"),
    [
        ([fr(1, 0.4), fr(2, 3.9)], set()),
        ([fr(1, 0.4), fr(2, 5.1)], {TARGET}),
        ([fr(1, NAN, ("no first 200 within the round",))], {RECOVERED, TARGET}),
        ([fr(1, 1.0, ("the old primary did not rejoin within the round",))], {RECOVERED}),
        ([], set()),
    ],
)
def test_round_checks(rounds: list[FailoverRound], failing: set[str]) -> None:
    assert {c.name for c in round_checks(rounds) if not c.ok} == failing


@pytest.mark.parametrize(
    ("ok", "fault", "gap"),
    [
        ([1.0, 1.1, 21.4, 21.5], 1.15, 20.25),
        ([1.0, 1.1], 1.15, NAN),  # never writable again
        ([5.0], 1.0, 4.0),
    ],
)
def test_write_probe_gap(ok: list[float], fault: float, gap: float) -> None:
    probe = WriteProbe("postgresql://x@h/db")
    probe.ok = ok
    got = probe.gap(fault)
    assert (math.isnan(got) and math.isnan(gap)) or got == pytest.approx(gap)


@pytest.mark.parametrize(("status", "attempts", "acked"), [(200, 1, 1), (200, 4, 1), (503, 9, 0), (-1, 3, 0)])
def test_fake_webhooks_enter_the_ledger(status: int, attempts: int, acked: int) -> None:
    body = meta_bytes(statuses_payload(status_obj("wamid.f1", "delivered", callback="chaos:k1")))
    ledger = Ledger()
    ledger_webhooks(
        ledger, [{"path": "/webhooks/meta", "body": body.decode(), "status": status, "attempts": attempts}]
    )
    (entry,) = ledger.entries.values()
    assert (entry.sent, entry.acked) == (attempts, acked)
    assert [status_key_of(r) for r in entry.status_keys] == ["status:wamid.f1:delivered:"]
    assert entry.keys == ("status:wamid.f1:delivered:",) and entry.msg_wamids == ()

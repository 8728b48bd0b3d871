"""The load test's payload factory: keys by the consumers' rules, Meta's escaping, and signatures
that the real gateway accepts (and rejects when they are wrong)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gateway.core.events import Status, event_day
from gateway.core.parsing import parse
from gateway.core.planning import StagedRow, plan_batch
from loadtest.harness.payloads import (
    Delivery,
    PayloadFactory,
    Secrets,
    meta_event_day,
    status_key_of,
    status_row,
)
from loadtest.harness.scenarios import SCENARIOS, Scenario, WebhookUser, task
from loadtest.harness.stats import Ledger
from loadtest.harness.verify import side_effect_expectations
from tests.support.payloads import KINDS, SECRETS


def keys_by_rules(d: Delivery) -> list[str]:
    """The key rules of HELPERS.md / the consumers, applied independently to the body."""
    doc = json.loads(d.body)
    if d.source == "tenashi":
        return [f"evt:{doc['id']}"]
    keys = []
    for entry in doc["entry"]:
        for change in entry["changes"]:
            v = change["value"]
            keys += [f"msg:{m['id']}" for m in v.get("messages", [])]
            keys += [
                f"status:{s['id']}:{s['status']}:{s.get('recipient_participant_id', '')}"
                for s in v.get("statuses", [])
            ]
    return keys


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_keys_follow_the_rules(kind: str) -> None:
    d = KINDS[kind](PayloadFactory(SECRETS, seed=3, run_tag="t1"))
    assert list(d.keys) == keys_by_rules(d)
    assert d.keys, "every kind carries at least one event"
    assert d.wire.endswith(d.body) and d.wire.startswith(f"POST {d.path} HTTP/1.1\r\n".encode())
    if d.source == "meta":
        assert d.body.isascii()  # Meta escapes non-ASCII as \uXXXX
        assert b"/" not in d.body.replace(b"\\/", b"")  # and '/' as \/
        assert set(d.msg_wamids) == {k[4:] for k in d.keys if k.startswith("msg:")}
        assert {status_key_of(r) for r in d.status_keys} == {k for k in d.keys if k.startswith("status:")}
    else:
        assert dict(d.headers)["X-Tenashi-Delivery"] == d.keys[0][4:]


@pytest.mark.parametrize(
    ("timestamp", "day"),
    [
        ("1764460800", "2025-11-30"),
        ("1764547199", "2025-11-30"),
        ("1764547200", "2025-12-01"),
        ("0", "1970-01-01"),  # the untimed day: the same partition
        ("²", "1970-01-01"),  # str.isdigit() accepts it; the gateway does not
        ("-5", "1970-01-01"),
        ("", "1970-01-01"),
        (None, "1970-01-01"),
        (1764460800, "1970-01-01"),  # Meta sends a string; the factory never sends a number
    ],
)
def test_a_status_row_is_its_key_and_the_day_of_its_timestamp(timestamp: object, day: str) -> None:
    row = status_row("status:wamid.A:read:", meta_event_day(timestamp))
    assert row == f"status:wamid.A:read:@{day}" and status_key_of(row) == "status:wamid.A:read:"


def test_status_rows_fall_on_the_gateways_event_days() -> None:
    """The factory's days, computed from its own payloads, are those the gateway's parser and
    event_day give the same bodies (the poison's untimed status included)."""
    f = PayloadFactory(SECRETS, seed=4, run_tag="days")
    for d in [f.status(), f.group_status(), f.batched(), f.poisoned()[0][0]]:
        events = [ev for ev in parse("meta", d.body) if isinstance(ev, Status)]
        assert events
        assert sorted(status_row(ev.key, event_day(ev, "meta")) for ev in events) == sorted(d.status_keys)


def test_a_status_key_on_two_days_is_expected_as_two_rows() -> None:
    """The poison's untimed ``delivered`` and a later timed ``delivered`` of the same wamid are
    two events to the gateway (keys live in their event's day): the verifier expects two rows."""
    f = PayloadFactory(SECRETS, seed=6, run_tag="twice")
    (poison, _), *_ = f.poisoned()
    wamid = next(k for k in poison.keys if k.startswith("status:")).split(":")[1]
    f.rng.random = lambda: 0.0  # type: ignore[method-assign]  # status() reuses a recent wamid
    f._outbound[:] = [wamid]
    later = f.status("delivered")
    assert status_key_of(later.status_keys[0]) == status_key_of(poison.status_keys[0])
    ledger = Ledger()
    for d in (poison, later, later):  # the later one redelivered: still one event
        ledger.acked(ledger.sent(d))
    _, _, must, may = side_effect_expectations(ledger.entries)
    assert must[wamid] == may[wamid] == 2


def test_group_status_has_one_key_per_participant() -> None:
    d = PayloadFactory(SECRETS).group_status(participants=4)
    parts = [k.rsplit(":", 1)[1] for k in d.keys]
    assert len(set(parts)) == 4 and all(parts)
    assert len({k.split(":")[1] for k in d.keys}) == 1  # one message, one status type


def test_seed_replays_and_run_tag_separates() -> None:
    def bodies(seed: int, tag: str) -> list[bytes]:
        f = PayloadFactory(SECRETS, seed, tag)
        sc = Scenario(SCENARIOS["mixed"], f)
        return [sc.next().body for _ in range(50)]

    assert bodies(7, "a") == bodies(7, "a")
    a, b = bodies(7, "a"), bodies(7, "b")
    assert not set(a) & set(b)


def test_bad_signature_keeps_bytes_and_drops_keys() -> None:
    f = PayloadFactory(SECRETS)
    for d in (f.inbound("text"), f.tenashi("message.status")):
        bad = f.with_bad_signature(d)
        assert bad.body == d.body and bad.keys == () and not bad.signed_ok
        assert bad.headers != d.headers


def test_scenario_picks_users_and_tasks_by_weight() -> None:
    class A(WebhookUser):
        weight = 3

        @task(1)
        def one(self) -> Delivery:
            return self.f.inbound("text")

        @task(3)
        def three(self) -> Delivery:
            return self.f.status("read")

    class B(WebhookUser):
        weight = 1

        @task(1)
        def tn(self) -> Delivery:
            return self.f.tenashi("message.status")

    sc = Scenario([A, B], PayloadFactory(SECRETS, seed=5))
    kinds = [sc.next().kind for _ in range(4000)]
    share = {k: kinds.count(k) / len(kinds) for k in set(kinds)}
    # Expected: A 3/4 split 1:3 -> text 3/16, read 9/16; B 1/4.
    assert share["inbound_text"] == pytest.approx(3 / 16, abs=0.03)
    assert share["status_read"] == pytest.approx(9 / 16, abs=0.03)
    assert share["tenashi_message.status"] == pytest.approx(1 / 4, abs=0.03)


def test_ledger_survives_json_for_a_verification_in_another_process() -> None:
    from loadtest.harness.payloads import PayloadFactory
    from loadtest.harness.stats import Ledger

    f = PayloadFactory(Secrets(meta="m-secret", tenashi="t-secret"), seed=3, run_tag="j")
    ledger = Ledger()
    d1, d2 = f.inbound("text"), f.status()
    ledger.acked(ledger.sent(d1))
    ledger.sent(d1)
    ledger.sent(f.with_bad_signature(d2))
    back = Ledger.from_json(ledger.to_json())
    assert back.entries == ledger.entries


def test_share_weight() -> None:
    import pytest

    from loadtest.harness.scenarios import share_weight

    assert share_weight(19, 0.05) == 1 and share_weight(95, 0.05) == 5 and share_weight(10, 0.0) == 0
    assert share_weight(1, 0.01) == 1  # never rounded away
    with pytest.raises(ValueError):
        share_weight(10, 1.0)


def test_scenarios_are_meta_only_without_a_tenashi_secret() -> None:
    import pytest

    from loadtest.harness.scenarios import TenashiUser, users

    assert TenashiUser in users("mixed") and TenashiUser not in users("mixed", tenashi=False)
    with pytest.raises(ValueError, match="Tenashi secret"):
        users("tenashi", tenashi=False)


def test_events_are_stamped_with_the_time_they_are_made_as_meta_stamps_them() -> None:
    """A key lives in the partition of its event's day: a benchmark's events must fall on the
    days live traffic does (today, made ahead by the maintenance job), not on a fixed past day
    that only the default partition holds."""
    before = datetime.now(UTC)
    f = PayloadFactory(SECRETS, seed=7, run_tag="now")
    deliveries = [f.status(), f.inbound(), f.batched()]
    after = datetime.now(UTC)
    days = {event_day(ev, "meta") for d in deliveries for ev in parse("meta", d.body)}
    assert days and days <= {before.date(), after.date(), (after + timedelta(seconds=60)).date()}


def test_the_poisoned_bodies_leave_the_dead_items_the_chaos_run_expects_of_the_planner() -> None:
    """What the planner refuses (a ``bad`` dead item each) and what it plans (the body's keys)
    are what chaos expects of each poisoned body: its check and the planner cannot drift apart."""
    f = PayloadFactory(SECRETS, seed=8, run_tag="poison")
    for d, kinds in f.poisoned():
        plan = plan_batch([StagedRow(id=1, source=d.source, body=d.body, delivery_id=None)])
        assert len(plan.bad) == kinds.count("bad"), (d.kind, [item.error for _, item in plan.bad])
        assert set(d.keys) <= set(plan.keys), d.kind

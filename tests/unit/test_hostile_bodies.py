"""Parsers and planner against hostile bodies: whatever the values, planning never raises;
every row is planned or parked, every fragment an event or a dead item."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.events import MAX_EVENTS_PER_PAYLOAD
from gateway.core.parsing import _unix, parse_items
from gateway.core.planning import StagedRow, plan_batch
from gateway.testing.hostile import nested, staged
from gateway.testing.payloads import meta_payload, meta_value, status_obj


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1764460800", 1764460800),
        (1764460800, 1764460800),
        ("²", None),  # str.isdigit() is True, int() raises
        ("①", None),
        ("١٢٣", None),  # Arabic-Indic digits: int() accepts them, Meta never sends them
        ("\U0001d7d9\U0001d7da", None),  # mathematical double-struck digits
        ("+1764460800", None),
        (" 1764460800", None),
        ("999999999999", None),  # beyond 11 digits
        (-5, None),
        (2**40, None),
        (True, None),
        (1.5, None),
        (None, None),
    ],
)
def test_unix_seconds_are_ascii_digits_only(value: object, expected: int | None) -> None:
    assert _unix(value) == expected


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def status_at(wamid: str, timestamp: str) -> bytes:
    st = {**status_obj(wamid, "read"), "timestamp": timestamp}
    return body(meta_payload(("messages", meta_value(statuses=[st]))))


TENASHI_STATUS = {
    "id": "evt_1",
    "type": "message.status",
    "created": "³",
    "data": {"message_id": "m", "status": "read"},
}

# The issue's bodies: each stopped every consumer (an exception outside the savepoint).
ISSUE_BODIES = [
    ("meta", status_at("wamid.A", "²")),
    ("meta", status_at("wamid.B", "①")),
    ("tenashi", body(TENASHI_STATUS)),
    ("meta", body(meta_payload(("account_update", {"deep": nested(300)})))),
    ("meta", body(meta_payload(("messages", meta_value(errors=[nested(300)]))))),
]


@pytest.mark.parametrize(("source", "raw"), ISSUE_BODIES)
def test_the_issues_bodies_plan_without_raising(source: str, raw: bytes) -> None:
    plan = plan_batch([StagedRow(1, source, raw, "evt_1" if source == "tenashi" else None)])
    assert plan.done == [1] or plan.parked == [1]
    for ev, _row, _item in plan.events:
        assert isinstance(ev.key, str)


def test_a_timestamp_of_odd_digits_is_kept_in_the_raw_json_only() -> None:
    raw = ISSUE_BODIES[0][1]
    (item,) = parse_items("meta", raw)
    (status,) = item.events
    assert status.timestamp is None and status.raw["timestamp"] == "²"  # type: ignore[union-attr]


def test_a_change_nested_beyond_the_serialiser_is_a_dead_fragment_not_a_failed_batch() -> None:
    plan = plan_batch([StagedRow(1, "meta", ISSUE_BODIES[3][1], None)])
    assert plan.done == [1] and plan.events == []
    ((row, item),) = plan.bad
    assert row.id == 1 and item.unit == "change" and "Recursion" in (item.error or "")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(staged(), min_size=1, max_size=4))
def test_planning_never_raises_and_accounts_for_every_row(bodies: list[tuple[str, bytes]]) -> None:
    rows = [StagedRow(i, source, raw, f"evt_d{i}") for i, (source, raw) in enumerate(bodies)]
    plan = plan_batch(rows)
    assert sorted(plan.done + plan.parked) == [r.id for r in rows]
    assert len(plan.parked_why) == len(plan.parked)
    planned = {ev.key for ev, _, _ in plan.events}
    assert len(planned) == len(plan.events) == len(plan.keys)
    for _row, items in plan.parsed:
        for item in items:
            # An item is events (planned, or duplicates of earlier ones), or an error: a
            # dead item with its bytes. Never silently nothing.
            assert item.events or item.error is not None
            assert all(ev.key in planned for ev in item.events)


def group_status(wamid: str, participants: int) -> dict[str, object]:
    return status_obj(wamid, "read", participant=[f"p{i}" for i in range(participants)])


@pytest.mark.parametrize(
    ("statuses", "parked"),
    [
        ([{}] * MAX_EVENTS_PER_PAYLOAD, None),
        ([{}] * (MAX_EVENTS_PER_PAYLOAD + 1), f"{MAX_EVENTS_PER_PAYLOAD + 1} fragments in one payload"),
        (
            [status_obj(f"wamid.{i}", "read") for i in range(MAX_EVENTS_PER_PAYLOAD + 1)],
            f"{MAX_EVENTS_PER_PAYLOAD + 1} fragments in one payload",
        ),
        # Two fragments, one event per group participant.
        ([group_status("wamid.G1", 5000), group_status("wamid.G2", 5001)], "10001 events in one payload"),
        ([group_status("wamid.G1", MAX_EVENTS_PER_PAYLOAD + 1)], "10001 participants in one payload"),
    ],
    ids=["malformed-at-the-bound", "malformed-past-it", "statuses-past-it", "events-past-it", "participants"],
)
def test_a_body_of_more_updates_than_any_meta_post_is_parked_whole(
    statuses: list[dict[str, object]], parked: str | None
) -> None:
    # Each malformed fragment would be a dead item (and a log line) of its own: past the
    # bound, the body moves aside as one row instead.
    plan = plan_batch(
        [StagedRow(1, "meta", body(meta_payload(("messages", meta_value(statuses=statuses)))), None)]
    )
    if parked is None:
        assert plan.parked == [] and len(plan.bad) == len(statuses)
    else:
        assert plan.parked == [1] and plan.bad == []
        assert plan.parked_why[0].startswith(f"TooMany: {parked}")

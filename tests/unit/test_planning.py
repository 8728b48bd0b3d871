"""Planning a consumer batch: pure, no database."""

from __future__ import annotations

import pytest

from gateway.core.planning import MAX_KEY_BYTES, StagedRow, plan_batch
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_bytes,
    meta_payload,
    meta_value,
    status_obj,
    statuses_payload,
    tenashi_event,
)


def row(i: int, body: bytes, source: str = "meta", delivery_id: str | None = None) -> StagedRow:
    return StagedRow(id=i, source=source, body=body, delivery_id=delivery_id)


@pytest.mark.parametrize(
    ("body", "source", "table", "kind"),
    [
        (messages_payload(message_obj("wamid.A")), "meta", "messages", "message"),
        (statuses_payload(status_obj("wamid.B", "read")), "meta", "statuses", "status"),
        (
            meta_payload(("messages", meta_value(errors=[{"code": 131047}]))),
            "meta",
            "account_errors",
            "account_error",
        ),
        (
            meta_payload(("message_template_status_update", {"event": "APPROVED"})),
            "meta",
            "account_updates",
            "account_update",
        ),
        (
            tenashi_event("evt_1", "message.received", {"message_id": "tn1", "from": "+49"}),
            "tenashi",
            "messages",
            "message",
        ),
        (tenashi_event("evt_2", "number.linked", {}), "tenashi", "account_updates", "account_update"),
    ],
)
def test_each_event_type_lands_in_its_table(
    body: dict[str, object], source: str, table: str, kind: str
) -> None:
    plan = plan_batch([row(7, meta_bytes(body), source)])
    rows = getattr(plan, table)
    assert len(rows) == 1 and rows[0]["inbox_id"] == 7 and rows[0]["key"] == plan.keys[0]
    assert plan.kinds == {kind: 1}
    others = {"messages", "statuses", "account_errors", "account_updates"} - {table}
    assert all(not getattr(plan, t) for t in others)
    assert plan.done == [7] and plan.key_inbox == [7]


def test_duplicates_in_one_batch_are_planned_once_and_bad_bodies_parked() -> None:
    body = meta_bytes(messages_payload(message_obj("wamid.A")))
    plan = plan_batch([row(1, body), row(2, body), row(3, b"not json"), row(4, b'{"object": "page"}')])
    assert plan.keys == ["msg:wamid.A"] and plan.duplicates_in_batch == 1
    assert plan.done == [1, 2]
    assert plan.parked == [3, 4]
    assert plan.parked_why[0].startswith("NotJson") and plan.parked_why[1].startswith("UnknownShape")


@pytest.mark.parametrize(
    ("wamid", "planned"),
    [
        ("wamid." + "a" * (MAX_KEY_BYTES - 10), True),  # msg:<wamid>: exactly the limit
        ("wamid." + "a" * (MAX_KEY_BYTES - 9), False),  # one byte past it
        ("wamid." + "é" * ((MAX_KEY_BYTES - 10) // 2 + 1), False),  # bytes counted, not characters
        ("wamid." + "é" * ((MAX_KEY_BYTES - 10) // 2), True),
    ],
)
def test_a_key_too_long_for_an_index_is_a_bad_fragment(wamid: str, planned: bool) -> None:
    body = meta_bytes(messages_payload(message_obj("wamid.GOOD"), message_obj(wamid)))
    plan = plan_batch([row(1, body)])
    assert plan.keys[0] == "msg:wamid.GOOD"  # its neighbour is planned either way
    assert (f"msg:{wamid}" in plan.keys) is planned
    if planned:
        assert plan.bad == []
    else:
        [(staged, item)] = plan.bad
        assert staged.id == 1 and "can be indexed" in (item.error or "")
        assert len(item.error or "") < 400  # the key is cut in the reason

"""Each dedup key's subject (the distribution column kept ready for Citus): a pure function
of the key, so a redelivery brings the same subject and meets the key it stored before."""

from __future__ import annotations

import pytest

from gateway.core.events import subject_of
from gateway.core.parsing import parse
from gateway.core.planning import StagedRow, plan_batch
from gateway.testing.payloads import (
    message_obj,
    messages_payload,
    meta_payload,
    meta_value,
    status_obj,
    statuses_payload,
    tenashi_event,
    to_bytes,
)
from tests.support.subjects import SUBJECTS


@pytest.mark.parametrize(("key", "subject"), SUBJECTS)
def test_subject_of(key: str, subject: str) -> None:
    assert subject_of(key) == subject


@pytest.mark.parametrize(
    ("source", "body", "subjects"),
    [
        ("meta", to_bytes(messages_payload(message_obj("wamid.M1"))), ["wamid.M1"]),
        (
            "meta",
            to_bytes(statuses_payload(status_obj("wamid.S1", "read", participant=["p1", "p2"]))),
            ["wamid.S1", "wamid.S1"],
        ),
        (
            "tenashi",
            to_bytes(tenashi_event("evt_9", "message.received", {"message_id": "t1", "from": "49"})),
            ["evt_9"],
        ),
        (
            "meta",
            to_bytes(meta_payload(("messages", meta_value(errors=[{"code": 131000}])))),
            None,  # account-level: the key itself
        ),
    ],
)
def test_a_redelivery_plans_the_same_keys_and_subjects(
    source: str, body: bytes, subjects: list[str] | None
) -> None:
    first = plan_batch([StagedRow(1, source, body, None)])
    again = plan_batch([StagedRow(2, source, body, None)])
    assert first.keys and first.keys == again.keys
    assert first.key_subjects == again.key_subjects
    assert first.key_subjects == [subject_of(k) for k in first.keys]
    expected = subjects if subjects is not None else first.keys
    assert first.key_subjects == expected
    # The Meta subject is the wamid the key is built from.
    for ev, subject in zip(parse(source, body), first.key_subjects, strict=True):
        if source == "meta" and hasattr(ev, "wamid"):
            assert subject == ev.wamid

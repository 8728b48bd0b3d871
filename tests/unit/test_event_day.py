"""Each dedup key's partition day: a pure function of the event and today's date."""

from __future__ import annotations

from datetime import UTC, date, datetime

import orjson
import pytest

from gateway.core.events import UNTIMED_DAY, event_day
from gateway.core.parsing import parse
from gateway.core.planning import StagedRow, plan_batch

TODAY = date(2026, 11, 30)


def ts(day: date, hour: int = 12) -> str:
    return str(int(datetime(day.year, day.month, day.day, hour, tzinfo=UTC).timestamp()))


def meta(
    messages: list[dict[str, object]] | None = None, statuses: list[dict[str, object]] | None = None
) -> bytes:
    value: dict[str, object] = {"messaging_product": "whatsapp", "metadata": {"phone_number_id": "1"}}
    if messages is not None:
        value["messages"] = messages
    if statuses is not None:
        value["statuses"] = statuses
    doc = {
        "object": "whatsapp_business_account",
        "entry": [{"id": "w", "changes": [{"field": "messages", "value": value}]}],
    }
    return orjson.dumps(doc)


def msg(timestamp: object) -> dict[str, object]:
    return {"id": "wamid.A", "from": "49", "timestamp": timestamp, "type": "text", "text": {"body": "x"}}


def status(timestamp: object) -> dict[str, object]:
    return {"id": "wamid.B", "status": "read", "timestamp": timestamp, "recipient_id": "49"}


@pytest.mark.parametrize(
    ("source", "body", "window", "want"),
    [
        # Meta messages and statuses: the UTC day of their own timestamp.
        ("meta", meta([msg(ts(TODAY))]), 7, TODAY),
        ("meta", meta(statuses=[status(ts(date(2026, 11, 29), 23))]), 7, date(2026, 11, 29)),
        ("meta", meta([msg(ts(TODAY, 0))]), 7, TODAY),  # midnight UTC is the new day
        ("meta", meta([msg(str(int(ts(TODAY, 0)) - 1))]), 7, date(2026, 11, 29)),
        # A redelivery 7 days later (the edge of Meta's window) keeps its day ...
        ("meta", meta([msg(ts(date(2026, 11, 23), 0))]), 7, date(2026, 11, 23)),
        # ... and a longer dedup retention widens the window.
        ("meta", meta([msg(ts(date(2026, 11, 1)))]), 30, date(2026, 11, 1)),
        # Older than the window, or beyond tomorrow: untimed, on every later delivery too.
        ("meta", meta([msg(ts(date(2026, 11, 22)))]), 7, UNTIMED_DAY),
        ("meta", meta([msg(ts(date(2026, 12, 1)))]), 7, date(2026, 12, 1)),
        ("meta", meta([msg(ts(date(2026, 12, 2)))]), 7, UNTIMED_DAY),
        # No usable timestamp.
        ("meta", meta([msg(None)]), 7, UNTIMED_DAY),
        ("meta", meta([msg("soon")]), 7, UNTIMED_DAY),
        ("meta", meta(statuses=[{"id": "wamid.C", "status": "sent"}]), 7, UNTIMED_DAY),
        # Account-level changes carry no event time.
        (
            "meta",
            orjson.dumps(
                {
                    "object": "whatsapp_business_account",
                    "entry": [{"id": "w", "changes": [{"field": "account_update", "value": {"x": 1}}]}],
                }
            ),
            7,
            UNTIMED_DAY,
        ),
        # Tenashi: whether a resend keeps `created` is not published, so never trusted.
        (
            "tenashi",
            orjson.dumps(
                {
                    "id": "evt_1",
                    "type": "message.status",
                    "created": int(ts(TODAY)),
                    "data": {"message_id": "m", "status": "read"},
                }
            ),
            7,
            UNTIMED_DAY,
        ),
    ],
)
def test_event_day(source: str, body: bytes, window: int, want: date) -> None:
    (ev,) = parse(source, body)
    assert event_day(ev, source, today=TODAY, window_days=window) == want


def test_a_redelivery_computes_the_same_day_on_every_day_of_the_window() -> None:
    body = meta([msg(ts(date(2026, 11, 24), 23))], [status(ts(date(2026, 11, 24), 23))])
    for offset in range(0, 8):
        today = date(2026, 11, 24 + offset) if 24 + offset <= 30 else date(2026, 12, 24 + offset - 30)
        plan = plan_batch([StagedRow(1, "meta", body, None)], today=today, window_days=7)
        assert plan.key_days == [date(2026, 11, 24)] * 2, today


def test_plan_carries_one_day_per_key() -> None:
    rows = [
        StagedRow(1, "meta", meta([msg(ts(TODAY))], [status(None)]), None),
        StagedRow(2, "meta", meta([msg(ts(TODAY))]), None),  # same key in the batch: once
    ]
    plan = plan_batch(rows, today=TODAY)
    assert list(zip(plan.keys, plan.key_days, strict=True)) == [
        ("msg:wamid.A", TODAY),
        ("status:wamid.B:read:", UNTIMED_DAY),
    ]
    assert plan.duplicates_in_batch == 1

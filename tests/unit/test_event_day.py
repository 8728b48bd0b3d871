"""Each dedup key's partition day: a pure function of the event, whatever the clock says."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import orjson
import pytest

from gateway.core import planning
from gateway.core.events import UNTIMED_DAY, event_day
from gateway.core.parsing import parse
from gateway.core.planning import StagedRow, plan_batch
from tests.support.clock import MovedClock

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
    ("source", "body", "want"),
    [
        # Meta messages and statuses: the UTC day of their own timestamp.
        ("meta", meta([msg(ts(TODAY))]), TODAY),
        ("meta", meta(statuses=[status(ts(date(2026, 11, 29), 23))]), date(2026, 11, 29)),
        ("meta", meta([msg(ts(TODAY, 0))]), TODAY),  # midnight UTC is the new day
        ("meta", meta([msg(str(int(ts(TODAY, 0)) - 1))]), date(2026, 11, 29)),
        # However far from today: a day without a partition goes to the default partition.
        ("meta", meta([msg(ts(date(2026, 11, 1)))]), date(2026, 11, 1)),
        ("meta", meta([msg(ts(date(2031, 5, 2)))]), date(2031, 5, 2)),
        ("meta", meta(statuses=[status("99999999999")]), date(5138, 11, 16)),
        # No usable timestamp.
        ("meta", meta([msg(None)]), UNTIMED_DAY),
        ("meta", meta([msg("soon")]), UNTIMED_DAY),
        ("meta", meta([msg("²")]), UNTIMED_DAY),
        ("meta", meta([msg("\u0661\u0662\u0663")]), UNTIMED_DAY),  # Arabic-Indic digits: isdigit(), not ASCII
        ("meta", meta([msg("")]), UNTIMED_DAY),
        ("meta", meta([msg("123456789012")]), UNTIMED_DAY),  # 12 digits: no Unix time we take
        ("meta", meta([msg(" 1796669462")]), UNTIMED_DAY),
        ("meta", meta([msg("+1796669462")]), UNTIMED_DAY),
        ("meta", meta([msg("0")]), UNTIMED_DAY),  # the epoch is the untimed day itself
        ("meta", meta([msg("86400")]), date(1970, 1, 2)),
        ("meta", meta(statuses=[{"id": "wamid.C", "status": "sent"}]), UNTIMED_DAY),
        # Account-level changes carry no event time.
        (
            "meta",
            orjson.dumps(
                {
                    "object": "whatsapp_business_account",
                    "entry": [{"id": "w", "changes": [{"field": "account_update", "value": {"x": 1}}]}],
                }
            ),
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
            UNTIMED_DAY,
        ),
    ],
)
def test_event_day(source: str, body: bytes, want: date) -> None:
    (ev,) = parse(source, body)
    assert event_day(ev, source) == want


@pytest.mark.parametrize("hours_ahead", [0, 20, 36, 60, 24 * 9])
def test_a_redelivery_plans_the_same_day_whatever_the_clock_did(
    monkeypatch: pytest.MonkeyPatch, hours_ahead: int
) -> None:
    """A status stamped ahead of our clock (36 h is the issue's case), and its redelivery a
    day, two, eight later: the same key on the same day each time."""
    monkeypatch.setattr(planning, "datetime", MovedClock, raising=False)
    stamp = datetime.now(UTC) + timedelta(hours=hours_ahead)
    body = meta([msg(str(int(stamp.timestamp())))], [status(str(int(stamp.timestamp())))])
    days = []
    for later in range(0, 9):
        MovedClock.shift = timedelta(days=later)
        days.append(plan_batch([StagedRow(1, "meta", body, None)]).key_days)
    assert days == [[stamp.date()] * 2] * 9


def test_plan_carries_one_day_per_key() -> None:
    rows = [
        StagedRow(1, "meta", meta([msg(ts(TODAY))], [status(None)]), None),
        StagedRow(2, "meta", meta([msg(ts(TODAY))]), None),  # same key in the batch: once
    ]
    plan = plan_batch(rows)
    assert list(zip(plan.keys, plan.key_days, strict=True)) == [
        ("msg:wamid.A", TODAY),
        ("status:wamid.B:read:", UNTIMED_DAY),
    ]
    assert plan.duplicates_in_batch == 1

"""The Meta-format body of one event, rendered by the consumer (gateway.core.meta_body), and the
forward row that carries it: table-driven, no database. tests/integration/test_meta_body_sql.py
holds the rendering equal to the SQL function's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.envelope import envelope, forward_row
from gateway.core.meta_body import meta_webhook
from gateway.core.parsing import parse
from gateway.testing.payloads import (
    contact_obj,
    message_obj,
    messages_payload,
    meta_payload,
    status_obj,
    statuses_payload,
    tenashi_event,
    to_bytes,
)

META = {"display_phone_number": "15550001111", "phone_number_id": "1111"}


def _env(typ: str, data: dict[str, Any], raw: Any, source: str = "meta") -> dict[str, Any]:
    return {
        "v": 1,
        "type": typ,
        "event_key": "k",
        "source": source,
        "timestamp": None,
        "data": data,
        "raw": raw,
    }


def _value(body: dict[str, Any] | None) -> Any:
    assert body is not None and body["object"] == "whatsapp_business_account"
    (entry,) = body["entry"]
    (change,) = entry["changes"]
    return entry["id"], change["field"], change["value"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # a message: metadata, its contact, the message as it came
        (
            _env("message.received", {**META, "waba_id": "W", "contact": {"wa_id": "49"}}, {"id": "m"}),
            ("W", "messages", {"messaging_product": "whatsapp", "metadata": META,
                               "contacts": [{"wa_id": "49"}], "messages": [{"id": "m"}]}),
        ),
        # metadata without the values the event lacks; no contacts without a contact object
        (
            _env("message.received", {"phone_number_id": "1111", "display_phone_number": None,
                                      "waba_id": None, "contact": "x"}, {"id": "m"}),
            (None, "messages", {"messaging_product": "whatsapp", "metadata": {"phone_number_id": "1111"},
                                "messages": [{"id": "m"}]}),
        ),
        # a status as it came, its callback data included
        (
            _env("message.status", {**META, "waba_id": "W"}, {"id": "s", "biz_opaque_callback_data": "b"}),
            ("W", "messages", {"messaging_product": "whatsapp", "metadata": META,
                               "statuses": [{"id": "s", "biz_opaque_callback_data": "b"}]}),
        ),
        # a group status: one body per participant, its list naming that one
        (
            _env("message.status", {**META, "waba_id": "W", "participant": "49"},
                 {"id": "s", "recipient_participant_id": ["48", "49"]}),
            ("W", "messages", {"messaging_product": "whatsapp", "metadata": META,
                               "statuses": [{"id": "s", "recipient_participant_id": ["49"]}]}),
        ),
        (
            _env("message.status", {**META, "waba_id": "W", "participant": "US.1"},
                 {"id": "s", "recipient_participant_user_id": ["US.1", "US.2"]}),
            ("W", "messages", {"messaging_product": "whatsapp", "metadata": META,
                               "statuses": [{"id": "s", "recipient_participant_user_id": ["US.1"]}]}),
        ),
        # a participant field that is no list is left as it came
        (
            _env("message.status", {**META, "waba_id": "W", "participant": "49"},
                 {"id": "s", "recipient_participant_id": "48"}),
            ("W", "messages", {"messaging_product": "whatsapp", "metadata": META,
                               "statuses": [{"id": "s", "recipient_participant_id": "48"}]}),
        ),
        # account errors and other changes: their field and value as they came
        (_env("account.update", {"waba_id": "W", "field": "account_update"}, {"event": "X"}),
         ("W", "account_update", {"event": "X"})),
        (_env("account.error", {"waba_id": "W", "field": "messages", "errors": []}, {"errors": [1]}),
         ("W", "messages", {"errors": [1]})),
    ],
)  # fmt: skip
def test_meta_body(env: dict[str, Any], expected: tuple[Any, str, Any]) -> None:
    raw_before = orjson.dumps(env["raw"])
    assert _value(meta_webhook(env)) == expected
    assert orjson.dumps(env["raw"]) == raw_before  # the envelope's fragment is not changed


def test_an_event_that_did_not_come_from_meta_has_no_meta_body() -> None:
    tev = tenashi_event("e1", "message.received", {"message_id": "tm1", "from": "49151", "type": "text"})
    (ev,) = parse("tenashi", to_bytes(tev))
    assert meta_webhook(envelope(ev, "tenashi")) is None
    row = forward_row(ev, "tenashi", 3, bodies=True)
    assert row["meta_body"] is None and orjson.loads(row["body"]) == envelope(ev, "tenashi")


def test_the_forward_row_carries_both_bodies_rendered() -> None:
    body = to_bytes(messages_payload(message_obj("wamid.A", "hi")))
    (ev,) = parse("meta", body)
    row = forward_row(ev, "meta", 7, bodies=True)
    env = envelope(ev, "meta")
    assert "envelope" not in row and row["source"] == "meta" and row["inbox_id"] == 7
    assert orjson.loads(row["body"]) == env
    assert orjson.loads(row["meta_body"]) == meta_webhook(env)


def test_a_status_naming_a_callback_carries_its_envelope_for_the_statement() -> None:
    st = status_obj("wamid.S", "read")
    st["biz_opaque_callback_data"] = "acme:k1"
    (ev,) = parse("meta", to_bytes(statuses_payload(st)))
    row = forward_row(ev, "meta", 7, bodies=True)
    assert row["callback"] == "acme:k1" and row["envelope"] == envelope(ev, "meta")
    assert "body" not in row and "meta_body" not in row


def test_a_contact_change_is_relayed_with_its_value() -> None:
    payload = meta_payload(("user_preferences", {"contacts": [contact_obj("49")], "user_preferences": []}))
    events = parse("meta", to_bytes(payload))
    assert events
    for ev in events:
        row = forward_row(ev, "meta", 1, bodies=True)
        got = orjson.loads(row["meta_body"])
        assert got["entry"][0]["changes"][0]["field"] == "user_preferences"

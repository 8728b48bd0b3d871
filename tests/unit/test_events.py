"""Key extraction from Meta and Tenashi payloads: pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.events import AccountError, AccountUpdate, InboundMessage, NotJson, Status, UnknownShape
from gateway.core.jsonspan import fragment
from gateway.core.parsing import parse, parse_fragment, parse_items
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

ERR = [{"code": 131000, "title": "Something went wrong"}]


def keys(source: str, payload: Any, delivery_id: str | None = None) -> list[str]:
    body = payload if isinstance(payload, bytes) else to_bytes(payload)
    return [e.key for e in parse(source, body, delivery_id)]


@pytest.mark.parametrize(
    ("source", "payload", "expected"),
    [
        ("meta", messages_payload(message_obj("wamid.A")), ["msg:wamid.A"]),
        (
            "meta",
            messages_payload(message_obj("wamid.A"), message_obj("wamid.B")),
            ["msg:wamid.A", "msg:wamid.B"],
        ),
        ("meta", statuses_payload(status_obj("wamid.S", "sent")), ["status:wamid.S:sent:"]),
        (
            "meta",
            statuses_payload(status_obj("wamid.S", "read", participant="p1")),
            ["status:wamid.S:read:p1"],
        ),
        # A group status listing three participants: one key each.
        (
            "meta",
            statuses_payload(status_obj("wamid.G", "delivered", participant=["p1", "p2", "p3"])),
            ["status:wamid.G:delivered:p1", "status:wamid.G:delivered:p2", "status:wamid.G:delivered:p3"],
        ),
        (
            "meta",
            statuses_payload(*(status_obj("wamid.G", "read", participant=p) for p in ("p1", "p2", "p3"))),
            ["status:wamid.G:read:p1", "status:wamid.G:read:p2", "status:wamid.G:read:p3"],
        ),
        # Several entries and changes: every key, in order.
        (
            "meta",
            meta_payload(
                ("messages", meta_value(messages=[message_obj("wamid.M")])),
                ("messages", meta_value(statuses=[status_obj("wamid.S", "sent")])),
                entries=2,
            ),
            ["msg:wamid.M", "status:wamid.S:sent:", "msg:wamid.M", "status:wamid.S:sent:"],
        ),
        ("meta", meta_payload(), []),
        ("meta", {"object": "whatsapp_business_account", "entry": []}, []),
        (
            "tenashi",
            tenashi_event("evt_1", "message.status", {"message_id": "m", "status": "sent"}),
            ["evt:evt_1"],
        ),
        (
            "tenashi",
            tenashi_event("evt_2", "message.received", {"message_id": "m", "from": "49", "type": "text"}),
            ["evt:evt_2"],
        ),
        ("tenashi", tenashi_event("evt_3", "account.updated", {}), ["evt:evt_3"]),
    ],
)
def test_keys(source: str, payload: dict[str, Any], expected: list[str]) -> None:
    assert keys(source, payload) == expected


def test_tenashi_id_falls_back_to_delivery_header() -> None:
    doc = {"type": "message.status", "data": {"message_id": "m", "status": "read"}}
    assert keys("tenashi", doc, "evt_hdr") == ["evt:evt_hdr"]


@pytest.mark.parametrize(
    ("change", "prefix", "kind"),
    [
        (("messages", meta_value(errors=ERR)), "acct-error:", AccountError),
        (
            ("message_template_status_update", {"event": "APPROVED", "message_template_id": 1}),
            "change:",
            AccountUpdate,
        ),
        (("account_update", {"event": "VERIFIED_ACCOUNT"}), "change:account_update:", AccountUpdate),
        # A messages change with nothing we act on is still recorded, not dropped.
        (
            ("messages", {"messaging_product": "whatsapp", "message_echoes": [{}]}),
            "change:messages:",
            AccountUpdate,
        ),
    ],
)
def test_changes_without_ids_are_keyed_by_content(change: tuple[str, Any], prefix: str, kind: type) -> None:
    payload = meta_payload(change)
    (event,) = parse("meta", to_bytes(payload))
    assert isinstance(event, kind)
    assert event.key.startswith(prefix)
    # A redelivery hashes to the same key; a different change does not.
    assert keys("meta", payload) == [event.key]
    other = meta_payload((change[0], {"different": True}))
    assert keys("meta", other) != [event.key]


def test_message_fields() -> None:
    (m,) = parse("meta", to_bytes(messages_payload(message_obj("wamid.A", sender="4911"))))
    assert isinstance(m, InboundMessage)
    assert (m.wamid, m.phone_number_id, m.sender, m.type, m.timestamp, m.contact_name) == (
        "wamid.A",
        "1111",
        "4911",
        "text",
        1764460800,
        "Ana",
    )
    assert m.message["text"] == {"body": "hi"}


def test_status_fields() -> None:
    st = status_obj("wamid.S", "failed", callback="cb-1", errors=ERR)
    (s,) = parse("meta", to_bytes(statuses_payload(st)))
    assert isinstance(s, Status)
    assert (s.wamid, s.status, s.participant, s.callback_data, s.errors, s.timestamp) == (
        "wamid.S",
        "failed",
        "",
        "cb-1",
        ERR,
        1764460801,
    )


def test_tenashi_status_carries_idempotency_key_as_callback() -> None:
    doc = tenashi_event(
        "evt_9", "message.status", {"message_id": "m1", "status": "read", "idempotency_key": "k"}
    )
    (s,) = parse("tenashi", to_bytes(doc))
    assert isinstance(s, Status) and (s.wamid, s.status, s.callback_data) == ("m1", "read", "k")


@pytest.mark.parametrize(
    ("source", "body", "error"),
    [
        ("meta", b"not json", NotJson),
        ("meta", b"", NotJson),
        ("meta", b"\xff\xfe", NotJson),
        ("meta", b"[]", UnknownShape),
        ("meta", b'{"object": "page", "entry": []}', UnknownShape),
        ("meta", b'{"object": "whatsapp_business_account"}', UnknownShape),
        ("meta", b'{"object": "whatsapp_business_account", "entry": {}}', UnknownShape),
        (
            "meta",
            b'{"object": "whatsapp_business_account", "entry": [{"changes": [{"value": {}}]}]}',
            UnknownShape,
        ),
        ("meta", to_bytes(statuses_payload({"status": "sent"})), UnknownShape),
        ("meta", to_bytes(statuses_payload({"id": "wamid.X"})), UnknownShape),
        ("meta", to_bytes(messages_payload({"from": "49", "type": "text"})), UnknownShape),
        ("meta", to_bytes(statuses_payload(status_obj("w", "sent", participant=[]))), UnknownShape),
        ("tenashi", b'{"type": "message.status", "data": {}}', UnknownShape),
        ("tenashi", b'{"id": "evt_1", "data": {}}', UnknownShape),
        ("tenashi", b'{"id": "evt_1", "type": "message.status", "data": {"status": "sent"}}', UnknownShape),
        ("tenashi", b"\x00\x01", NotJson),
        ("other", b"{}", UnknownShape),
    ],
)
def test_unparseable_raises_a_specific_error(source: str, body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse(source, body)


def _items_body(*messages: bytes) -> bytes:
    return (
        b'{"object":"whatsapp_business_account","entry":[{"id":"w","changes":[{"field":"messages",'
        b'"value":{"metadata":{"phone_number_id":"1111"},"contacts":[{"profile":{"name":"Ana"},"wa_id":"49"}],'
        b'"messages":[' + b",".join(messages) + b"]}}]}]}"
    )


GOOD = b'{"from":"49","id":"wamid.G","type":"text","text":{"body":"hi"}}'


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b'{"from":"49","type":"text"}', "without a string 'id'"),
        (b'"a string"', "is not an object"),
        (b'{"from":"49","id":7}', "without a string 'id'"),
    ],
)
def test_a_malformed_message_is_a_bad_item_and_the_rest_parses(bad: bytes, error: str) -> None:
    items = parse_items("meta", _items_body(GOOD, bad, GOOD.replace(b"wamid.G", b"wamid.H")))
    assert [(i.position, i.unit, i.error is None) for i in items] == [
        (0, "message", True),
        (1, "message", False),
        (2, "message", True),
    ]
    assert error in (items[1].error or "")
    assert [e.key for i in items for e in i.events] == ["msg:wamid.G", "msg:wamid.H"]
    assert items[1].path == ("entry", 0, "changes", 0, "value", "messages", 1)
    with pytest.raises(UnknownShape):
        parse("meta", _items_body(GOOD, bad))


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        (b"a\\u0000b", "a\\u0000b"),
        (b"x\\ud800y", "x\\ud800y"),  # orjson refuses the body; the standard library parses it
        (b"\\u00e9", "\u00e9"),  # an ordinary escape is left alone
    ],
)
def test_unstorable_characters_are_escaped(text: bytes, stored: str) -> None:
    msg = b'{"from":"49","id":"wamid.N","type":"text","text":{"body":"' + text + b'"}}'
    (item,) = parse_items("meta", _items_body(msg))
    (ev,) = item.events
    assert isinstance(ev, InboundMessage)
    assert ev.message["text"]["body"] == stored
    assert item.scrubbed == (stored != "\u00e9")
    # Rebuilt from the fragment alone, the event is the same (retries and replays).
    assert parse_fragment("meta", item.unit, msg, item.context) == [ev]


def test_every_unit_rebuilds_from_its_fragment() -> None:
    body = to_bytes(
        meta_payload(
            (
                "messages",
                meta_value(
                    messages=[message_obj("wamid.A", sender="4911")],
                    statuses=[status_obj("wamid.B", "read", participant=["p1", "p2"])],
                    errors=[{"code": 131000}],
                ),
            ),
            ("message_template_status_update", {"event": "APPROVED"}),
        )
    )
    items = parse_items("meta", body)
    assert [i.unit for i in items] == ["message", "status", "change", "change"]
    for item in items:
        raw = fragment(body, item.path)
        assert raw is not None
        assert parse_fragment("meta", item.unit, raw, item.context) == list(item.events)
    (t,) = parse_items("tenashi", b'{"type":"x.y","data":{}}', "dlv-1")
    assert parse_fragment("tenashi", t.unit, b'{"type":"x.y","data":{}}', t.context) == list(t.events)

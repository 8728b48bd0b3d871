"""Customer identities since BSUIDs: parsed leniently from webhooks, linked per business number."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.events import InboundMessage, Status
from gateway.core.identity import Contacts, Who, contact_for, ident, is_bsuid, recipient_field
from gateway.core.parsing import parse, parse_items
from gateway.core.planning import StagedRow, identity_links, plan_batch
from gateway.testing.payloads import (
    contact_obj,
    message_obj,
    meta_payload,
    meta_value,
    status_obj,
    to_bytes,
)

PHONE = "4915112345678"
BSUID = "US.13491208655302741918"
PARENT = "US.ENT.11815799212886844830"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4915112345678", "4915112345678"),
        (4915112345678, "4915112345678"),  # a number where Meta sends a string
        (BSUID, BSUID),
        ("", None),
        (None, None),
        (True, None),
        (["US.1"], None),
        ({"id": "US.1"}, None),
        ("x" * 257, None),
        ("US.1\n", None),
        ("US.1\x00", None),
        ("US.1\x1f", None),
        ("US.1\x7f", None),
        ("\x7fUS.1", None),
        ("US.1 ", "US.1 "),  # the first character that is not a control one
        ("US.1\x80", "US.1\x80"),  # C1 range: kept as sent, like any other text
    ],
)
def test_ident_keeps_only_plausible_identifiers(value: Any, expected: str | None) -> None:
    assert ident(value) == expected


@pytest.mark.parametrize(
    ("address", "field", "bsuid"),
    [
        (PHONE, "to", False),
        (BSUID, "recipient", True),
        (PARENT, "recipient", True),
        ("us.123", "to", False),
        ("US.", "to", False),
        ("US." + "1" * 129, "to", False),
    ],
)
def test_recipient_field(address: str, field: str, bsuid: bool) -> None:
    assert recipient_field(address) == field and is_bsuid(address) is bsuid


def _message(msg: dict[str, Any], contacts: list[Any] | None) -> InboundMessage:
    value = meta_value(messages=[msg], contacts=contacts)
    if contacts is None:
        value.pop("contacts")
    (ev,) = parse("meta", to_bytes(meta_payload(("messages", value))))
    assert isinstance(ev, InboundMessage)
    return ev


@pytest.mark.parametrize(
    ("msg", "contacts", "who", "name"),
    [
        # A customer with a phone number, before BSUIDs.
        (message_obj("wamid.A", sender=PHONE), [contact_obj(PHONE)], Who(PHONE), "Ana"),
        # Since April 2026: phone number and BSUID, parent BSUID where enabled.
        (
            message_obj("wamid.A", sender=PHONE, user_id=BSUID),
            [contact_obj(PHONE, BSUID, parent_user_id=PARENT)],
            Who(PHONE, BSUID, PARENT),
            "Ana",
        ),
        # A username user whose number Meta does not share: no from, no wa_id.
        (
            message_obj("wamid.A", sender=None, user_id=BSUID),
            [contact_obj(None, BSUID, username="ana.b")],
            Who(None, BSUID, None, "ana.b"),
            "Ana",
        ),
        # The BSUID only in the contact (the message has no from_user_id).
        (message_obj("wamid.A", sender=PHONE), [contact_obj(PHONE, BSUID)], Who(PHONE, BSUID), "Ana"),
        # The contact of another customer is not this one's.
        (message_obj("wamid.A", sender=PHONE), [contact_obj("4900000", "US.9")], Who(PHONE), None),
        # Two contacts: the matching one by BSUID.
        (
            message_obj("wamid.A", sender=None, user_id=BSUID),
            [contact_obj("4900000", "US.9", name="Bo"), contact_obj(None, BSUID, name="Cy")],
            Who(None, BSUID),
            "Cy",
        ),
        # Identity fields in unexpected shapes: processed with what is there.
        (
            {**message_obj("wamid.A", sender=None), "from_user_id": ["US.1"]},
            [{"profile": "Ana", "user_id": {"x": 1}, "wa_id": 12345678}],
            Who("12345678"),
            None,
        ),
        ({**message_obj("wamid.A", sender=None), "from": "9" * 300}, None, Who(), None),
        ({**message_obj("wamid.A", sender=None)}, "not a list", Who(), None),
    ],
)
def test_message_identities(msg: dict[str, Any], contacts: Any, who: Who, name: str | None) -> None:
    ev = _message(msg, contacts)
    assert ev.who == who and ev.contact_name == name
    assert (
        ev.waba_id == "waba-0" and ev.phone_number_id == "1111" and ev.display_phone_number == "15550001111"
    )


def test_a_message_without_any_identity_is_a_message_not_a_dead_item() -> None:
    body = to_bytes(meta_payload(("messages", meta_value(messages=[message_obj("wamid.A", sender=None)]))))
    (item,) = parse_items("meta", body)
    assert item.error is None and item.events[0].key == "msg:wamid.A"


def _statuses(st: dict[str, Any], contacts: list[Any] | None) -> list[Status]:
    out = parse("meta", to_bytes(meta_payload(("messages", meta_value(statuses=[st], contacts=contacts)))))
    assert all(isinstance(s, Status) for s in out)
    return out  # type: ignore[return-value]


def test_status_of_a_send_to_a_bsuid_names_the_recipient_by_bsuid() -> None:
    st = {"id": "wamid.S", "status": "delivered", "timestamp": "1", "recipient_user_id": BSUID}
    (ev,) = _statuses(st, [contact_obj(None, BSUID, username="ana.b")])
    assert ev.who == Who(None, BSUID, None, "ana.b") and ev.recipient is None
    assert ev.contact == contact_obj(None, BSUID, username="ana.b")


def test_failed_status_without_contacts() -> None:
    st = status_obj("wamid.S", "failed", errors=[{"code": 131026}])
    (ev,) = _statuses(st, None)
    assert ev.who == Who(PHONE) and ev.contact is None


def test_group_status_of_a_participant_known_only_by_bsuid_has_its_own_key() -> None:
    base = {
        "id": "wamid.G",
        "status": "read",
        "timestamp": "1",
        "recipient_id": "grp",
        "recipient_type": "group",
    }
    a = _statuses({**base, "recipient_participant_user_id": "US.1"}, [contact_obj(None, "US.1")])
    b = _statuses({**base, "recipient_participant_user_id": "US.2"}, None)
    assert [a[0].key, b[0].key] == ["status:wamid.G:read:US.1", "status:wamid.G:read:US.2"]
    assert a[0].contact is None  # a group's contacts are not its recipient's


def test_links_per_business_number() -> None:
    msg = message_obj("wamid.A", sender=PHONE, user_id=BSUID)
    (ev,) = parse(
        "meta",
        to_bytes(
            meta_payload(("messages", meta_value(messages=[msg], contacts=[contact_obj(PHONE, BSUID)])))
        ),
    )
    assert identity_links(ev) == [
        {
            "phone_number_id": "1111",
            "user_id": BSUID,
            "wa_id": PHONE,
            "parent_user_id": None,
            "username": None,
        }
    ]
    # No BSUID, or a malformed one: nothing to link.
    (old,) = parse(
        "meta", to_bytes(meta_payload(("messages", meta_value(messages=[message_obj("wamid.B")]))))
    )
    assert identity_links(old) == []
    bad = {**msg, "id": "wamid.C", "from_user_id": "not-a-bsuid"}
    (ev2,) = parse("meta", to_bytes(meta_payload(("messages", meta_value(messages=[bad], contacts=[])))))
    assert identity_links(ev2) == []


def test_system_message_of_a_changed_number_links_the_new_pair() -> None:
    system = {
        "from": PHONE,
        "id": "wamid.SYS",
        "timestamp": "1739321024",
        "type": "system",
        "system": {
            "body": "User A changed from 1 to 2",
            "wa_id": "4917000000001",
            "user_id": "US.777",
            "type": "user_changed_number",
        },
    }
    value = meta_value(messages=[system])
    value.pop("contacts")  # system messages carry no contacts
    (ev,) = parse("meta", to_bytes(meta_payload(("messages", value))))
    assert [(link["wa_id"], link["user_id"]) for link in identity_links(ev)] == [("4917000000001", "US.777")]


def test_contacts_of_other_fields_are_linked_too() -> None:
    value = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550001111", "phone_number_id": "1111"},
        "contacts": [contact_obj(PHONE, BSUID)],
        "user_preferences": [
            {"wa_id": PHONE, "category": "marketing_messages", "value": "stop", "timestamp": 1}
        ],
    }
    plan = plan_batch([StagedRow(1, "meta", to_bytes(meta_payload(("user_preferences", value))), None)])
    assert plan.kinds["account_update"] == 1
    assert [(link["phone_number_id"], link["wa_id"], link["user_id"]) for link in plan.links] == [
        ("1111", PHONE, BSUID)
    ]


def test_contact_for_refuses_a_contradicting_only_contact() -> None:
    assert contact_for([contact_obj(PHONE)], "4900000", None) is None
    assert contact_for([contact_obj(PHONE)], None, BSUID) == contact_obj(PHONE)
    assert contact_for([contact_obj(PHONE, "US.9")], None, BSUID) is None


def first_naming(contacts: list[object], wa_id: str | None, user_id: str | None) -> object:
    """The rule by its definition: the first contact that names either identifier."""
    for c in contacts:
        if isinstance(c, dict) and (
            (wa_id is not None and ident(c.get("wa_id")) == wa_id)
            or (user_id is not None and ident(c.get("user_id")) == user_id)
        ):
            return c
    return None


A = {"wa_id": "491", "user_id": "US.1", "profile": {"name": "a"}}
B = {"wa_id": "492", "user_id": "US.2", "profile": {"name": "b"}}
B_AGAIN = {"wa_id": "492", "profile": {"name": "b2"}}
CROSS = {"wa_id": "493", "user_id": "US.1", "profile": {"name": "c"}}  # A's BSUID, another number
FILLER = [{"wa_id": f"40{i}", "user_id": f"US.40{i}"} for i in range(10)]


@pytest.mark.parametrize(
    ("contacts", "wa_id", "user_id", "expected"),
    [
        ([A, B], "492", None, B),
        ([A, B], None, "US.1", A),
        ([B, B_AGAIN], "492", None, B),  # the first of duplicates
        ([B_AGAIN, B], "492", "US.2", B_AGAIN),  # the first naming either
        ([CROSS, A], "491", "US.1", CROSS),  # CROSS names the BSUID and comes first
        ([A, CROSS], "493", "US.1", A),
        ([A, B], "499", "US.9", None),
        ([A, "not a dict", 7, B], "492", None, B),
        ([A], None, None, A),  # the only contact, naming no one else
        ([A], "499", None, None),  # the only contact names another number
        ([], "491", None, None),
        ("not a list", "491", None, None),
        # Longer lists are indexed: the same rule.
        ([*FILLER, CROSS, A], "491", "US.1", CROSS),
        ([*FILLER, A, CROSS], "493", "US.1", A),
        ([*FILLER, B_AGAIN, B], "492", "US.2", B_AGAIN),
        ([*FILLER, A, B], None, "US.2", B),
        ([*FILLER, A], "499", None, None),
        ([*FILLER, A], None, None, None),
    ],
)
def test_contacts_find_the_first_contact_naming_either_identifier(
    contacts: object, wa_id: str | None, user_id: str | None, expected: object
) -> None:
    got = Contacts(contacts).find(wa_id, user_id)
    assert got == expected
    assert got is contact_for(contacts, wa_id, user_id)
    if isinstance(contacts, list) and len([c for c in contacts if isinstance(c, dict)]) > 1:
        assert got is first_naming(contacts, wa_id, user_id)


@pytest.mark.parametrize(
    ("field", "value", "raws"),
    [
        # A list of several: each participant's status names only its participant.
        ("recipient_participant_id", ["48", "49"], [["48"], ["49"]]),
        ("recipient_participant_user_id", ["US.1", "US.2", "US.3"], [["US.1"], ["US.2"], ["US.3"]]),
        # A list of one, or a single value, is kept as it came.
        ("recipient_participant_id", ["48"], [["48"]]),
        ("recipient_participant_id", "48", ["48"]),
    ],
)
def test_a_group_status_per_participant_names_only_its_participant(
    field: str, value: object, raws: list[object]
) -> None:
    st = {"id": "wamid.G", "status": "read", "recipient_id": "grp", "recipient_type": "group", field: value}
    events = _statuses(st, None)
    assert [ev.raw[field] for ev in events] == raws
    assert [ev.participant for ev in events] == [r[0] if isinstance(r, list) else r for r in raws]
    assert all(
        {k: v for k, v in ev.raw.items() if k != field} == {k: v for k, v in st.items() if k != field}
        for ev in events
    )

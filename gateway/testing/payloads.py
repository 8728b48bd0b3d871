"""The one factory of Meta- and Tenashi-shaped webhook payloads, for tests, the fake provider,
the benchmarks and the load harness. Shapes follow Meta's WhatsApp Cloud API webhook reference."""

from __future__ import annotations

import json
from typing import Any

DISPLAY_NUMBER = "15550001111"
PHONE_NUMBER_ID = "1111"
CUSTOMER = "4915112345678"
MESSAGE_TS = "1764460800"


def meta_bytes(payload: dict[str, Any], escape_slash: bool = False) -> bytes:
    """Serialised as Meta sends it: non-ASCII escaped as \\uXXXX (emoji as surrogate pairs),
    no spaces, '/' optionally escaped. Sign exactly these bytes."""
    text = json.dumps(payload, ensure_ascii=True, separators=(",", ":"))
    if escape_slash:
        text = text.replace("/", "\\/")
    return text.encode()


# Tenashi is serialised the same way.
to_bytes = meta_bytes


def metadata(phone_number_id: str = PHONE_NUMBER_ID, display: str = DISPLAY_NUMBER) -> dict[str, str]:
    return {"display_phone_number": display, "phone_number_id": phone_number_id}


def meta_value(
    *,
    messages: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    errors: list[dict[str, Any]] | None = None,
    contacts: list[dict[str, Any]] | None = None,
    phone_number_id: str = PHONE_NUMBER_ID,
    display: str = DISPLAY_NUMBER,
) -> dict[str, Any]:
    """The ``value`` of a ``messages`` change; contacts default to one per message sender."""
    value: dict[str, Any] = {"messaging_product": "whatsapp", "metadata": metadata(phone_number_id, display)}
    if contacts is not None:
        value["contacts"] = contacts
    if messages is not None:
        if contacts is None:
            value["contacts"] = [{"profile": {"name": "Ana"}, "wa_id": m.get("from", "")} for m in messages]
        value["messages"] = messages
    if statuses is not None:
        value["statuses"] = statuses
    if errors is not None:
        value["errors"] = errors
    return value


def meta_envelope(entries: list[tuple[str, list[tuple[str, Any]]]]) -> dict[str, Any]:
    """A whole POST: ``entries`` are (WABA id, [(field, value), ...])."""
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {"id": waba, "changes": [{"field": f, "value": v} for f, v in changes]}
            for waba, changes in entries
        ],
    }


def meta_payload(*changes: tuple[str, Any], entries: int = 1) -> dict[str, Any]:
    """``changes`` are (field, value) pairs, repeated in each of ``entries`` entries."""
    return meta_envelope([(f"waba-{e}", list(changes)) for e in range(entries)])


def message_obj(
    wamid: str,
    text: str = "hi",
    sender: str | None = CUSTOMER,
    timestamp: str = MESSAGE_TS,
    user_id: str | None = None,
) -> dict[str, Any]:
    """A text message; ``sender`` None: a user whose phone number Meta does not share (only
    ``from_user_id``, their BSUID)."""
    msg: dict[str, Any] = {}
    if sender is not None:
        msg["from"] = sender
    if user_id is not None:
        msg["from_user_id"] = user_id
    return {**msg, "id": wamid, "timestamp": timestamp, "type": "text", "text": {"body": text}}


def contact_obj(
    wa_id: str | None = CUSTOMER,
    user_id: str | None = None,
    *,
    name: str = "Ana",
    username: str | None = None,
    parent_user_id: str | None = None,
) -> dict[str, Any]:
    """A ``contacts[]`` object as Meta sends it since 2026 (BSUID, optional phone and username)."""
    profile: dict[str, Any] = {"name": name}
    if username is not None:
        profile["username"] = username
    out: dict[str, Any] = {"profile": profile}
    if wa_id is not None:
        out["wa_id"] = wa_id
    if user_id is not None:
        out["user_id"] = user_id
    if parent_user_id is not None:
        out["parent_user_id"] = parent_user_id
    return out


def status_obj(
    wamid: str,
    status: str,
    callback: str | None = None,
    participant: str | list[str] | None = None,
    recipient: str = CUSTOMER,
    errors: list[dict[str, Any]] | None = None,
    timestamp: str = "1764460801",
) -> dict[str, Any]:
    st: dict[str, Any] = {"id": wamid, "status": status, "timestamp": timestamp, "recipient_id": recipient}
    if callback is not None:
        st["biz_opaque_callback_data"] = callback
    if participant is not None:
        st["recipient_type"] = "group"
        st["recipient_participant_id"] = participant
    if errors is not None:
        st["errors"] = errors
    return st


def statuses_payload(*statuses: dict[str, Any], phone_number_id: str = PHONE_NUMBER_ID) -> dict[str, Any]:
    return meta_payload(("messages", meta_value(statuses=list(statuses), phone_number_id=phone_number_id)))


def messages_payload(*messages: dict[str, Any]) -> dict[str, Any]:
    return meta_payload(("messages", meta_value(messages=list(messages))))


def message_payload(wamid: str, text: str = "hi", phone_number_id: str = PHONE_NUMBER_ID) -> dict[str, Any]:
    """One text message from a customer with a non-ASCII profile name (escaping matters)."""
    value = meta_value(
        messages=[message_obj(wamid, text)],
        contacts=[{"profile": {"name": "Jörg"}, "wa_id": CUSTOMER}],
        phone_number_id=phone_number_id,
    )
    return meta_envelope([("waba-1", [("messages", value)])])


def tenashi_event(event_id: str, typ: str, data: dict[str, Any], created: int = 1764460802) -> dict[str, Any]:
    return {"id": event_id, "type": typ, "created": created, "data": data}

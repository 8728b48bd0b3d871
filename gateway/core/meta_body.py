"""The body a Meta-format destination gets for one event: the event as its own Meta webhook,
rendered from its envelope (gateway.core.envelope), which keeps what Meta sent.

    {"object": "whatsapp_business_account",
     "entry": [{"id": <WABA id>, "changes": [{"field": "messages",
                "value": {"messaging_product": "whatsapp", "metadata": {...},
                          "contacts": [<the event's contact>], "messages"|"statuses": [<it>]}}]}]}

Account errors and other changes keep their value as it came: ``{"field": ..., "value": ...}``.
A group status listing several participants is one event per participant: its participant list
names that one. This is the rendering of an event that is not a status of a send of ours; the
SQL function ``meta_webhook`` renders the same body (and, for such a status, puts the send API
caller's ``biz_opaque_callback_data`` in it), and a test holds the two equal.
"""

from __future__ import annotations

from typing import Any

# A group status's participant list, by the name Meta gives it (phone numbers or BSUIDs).
_PARTICIPANT_LISTS = ("recipient_participant_id", "recipient_participant_user_id")


def _status(raw: Any, participant: Any) -> Any:
    if isinstance(raw, dict):
        for name in _PARTICIPANT_LISTS:
            if isinstance(raw.get(name), list):
                return {**raw, name: [participant]}
    return raw


def meta_webhook(envelope: dict[str, Any]) -> dict[str, Any] | None:
    """The Meta webhook of one event; None for an event that did not come from Meta."""
    if envelope.get("source") != "meta":
        return None
    data = envelope.get("data") or {}
    raw = envelope.get("raw")
    typ = envelope.get("type")
    change: dict[str, Any]
    if typ in ("message.received", "message.status"):
        metadata = {
            k: data[k] for k in ("display_phone_number", "phone_number_id") if data.get(k) is not None
        }
        value: dict[str, Any] = {"messaging_product": "whatsapp", "metadata": metadata}
        if isinstance(data.get("contact"), dict):
            value["contacts"] = [data["contact"]]
        if typ == "message.received":
            value["messages"] = [raw]
        else:
            value["statuses"] = [_status(raw, data.get("participant"))]
        change = {"field": "messages", "value": value}
    else:
        change = {"field": data.get("field"), "value": raw}
    return {
        "object": "whatsapp_business_account",
        "entry": [{"id": data.get("waba_id"), "changes": [change]}],
    }

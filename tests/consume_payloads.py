"""Meta status / error / Tenashi payload builders for the consumer tests and benchmark."""

from __future__ import annotations

import json
from typing import Any


def status_obj(
    wamid: str,
    status: str,
    callback: str | None = None,
    participant: str | list[str] | None = None,
    recipient: str = "4915112345678",
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


def meta_value(
    *,
    messages: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    errors: list[dict[str, Any]] | None = None,
    phone_number_id: str = "1111",
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550001111", "phone_number_id": phone_number_id},
    }
    if messages is not None:
        value["contacts"] = [{"profile": {"name": "Ana"}, "wa_id": m.get("from", "")} for m in messages]
        value["messages"] = messages
    if statuses is not None:
        value["statuses"] = statuses
    if errors is not None:
        value["errors"] = errors
    return value


def meta_payload(*changes: tuple[str, Any], entries: int = 1) -> dict[str, Any]:
    """``changes`` are (field, value) pairs, repeated in each of ``entries`` entries."""
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {"id": f"waba-{e}", "changes": [{"field": f, "value": v} for f, v in changes]}
            for e in range(entries)
        ],
    }


def message_obj(wamid: str, text: str = "hi", sender: str = "4915112345678") -> dict[str, Any]:
    return {"from": sender, "id": wamid, "timestamp": "1764460800", "type": "text", "text": {"body": text}}


def statuses_payload(*statuses: dict[str, Any]) -> dict[str, Any]:
    return meta_payload(("messages", meta_value(statuses=list(statuses))))


def messages_payload(*messages: dict[str, Any]) -> dict[str, Any]:
    return meta_payload(("messages", meta_value(messages=list(messages))))


def tenashi_event(event_id: str, typ: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": event_id, "type": typ, "created": 1764460802, "data": data}


def to_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode()

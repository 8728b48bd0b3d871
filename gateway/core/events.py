"""Staged webhook bodies -> typed events, each with its dedup key. Pure: no I/O.

Keys (fixed names, other parts code against them):

- ``msg:<wamid>`` an inbound Meta message;
- ``status:<wamid>:<status>:<participant>`` a Meta status (participant =
  ``recipient_participant_id``, empty outside groups; a group status listing several
  participants yields one event per participant);
- ``evt:<id>`` a Tenashi event (its body ``id``, else the ``X-Tenashi-Delivery`` header);
- ``acct-error:<sha256>`` a Meta change carrying ``value.errors`` (account-level, no id):
  the hash of the WABA id and the canonical change, so a redelivery has the same key;
- ``change:<field>:<sha256>`` any other change (template status, account updates, ...):
  recorded as an account update for operators, keyed the same way. Nothing is dropped.

A body that is not JSON, or JSON of a shape we do not know, raises ``PayloadError``:
the consumer parks it as dead with its bytes intact.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from gateway.core.enums import Source

# Meta may batch up to 1000 updates per POST; more than this is not a Meta payload.
MAX_EVENTS_PER_PAYLOAD = 10_000


class PayloadError(ValueError):
    """The body cannot be turned into events; retrying will not help."""


class NotJson(PayloadError):
    pass


class UnknownShape(PayloadError):
    pass


@dataclass(frozen=True, slots=True)
class InboundMessage:
    key: str
    wamid: str
    phone_number_id: str | None
    sender: str | None
    type: str | None
    timestamp: int | None
    contact_name: str | None
    message: dict[str, Any]
    kind: ClassVar[str] = "message"

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``inbound_messages`` row (as the consumer's batch statement reads it)."""
        return {
            "key": self.key,
            "source": source,
            "wamid": self.wamid,
            "phone_number_id": self.phone_number_id,
            "sender": self.sender,
            "type": self.type,
            "ts": self.timestamp,
            "contact_name": self.contact_name,
            "message": self.message,
            "inbox_id": inbox_id,
        }


@dataclass(frozen=True, slots=True)
class Status:
    key: str
    wamid: str
    status: str
    participant: str
    recipient: str | None
    timestamp: int | None
    callback_data: str | None
    errors: list[Any] | None
    raw: dict[str, Any]
    kind: ClassVar[str] = "status"

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``message_statuses`` row; it also moves the outbox row it names."""
        return {
            "key": self.key,
            "source": source,
            "wamid": self.wamid,
            "status": self.status,
            "participant": self.participant,
            "recipient": self.recipient,
            "ts": self.timestamp,
            "callback_data": self.callback_data,
            "errors": self.errors,
            "raw": self.raw,
            "inbox_id": inbox_id,
        }


@dataclass(frozen=True, slots=True)
class AccountError:
    key: str
    waba_id: str | None
    phone_number_id: str | None
    field: str
    errors: list[Any]
    raw: dict[str, Any]
    kind: ClassVar[str] = "account_error"

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``account_errors`` row."""
        return {
            "key": self.key,
            "waba_id": self.waba_id,
            "phone_number_id": self.phone_number_id,
            "field": self.field,
            "errors": self.errors,
            "raw": self.raw,
            "inbox_id": inbox_id,
        }


@dataclass(frozen=True, slots=True)
class AccountUpdate:
    key: str
    waba_id: str | None
    field: str
    value: Any
    kind: ClassVar[str] = "account_update"

    def to_row(self, inbox_id: int, source: str) -> dict[str, Any]:
        """The ``account_updates`` row."""
        return {
            "key": self.key,
            "waba_id": self.waba_id,
            "field": self.field,
            "value": self.value,
            "inbox_id": inbox_id,
        }


Event = InboundMessage | Status | AccountError | AccountUpdate


def parse(source: str, body: bytes, delivery_id: str | None = None) -> list[Event]:
    """Every event in one staged body, in payload order (duplicates included)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise NotJson(f"body is not JSON: {exc}") from None
    if source == Source.META:
        events = parse_meta(doc)
    elif source == Source.TENASHI:
        events = [parse_tenashi(doc, delivery_id)]
    else:
        raise UnknownShape(f"unknown source {source!r}")
    if len(events) > MAX_EVENTS_PER_PAYLOAD:
        raise UnknownShape(f"{len(events)} events in one payload")
    return events


def _digest(*parts: Any) -> str:
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _opt_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _req_str(obj: dict[str, Any], name: str, what: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise UnknownShape(f"{what} without a string {name!r}")
    return value


def _unix(value: Any) -> int | None:
    """Meta sends Unix seconds as a string; anything else is kept in the raw JSON only."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 2**37 else None
    if isinstance(value, str) and value.isdigit() and len(value) <= 11:
        return int(value)
    return None


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UnknownShape(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UnknownShape(f"{what} is not a list")
    return value


def parse_meta(doc: Any) -> list[Event]:
    doc = _dict(doc, "payload")
    if doc.get("object") != "whatsapp_business_account":
        raise UnknownShape(f"object is {str(doc.get('object'))[:60]!r}, not whatsapp_business_account")
    if "entry" not in doc:
        raise UnknownShape("payload without entry")
    events: list[Event] = []
    for entry in _list(doc["entry"], "entry"):
        entry = _dict(entry, "entry")
        waba_id = _opt_str(entry.get("id"))
        for change in _list(entry.get("changes"), "changes"):
            events.extend(_meta_change(waba_id, _dict(change, "change")))
    return events


def _meta_change(waba_id: str | None, change: dict[str, Any]) -> list[Event]:
    fld = change.get("field")
    if not isinstance(fld, str) or not fld:
        raise UnknownShape("change without a field")
    value = change.get("value")
    if fld != "messages":
        return [AccountUpdate(f"change:{fld}:{_digest(waba_id, change)}", waba_id, fld, value)]
    value = _dict(value, "messages change value")
    metadata = value.get("metadata")
    phone_number_id = _opt_str(metadata.get("phone_number_id")) if isinstance(metadata, dict) else None
    contacts = _contact_names(value.get("contacts"))
    events: list[Event] = []
    for msg in _list(value.get("messages"), "messages"):
        events.append(_meta_message(_dict(msg, "message"), phone_number_id, contacts))
    for st in _list(value.get("statuses"), "statuses"):
        events.extend(_meta_statuses(_dict(st, "status")))
    errors = _list(value.get("errors"), "errors")
    if errors:
        key = f"acct-error:{_digest(waba_id, change)}"
        events.append(AccountError(key, waba_id, phone_number_id, fld, errors, value))
    if not events:
        # A messages change with nothing we act on (e.g. echoes): still recorded, not dropped.
        events.append(AccountUpdate(f"change:{fld}:{_digest(waba_id, change)}", waba_id, fld, value))
    return events


def _contact_names(contacts: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in contacts if isinstance(contacts, list) else []:
        if not isinstance(c, dict):
            continue
        profile = c.get("profile")
        name = profile.get("name") if isinstance(profile, dict) else None
        wa_id = _opt_str(c.get("wa_id"))
        if isinstance(name, str):
            out[wa_id or ""] = name
    return out


def _meta_message(
    msg: dict[str, Any], phone_number_id: str | None, contacts: dict[str, str]
) -> InboundMessage:
    wamid = _req_str(msg, "id", "message")
    sender = _opt_str(msg.get("from"))
    name = contacts.get(sender or "")
    if name is None and len(contacts) == 1:
        name = next(iter(contacts.values()))
    return InboundMessage(
        key=f"msg:{wamid}",
        wamid=wamid,
        phone_number_id=phone_number_id,
        sender=sender,
        type=_opt_str(msg.get("type")),
        timestamp=_unix(msg.get("timestamp")),
        contact_name=name,
        message=msg,
    )


def _participants(st: dict[str, Any]) -> list[str]:
    """Group statuses name a participant; a list of them yields one status each."""
    value = st.get("recipient_participant_id")
    if value is None:
        return [""]
    if isinstance(value, list):
        out = [p for p in (_opt_str(v) for v in value) if p]
        if not out:
            raise UnknownShape("status with an empty participant list")
        return out
    single = _opt_str(value)
    if single is None:
        raise UnknownShape("status with a malformed recipient_participant_id")
    return [single]


def _meta_statuses(st: dict[str, Any]) -> list[Status]:
    wamid = _req_str(st, "id", "status")
    status = _req_str(st, "status", "status")
    errors = st.get("errors")
    callback = st.get("biz_opaque_callback_data")
    return [
        Status(
            key=f"status:{wamid}:{status}:{participant}",
            wamid=wamid,
            status=status,
            participant=participant,
            recipient=_opt_str(st.get("recipient_id")),
            timestamp=_unix(st.get("timestamp")),
            callback_data=callback if isinstance(callback, str) and callback else None,
            errors=errors if isinstance(errors, list) else None,
            raw=st,
        )
        for participant in _participants(st)
    ]


def parse_tenashi(doc: Any, delivery_id: str | None = None) -> Event:
    doc = _dict(doc, "payload")
    event_id = _opt_str(doc.get("id")) or delivery_id
    if not event_id:
        raise UnknownShape("Tenashi event without an id")
    typ = doc.get("type")
    if not isinstance(typ, str) or not typ:
        raise UnknownShape("Tenashi event without a type")
    key = f"evt:{event_id}"
    data = doc.get("data")
    if typ == "message.status":
        data = _dict(data, "message.status data")
        errors = data.get("errors")
        callback = data.get("idempotency_key")
        return Status(
            key=key,
            wamid=_req_str(data, "message_id", "message.status"),
            status=_req_str(data, "status", "message.status"),
            participant="",
            recipient=_opt_str(data.get("recipient")),
            timestamp=_unix(doc.get("created")),
            callback_data=callback if isinstance(callback, str) and callback else None,
            errors=errors if isinstance(errors, list) else None,
            raw=doc,
        )
    if typ == "message.received":
        data = _dict(data, "message.received data")
        return InboundMessage(
            key=key,
            wamid=_req_str(data, "message_id", "message.received"),
            phone_number_id=_opt_str(data.get("phone_number_id")),
            sender=_opt_str(data.get("from")),
            type=_opt_str(data.get("type")),
            timestamp=_unix(data.get("timestamp")) or _unix(doc.get("created")),
            contact_name=_opt_str(data.get("contact_name")),
            message=data,
        )
    return AccountUpdate(key, None, f"tenashi:{typ}", doc)

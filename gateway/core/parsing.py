"""Staged webhook bodies -> the typed events of ``gateway.core.events``. Pure: no I/O.

Meta bodies are split into items (one per message, status or account-level change) so one
malformed fragment is parked on its own while the rest of the body is processed; Tenashi
bodies are one event each.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import orjson

from gateway.core.enums import Source
from gateway.core.events import (
    MAX_EVENTS_PER_PAYLOAD,
    AccountError,
    AccountUpdate,
    Event,
    InboundMessage,
    Item,
    NotJson,
    Status,
    UnknownShape,
)
from gateway.core.identity import Contacts, Who, contact_name, from_contact, ident, merge

# What a body may contain that PostgreSQL cannot store: U+0000 (text and jsonb refuse it)
# and lone UTF-16 surrogates (not UTF-8). Each becomes the six characters of its JSON
# escape (``\u0000``), so the stored text shows what was sent; the exact bytes are kept
# beside it (``event_fragments``). Numbers beyond a double (``1e400``) become null.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _escape_char(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def scrub(value: Any) -> tuple[Any, bool]:
    """``value`` with unstorable characters escaped; True if anything changed."""
    if isinstance(value, str):
        if _UNSTORABLE.search(value) is None:
            return value, False
        return _UNSTORABLE.sub(_escape_char, value), True
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            k2, c1 = scrub(k)
            v2, c2 = scrub(v)
            out[k2] = v2
            changed = changed or c1 or c2
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        pairs = [scrub(v) for v in value]
        if any(c for _, c in pairs):
            return [v for v, _ in pairs], True
        return value, False
    if isinstance(value, float) and not math.isfinite(value):
        return None, True
    return value, False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load(body: bytes) -> tuple[Any, bool]:
    """Parse JSON; returns (document, needs_scrub). Raises NotJson.

    orjson refuses lone surrogates and numbers beyond a double; the standard library
    accepts them, so such a body is still parsed and its fragments scrubbed rather than the
    whole POST parked for one odd character.
    """
    try:
        return orjson.loads(body), b"\\u0000" in body
    except orjson.JSONDecodeError as exc:
        first = exc
    try:
        return json.loads(body, parse_constant=_reject_constant), True
    except (ValueError, RecursionError):
        raise NotJson(f"body is not JSON: {first}") from None


def parse(source: str, body: bytes, delivery_id: str | None = None) -> list[Event]:
    """Every event in one staged body, in payload order (duplicates included).

    Strict: any malformed fragment raises. The consumer uses ``parse_items``."""
    events: list[Event] = []
    for item in parse_items(source, body, delivery_id):
        if item.error is not None:
            raise UnknownShape(item.error)
        events.extend(item.events)
    return events


def parse_items(source: str, body: bytes, delivery_id: str | None = None) -> list[Item]:
    """The body's fragments in payload order. Raises ``PayloadError`` only when the body as
    a whole is unusable (not JSON, not a payload we know); a malformed fragment inside a
    valid payload is an ``Item`` with ``error`` set."""
    doc, dirty = load(body)
    if source == Source.META:
        items = _meta_items(doc, dirty)
    elif source == Source.TENASHI:
        raw, changed = scrub(doc) if dirty else (doc, False)
        ev = parse_tenashi(raw, delivery_id)
        items = [Item(0, (), "event", {"delivery_id": delivery_id}, (ev,), None, changed)]
    else:
        raise UnknownShape(f"unknown source {source!r}")
    _bounded(sum([len(i.events) for i in items]), "events")
    return items


class TooMany(UnknownShape):
    """More updates in one body than any Meta POST holds: the body is no payload, whole."""


def _bounded(n: int, what: str) -> None:
    # Malformed fragments count too (each would be a dead item of its own); checked as the
    # body is walked, so a body of a million fragments is refused before they are all built.
    if n > MAX_EVENTS_PER_PAYLOAD:
        raise TooMany(f"{n} {what} in one payload (at most {MAX_EVENTS_PER_PAYLOAD})")


def parse_fragment(source: str, unit: str, fragment: bytes, context: dict[str, Any]) -> list[Event]:
    """Rebuild an item's events from its raw bytes and context (for retries and replays)."""
    doc, dirty = load(fragment)
    if dirty:
        doc, _ = scrub(doc)
    if source == Source.TENASHI:
        return [parse_tenashi(doc, context.get("delivery_id"))]
    if unit == "message":
        name = context.get("contact_name")  # items recorded before the contact was kept whole
        return [
            _meta_message(
                _dict(doc, "message"),
                _where_from(context),
                Contacts([context["contact"]] if isinstance(context.get("contact"), dict) else []),
                name if isinstance(name, str) else None,
            )
        ]
    if unit == "status":
        contact = context.get("contact")
        contacts = Contacts([contact] if contact else [])
        return list(_meta_statuses(_dict(doc, "status"), _where_from(context), contacts))
    if unit == "change":
        return [_change_event(context.get("waba_id"), _dict(doc, "change"))]
    raise UnknownShape(f"a {unit} fragment cannot be processed alone")


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
    """Meta sends Unix seconds as a string; anything else is kept in the raw JSON only.

    ASCII digits only: ``str.isdigit`` also accepts ``"²"`` and ``"①"``, which ``int`` refuses."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 2**37 else None
    # isdigit() on ASCII is exactly [0-9]: the check of a regex, at a fraction of its cost.
    if isinstance(value, str) and 0 < len(value) <= 11 and value.isascii() and value.isdigit():
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
    """Strict: every event of a Meta payload (raises on any malformed fragment)."""
    events: list[Event] = []
    for item in _meta_items(doc, False):
        if item.error is not None:
            raise UnknownShape(item.error)
        events.extend(item.events)
    return events


def _meta_items(doc: Any, dirty: bool) -> list[Item]:
    doc = _dict(doc, "payload")
    if doc.get("object") != "whatsapp_business_account":
        raise UnknownShape(f"object is {str(doc.get('object'))[:60]!r}, not whatsapp_business_account")
    if "entry" not in doc:
        raise UnknownShape("payload without entry")
    items: list[Item] = []

    def bad(path: tuple[str | int, ...], unit: str, exc: Exception) -> None:
        items.append(Item(len(items), path, unit, error=_error(exc)))

    for e, entry in enumerate(_list(doc["entry"], "entry")):
        try:
            entry = _dict(entry, "entry")
            changes = _list(entry.get("changes"), "changes")
        except UnknownShape as exc:
            bad(("entry", e), "entry", exc)
            continue
        waba_id = _opt_str(entry.get("id"))
        if dirty:
            waba_id = scrub(waba_id)[0]
        for c, change in enumerate(changes):
            path: tuple[str | int, ...] = ("entry", e, "changes", c)
            before = len(items)
            _bounded(len(items) + 1, "fragments")
            try:
                _meta_change(items, path, waba_id, _dict(change, "change"), dirty)
            except TooMany:
                raise
            except Exception as exc:  # whatever this change's values make us raise is its own
                del items[before:]
                bad(path, "change", exc)
    return items


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _change_event(waba_id: str | None, change: dict[str, Any]) -> Event:
    """The account-level event of a change: its errors, or the change itself as an update."""
    fld = change.get("field")
    if not isinstance(fld, str) or not fld:
        raise UnknownShape("change without a field")
    value = change.get("value")
    if fld == "messages":
        value = _dict(value, "messages change value")
        errors = _list(value.get("errors"), "errors")
        if errors:
            metadata = value.get("metadata")
            pnid = _opt_str(metadata.get("phone_number_id")) if isinstance(metadata, dict) else None
            return AccountError(f"acct-error:{_digest(waba_id, change)}", waba_id, pnid, fld, errors, value)
    return AccountUpdate(f"change:{fld}:{_digest(waba_id, change)}", waba_id, fld, value)


def _meta_change(
    items: list[Item], path: tuple[str | int, ...], waba_id: str | None, raw: dict[str, Any], dirty: bool
) -> None:
    change, changed = scrub(raw) if dirty else (raw, False)
    fld = change.get("field")
    if not isinstance(fld, str) or not fld:
        raise UnknownShape("change without a field")
    ctx = {"waba_id": waba_id}
    if fld != "messages":
        items.append(Item(len(items), path, "change", ctx, (_change_event(waba_id, change),), None, changed))
        return
    value = _dict(change.get("value"), "messages change value")
    raw_value = raw["value"]
    messages = _list(value.get("messages"), "messages")
    statuses = _list(value.get("statuses"), "statuses")
    errors = _list(value.get("errors"), "errors")
    _bounded(len(items) + len(messages) + len(statuses), "fragments")
    where = _where(value.get("metadata"), waba_id)
    contacts = Contacts(value.get("contacts"))
    before = len(items)
    for k, msg in enumerate(messages):
        sub = (*path, "value", "messages", k)
        try:
            m = _meta_message(_dict(msg, "message"), where, contacts)
        except Exception as exc:
            items.append(Item(len(items), sub, "message", error=_error(exc)))
            continue
        dirty_msg = changed and scrub(raw_value["messages"][k])[1]
        items.append(Item(len(items), sub, "message", {**where, "contact": m.contact}, (m,), None, dirty_msg))
    for k, st in enumerate(statuses):
        sub = (*path, "value", "statuses", k)
        try:
            sts = tuple(_meta_statuses(_dict(st, "status"), where, contacts))
        except TooMany:
            raise
        except Exception as exc:
            items.append(Item(len(items), sub, "status", error=_error(exc)))
            continue
        dirty_st = changed and scrub(raw_value["statuses"][k])[1]
        sctx = {**where, "contact": sts[0].contact if sts else None}
        items.append(Item(len(items), sub, "status", sctx, sts, None, dirty_st))
    if errors or len(items) == before:
        # value.errors (account level), or a messages change with nothing we act on (e.g.
        # echoes): recorded, not dropped.
        items.append(Item(len(items), path, "change", ctx, (_change_event(waba_id, change),), None, changed))


def _where(metadata: Any, waba_id: str | None) -> dict[str, str | None]:
    """The business number a change came to (its ``metadata``) and the account (``entry.id``)."""
    md = metadata if isinstance(metadata, dict) else {}
    return {
        "phone_number_id": _opt_str(md.get("phone_number_id")),
        "display_phone_number": _opt_str(md.get("display_phone_number")),
        "waba_id": waba_id,
    }


def _where_from(context: dict[str, Any]) -> dict[str, str | None]:
    return {k: _opt_str(context.get(k)) for k in ("phone_number_id", "display_phone_number", "waba_id")}


def _meta_message(
    msg: dict[str, Any], where: dict[str, str | None], contacts: Contacts, fallback_name: str | None = None
) -> InboundMessage:
    wamid = _req_str(msg, "id", "message")
    sender, user_id = ident(msg.get("from")), ident(msg.get("from_user_id"))
    contact = contacts.find(sender, user_id)
    who = merge(Who(sender, user_id, ident(msg.get("from_parent_user_id"))), from_contact(contact))
    return InboundMessage(
        key=f"msg:{wamid}",
        wamid=wamid,
        phone_number_id=where["phone_number_id"],
        sender=who.wa_id,
        type=_opt_str(msg.get("type")),
        timestamp=_unix(msg.get("timestamp")),
        contact_name=contact_name(contact) or fallback_name,
        message=msg,
        user_id=who.user_id,
        parent_user_id=who.parent_user_id,
        username=who.username,
        waba_id=where["waba_id"],
        display_phone_number=where["display_phone_number"],
        contact=contact,
    )


def _participants(st: dict[str, Any]) -> tuple[str | None, list[str]]:
    """Group statuses name a participant (by phone number, else by BSUID); a list of them
    yields one status each. Also the field that held a list (None: no list)."""
    name = "recipient_participant_id"
    value = st.get(name)
    if value is None:
        name = "recipient_participant_user_id"
        value = st.get(name)
    if value is None:
        return None, [""]
    if isinstance(value, list):
        _bounded(len(value), "participants")
        out = [p for p in (_opt_str(v) for v in value) if p]
        if not out:
            raise UnknownShape("status with an empty participant list")
        return name, out
    single = _opt_str(value)
    if single is None:
        raise UnknownShape("status with a malformed recipient_participant_id")
    return None, [single]


def _meta_statuses(st: dict[str, Any], where: dict[str, str | None], contacts: Contacts) -> list[Status]:
    wamid = _req_str(st, "id", "status")
    status = _req_str(st, "status", "status")
    errors = st.get("errors")
    callback = st.get("biz_opaque_callback_data")
    recipient, user_id = ident(st.get("recipient_id")), ident(st.get("recipient_user_id"))
    # A group status names the group; its contacts are not the recipient's.
    contact = None if st.get("recipient_type") == "group" else contacts.find(recipient, user_id)
    who = merge(Who(recipient, user_id, ident(st.get("recipient_parent_user_id"))), from_contact(contact))
    listed, participants = _participants(st)
    return [
        Status(
            key=f"status:{wamid}:{status}:{participant}",
            wamid=wamid,
            status=status,
            participant=participant,
            recipient=who.wa_id,
            timestamp=_unix(st.get("timestamp")),
            callback_data=callback if isinstance(callback, str) and callback else None,
            errors=errors if isinstance(errors, list) else None,
            # Each participant's status names only its participant, as Meta-format bodies do:
            # with the whole list in each, n participants would weigh n times n.
            raw={**st, listed: [participant]} if listed is not None and len(participants) > 1 else st,
            recipient_user_id=who.user_id,
            recipient_parent_user_id=who.parent_user_id,
            recipient_username=who.username,
            phone_number_id=where["phone_number_id"],
            waba_id=where["waba_id"],
            display_phone_number=where["display_phone_number"],
            contact=contact,
        )
        for participant in participants
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

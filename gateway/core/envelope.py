"""The envelope: the JSON body a destination receives for one event (documented in
docs/forwarding.md), and the row that fans an event out to the destinations that want it.

The envelope is the same bytes for every attempt and every destination of one event; only the
``webhook-*`` headers differ.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.core.destinations import conversation_of, kind_of, number_of
from gateway.core.events import AccountError, AccountUpdate, Event, InboundMessage, Status
from gateway.core.meta_body import meta_webhook

ENVELOPE_VERSION = 1


def _iso(ts: int | None) -> str | None:
    # time.gmtime, not datetime: half the cost, run once per event a consumer plans. The same
    # text for every timestamp the parser keeps (0 to 2**37 - 1, i.e. up to year 6325).
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def envelope(ev: Event, source: str) -> dict[str, Any]:
    """The JSON body forwarded for one event: normalised fields in ``data``, the provider's
    own fragment untouched in ``raw``."""
    data: dict[str, Any]
    raw: Any
    ts: int | None = None
    if isinstance(ev, InboundMessage):
        typ = "message.received"
        ts = ev.timestamp
        data = {
            "wamid": ev.wamid,
            "phone_number_id": ev.phone_number_id,
            "display_phone_number": ev.display_phone_number,
            "waba_id": ev.waba_id,
            "from": ev.sender,
            "from_user_id": ev.user_id,
            "from_parent_user_id": ev.parent_user_id,
            "username": ev.username,
            "type": ev.type,
            "contact_name": ev.contact_name,
            "contact": ev.contact,
        }
        raw = ev.message
    elif isinstance(ev, Status):
        typ = "message.status"
        ts = ev.timestamp
        data = {
            "wamid": ev.wamid,
            "status": ev.status,
            "phone_number_id": ev.phone_number_id,
            "display_phone_number": ev.display_phone_number,
            "waba_id": ev.waba_id,
            "recipient_id": ev.recipient,
            "recipient_user_id": ev.recipient_user_id,
            "recipient_parent_user_id": ev.recipient_parent_user_id,
            "recipient_username": ev.recipient_username,
            "participant": ev.participant or None,
            "callback_data": ev.callback_data,
            "biz_opaque_callback_data": ev.biz_opaque_callback_data,
            "errors": ev.errors,
            "contact": ev.contact,
        }
        raw = ev.raw
    elif isinstance(ev, AccountError):
        typ = "account.error"
        data = {
            "waba_id": ev.waba_id,
            "phone_number_id": ev.phone_number_id,
            "field": ev.field,
            "errors": ev.errors,
        }
        raw = ev.raw
    else:
        assert isinstance(ev, AccountUpdate)
        typ = "account.update"
        data = {"waba_id": ev.waba_id, "field": ev.field}
        raw = ev.value
    return {
        "v": ENVELOPE_VERSION,
        "type": typ,
        "event_key": ev.key,
        "source": source,
        "timestamp": _iso(ts),
        "data": data,
        "raw": raw,
    }


def forward_row(ev: Event, source: str, inbox_id: int, *, bodies: bool = False) -> dict[str, Any]:
    """What the consumer's batch statement needs to fan one event out to destinations. With
    ``bodies`` (the consumer expects destinations), its bodies rendered here (``body`` the
    envelope, ``meta_body`` the Meta webhook or None), which the database stores as they come;
    else its envelope, which the statement renders only if some destination wants the event.
    A status that names a callback may be of a send of ours, whose caller's
    ``biz_opaque_callback_data`` goes into its bodies: only the statement can look that up, so
    it always carries its envelope (the SQL function meta_webhook renders what
    gateway.core.meta_body does)."""
    env = envelope(ev, source)
    callback = ev.callback_data if isinstance(ev, Status) else None
    row: dict[str, Any] = {
        "key": ev.key,
        "kind": kind_of(ev),
        "conversation": conversation_of(ev),
        "source": source,
        "inbox_id": inbox_id,
        "callback": callback,
        "number": number_of(ev),
    }
    if bodies and callback is None:
        meta = meta_webhook(env)
        row["body"] = orjson.dumps(env).decode()
        row["meta_body"] = None if meta is None else orjson.dumps(meta).decode()
    else:
        row["envelope"] = env
    return row

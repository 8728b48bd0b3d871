"""Hostile webhook bodies for property-based tests (hypothesis strategies): the shapes Meta and
Tenashi send, with any field replaced by an arbitrary JSON value, odd digits, deep nesting.

A product test tool (like the fake provider): the unit and integration tests share it, and
nothing in the product imports it.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Strings that look like what a field wants and are not: non-ASCII digits (``str.isdigit``
# accepts them, ``int`` refuses some), signs, whitespace, escapes PostgreSQL cannot store.
NASTY_STRINGS = (
    "²",
    "①",
    "١٢٣",
    "\U0001d7d9\U0001d7da\U0001d7db",  # mathematical double-struck digits
    "-1",
    "+1700000000",
    " 1700000000",
    "1e9",
    "99999999999",
    "999999999999999999999",
    "",
    "\x00",
    "\ud800",
    "wamid.\u202e",
    "a" * 300,
)


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels (orjson serialises at most 254)."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(NASTY_STRINGS),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
) | st.integers(min_value=250, max_value=400).map(nested)


@st.composite
def maybe(draw: st.DrawFn, default: Any) -> Any:
    """The field as a sender would fill it, or anything at all."""
    return draw(st.one_of(st.just(default), json_values, st.sampled_from(NASTY_STRINGS)))


@st.composite
def meta_body(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 10**9))
    message = {
        "from": draw(maybe("4915112345678")),
        "id": draw(maybe(f"wamid.H{n}")),
        "timestamp": draw(maybe("1764460800")),
        "type": draw(maybe("text")),
        "text": draw(maybe({"body": "hi"})),
        "context": draw(maybe({"from": "4915", "id": "wamid.C"})),
    }
    status = {
        "id": draw(maybe(f"wamid.S{n}")),
        "status": draw(maybe("delivered")),
        "timestamp": draw(maybe("1764460800")),
        "recipient_id": draw(maybe("4915112345678")),
        "recipient_participant_id": draw(st.one_of(st.just(None), json_values)),
        "biz_opaque_callback_data": draw(maybe("acme:order-1")),
        "errors": draw(maybe([{"code": 131026}])),
        "conversation": draw(maybe({"id": "c", "origin": {"type": "service"}})),
    }
    value = {
        "messaging_product": draw(maybe("whatsapp")),
        "metadata": draw(maybe({"display_phone_number": "15550001111", "phone_number_id": "1111"})),
        "contacts": draw(maybe([{"profile": {"name": "Ana"}, "wa_id": "4915112345678"}])),
        "messages": draw(maybe([message])),
        "statuses": draw(maybe([status])),
        "errors": draw(st.one_of(st.just([]), json_values)),
    }
    change = {"field": draw(maybe("messages")), "value": draw(maybe(value))}
    entry = {"id": draw(maybe("waba-1")), "changes": draw(maybe([change]))}
    return {"object": draw(maybe("whatsapp_business_account")), "entry": draw(maybe([entry]))}


@st.composite
def tenashi_body(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 10**9))
    data = {
        "message_id": draw(maybe(f"msg_{n}")),
        "status": draw(maybe("delivered")),
        "idempotency_key": draw(maybe("acme:order-1")),
        "recipient": draw(maybe("+4915112345678")),
        "from": draw(maybe("+4915112345678")),
        "timestamp": draw(maybe(1764460800)),
        "errors": draw(maybe([])),
    }
    return {
        "id": draw(maybe(f"evt_{n:024x}")),
        "type": draw(maybe(draw(st.sampled_from(["message.status", "message.received", "other"])))),
        "created": draw(maybe(1764460800)),
        "data": draw(maybe(data)),
    }


@st.composite
def staged(draw: st.DrawFn) -> tuple[str, bytes]:
    """(source, raw body) as the ingest edge stages it; the bytes as a sender might write
    them (non-ASCII escaped or not)."""
    source = draw(st.sampled_from(["meta", "tenashi"]))
    doc = draw(meta_body() if source == "meta" else tenashi_body())
    raw = json.dumps(doc, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    return source, raw

"""The send API's body validation, driven by the OpenAPI document's own request schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.core.enums import UnknownPolicy
from gateway.core.messages import DEFAULT_BOT, Invalid, Message
from gateway.outbound.validation import RequestValidator

DOC = orjson.loads((Path(__file__).parents[2] / "gateway" / "outbound" / "openapi.json").read_bytes())
V = RequestValidator(DOC)


def text(**extra: Any) -> dict[str, Any]:
    return {"to": "4915112345678", "phone_number_id": "1111", "type": "text", "text": {"body": "hi"}, **extra}


def template(**extra: Any) -> dict[str, Any]:
    t = {"name": "order_update", "language": {"code": "en_US"}, "components": [{"type": "body"}]}
    return {"to": "4915112345678", "phone_number_id": "1111", "type": "template", "template": t, **extra}


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (text(), []),
        (template(), []),
        (text(to="+4915112345678", in_reply_to="wamid.HBgL=", bot="order-bot.v2"), []),
        ([], ["body: must be a JSON object"]),
        ("x", ["body: must be a JSON object"]),
        ({}, ["type: one of text, template"]),
        (text(type="image"), ["type: one of text, template"]),
        (text(type={}), ["type: one of text, template"]),  # unhashable: once a 500
        (text(type=["text"]), ["type: one of text, template"]),
        (text(to="4915112345678\n"), ["to: must match ^\\+?[0-9]{5,20}$"]),
        (text(to="491"), ["to: must match ^\\+?[0-9]{5,20}$"]),
        (text(to=4915112345678), ["to: must be a string"]),
        (text(phone_number_id="1\n"), ["phone_number_id: must match ^[0-9A-Za-z_-]{1,64}$"]),
        (text(text={"body": "a\x00"}), ["text.body: must match ^[^\\u0000]*$"]),
        (text(text={"body": "x" * 4097}), ["text.body: at most 4096 characters"]),
        (text(text={"body": "hi", "x": 1}), ["text: unknown fields: x"]),
        (text(template={}), ["body: unknown fields: template"]),
        (text(unknown_policy="never"), ["unknown_policy: one of resend, review"]),
        (text(in_reply_to="wamid A"), ["in_reply_to: must match ^[\\x21-\\x7e]+$"]),
        (text(in_reply_to="w" * 257), ["in_reply_to: at most 256 characters"]),
        (text(bot=""), ["bot: must match ^[0-9A-Za-z_.-]{1,64}$"]),
        (
            {"type": "text"},
            sorted(f"body: '{f}' is a required property" for f in ("phone_number_id", "text", "to")),
        ),
        (
            template(template={"name": "Bad Name", "language": {"code": "en_US"}}),
            ["template.name: must match ^[0-9a-z_]+$"],
        ),
        (
            template(template={"name": "x", "language": {"code": "en"}, "components": [{"a": "b\x00"}]}),
            ["template.components.0.a: U+0000 is not allowed"],
        ),
        (
            template(template={"name": "x", "language": {"code": "en"}, "components": [{"\x00": 1}]}),
            ["template.components.0: U+0000 is not allowed in field names"],
        ),
    ],
)
def test_errors(body: Any, errors: list[str]) -> None:
    assert V.errors(body) == errors


def test_errors_never_echo_a_huge_value() -> None:
    (line,) = V.errors(text(to="9" * 10_000))
    assert len(line) < 200


def test_validate_returns_the_message() -> None:
    assert V.validate(text(to="+4915112345678", in_reply_to="wamid.X")) == Message(
        to="4915112345678",
        phone_number_id="1111",
        message={"type": "text", "text": {"body": "hi"}},
        unknown_policy=UnknownPolicy.REVIEW,
        in_reply_to="wamid.X",
        bot=DEFAULT_BOT,
    )
    m = V.validate(template(unknown_policy="resend", bot="b"))
    assert m.message["type"] == "template" and m.unknown_policy is UnknownPolicy.RESEND
    assert m.in_reply_to is None and m.bot == "b"
    with pytest.raises(Invalid) as exc:
        V.validate(text(to="x", extra=1))
    assert exc.value.errors == ["body: unknown fields: extra", "to: must match ^\\+?[0-9]{5,20}$"]


def test_the_document_is_a_oneof_on_type() -> None:
    schema = DOC["components"]["schemas"]["SendRequest"]
    assert [s["$ref"].rsplit("/", 1)[1] for s in schema["oneOf"]] == ["SendText", "SendTemplate"]
    assert schema["discriminator"]["propertyName"] == "type"


def test_a_recursive_schema_is_refused_at_start_up() -> None:
    doc = {
        "components": {
            "schemas": {
                "SendRequest": {
                    "discriminator": {"propertyName": "type", "mapping": {"text": "#/components/schemas/A"}}
                },
                "A": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A"}}},
            }
        }
    }
    with pytest.raises(ValueError, match="cycle"):
        RequestValidator(doc)

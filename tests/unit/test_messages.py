"""The send API's body validation, driven by the OpenAPI document's own request schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.core.enums import UnknownPolicy
from gateway.core.messages import DEFAULT_BOT, MESSAGE_TYPES, Invalid, Message
from gateway.outbound.validation import RequestValidator
from gateway.testing.messages import EXAMPLES

DOC = orjson.loads((Path(__file__).parents[2] / "gateway" / "outbound" / "openapi.json").read_bytes())
V = RequestValidator(DOC)


BAD_PARAM = {"type": "body", "parameters": [{"type": "text", "text": "b\x00"}]}
ALL = "text, image, audio, video, document, sticker, location, contacts, interactive, reaction, template"


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
        ({}, [f"type: one of {ALL}"]),
        (text(type="poll"), [f"type: one of {ALL}"]),
        (text(type={}), [f"type: one of {ALL}"]),  # unhashable: once a 500
        (text(type=["text"]), [f"type: one of {ALL}"]),
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
            sorted(
                [
                    *(f"body: '{f}' is a required property" for f in ("phone_number_id", "text")),
                    "to: give to (a phone number) or recipient (a BSUID)",
                ]
            ),
        ),
        (
            template(template={"name": "Bad Name", "language": {"code": "en_US"}}),
            ["template.name: must match ^[0-9a-z_]+$"],
        ),
        (
            template(template={"name": "x", "language": {"code": "en"}, "components": [BAD_PARAM]}),
            ["template.components.0.parameters.0.text: must match ^[^\\u0000]*$"],
        ),
        (
            template(template={"name": "x", "language": {"code": "en"}, "components": [{"\x00": 1}]}),
            [
                "template.components.0: 'type' is a required property",
                "template.components.0: unknown fields: \\x00",
            ],
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
    assert [s["$ref"].rsplit("/", 1)[1] for s in schema["oneOf"]] == [
        f"Send{t.capitalize()}" for t in MESSAGE_TYPES
    ]
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


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_message_is_valid_and_kept_as_given(name: str) -> None:
    example = EXAMPLES[name]
    for addressed in ({"to": "4915112345678"}, {"recipient": "US.13491208655302741918"}):
        m = V.validate({**addressed, "phone_number_id": "1111", **example})
        assert m.message == example  # nothing dropped or reshaped


def test_with_both_to_and_recipient_to_wins() -> None:
    m = V.validate(text(to="+4915112345678", recipient="US.1"))
    assert m.to == "4915112345678"
    only = {k: v for k, v in text(recipient="US.ENT.9").items() if k != "to"}
    assert V.validate(only).to == "US.ENT.9"


def _typed(kind: str, obj: Any) -> dict[str, Any]:
    return {"to": "4915112345678", "phone_number_id": "1111", "type": kind, kind: obj}


IMAGE = EXAMPLES["image_by_id"]["image"]
BUTTON = EXAMPLES["interactive_button"]["interactive"]
LIST = EXAMPLES["interactive_list"]["interactive"]
INTERACTIVE = ("button", "list", "cta_url", "flow", "product", "product_list", "location_request_message")
ONE_OF_ID_LINK = "give id (a media id from POST /v1/media) or link (an http(s) URL), not both"


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (text(to=None), ["to: must be a string"]),
        (text(recipient="US.1\n"), ["recipient: must match ^[A-Z]{2}\\.(ENT\\.)?[0-9A-Za-z]{1,128}$"]),
        (text(biz_opaque_callback_data="x" * 513), ["biz_opaque_callback_data: at most 512 characters"]),
        (_typed("image", {**IMAGE, "link": "https://x.example/a.png"}), [f"image: {ONE_OF_ID_LINK}"]),
        (_typed("image", {"caption": "no file"}), [f"image: {ONE_OF_ID_LINK}"]),
        (_typed("image", {"link": "file:///etc/passwd"}), ["image.link: must match ^https?://[^\\s]+$"]),
        (_typed("audio", {"id": "1", "caption": "x"}), ["audio: unknown fields: caption"]),
        (
            _typed("document", {"link": "https://e.x/a", "filename": "f" * 241}),
            ["document.filename: at most 240 characters"],
        ),
        (_typed("location", {"latitude": 91, "longitude": 0}), ["location.latitude: at most 90"]),
        (_typed("location", {"latitude": "52.5", "longitude": 13}), ["location.latitude: must be a number"]),
        (_typed("contacts", []), ["contacts: at least 1 item"]),
        (_typed("contacts", [{"phones": []}]), ["contacts.0: 'name' is a required property"]),
        (_typed("reaction", {"message_id": "wamid.X"}), ["reaction: 'emoji' is a required property"]),
        (
            _typed("interactive", {"type": "carousel"}),
            ["interactive.type: one of " + ", ".join(INTERACTIVE)],
        ),
        (
            _typed("interactive", {**BUTTON, "action": {"buttons": []}}),
            ["interactive.action.buttons: at least 1 item"],
        ),
        (
            _typed("interactive", {**BUTTON, "action": {"buttons": BUTTON["action"]["buttons"] * 2}}),
            ["interactive.action.buttons: at most 3 items"],
        ),
        (
            _typed("interactive", {**BUTTON, "body": {"text": "x" * 1025}}),
            ["interactive.body.text: at most 1024 characters"],
        ),
        (
            _typed("interactive", {k: v for k, v in BUTTON.items() if k != "body"}),
            ["interactive: 'body' is a required property"],
        ),
        (
            _typed("interactive", {**LIST, "action": {**LIST["action"], "button": "b" * 21}}),
            ["interactive.action.button: at most 20 characters"],
        ),
        (
            _typed(
                "interactive",
                {
                    "type": "flow",
                    "body": {"text": "x"},
                    "action": {"name": "flow", "parameters": {"flow_message_version": "3", "flow_cta": "Go"}},
                },
            ),
            ["interactive.action.parameters: give flow_id or flow_name"],
        ),
        (
            _typed(
                "interactive",
                {
                    "type": "product",
                    "header": {"type": "text", "text": "h"},
                    "action": {"catalog_id": "1", "product_retailer_id": "2"},
                },
            ),
            ["interactive: unknown fields: header"],
        ),
        (
            _typed(
                "template",
                {
                    "name": "t",
                    "language": {"code": "en"},
                    "components": [{"type": "body", "parameters": [{"type": "text"}]}],
                },
            ),
            ["template.components.0.parameters.0: 'text' is a required property"],
        ),
        (
            _typed(
                "template",
                {
                    "name": "t",
                    "language": {"code": "en"},
                    "components": [{"type": "body", "parameters": [{"type": "emoji"}]}],
                },
            ),
            [
                "template.components.0.parameters.0.type: one of text, currency, date_time, image, video, "
                "document, location, payload, action, coupon_code, limited_time_offer, product"
            ],
        ),
        (
            _typed(
                "template",
                {"name": "t", "language": {"code": "en"}, "components": [{"type": "button", "index": "a"}]},
            ),
            ["template.components.0.index: does not match any of its allowed forms"],
        ),
    ],
)
def test_message_errors(body: Any, errors: list[str]) -> None:
    assert V.errors(body) == errors


def test_the_examples_in_the_docs_are_valid() -> None:
    """docs/send.md shows one message per family: each passes the schema as written."""
    text = (Path(__file__).parents[2] / "docs" / "send.md").read_text()
    block = text.split("One example per family", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    examples = [orjson.loads(line) for line in block.strip().splitlines()]
    assert {e["type"] for e in examples} >= {
        "text",
        "image",
        "location",
        "contacts",
        "interactive",
        "reaction",
        "template",
    }
    for e in examples:
        assert V.errors({"phone_number_id": "1111", **e}) == [], e

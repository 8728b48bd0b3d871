"""The Graph-compatible endpoint's pure parts: versions, bodies, Meta's answers and errors."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core import graphcompat as g
from gateway.outbound.outcomes import OutboxOutcome, parse


@pytest.mark.parametrize(
    ("version", "ok"),
    [("v23.0", True), ("v99.0", True), ("v7.1", True), ("v1", False), ("v23", False), ("v23.0.1", False),
     ("V23.0", False), ("v23.0 ", False), ("", False), ("v..0", False), ("v23.0\n", False)],
)  # fmt: skip
def test_versions(version: str, ok: bool) -> None:
    assert g.version_ok(version) is ok


@pytest.mark.parametrize(
    ("number", "ok"),
    [("1111", True), ("106540352242922", True), ("../1111", False), ("1111/..", False), ("", False),
     ("x" * 65, False), ("11 11", False), ("1111%2F", False)],
)  # fmt: skip
def test_numbers(number: str, ok: bool) -> None:
    assert g.number_ok(number) is ok


@pytest.mark.parametrize(
    ("body", "read"),
    [({"messaging_product": "whatsapp", "status": "read", "message_id": "w"}, True),
     ({"messaging_product": "whatsapp", "type": "text", "text": {"body": "x"}}, False),
     ({"status": "read", "type": "text"}, False), ([], False), ("read", False)],
)  # fmt: skip
def test_read_receipts_are_told_apart(body: Any, read: bool) -> None:
    assert g.is_read_receipt(body) is read


def test_a_body_becomes_the_message_it_asks_for() -> None:
    body = g.with_default_type({"messaging_product": "whatsapp", "to": "+4915112345678", "recipient": "US.1",
                                "text": {"body": "hi"}, "context": {"message_id": "wamid.IN"},
                                "biz_opaque_callback_data": "t-1"})  # fmt: skip
    m = g.message_of(body, "1111")
    assert (m.to, m.phone_number_id, m.in_reply_to, m.biz_opaque_callback_data) == (
        "4915112345678", "1111", "wamid.IN", "t-1")  # fmt: skip
    assert m.message == {"type": "text", "text": {"body": "hi"}}  # "to" wins; type defaults to text
    assert g.with_default_type({"image": {}}) == {"image": {}}  # no default but text


@pytest.mark.parametrize(
    ("body", "contact"),
    [({"to": "+4915112345678"}, {"input": "+4915112345678", "wa_id": "4915112345678"}),
     ({"recipient": "US.13491208655302741918"}, {"input": "US.13491208655302741918",
                                                  "user_id": "US.13491208655302741918"})],
)  # fmt: skip
def test_answers_in_metas_shape(body: dict[str, Any], contact: dict[str, str]) -> None:
    assert g.sent(body, "wamid.X") == {"messaging_product": "whatsapp", "contacts": [contact],
                                       "messages": [{"id": "wamid.X"}]}  # fmt: skip
    q = g.queued(body, "k1", "pending", "/v1/messages/k1")
    assert q["messages"][0]["id"] == "k1" and q["contacts"] == [contact]
    assert q["gateway"]["state"] == "pending"


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [("invalid", 400, 100), ("no_inbound", 400, 100), ("reused", 422, 100), ("in_progress", 409, 100),
     ("answered", 409, 100), ("unavailable", 503, 2), ("anything", 400, 100)],
)  # fmt: skip
def test_refusals_carry_metas_codes(kind: str, status: int, code: int) -> None:
    got_status, body = g.refusal(kind, "why", "trace-1")
    err = body["error"]
    assert (got_status, err["code"], err["fbtrace_id"]) == (status, code, "trace-1")
    assert err["message"].startswith(f"(#{code}) ") and err["error_data"]["details"] == "why"


@pytest.mark.parametrize(
    ("status", "problem", "want"),
    [(401, {"title": "missing or invalid API key"}, (401, 190)),
     (404, {"title": "no media with this id"}, (404, 100)),
     (413, {"title": "media too large"}, (413, 100)),
     (502, {"title": "the Graph API refused", "code": 131053}, (502, 131053)),
     (504, {"title": "the Graph API was not reached"}, (504, 2)),
     (503, {"title": "database unavailable"}, (503, 2))],
)  # fmt: skip
def test_problems_become_metas_errors(status: int, problem: dict[str, Any], want: tuple[int, int]) -> None:
    got_status, body = g.from_problem(status, problem)
    assert (got_status, body["error"]["code"]) == want


def test_a_providers_refusal_is_relayed_as_it_came() -> None:
    err = {"message": "(#10) no permission", "type": "OAuthException", "code": 10}
    stored = {"status": 403, "error": err}
    status, body = g.provider_refusal(stored, 10, "no permission", "t")
    assert status == 403 and body["error"] == {**stored["error"], "fbtrace_id": "t"}
    status, body = g.provider_refusal(None, None, None)
    assert status == 400 and body["error"]["code"] == 131000
    status, body = g.provider_refusal({"status": 200, "error": {"code": 1}}, 1, "x")
    assert status == 400  # a status that is no error is not relayed


@pytest.mark.parametrize(
    ("payload", "parsed"),
    [("12 accepted wamid.X", (12, OutboxOutcome("accepted", "wamid.X"))),
     ("7 failed ", (7, OutboxOutcome("failed", None))), ("7 sending ", (7, OutboxOutcome("sending", None))),
     ("x accepted w", None), ("12", None), ("", None)],
)  # fmt: skip
def test_outcome_notifications(payload: str, parsed: tuple[int, OutboxOutcome] | None) -> None:
    assert parse(payload) == parsed
    if parsed is not None:
        assert parsed[1].final is (parsed[1].state in ("accepted", "failed"))

"""The exact bytes of a value inside a JSON body."""

from __future__ import annotations

import orjson
import pytest

from gateway.core.jsonspan import Spans, fragment, pointer

BODY = (
    b'{ "entry" : [ {"id":"w", "changes": [ {"field":"messages", "value": {"messages": ['
    b'{"id":"a","text":{"body":"[not]{a} \\"bracket\\""}} ,'
    b'  { "from" : "49",\n "type":"text" } , 12.5e3, "s\\u00e9", null, [1,[2]] ]}} ]} ] , "x": 1, "x": 2}'
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            ("entry", 0, "changes", 0, "value", "messages", 0),
            b'{"id":"a","text":{"body":"[not]{a} \\"bracket\\""}}',
        ),
        (("entry", 0, "changes", 0, "value", "messages", 1), b'{ "from" : "49",\n "type":"text" }'),
        (("entry", 0, "changes", 0, "value", "messages", 2), b"12.5e3"),
        (("entry", 0, "changes", 0, "value", "messages", 3), b'"s\\u00e9"'),
        (("entry", 0, "changes", 0, "value", "messages", 4), b"null"),
        (("entry", 0, "changes", 0, "value", "messages", 5), b"[1,[2]]"),
        (("entry", 0, "changes", 0, "value", "messages", 6), None),
        (("entry", 0, "id"), b'"w"'),
        (("x",), b"2"),  # the last duplicate wins, as parsers do
        (("missing",), None),
        (("entry", "0"), None),
        ((), BODY),
    ],
)
def test_fragment(path: tuple[str | int, ...], expected: bytes | None) -> None:
    got = fragment(BODY, path)
    assert got == expected
    if got is not None:
        orjson.loads(got)  # a fragment is JSON on its own


@pytest.mark.parametrize("body", [b"", b"{", b'{"a": [1, 2', b'{"a" 1}'])
def test_malformed_answers_none(body: bytes) -> None:
    assert fragment(body, ("a", 1)) is None


def test_pointer() -> None:
    assert pointer(("entry", 0, "a/b", "c~d")) == "/entry/0/a~1b/c~0d"


def test_one_body_scanned_once_for_all_its_events() -> None:
    # The fragments of every event of a body (a dead item each, or an escaped event each) come
    # from one pass over each container on their path, not one pass over the body per event.
    messages = [{"id": f"m{i}", "text": {"body": "[x] " * (i % 7)}} for i in range(300)]
    body = orjson.dumps({"entry": [{"id": "w", "changes": [{"value": {"messages": messages}}]}], "z": 1})
    spans = Spans(body)
    for i, m in enumerate(messages):
        path = ("entry", 0, "changes", 0, "value", "messages", i)
        got = spans.fragment(path)
        assert got is not None and orjson.loads(got) == m
        assert got == fragment(body, path)
    # root, entry, entry 0, changes, change 0, value, messages
    assert spans.scanned == 7
    assert spans.fragment(("entry", 0, "changes", 0, "value", "messages", 300)) is None
    assert spans.fragment(("entry", 0, "id", "deeper")) is None  # a scalar has no members


def test_a_value_asked_for_again_is_not_scanned_again() -> None:
    # A group status listing n participants is n events of one fragment, a dead item each: its
    # end is found once, not once per participant.
    status = {"id": "wamid.G", "status": "read", "recipient_participant_id": [f"p{i}" for i in range(500)]}
    body = orjson.dumps({"entry": [{"changes": [{"value": {"statuses": [status]}}]}]})
    path = ("entry", 0, "changes", 0, "value", "statuses", 0)
    spans = Spans(body)
    got = [spans.fragment(path) for _ in range(500)]
    assert got == [fragment(body, path)] * 500 and orjson.loads(got[0] or b"") == status
    assert spans.measured == 1

"""The compiled check in front of the send APIs' validation changes no answer: a body it
passes is one the OpenAPI validator passes too, and every other body gets the OpenAPI
validator's errors. Bodies: every example message, in the send API's and in Meta's shape,
each mutated at a random place with hostile values (wrong types, nulls, floats for integers,
a trailing newline or non-ASCII digits against a pattern, U+0000, U+FEFF, huge strings,
unknown fields, missing ones)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.outbound import validation
from gateway.outbound.validation import BodyValidator, RequestValidator
from gateway.testing.messages import EXAMPLES

DOC = orjson.loads((Path(__file__).parents[2] / "gateway" / "outbound" / "openapi.json").read_bytes())
SEND = RequestValidator(DOC)
GRAPH = RequestValidator(DOC, "GraphSendRequest")
GRAPH_READ = BodyValidator(DOC, "GraphReadRequest")


def send_body(example: dict[str, Any]) -> dict[str, Any]:
    return {"to": "4915112345678", "phone_number_id": "1111", **copy.deepcopy(example)}


def graph_body(example: dict[str, Any]) -> dict[str, Any]:
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": "4915112345678",
            **copy.deepcopy(example)}  # fmt: skip


SEEDS = [(SEND, send_body(e)) for e in EXAMPLES.values()]
SEEDS += [(GRAPH, graph_body(e)) for e in EXAMPLES.values()]
READ = {"messaging_product": "whatsapp", "status": "read", "message_id": "wamid.HBgLMTIzNDU2Nzg5MDEy"}

HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1.5, 5.0, 2**63, 10**30, "", " ", "x" * 5000, "a\nb",
    "4915112345678\n", "+4915112345678\n", "\u0661\u0662\u0663\u0664\u0665", "\uff11\uff12\uff13\uff14\uff15",
    "a\ufeffb", "a\u00a0b", "https://example.com/a\ufeff", "https://example.com/\n",
    "https://example.com/a b",
    "\x00", "hi\x00", "en_US\n", "EN_us", "USD\n", "2026-12-05\n", "text", "image", "button",
    "wamid.x", [], [1, 1], [None], {}, {"x": 1}, {"\x00": 1}, {"type": "text"},
]  # fmt: skip


def _places(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _places(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _places(v, (*path, i))
    return out


def _mutate(body: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    body = copy.deepcopy(body)
    for _ in range(data.draw(st.integers(1, 3))):
        places = [p for p in _places(body) if p]
        path = data.draw(st.sampled_from(places))
        parent: Any = body
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        op = data.draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap"]))
        if op == "replace":
            parent[last] = copy.deepcopy(data.draw(st.sampled_from(HOSTILE)))
        elif op == "delete" and isinstance(parent, dict):
            del parent[last]
        elif op == "add" and isinstance(parent[last], dict):
            parent[last][data.draw(st.sampled_from(["extra", "type", "\x00", "body", "id", "link"]))] = (
                copy.deepcopy(data.draw(st.sampled_from(HOSTILE)))
            )
        elif op == "wrap":
            parent[last] = [parent[last]]
    return body


@pytest.mark.parametrize(("validator", "body"), SEEDS)
def test_every_example_passes_both_ways(validator: RequestValidator, body: dict[str, Any]) -> None:
    assert validator.errors(body) == [] == validator.explain(body)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_fast_check_changes_no_answer(data: st.DataObject) -> None:
    validator, seed = data.draw(st.sampled_from(SEEDS))
    body = _mutate(seed, data)
    assert validator.errors(body) == validator.explain(body)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_fast_check_changes_no_answer_for_a_plain_schema(data: st.DataObject) -> None:
    body = _mutate(READ, data)
    assert GRAPH_READ.errors(body) == GRAPH_READ.explain(body)


@pytest.mark.parametrize(
    "to",
    [
        "4915112345678\n",  # ECMA's $ is the end of the string; Python's re would let this by
        "\u0661\u0662\u0663\u0664\u0665\u0666",  # digits, but not [0-9]
        "\uff14\uff19\uff11\uff15\uff11",
    ],
)
def test_a_pattern_is_read_as_ecma_262_reads_it(to: str) -> None:
    body = graph_body(EXAMPLES["text"])
    body["to"] = to
    assert GRAPH.errors(body) == GRAPH.explain(body) != []


def test_a_value_the_compiled_check_cannot_take_counts_as_rejected() -> None:
    """Not from the network (orjson refuses a lone surrogate), but a crash would be a 500."""
    fast = validation._fast({"type": "object", "properties": {"x": {"type": "string", "pattern": "^ok$"}}})
    assert validation._accepts(fast, {"x": "ok"})
    assert not validation._accepts(fast, {"x": "\ud800"})  # no Rust string holds it
    assert not validation._accepts(fast, {"x": {1, 2}})  # not JSON


@pytest.mark.parametrize(("bad", "listed"), [(3, 3), (20, 20), (21, 22), (1300, None)])
def test_a_body_of_many_errors_lists_the_first_few(bad: int, listed: int | None) -> None:
    # Every component of this template is wrong on its own (and more than 20 are one error
    # more); past MAX_ERRORS the rest are not worded (nor looked for), and a last line says so.
    components = [{"type": "body", "parameters": [{"type": f"nope{i}"}]} for i in range(bad)]
    body = {
        "to": "4915112345678",
        "phone_number_id": "1111",
        "type": "template",
        "template": {"name": "x", "language": {"code": "en"}, "components": components},
    }
    assert len(orjson.dumps(body)) < 64 * 1024  # the send API's largest body
    errors = SEND.errors(body)
    if listed is not None:
        assert len(errors) == listed and not any("more than" in e for e in errors)
    else:
        assert len(errors) == validation.MAX_ERRORS + 1
        assert (
            errors[-1]
            == f"body: more than {validation.MAX_ERRORS} errors, the first {validation.MAX_ERRORS} listed"
        )

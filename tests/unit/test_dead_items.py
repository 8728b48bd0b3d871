"""Rebuilding dead items' events: each fragment parsed once for the items that share it."""

from __future__ import annotations

import orjson
import pytest

from gateway.core.faults import BadEvent
from gateway.inbound.dead_items import Rebuilder
from gateway.store.dead_events import Claimed
from gateway.testing.payloads import status_obj
from tests.support.parses import count_parses

CONTEXT = {"phone_number_id": "1111", "waba_id": "waba-0", "display_phone_number": "15550001111"}
PATH = "/entry/0/changes/0/value/statuses/0"


def group_status(wamid: str, participants: list[str]) -> bytes:
    return orjson.dumps(status_obj(wamid, "read", participant=participants))


def item(n: int, fragment: bytes, key: str | None, *, inbox_id: int = 1, unit: str = "status") -> Claimed:
    return Claimed(n, inbox_id, 0, PATH, key, "status", "meta", unit, dict(CONTEXT), fragment, 1, 0)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    return count_parses(monkeypatch)


def test_the_items_of_one_group_status_parse_it_once(parses: list[bytes]) -> None:
    people = [f"4915100000{i:03d}" for i in range(200)]
    frag = group_status("wamid.G", people)
    items = [item(i, frag, f"status:wamid.G:read:{p}") for i, p in enumerate(people)]
    rebuilt = Rebuilder()
    got = [rebuilt(it) for it in items]
    assert len(parses) == 1
    assert [[ev.key for ev in evs] for evs in got] == [[it.event_key] for it in items]
    # The same events as rebuilding each item alone.
    assert got[:3] == [Rebuilder()(it) for it in items[:3]]
    assert [ev.participant for evs in got for ev in evs] == people


def test_a_key_asked_again_gets_events_of_its_own(parses: list[bytes]) -> None:
    frag = group_status("wamid.G", ["p1", "p2"])
    rebuilt = Rebuilder()
    first = rebuilt(item(1, frag, "status:wamid.G:read:p1"))
    again = rebuilt(item(2, frag, "status:wamid.G:read:p1"))
    assert first == again and first[0] is not again[0]
    assert len(parses) == 2
    # p2 is still there after the second parse.
    assert rebuilt(item(3, frag, "status:wamid.G:read:p2"))[0].participant == "p2"
    assert len(parses) == 2


@pytest.mark.parametrize(
    ("fragment", "keys", "error", "parsed"),
    [
        # A key the fragment does not have: no event, and no parse more for the next such key.
        (
            group_status("wamid.G", ["p1"]),
            ["status:wamid.G:read:p9", "status:wamid.G:read:p8"],
            "has no event",
            1,
        ),
        # Bytes that are no status: each item is no event, the fragment parsed once.
        (
            b'{"id": "wamid.G", "status": 7',
            ["status:wamid.G:read:p1", "status:wamid.G:read:p2"],
            "not JSON",
            1,
        ),
        (
            orjson.dumps({"status": "read"}),
            ["status:x:read:p1", "status:x:read:p2"],
            "without a string 'id'",
            1,
        ),
    ],
)
def test_items_that_are_no_event_fail_alone(
    parses: list[bytes], fragment: bytes, keys: list[str], error: str, parsed: int
) -> None:
    rebuilt = Rebuilder()
    for n, key in enumerate(keys):
        with pytest.raises(BadEvent, match=error):
            rebuilt(item(n, fragment, key))
    assert len(parses) == parsed


def test_fragments_taken_in_turn_are_each_rebuilt_right(parses: list[bytes]) -> None:
    a, b = group_status("wamid.A", ["p1", "p2"]), group_status("wamid.B", ["p1", "p2"])
    rebuilt = Rebuilder()
    order = [(a, "wamid.A", "p1"), (b, "wamid.B", "p1"), (a, "wamid.A", "p2"), (b, "wamid.B", "p2")]
    got = [
        rebuilt(item(n, f, f"status:{w}:read:{p}", inbox_id=1 if f is a else 2))
        for n, (f, w, p) in enumerate(order)
    ]
    assert [(ev.wamid, ev.participant) for evs in got for ev in evs] == [(w, p) for _, w, p in order]
    assert len(parses) == 4  # interleaved: the caller sorts a claim by (inbox_id, path)


def test_an_item_without_a_key_gets_every_event_of_its_fragment(parses: list[bytes]) -> None:
    frag = group_status("wamid.G", ["p1", "p2", "p3"])
    assert [ev.participant for ev in Rebuilder()(item(1, frag, None))] == ["p1", "p2", "p3"]

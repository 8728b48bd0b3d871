"""``gateway.core.records.record``: a frozen dataclass for everything but the run-time refusal,
which mypy gives instead (checked here with mypy itself, as CI runs it)."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from mypy import api

from gateway.core.events import Item, Status
from gateway.core.identity import Who
from gateway.core.records import record


@record
class Pair:
    a: str
    b: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPair:
    a: str
    b: list[int] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (Who("491"), Who("491"), True),
        (Who("491"), Who("491", "DE.1"), False),
        (Who(None, "DE.1"), Who(wa_id=None, user_id="DE.1"), True),
    ],
)
def test_records_compare_and_hash_as_frozen_dataclasses(left: Who, right: Who, equal: bool) -> None:
    assert (left == right) is equal
    assert (hash(left) == hash(right)) is equal  # hashes of these few values do not collide
    assert len({left, right}) == (1 if equal else 2)


def test_a_record_is_a_slotted_dataclass_with_defaults_replace_and_no_stray_attributes() -> None:
    p = Pair("x")
    assert dataclasses.is_dataclass(p) and [f.name for f in dataclasses.fields(p)] == ["a", "b"]
    assert p.b == [] and p.b is not Pair("y").b  # default_factory: one list each
    assert dataclasses.replace(p, a="z") == Pair("z")
    assert not hasattr(p, "__dict__")
    with pytest.raises(AttributeError):
        p.c = 1  # type: ignore[attr-defined]
    assert repr(p) == "Pair(a='x', b=[])" and repr(FrozenPair("x")) == "FrozenPair(a='x', b=[])"
    # Unhashable fields make the record unhashable, as they make a frozen dataclass.
    for obj in (p, FrozenPair("x")):
        with pytest.raises(TypeError):
            hash(obj)


def test_assigning_a_field_of_a_record_fails_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "assigns.py"
    source.write_text(
        textwrap.dedent(
            """
            from gateway.core.events import Item, Status
            from gateway.core.identity import Who

            def f(s: Status, i: Item, w: Who) -> None:
                s.key = "x"
                i.events = ()
                w.wa_id = "y"
                print(s.key, i.events, w.wa_id)
            """
        )
    )
    out, _, status = api.run(["--strict", "--no-incremental", "--follow-imports=silent", str(source)])
    assert status == 1
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [e.split(": error: ")[1] for e in errors] == [
        'Property "key" defined in "Status" is read-only  [misc]',
        'Property "events" defined in "Item" is read-only  [misc]',
        'Property "wa_id" defined in "Who" is read-only  [misc]',
    ]
    assert Status.__slots__ and Item.__slots__  # the records themselves are slotted

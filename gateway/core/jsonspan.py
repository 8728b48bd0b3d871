"""The exact bytes of one value inside a JSON document, found by its path. Pure: no I/O.

A parser gives values, not where they were; a dead event must keep the bytes the sender
wrote (escapes, spacing, number spelling), so this scanner walks the raw body to the value's
span. It assumes the body already parsed as JSON (the consumer only asks after parsing) and
answers ``None`` on anything it does not understand rather than guess. Duplicate object
keys resolve to the last one, as JSON parsers do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

_STR = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_WS = re.compile(rb"[ \t\n\r]*")
_SCALAR = re.compile(rb"[^,\]\}\s]+")
_TOKEN = re.compile(rb'["\[\]\{\}]')

Path = Sequence[str | int]


class _Malformed(Exception):
    pass


def _ws(b: bytes, i: int) -> int:
    m = _WS.match(b, i)
    assert m is not None  # matches the empty string
    return m.end()


def _string_end(b: bytes, i: int) -> int:
    m = _STR.match(b, i)
    if m is None:
        raise _Malformed
    return m.end()


def _value_end(b: bytes, i: int) -> int:
    """Index just past the value starting at ``i``."""
    c = b[i : i + 1]
    if c == b'"':
        return _string_end(b, i)
    if c in (b"{", b"["):
        depth = 0
        while True:
            m = _TOKEN.search(b, i)
            if m is None:
                raise _Malformed
            t = b[m.start()]
            if t == 0x22:  # '"': skip the whole string, brackets inside do not count
                i = _string_end(b, m.start())
                continue
            depth += 1 if t in (0x5B, 0x7B) else -1
            i = m.end()
            if depth == 0:
                return i
    m = _SCALAR.match(b, i)
    if m is None:
        raise _Malformed
    return m.end()


def _after_member(b: bytes, i: int) -> int:
    i = _ws(b, i)
    if b[i : i + 1] == b",":
        return _ws(b, i + 1)
    return i


def _children(b: bytes, i: int) -> dict[str | int, int]:
    """Where each member (by key) or element (by index) of the container at ``i`` starts; a
    scalar has none. Duplicate keys: the last one wins."""
    c = b[i : i + 1]
    found: dict[str | int, int] = {}
    if c == b"[":
        i = _ws(b, i + 1)
        n = 0
        while i < len(b) and b[i : i + 1] != b"]":
            found[n] = i
            i = _after_member(b, _value_end(b, i))
            n += 1
    elif c == b"{":
        i = _ws(b, i + 1)
        while i < len(b) and b[i : i + 1] != b"}":
            end = _string_end(b, i)
            key = json.loads(b[i:end])
            i = _ws(b, end)
            if b[i : i + 1] != b":":
                raise _Malformed
            i = _ws(b, i + 1)
            found[key] = i
            i = _after_member(b, _value_end(b, i))
    return found


class Spans:
    """The spans of values in one body, for many paths: each container on the way is scanned
    once, so the fragments of all n events of a body cost one pass, not n; and a value's end is
    found once, however often it is asked for (a group status listing n participants is n
    events of one fragment: measured per event, its n dead items scanned it n times)."""

    __slots__ = ("_children", "_ends", "body")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self._children: dict[int, dict[str | int, int]] = {}
        self._ends: dict[int, int] = {}

    def span(self, path: Path) -> tuple[int, int] | None:
        """(start, end) of the value at ``path`` (keys and list indexes), or None."""
        b = self.body
        try:
            i = _ws(b, 0)
            for step in path:
                children = self._children.get(i)
                if children is None:
                    children = self._children[i] = _children(b, i)
                # An object's keys are strings and a list's indexes ints: a step of the other
                # type finds nothing, as it should.
                found = children.get(step)
                if found is None:
                    return None
                i = found
            end = self._ends.get(i)
            if end is None:
                end = self._ends[i] = _value_end(b, i)
            return i, end
        except (_Malformed, ValueError, IndexError):
            return None

    @property
    def scanned(self) -> int:
        """How many values were scanned for their members so far."""
        return len(self._children)

    @property
    def measured(self) -> int:
        """How many values' ends were found so far."""
        return len(self._ends)

    def fragment(self, path: Path) -> bytes | None:
        """The raw bytes of the value at ``path``, exactly as sent, or None."""
        s = self.span(path)
        return None if s is None else self.body[s[0] : s[1]]


def fragment(body: bytes, path: Path) -> bytes | None:
    """The raw bytes of the value at ``path``, exactly as sent, or None."""
    return Spans(body).fragment(path)


def pointer(path: Path) -> str:
    """``path`` as a JSON Pointer (RFC 6901), for people and logs."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)

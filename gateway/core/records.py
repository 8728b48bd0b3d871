"""Immutable records that cost no more to build than plain objects.

A frozen dataclass sets each field through ``object.__setattr__`` in its ``__init__``: 2.4 µs
for a status event of seventeen fields, against 0.3 µs for a plain slotted dataclass, and a
consumer builds several records per event it plans (the event, its item, the customer's
identities). ``record`` makes a plain slotted dataclass that type checkers hold frozen
(``dataclass_transform(frozen_default=True)``): assigning a field fails mypy, and equality and
hashing are those of a frozen dataclass. What it gives up is the run-time refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True, slots=True)``, built at the cost of a plain dataclass."""
    return dataclass(slots=True, unsafe_hash=True)(cls)

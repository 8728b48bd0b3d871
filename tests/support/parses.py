"""The fragments ``gateway.inbound.dead_items`` parses, counted (the real parser runs)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.inbound import dead_items


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """A list that gets each fragment dead_items parses from now on, in order."""
    seen: list[bytes] = []
    real = dead_items.parse_fragment

    def counted(source: str, unit: str, fragment: bytes, context: dict[str, Any]) -> Any:
        seen.append(fragment)
        return real(source, unit, fragment, context)

    monkeypatch.setattr(dead_items, "parse_fragment", counted)
    return seen

"""A lane cursor's snapshot in PostgreSQL's text form, both ways."""

from __future__ import annotations

import pytest

from gateway.core.lanes import Snapshot


@pytest.mark.parametrize(
    ("text", "snapshot", "canonical"),
    [
        ("10:10:", Snapshot(10, 10), "10:10:"),
        ("10:20:12,15", Snapshot(10, 20, (12, 15)), "10:20:12,15"),
        ("10:20:15,12", Snapshot(10, 20, (15, 12)), "10:20:12,15"),  # running ones sorted
    ],
)
def test_a_snapshot_reads_and_writes_postgresqls_text(text: str, snapshot: Snapshot, canonical: str) -> None:
    parsed = Snapshot.parse(text)
    assert parsed == snapshot
    assert parsed.text() == canonical
    assert parsed.text() == canonical  # the second time from the memo


@pytest.mark.parametrize("text", ["20:10:", "10:20:9", "10:20:20", "10:20", "a:b:"])
def test_a_malformed_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Snapshot.parse(text)


def test_the_memo_is_not_part_of_a_snapshots_identity() -> None:
    written, fresh = Snapshot(5, 9, (6,)), Snapshot(5, 9, (6,))
    written.text()
    assert written == fresh
    assert hash(written) == hash(fresh)
    assert {written: 1}[fresh] == 1

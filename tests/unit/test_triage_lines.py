"""The log lines of a batch's malformed fragments: a few per row, then one line for the rest."""

from __future__ import annotations

import logging

import orjson
import pytest

from gateway.core.planning import StagedRow, plan_batch
from gateway.inbound import triage
from gateway.store.inbox import Applied
from gateway.testing.payloads import meta_payload, meta_value


def row(inbox_id: int, bad: int) -> StagedRow:
    body = orjson.dumps(meta_payload(("messages", meta_value(statuses=[{}] * bad))))
    return StagedRow(inbox_id, "meta", body, None)


@pytest.mark.parametrize(
    ("bad", "lines"),
    [
        (1, ["/0"]),
        (3, ["/0", "/1", "/2"]),
        (4, ["/0", "/1", "/2", "1 more"]),
        (5000, ["/0", "/1", "/2", "4997 more"]),
    ],
)
def test_a_rows_malformed_fragments_are_told_in_a_few_lines(
    bad: int, lines: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    plan = plan_batch([row(7, bad), row(8, 2)])
    assert len(plan.bad) == bad + 2
    caplog.set_level(logging.ERROR, logger="gateway.inbound.consumer")
    triage.observe(plan, Applied(0, 0, 0, 0, 0, 0, 0, 0, 0, []))
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == len(lines) + 2
    for line, end in zip(told, lines, strict=False):
        assert line.startswith("inbox row 7: ")
        assert ("statuses" + end) in line if end.startswith("/") else f": {end} fragments" in line
    assert all(line.startswith("inbox row 8: fragment ") for line in told[len(lines) :])

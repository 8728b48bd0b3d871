"""metrics.observe_many fills a histogram exactly as one observe() per value does."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from gateway.metrics import observe_many

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0)


def _samples(h: Histogram) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for m in h.collect() for s in m.samples]


@pytest.mark.parametrize(
    "values",
    [
        [],
        [0.0005],
        [0.001, 0.005, 0.01, 0.1, 1.0],  # each exactly on a bound: that bucket, as observe() says
        [0.0010001, 0.2, 7.5, 7.5, 0.0],  # between bounds and past the last (+Inf)
        [0.003] * 50 + [0.5] * 3,
    ],
)
def test_same_samples_as_observe_one_by_one(values: list[float]) -> None:
    one = Histogram("one", "h", ["source"], buckets=BUCKETS, registry=CollectorRegistry())
    many = Histogram("many", "h", ["source"], buckets=BUCKETS, registry=CollectorRegistry())
    child = one.labels("meta")
    for v in values:
        child.observe(v)
    observe_many(many.labels("meta"), values)
    got = [(n.replace("many", "one"), labels, v) for n, labels, v in _samples(many)]
    assert got == _samples(one)

"""What connecting finds reaches the metrics: gateway.store.db tells its observers, and
gateway.metrics (a layer above) counts each event."""

from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from gateway import metrics  # noqa: F401 - registers its observer of gateway.store.db
from gateway.store import db


def value(name: str, labels: dict[str, str] | None = None) -> float:
    got = REGISTRY.get_sample_value(name, labels or {})
    return 0.0 if got is None else got


@pytest.mark.parametrize(
    ("events", "read", "delta"),
    [
        ([("primary", "pg2:5432")], lambda: value("gateway_db_primary_changes_total"), 1.0),
        (
            [("no_primary", "no host writable")] * 2,
            lambda: value("gateway_db_no_primary_total", {"reason": "no host writable"}),
            2.0,
        ),
        ([("listen_up", "t_obs")], lambda: value("gateway_listen_up", {"channel": "t_obs"}), 1.0),
        (
            [("listen_up", "t_obs2"), ("listen_down", "t_obs2")],
            lambda: value("gateway_listen_up", {"channel": "t_obs2"}),
            0.0,
        ),
        (
            [("listen_up", "t_obs3"), ("listen_down", "t_obs3"), ("listen_up", "t_obs3")],
            lambda: value("gateway_listen_sessions_total", {"channel": "t_obs3"}),
            2.0,
        ),
    ],
)
def test_events_are_counted(events: list[tuple[str, str]], read: Callable[[], float], delta: float) -> None:
    before = read()
    for event, detail in events:
        db.observe(event, detail)
    assert read() - before == delta

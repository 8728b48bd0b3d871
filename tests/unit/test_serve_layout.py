"""The processes `gateway serve` runs by core count (gateway.runtime.workers.layout)."""

from __future__ import annotations

import pytest

from gateway.core.settings import Settings
from gateway.runtime.workers import Layout, children, layout


@pytest.mark.parametrize(
    ("cores", "workers", "services", "has_services", "expected"),
    [
        # auto: one process on one core; apart from two cores on, an HTTP worker per other core
        (1, 0, "auto", True, Layout(1, False)),
        (2, 0, "auto", True, Layout(1, True)),
        (8, 0, "auto", True, Layout(7, True)),
        # nothing to run apart (GATEWAY_RUN_* all false): an HTTP worker per core
        (1, 0, "auto", False, Layout(1, False)),
        (4, 0, "auto", False, Layout(4, False)),
        (4, 0, "process", False, Layout(4, False)),
        # asked for workers: that many HTTP workers, the services beside them by the same rule
        (1, 3, "auto", True, Layout(3, False)),
        (2, 1, "auto", True, Layout(1, True)),
        (4, 2, "auto", True, Layout(2, True)),
        # inline: the old way, the services inside every worker
        (4, 0, "inline", True, Layout(4, False)),
        (4, 2, "inline", True, Layout(2, False)),
        # process: apart even on one core
        (1, 0, "process", True, Layout(1, True)),
        (1, 2, "process", True, Layout(2, True)),
    ],
)
def test_layout(cores: int, workers: int, services: str, has_services: bool, expected: Layout) -> None:
    assert layout(cores, workers, services, has_services) == expected


@pytest.mark.parametrize(
    ("cores", "workers", "services", "forwarder", "expected"),
    [
        # apart: the forwarder in one more process; the HTTP workers counted as before
        (2, 0, "auto", "apart", Layout(1, True, True)),
        (8, 0, "auto", "apart", Layout(7, True, True)),
        (1, 0, "process", "apart", Layout(1, True, True)),
        (4, 2, "process", "apart", Layout(2, True, True)),
        # auto: in the services process below 4 cores, apart from 4 on
        (2, 0, "auto", "auto", Layout(1, True, False)),
        (3, 0, "auto", "auto", Layout(2, True, False)),
        (4, 0, "auto", "auto", Layout(3, True, True)),
        (8, 2, "auto", "auto", Layout(2, True, True)),
        (1, 0, "process", "auto", Layout(1, True, False)),
        # with-services: never a process of its own
        (8, 0, "auto", "with-services", Layout(7, True, False)),
        # not beside another service (None): the services process is already its own
        (8, 0, "auto", None, Layout(7, True, False)),
        # the services inside the workers: so is the forwarder
        (1, 0, "auto", "apart", Layout(1, False, False)),
        (4, 0, "inline", "apart", Layout(4, False, False)),
        (8, 0, "inline", "auto", Layout(8, False, False)),
    ],
)
def test_layout_of_the_forwarder(
    cores: int, workers: int, services: str, forwarder: str | None, expected: Layout
) -> None:
    lay = layout(cores, workers, services, True, forwarder)
    assert lay == expected
    assert lay.processes == expected.http + expected.services_apart + expected.forwarder_apart


def test_children_with_the_forwarder_apart() -> None:
    s = Settings(database_url="postgresql://u@h/db")
    kids = children(s, Layout(1, True, True), "/tmp/metrics")
    assert [(c.name, c.flag) for c in kids] == [
        ("worker 0", "--worker"),
        ("services", "--services"),
        ("forwarder", "--forwarder"),
    ]
    runs = {
        c.name: {r for r in ("CONSUMERS", "SENDER", "FORWARDER") if c.env.get(f"GATEWAY_RUN_{r}") != "false"}
        for c in kids
    }
    # each service runs in exactly one process
    assert runs == {"worker 0": set(), "services": {"CONSUMERS", "SENDER"}, "forwarder": {"FORWARDER"}}
    assert kids[2].env["GATEWAY_METRICS_PORT"] == "0"


def test_children_of_a_split_layout() -> None:
    s = Settings(database_url="postgresql://u@h/db", metrics_port=9100)
    kids = children(s, Layout(2, True), "/tmp/metrics")
    assert [(c.name, c.flag) for c in kids] == [
        ("worker 0", "--worker"),
        ("worker 1", "--worker"),
        ("services", "--services"),
    ]
    for c in kids[:2]:  # the HTTP workers run none of the services
        assert {c.env[f"GATEWAY_RUN_{r}"] for r in ("CONSUMERS", "SENDER", "FORWARDER")} == {"false"}
    services = kids[2].env
    assert services["GATEWAY_METRICS_PORT"] == "0"  # the workers' /metrics reports it
    assert all(c.env["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/metrics" for c in kids)
    assert all(c.env["GATEWAY_MIGRATE_ON_START"] == "false" for c in kids)  # the parent migrated


def test_children_inline() -> None:
    s = Settings(database_url="postgresql://u@h/db")
    kids = children(s, Layout(2, False), "/tmp/metrics")
    assert [c.flag for c in kids] == ["--worker", "--worker"]
    assert all(c.env.get("GATEWAY_RUN_CONSUMERS") != "false" for c in kids)

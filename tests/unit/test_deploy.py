"""The deployment bundle under deploy/, checked with real parsers: compose.yaml against the
Compose Specification's JSON schema, the Prometheus config and alert rules with promtool, the
Grafana dashboard against the metrics the gateway really exports. `make compose-test` builds the
image and runs the bundle itself (tests/compose/)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import REGISTRY

import gateway.metrics
from gateway.cli import COMMANDS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
GATEWAY_SERVICES = ("migrate", "serve", "consume", "send", "forward")


def load_yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml("compose.yaml")
    return doc


def test_compose_file_is_valid_per_the_compose_spec(compose: dict[str, Any]) -> None:
    schema = json.loads((DEPLOY / "schema" / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(compose, schema, cls=jsonschema.Draft7Validator)
    # The validator is real: a misspelt key is refused.
    broken = {**compose, "services": {**compose["services"], "serve": {**compose["services"]["serve"]}}}
    broken["services"]["serve"]["helthcheck"] = {}
    with pytest.raises(jsonschema.ValidationError, match="helthcheck"):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft7Validator)


def test_compose_services_and_health_checks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "prometheus", "grafana", *GATEWAY_SERVICES} <= set(services)
    for name in GATEWAY_SERVICES:
        svc = services[name]
        command = svc["command"]
        assert command[:2] == ["gateway", name], name
        assert name in COMMANDS, name
        assert svc["environment"]["DATABASE_URL"].startswith("postgresql://gateway:${POSTGRES_PASSWORD")
    assert services["migrate"]["restart"] == "no"
    for name in GATEWAY_SERVICES:
        svc = services[name]
        assert svc["depends_on"] == {"postgres": {"condition": "service_healthy"}}, name
        # No process migrates but `migrate`: the others wait for its schema (GATEWAY_DB_WAIT_S).
        assert svc["environment"]["GATEWAY_MIGRATE_ON_START"] == "false"
        assert float(svc["environment"]["GATEWAY_DB_WAIT_S"]) >= 30
    for name in ("serve", "consume", "send", "forward"):
        svc = services[name]
        probe = " ".join(svc["healthcheck"]["test"])
        assert ("/readyz" in probe and ":8080" in probe) if name == "serve" else ":9100/healthz" in probe
    for switch in ("GATEWAY_RUN_CONSUMERS", "GATEWAY_RUN_SENDER", "GATEWAY_RUN_FORWARDER"):
        assert services["serve"]["environment"][switch] == "false"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_no_dependency_chains(compose: dict[str, Any]) -> None:
    """Every service depends only on services that depend on nothing, and never on the one-shot
    `migrate`: podman (4.3) cannot start a chain such as serve -> migrate -> postgres, nor
    restart a container that requires an exited one."""
    services = compose["services"]
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep != "migrate", name
            assert not services[dep].get("depends_on"), (name, dep)


def test_published_ports_are_settable(compose: dict[str, Any]) -> None:
    """Host ports (and the address they bind to) come from deploy/.env, default the usual ones."""
    ports = {name: svc["ports"] for name, svc in compose["services"].items() if "ports" in svc}
    assert ports == {
        "serve": ["${PUBLISH_HTTP:-8080}:8080"],
        "prometheus": ["${PUBLISH_PROMETHEUS:-9090}:9090"],
        "grafana": ["${PUBLISH_GRAFANA:-3000}:3000"],
    }


def test_images_are_pinned_by_digest(compose: dict[str, Any]) -> None:
    """Third-party images by version tag and digest (a tag alone can move under a deployment);
    the gateway's own image is built from the Dockerfile, whose base is pinned the same way."""
    digest = re.compile(r"^[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")
    for name, svc in compose["services"].items():
        if "build" in svc:
            continue
        assert digest.match(svc["image"]), (name, svc["image"])
    base = re.search(r"^ARG BASE=(\S+)$", (DEPLOY.parent / "Dockerfile").read_text(), re.M)
    assert base is not None and digest.match(base.group(1)), base


def test_prometheus_scrapes_every_process(compose: dict[str, Any]) -> None:
    config = load_yaml("prometheus/prometheus.yml")
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:9100" for name in ("serve", "consume", "send", "forward")}
    mounts = " ".join(compose["services"]["prometheus"]["volumes"])
    assert "prometheus.yml" in mounts and "alerts.yml" in mounts


def exported_names() -> set[str]:
    """Every series name the gateway's metrics can produce (``_total``, ``_bucket``, ...), with or
    without samples yet; database-wide gauges included (only the leader exports them)."""
    names: set[str] = set()
    for registry in (REGISTRY, gateway.metrics.DB_REGISTRY):
        names.update(registry._names_to_collectors)
    return names


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DEPLOY / "grafana" / "dashboards" / "gateway.json").read_text())
    return doc


# Prometheus' own series.
FUTURE = {"up"}


def metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\bgateway_[a-z0-9_]+", expr))
    return names | ({"up"} if re.search(r"\bup\{", expr) else set())


def test_dashboard_panels_read_real_metrics() -> None:
    doc = dashboard()
    panels = [p for p in doc["panels"] if p.get("type") != "row"]
    titles = " | ".join(p["title"].lower() for p in panels)
    for topic in (
        "ingest",
        "ack latency",
        "batch size",
        "backlog",
        "lag",
        "dead",
        "outbox",
        "review",
        "sends",
        "forward",
    ):
        assert topic in titles, topic
    known = exported_names() | FUTURE
    for panel in panels:
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, target["expr"]
            assert names <= known, (panel["title"], names - known)
    ack = next(p for p in panels if "ack latency" in p["title"].lower())
    steps = [s["value"] for s in ack["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert 0.25 in steps and 1 in steps  # Meta's bars drawn on the chart


def test_alert_rules_read_real_metrics() -> None:
    rules = load_yaml("prometheus/alerts.yml")
    known = exported_names() | FUTURE
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    for name in (
        "GatewayAcksFailing",
        "GatewayConsumerLagHigh",
        "GatewayDeadLetters",
        "GatewayReviewQueueGrowing",
        "GatewayUnknownSendsAgeing",
        "GatewayBreakerOpen",
    ):
        assert name in alerts
    for name, expr in alerts.items():
        names = metric_names(expr)
        assert names and names <= known, (name, names - known)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (.ci/run installs it: apt-get install prometheus)")
    return found


def test_promtool_checks_config_and_rules(tmp_path: Path) -> None:
    tool = promtool()
    rules = DEPLOY / "prometheus" / "alerts.yml"
    done = subprocess.run([tool, "check", "rules", str(rules)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # The config names the rules where the container mounts them; point it at the repo's copy.
    config = load_yaml("prometheus/prometheus.yml")
    config["rule_files"] = [str(rules)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    config_path = str(tmp_path / "prometheus.yml")
    done = subprocess.run([tool, "check", "config", config_path], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_alerts() -> None:
    tool = promtool()
    done = subprocess.run(
        [tool, "test", "rules", "alerts_test.yml"],
        cwd=DEPLOY / "prometheus",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr

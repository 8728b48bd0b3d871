"""Load-test reports: secrets redacted everywhere, the verdict and its exit code, the charts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtest.harness import ingest_report, redact, report
from loadtest.harness.charts import complete_seconds
from loadtest.harness.database import embedded_dsn

META = "meta-app-secret-1234"
TENASHI = "tenashi-secret-5678"
DB_PASSWORD = "pg-pass-9012"


def run_result(**summary: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "sent": 1000,
        "answered": 1000,
        "rate_reached": 100.0,
        "throughput": 100.0,
        "ack_ms": {"count": 1000, "p50": 3.0, "p90": 5.0, "p99": 9.0, "p99.9": 20.0, "max": 30.0},
        "errors": {},
        "generator_cpu": 0.1,
        "max_dispatch_lag_ms": 1.0,
    }
    base.update(summary)
    return {
        "parameters": {
            "url": "http://127.0.0.1:8080",
            "meta_secret": META,
            "tenashi_secret": TENASHI,
            "database_url": f"postgresql://gw:{DB_PASSWORD}@db.internal:5432/gateway",
            "gateway_env": [f"GATEWAY_META_APP_SECRETS={META},old-secret-0000", "GATEWAY_PORT=8080"],
            "duration": 10.0,
            "profile": None,
        },
        "target_rate": 100.0,
        "duration_s": 10.0,
        "summary": base,
        "timeline": [
            {"t": t, "sent": 100, "ok": 100, "errors": 0, "throughput": 100, "p50_ms": 3.0} for t in range(10)
        ]
        + [{"t": 10, "sent": 0, "ok": 0, "errors": 0, "throughput": 4}],
        "samples": [],
        "warnings": [f"gateway log said: secret is {META}"],
        "verification": None,
        "e2e_timeline": [],
    }


SECRETS = (META, TENASHI, DB_PASSWORD, "old-secret-0000")


def test_redact_hides_every_secret_and_keeps_the_rest() -> None:
    out = redact.redact(run_result())
    dumped = json.dumps(out)
    for s in SECRETS:
        assert s not in dumped
    p = out["parameters"]
    assert p["meta_secret"] == p["tenashi_secret"] == "***"
    assert p["database_url"] == "postgresql://gw:***@db.internal:5432/gateway"  # host kept: useful
    assert p["gateway_env"] == ["GATEWAY_META_APP_SECRETS=***", "GATEWAY_PORT=8080"]
    assert out["warnings"] == ["gateway log said: secret is ***"]  # found again elsewhere
    assert out["summary"]["ack_ms"]["p50"] == 3.0 and p["url"] == "http://127.0.0.1:8080"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://u:pw-1234@h/db", "postgresql://u:***@h/db"),
        ("postgresql:///db?host=/tmp&password=pw-1234", "postgresql:///db?host=/tmp&password=***"),
        (
            "postgresql://postgres:@/gateway?host=/x",
            "postgresql://postgres:@/gateway?host=/x",
        ),  # none to hide
        ("plain text", "plain text"),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    assert redact.redact_text(text) == expected


def test_written_json_and_html_hold_no_secret(tmp_path: Path) -> None:
    result = run_result()
    verdict = report.run_verdict(result)
    text = report.run_table(result) + f"\nWARNING: {result['warnings'][0]}"
    jpath, hpath = report.write(tmp_path, "r", result, text, report.run_charts(result, verdict), verdict)
    for path in (jpath, hpath):
        body = path.read_text()
        for s in SECRETS:
            assert s not in body, (path.name, s)
    assert json.loads(jpath.read_text())["verdict"]["verdict"] == "PASS"


def test_run_table_without_verification_does_not_crash() -> None:
    # --url without a database and --no-verify: "verification" is None (once an AttributeError).
    assert "n/a (not verified)" in report.run_table(run_result())


@pytest.mark.parametrize(
    ("summary", "verification", "word", "why"),
    [
        ({}, None, "PASS", ""),
        ({"ack_ms": {"p50": 300.0, "p99": 400.0}}, None, "FAIL", "ack p50"),
        ({"ack_ms": {"p50": 3.0, "p99": 1500.0}}, None, "FAIL", "ack p99"),
        ({"errors": {"timeout": 20}}, None, "FAIL", "failed acks"),
        ({"errors": {"timeout": 5}}, None, "PASS", ""),  # 0.5 %: under Meta's 1 %
        ({"rate_reached": 80.0}, None, "FAIL", "rate reached"),
        ({"errors": {"bad_signature_got_200": 1}}, None, "FAIL", "badly signed"),
        (
            {},
            {"checks": [{"name": "ingest: every 200 stored", "ok": False, "detail": "3 missing"}]},
            "FAIL",
            "3 missing",
        ),
        (
            {},
            {"checks": [{"name": "ingest: every 200 stored", "ok": True, "detail": "0 missing"}]},
            "PASS",
            "",
        ),
        ({"ack_ms": {}}, None, "FAIL", "ack p50: -"),  # nothing answered: no latency is no pass
    ],
)
def test_run_verdict(summary: dict[str, Any], verification: Any, word: str, why: str) -> None:
    result = run_result(**summary)
    result["verification"] = verification
    v = report.run_verdict(result)
    assert v.word == word
    assert why in v.summary()
    assert ("not verified" in v.summary()) == (verification is None and word == "PASS")


def test_forwarding_failure_fails_the_verdict() -> None:
    result = run_result()
    result["forwarding"] = {
        "ok": False,
        "lost": 2,
        "unexpected": 0,
        "without_delivery": 0,
        "bad_signatures": 0,
    }
    v = report.run_verdict(result)
    assert v.word == "FAIL" and "forwarding: lost 2" in v.summary()
    result["forwarding"] = {"ok": True, "lost": 0}
    assert report.run_verdict(result).passed


def test_verdict_leads_the_page(tmp_path: Path) -> None:
    result = run_result(ack_ms={"p50": 3.0, "p99": 2000.0})
    v = report.run_verdict(result)
    page = report.html_page("r", "table", [], result["parameters"], v)
    body = page[page.index("<body>") :]
    assert body.index("FAIL") < body.index("table") and "class='verdict fail'" in body
    assert "ack p99: 2000 ms (goal &lt;= 1000 ms)" in page


def test_throughput_drops_the_last_partial_second() -> None:
    tl = run_result()["timeline"]
    assert [r["t"] for r in complete_seconds(tl, 10.0)] == list(range(10))
    assert [r["t"] for r in complete_seconds(tl, 9.5)] == list(range(9))
    assert [r["t"] for r in complete_seconds(tl, None)] == list(range(10))


def test_charts_are_inline_svg_with_the_targets() -> None:
    result = run_result()
    charts = report.run_charts(result, report.run_verdict(result))
    assert all(c.startswith("<svg") for c in charts)
    assert "target ack p99: 1000" in charts[0] and "target mean rate: 100" in charts[1]


def bench_result(vs_bare: float, p99: float) -> dict[str, Any]:
    def target(v: float, goal: float, higher: bool) -> dict[str, Any]:
        return {"target": goal, "value": v, "met": v >= goal if higher else v <= goal}

    half = {
        name: {"ack_ms": {"p50": 2.0, "p99": p99}, "errors": {}, "timeline": [], "duration_s": 10.0}
        for name in ingest_report.SERVERS
    }
    return {
        "saturation": {"bare": 10000.0, "insert": 2000.0, "gateway": 10000.0 * vs_bare},
        "half_rate": 4000.0,
        "half": half,
        "targets": {
            "gateway_vs_bare": target(vs_bare, ingest_report.TARGET_VS_BARE, True),
            "gateway_vs_insert": target(5.0, ingest_report.TARGET_VS_INSERT, True),
            "p99_ms_at_half": target(p99, ingest_report.TARGET_P99_MS, False),
            "p50_ms_at_half": target(2.0, ingest_report.TARGET_P50_MS, False),
        },
    }


@pytest.mark.parametrize(
    ("vs_bare", "p99", "word"), [(1.0, 10.0, "PASS"), (0.5, 10.0, "FAIL"), (1.0, 80.0, "FAIL")]
)
def test_bench_ingest_verdict(vs_bare: float, p99: float, word: str) -> None:
    v = ingest_report.bench_verdict(bench_result(vs_bare, p99))
    assert v.word == word
    # bench-ingest's exit code is this verdict's (it used to print "NO" and exit 0).
    assert (0 if v.passed else 1) == (0 if word == "PASS" else 1)


def test_bench_ingest_headline_is_a_bar_chart() -> None:
    charts = ingest_report.bench_charts(bench_result(1.0, 10.0))
    assert charts[0].startswith("<svg") and "target 0.85 x bare" in charts[0]


def test_embedded_dsn_names_the_socket_directory(tmp_path: Path) -> None:
    assert embedded_dsn(tmp_path) == f"postgresql://postgres@/gateway?host={tmp_path.resolve()}/pgdata"

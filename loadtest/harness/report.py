"""Reports: a terminal table, a JSON result file and a self-contained HTML page.

The page leads with a PASS/FAIL verdict against named targets, then charts drawn with
matplotlib (Agg backend, inlined as SVG: no JavaScript, nothing fetched), with the targets as
lines on them (loadtest.harness.charts). Secrets never reach a report: ``redact`` runs over
everything written (loadtest.harness.redact).
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.harness.charts import complete_seconds, line_chart, series
from loadtest.harness.redact import redact, redact_text, secret_values

# Meta's standard for a webhook endpoint (its webhook docs): median latency <= 250 ms and fewer
# than 1 % of responses over 1 s. A run that misses them fails.
META_P50_MS = 250.0
META_P99_MS = 1000.0
MAX_ERROR_SHARE = 0.01
# Below this share of the scheduled rate the generator (or the gateway) did not keep pace, and
# the latencies describe a lighter load than asked for.
MIN_RATE_SHARE = 0.95


def fmt_ms(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---- verdict --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Target:
    """One named goal: ``value`` compared with ``goal`` (``<=`` or ``>=``); ``rounds``: the
    value of each round when ``value`` is their median (``median``)."""

    name: str
    value: float | None
    goal: float
    op: str  # "<=" | ">="
    unit: str = ""
    rounds: tuple[float, ...] = ()

    @classmethod
    def median(cls, name: str, rounds: Sequence[float], goal: float, op: str, unit: str = "") -> Target:
        """The median of the rounds judged (no round: no value, missed)."""
        return cls(name, statistics.median(rounds) if rounds else None, goal, op, unit, tuple(rounds))

    @property
    def met(self) -> bool:
        if self.value is None or math.isnan(self.value):
            return False
        return self.value <= self.goal if self.op == "<=" else self.value >= self.goal

    def line(self) -> str:
        value = "-" if self.value is None else f"{self.value:.4g}{self.unit}"
        rounds = f", rounds {' / '.join(f'{r:.4g}' for r in self.rounds)}" if len(self.rounds) > 1 else ""
        return f"{self.name}: {value} (goal {self.op} {self.goal:.4g}{self.unit}{rounds})"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "goal": self.goal, "op": self.op, "unit": self.unit,
                "met": self.met, "rounds": list(self.rounds)}  # fmt: skip


@dataclass
class Verdict:
    """PASS when every target is met and every check passed."""

    targets: list[Target] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # caveats that do not fail the run

    @property
    def passed(self) -> bool:
        return all(t.met for t in self.targets) and not self.failed_checks

    @property
    def word(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def reasons(self) -> list[str]:
        return [t.line() for t in self.targets if not t.met] + self.failed_checks

    def summary(self) -> str:
        """One terminal line: the word, then why it failed (or what it could not check)."""
        if self.passed:
            return "PASS" + (f" ({'; '.join(self.notes)})" if self.notes else "")
        return "FAIL: " + "; ".join(self.reasons())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        """A verdict as ``as_dict`` wrote it."""
        targets = [
            Target(t["name"], t["value"], t["goal"], t["op"], t.get("unit", ""), tuple(t.get("rounds") or ()))
            for t in d.get("targets", [])
        ]
        return cls(targets, list(d.get("failed_checks", [])), list(d.get("notes", [])))

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.word,
            "targets": [t.as_dict() for t in self.targets],
            "failed_checks": self.failed_checks,
            "notes": self.notes,
        }


def run_verdict(
    result: dict[str, Any],
    *,
    p50_ms: float = META_P50_MS,
    p99_ms: float = META_P99_MS,
    max_error_share: float = MAX_ERROR_SHARE,
) -> Verdict:
    """The verdict of a load run: Meta's latency bars, errors, pace, and the database checks."""
    s = result["summary"]
    ack = s.get("ack_ms") or {}
    sent = s.get("sent") or 0
    errors = sum(v for k, v in (s.get("errors") or {}).items() if not k.startswith("bad_signature_got_"))
    v = Verdict(
        targets=[
            Target("ack p50", ack.get("p50"), p50_ms, "<=", " ms"),
            Target("ack p99", ack.get("p99"), p99_ms, "<=", " ms"),
            Target("failed acks", errors / sent * 100 if sent else None, max_error_share * 100, "<=", " %"),
            Target(
                "rate reached",
                s.get("rate_reached", 0.0) / result["target_rate"] * 100
                if result.get("target_rate")
                else None,
                MIN_RATE_SHARE * 100,
                ">=",
                " % of the schedule",
            ),
        ]
    )
    accepted_bad = {k: n for k, n in (s.get("errors") or {}).items() if k.startswith("bad_signature_got_")}
    if accepted_bad:
        v.failed_checks.append(f"badly signed requests not refused: {accepted_bad}")
    verification = result.get("verification")
    if verification:
        v.failed_checks += [f"{c['name']}: {c['detail']}" for c in verification["checks"] if not c["ok"]]
    else:
        v.notes.append("not verified against the database")
    forwarding = result.get("forwarding")
    if forwarding and not forwarding.get("ok", True):
        wrong = ("lost", "unexpected", "without_delivery", "bad_signatures")
        what = ", ".join(f"{k} {forwarding.get(k)}" for k in wrong if forwarding.get(k))
        v.failed_checks.append(f"forwarding: {what or 'deliveries not all delivered'}")
    return v


def run_duration(result: dict[str, Any]) -> float | None:
    d = result.get("duration_s")
    if d is None:
        d = (
            (result.get("parameters") or {}).get("duration")
            if not result["parameters"].get("profile")
            else None
        )
    return float(d) if d else None


def run_charts(result: dict[str, Any], verdict: Verdict | None = None) -> list[str]:
    tl = complete_seconds(result.get("timeline", []), run_duration(result))
    samples = result.get("samples", [])
    goals = {t.name: t.goal for t in (verdict.targets if verdict else [])}
    lat_targets = [(f"target {k}", goals[k]) for k in ("ack p50", "ack p99") if k in goals]
    charts = [
        line_chart(
            "Ack latency per second (from each request's intended start)",
            [(k[:-3], series(tl, "t", k)) for k in ("p50_ms", "p99_ms", "max_ms")],
            "ms (log scale)",
            targets=lat_targets,
            log_y=True,
        ),
        line_chart(
            "Throughput per second",
            [("scheduled", series(tl, "t", "sent")), ("answered", series(tl, "t", "throughput"))],
            "requests/s",
            targets=[("target mean rate", float(result["target_rate"]))] if result.get("target_rate") else [],
        ),
    ]
    e2e = result.get("e2e_timeline", [])
    if e2e:
        charts.append(
            line_chart(
                "Receipt -> processed by the consumers",
                [("p50", series(e2e, "t", "p50_ms")), ("p99", series(e2e, "t", "p99_ms"))],
                "ms (log scale)",
                log_y=True,
            )
        )
    if any("pending" in s for s in samples):
        charts.append(
            line_chart("Backlog (pending inbox rows)", [("pending", series(samples, "t", "pending"))], "rows")
        )
        charts.append(
            line_chart(
                "Consumer lag (oldest pending row)", [("lag", series(samples, "t", "lag_s", 1000))], "ms"
            )
        )
    if any("rss_mb" in s for s in samples):
        charts.append(line_chart("Gateway resident memory", [("RSS", series(samples, "t", "rss_mb"))], "MB"))
    return charts


# ---- terminal table of a run ----------------------------------------------------------------
def run_table(result: dict[str, Any]) -> str:
    s = result["summary"]
    ack = s["ack_ms"]
    rows: list[tuple[str, str]] = [
        ("target rate (mean)", f"{result['target_rate']:.1f}/s"),
        ("rate reached", f"{s['rate_reached']:.1f}/s"),
        ("answered (200 + expected 401)", f"{s['answered']} of {s['sent']}"),
    ]
    rows += [(f"ack {k}", f"{fmt_ms(ack.get(k))} ms") for k in ("p50", "p90", "p99", "p99.9", "max")]
    rows.append(("errors", ", ".join(f"{k}={v}" for k, v in s["errors"].items()) or "none"))
    verification = result.get("verification") or {}
    e2e = verification.get("e2e_ms") or {}
    if e2e:
        rows += [(f"receipt->processed {k}", f"{fmt_ms(e2e.get(k))} ms") for k in ("p50", "p99", "max")]
    elif not verification:
        rows.append(("receipt->processed", "n/a (not verified)"))
    else:
        rows.append(("receipt->processed", "n/a (no consumers)"))
    samples = result.get("samples", [])
    lags = [x["lag_s"] for x in samples if "lag_s" in x]
    pend = [x["pending"] for x in samples if "pending" in x]
    if lags:
        rows.append(("consumer lag max", f"{max(lags) * 1000:.0f} ms (backlog max {max(pend):.0f} rows)"))
    rss = [x["rss_mb"] for x in samples if "rss_mb" in x and not math.isnan(x["rss_mb"])]
    if rss:
        rows.append(("gateway RSS min/max", f"{min(rss):.0f} / {max(rss):.0f} MB"))
    rows.append(
        (
            "generator CPU",
            f"{s['generator_cpu'] * 100:.0f}% of a core, max lag {s['max_dispatch_lag_ms']:.1f} ms",
        )
    )
    out = table(("metric", "value"), rows)
    minutes = result.get("per_minute", [])
    if len(minutes) > 1:
        out += "\n\n" + table(
            (
                "minute",
                "acks",
                "p50 ms",
                "p99 ms",
                "p99.9 ms",
                "max ms",
                "backlog max",
                "lag max ms",
                "RSS max MB",
            ),
            [
                (
                    int(m["minute"]),
                    int(m["count"]),
                    *(fmt_ms(m.get(k)) for k in ("p50", "p99", "p99.9", "max")),
                    f"{m['pending_max']:.0f}" if "pending_max" in m else "-",
                    f"{m['lag_s_max'] * 1000:.0f}" if "lag_s_max" in m else "-",
                    f"{m['rss_mb_max']:.0f}" if "rss_mb_max" in m else "-",
                )
                for m in minutes
            ],
        )
    if verification:
        out += "\n\n" + table(
            ("check", "ok", "detail"),
            [(c["name"], "yes" if c["ok"] else "NO", c["detail"]) for c in verification["checks"]],
        )
    return out


# ---- the page -------------------------------------------------------------------------------
_CSS = (
    "body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}"
    "pre{background:#f6f6f6;padding:12px;overflow-x:auto;font-size:12px}"
    ".verdict{border-radius:6px;padding:14px 18px;margin:12px 0 20px;color:#fff}"
    ".verdict b{font-size:28px;letter-spacing:1px;margin-right:12px}"
    ".pass{background:#1e8449}.fail{background:#c0392b}"
    ".verdict ul{margin:8px 0 0;padding-left:4px;list-style:none}.verdict li{margin:2px 0}"
    "table.t{border-collapse:collapse;margin:8px 0 16px}"
    "table.t td,table.t th{border:1px solid #ddd;padding:4px 10px;text-align:left;font-size:13px}"
    ".ok{color:#1e8449;font-weight:bold}.no{color:#c0392b;font-weight:bold}"
    ".chart{margin:10px 0 18px}.chart svg{max-width:100%;height:auto}"
)


def _verdict_html(v: Verdict) -> str:
    items = []
    for t in v.targets:
        mark = "&#10003;" if t.met else "&#10007;"
        items.append(f"<li>{mark} {html.escape(t.line())}</li>")
    items += [f"<li>&#10007; {html.escape(c)}</li>" for c in v.failed_checks]
    items += [f"<li>note: {html.escape(n)}</li>" for n in v.notes]
    css = "pass" if v.passed else "fail"
    return f"<div class='verdict {css}'><b>{v.word}</b><ul>{''.join(items)}</ul></div>"


def _targets_table(v: Verdict) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(t.name)}</td>"
        f"<td>{'-' if t.value is None else f'{t.value:.4g}'}{html.escape(t.unit)}</td>"
        f"<td>{html.escape(t.op)} {t.goal:.4g}{html.escape(t.unit)}</td>"
        f"<td class='{'ok' if t.met else 'no'}'>{'met' if t.met else 'MISSED'}</td></tr>"
        for t in v.targets
    )
    return f"<table class='t'><tr><th>target</th><th>value</th><th>goal</th><th></th></tr>{rows}</table>"


def html_page(
    title: str,
    text_table: str,
    charts: Sequence[str],
    meta: dict[str, Any],
    verdict: Verdict | None = None,
    secrets: Iterable[str] = (),
) -> str:
    """The page: verdict first, then the targets, the charts, the figures and the parameters."""
    values = set(secrets) | secret_values(meta)
    head = _verdict_html(verdict) + _targets_table(verdict) if verdict is not None else ""
    params = json.dumps(redact(meta, values), indent=2, default=str)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        + head
        + "".join(f"<div class='chart'>{c}</div>" for c in charts)
        + f"<h2>Figures</h2><pre>{html.escape(redact_text(text_table, values))}</pre>"
        + f"<h2>Parameters</h2><pre>{html.escape(params)}</pre>"
        "</body></html>"
    )


def write(
    result_dir: Path,
    stem: str,
    result: dict[str, Any],
    text_table: str,
    charts: Sequence[str],
    verdict: Verdict | None = None,
    secrets: Iterable[str] = (),
) -> tuple[Path, Path]:
    """``<stem>.json`` and ``<stem>.html``, both redacted (``secrets``: values to hide besides
    those found under secret-looking keys)."""
    result_dir.mkdir(parents=True, exist_ok=True)
    values = set(secrets) | secret_values(result)
    if verdict is not None:
        result = {**result, "verdict": verdict.as_dict()}
    jpath = result_dir / f"{stem}.json"
    hpath = result_dir / f"{stem}.html"
    jpath.write_text(json.dumps(redact(result, values), indent=2, default=str))
    hpath.write_text(html_page(stem, text_table, charts, result.get("parameters", {}), verdict, values))
    return jpath, hpath

"""Reports: a terminal table, a JSON result file and a self-contained HTML page.

The page leads with a PASS/FAIL verdict against named targets, then charts drawn with
matplotlib (Agg backend, inlined as SVG: no JavaScript, nothing fetched), with the targets as
lines on them. Secrets never reach a report: ``redact`` runs over everything written.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")  # no red: red is a target
TARGET_COLOR = "#c0392b"

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


# ---- redaction ------------------------------------------------------------------------------
REDACTED = "***"
_SECRET_NAME = re.compile(r"secret|token|password|passwd|api_?keys?|dsn|database_url", re.IGNORECASE)
# scheme://user:PASSWORD@host
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]+)(?P<at>@)")
# ...?password=PASSWORD&... (libpq accepts it in the query string too)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<pw>[^&\s]+)", re.IGNORECASE)
# NAME=VALUE where NAME looks secret (gateway_env entries such as GATEWAY_META_APP_SECRETS=...)
_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.+)$", re.DOTALL)
# Values this short are not worth hiding and would mangle unrelated text if replaced everywhere.
_MIN_SECRET_LEN = 4


def _secret_values(obj: Any, under_secret: bool = False) -> set[str]:
    """Every string held under a secret-looking name, and every password inside a URL."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            found |= _secret_values(v, under_secret or bool(_SECRET_NAME.search(str(k))))
    elif isinstance(obj, list | tuple):
        for v in obj:
            found |= _secret_values(v, under_secret)
    elif isinstance(obj, str):
        for rx in (_URL_PASSWORD, _QUERY_PASSWORD):
            found.update(m.group("pw") for m in rx.finditer(obj))
        m = _ASSIGNMENT.match(obj)
        if m and _SECRET_NAME.search(m.group("name")):
            found.update(p.strip() for p in m.group("value").split(","))
        elif under_secret and "://" not in obj:
            found.update(p.strip() for p in obj.split(","))
    return {s for s in found if len(s) >= _MIN_SECRET_LEN and s != REDACTED}


def redact_text(text: str, values: Iterable[str] = ()) -> str:
    """Passwords in URLs, then every known secret value wherever it appears."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("at"), text)
    text = _QUERY_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    for v in sorted(values, key=len, reverse=True):  # longest first: a secret may contain another
        text = text.replace(v, REDACTED)
    return text


def redact(obj: Any, values: Iterable[str] | None = None) -> Any:
    """A copy with secrets replaced by ``***``: values under secret-looking keys (``meta_secret``,
    ``tenashi_secret``, ``*_token``, ...), passwords in URLs (``database_url``), and any of those
    values found again elsewhere (an argv, a log line, a warning)."""
    found = set(values) if values is not None else _secret_values(obj)

    def walk(x: Any, under_secret: bool) -> Any:
        if isinstance(x, dict):
            return {k: walk(v, under_secret or bool(_SECRET_NAME.search(str(k)))) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [walk(v, under_secret) for v in x]
        if isinstance(x, str):
            if under_secret and x and "://" not in x:
                return REDACTED
            m = _ASSIGNMENT.match(x)
            if m and _SECRET_NAME.search(m.group("name")):
                return f"{m.group('name')}={REDACTED}"
            return redact_text(x, found)
        return x

    return walk(obj, False)


# ---- verdict --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Target:
    """One named goal: ``value`` compared with ``goal`` (``<=`` or ``>=``)."""

    name: str
    value: float | None
    goal: float
    op: str  # "<=" | ">="
    unit: str = ""

    @property
    def met(self) -> bool:
        if self.value is None or math.isnan(self.value):
            return False
        return self.value <= self.goal if self.op == "<=" else self.value >= self.goal

    def line(self) -> str:
        value = "-" if self.value is None else f"{self.value:.4g}{self.unit}"
        return f"{self.name}: {value} (goal {self.op} {self.goal:.4g}{self.unit})"


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.word,
            "targets": [
                {"name": t.name, "value": t.value, "goal": t.goal, "op": t.op, "unit": t.unit, "met": t.met}
                for t in self.targets
            ],
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


# ---- charts ---------------------------------------------------------------------------------
def _pyplot() -> Any:
    """matplotlib on the Agg backend (no display), text kept as text in the SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",
            "font.size": 10,
            "axes.titlesize": 12,
            "axes.titleweight": "bold",
            "axes.grid": True,
            "grid.color": "#e5e5e5",
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # inline: drop the XML prolog and DOCTYPE


def _ms_formatter(v: float, _pos: int) -> str:
    return f"{v:g}"


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    y_label: str,
    *,
    targets: Sequence[tuple[str, float]] = (),
    log_y: bool = False,
    x_label: str = "seconds into the run",
    width_in: float = 10.0,
    height_in: float = 3.2,
) -> str:
    """Lines over time, with each target as a dashed horizontal line labelled with its value."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(width_in, height_in))
    ax.set_title(title, loc="left")
    plotted = False
    for i, (name, pts) in enumerate(series):
        clean = [(x, y) for x, y in pts if not math.isnan(y) and (y > 0 or not log_y)]
        if clean:
            ax.plot(
                [p[0] for p in clean],
                [p[1] for p in clean],
                label=name,
                color=COLORS[i % len(COLORS)],
                lw=1.4,
            )
            plotted = True
    for name, value in targets:
        ax.axhline(value, color=TARGET_COLOR, ls="--", lw=1.2, label=f"{name}: {value:g}")
    if not plotted:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#888")
    if log_y:
        ax.set_yscale("log")
        # 1, 2, 5, 10, 20, 50, ...: plain numbers a reader can take in at a glance.
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_ms_formatter))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(MaxNLocator(6))
    ax.xaxis.set_major_locator(MaxNLocator(10, integer=True))
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def bar_chart(
    title: str,
    bars: Sequence[tuple[str, float]],
    y_label: str,
    *,
    targets: Sequence[tuple[str, float]] = (),
    highlight: str | None = None,
    value_fmt: str = "{:,.0f}",
    log_y: bool = False,
) -> str:
    """Bars with their values written on them; targets as dashed lines across the chart."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    ax.set_title(title, loc="left")
    names = [b[0] for b in bars]
    values = [b[1] for b in bars]
    colors = [COLORS[0] if n == highlight else "#9aa7b4" for n in names]
    rects = ax.bar(names, values, color=colors, width=0.55)
    for rect, v in zip(rects, values, strict=True):
        ax.annotate(
            value_fmt.format(v),
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            xytext=(0, 3),
            textcoords="offset points",
        )
    for i, (name, value) in enumerate(targets):
        ax.axhline(
            value,
            color=TARGET_COLOR,
            ls=("--", ":", "-.")[i % 3],
            lw=1.2,
            label=f"{name}: {value_fmt.format(value)}",
        )
    ax.set_ylabel(y_label)
    top = max([*values, *(t[1] for t in targets), 1.0])
    if log_y:  # one saturated baseline would otherwise flatten the others to nothing
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        positive = [v for v in [*values, *(t[1] for t in targets)] if v > 0] or [1.0]
        ax.set_ylim(min(positive) / 2, top * 3)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_ms_formatter))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(0, top * 1.18)
    ax.grid(axis="x", visible=False)
    if targets:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _svg(fig)


def _series(rows: Sequence[dict[str, Any]], x: str, y: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(float(r[x]), float(r[y]) * scale) for r in rows if y in r and r[y] is not None]


def complete_seconds(timeline: Sequence[dict[str, Any]], duration_s: float | None) -> list[dict[str, Any]]:
    """The per-second rows of whole seconds inside the schedule: the last, partial second (and
    the stragglers answered after the schedule ended) would draw a fall to zero that is not one."""
    if not duration_s:
        return list(timeline[:-1]) if len(timeline) > 1 else list(timeline)
    return [r for r in timeline if float(r["t"]) + 1 <= duration_s]


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
            [(k[:-3], _series(tl, "t", k)) for k in ("p50_ms", "p99_ms", "max_ms")],
            "ms (log scale)",
            targets=lat_targets,
            log_y=True,
        ),
        line_chart(
            "Throughput per second",
            [("scheduled", _series(tl, "t", "sent")), ("answered", _series(tl, "t", "throughput"))],
            "requests/s",
            targets=[("target mean rate", float(result["target_rate"]))] if result.get("target_rate") else [],
        ),
    ]
    e2e = result.get("e2e_timeline", [])
    if e2e:
        charts.append(
            line_chart(
                "Receipt -> processed by the consumers",
                [("p50", _series(e2e, "t", "p50_ms")), ("p99", _series(e2e, "t", "p99_ms"))],
                "ms (log scale)",
                log_y=True,
            )
        )
    if any("pending" in s for s in samples):
        charts.append(
            line_chart(
                "Backlog (pending inbox rows)", [("pending", _series(samples, "t", "pending"))], "rows"
            )
        )
        charts.append(
            line_chart(
                "Consumer lag (oldest pending row)", [("lag", _series(samples, "t", "lag_s", 1000))], "ms"
            )
        )
    if any("rss_mb" in s for s in samples):
        charts.append(line_chart("Gateway resident memory", [("RSS", _series(samples, "t", "rss_mb"))], "MB"))
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
    values = set(secrets) | _secret_values(meta)
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
    values = set(secrets) | _secret_values(result)
    if verdict is not None:
        result = {**result, "verdict": verdict.as_dict()}
    jpath = result_dir / f"{stem}.json"
    hpath = result_dir / f"{stem}.html"
    jpath.write_text(json.dumps(redact(result, values), indent=2, default=str))
    hpath.write_text(html_page(stem, text_table, charts, result.get("parameters", {}), verdict, values))
    return jpath, hpath


# ---- re-rendering a saved result ------------------------------------------------------------
def render(json_path: Path, out_dir: Path | None = None) -> tuple[Path, Path, Verdict]:
    """Redact a saved result and re-draw its page (``python -m loadtest render FILE.json``)."""
    result = json.loads(json_path.read_text())
    result.pop("verdict", None)
    if "saturation" in result:  # a bench-ingest result
        from loadtest import bench_ingest

        verdict = bench_ingest.bench_verdict(result)
        text, charts = bench_ingest.bench_table(result), bench_ingest.bench_charts(result)
    else:
        p = result.get("parameters") or {}
        verdict = run_verdict(
            result,
            p50_ms=float(p.get("target_p50_ms") or META_P50_MS),
            p99_ms=float(p.get("target_p99_ms") or META_P99_MS),
        )
        text, charts = run_table(result), run_charts(result, verdict)
    jpath, hpath = write(out_dir or json_path.parent, json_path.stem, result, text, charts, verdict)
    return jpath, hpath, verdict

"""Reports: a terminal table, a JSON result file and a self-contained HTML page with inline SVG
charts (no JavaScript, nothing fetched)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


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
    e2e = result.get("verification", {}).get("e2e_ms") or {}
    if e2e:
        rows += [(f"receipt->processed {k}", f"{fmt_ms(e2e.get(k))} ms") for k in ("p50", "p99", "max")]
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
    v = result.get("verification")
    if v:
        out += "\n\n" + table(
            ("check", "ok", "detail"),
            [(c["name"], "yes" if c["ok"] else "NO", c["detail"]) for c in v["checks"]],
        )
    return out


# ---- SVG ------------------------------------------------------------------------------------
def svg_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    y_label: str,
    width: int = 900,
    height: int = 260,
    x_label: str = "seconds",
) -> str:
    """A line chart; one polyline per series, axes with five ticks each."""
    pts = [p for _, s in series for p in s if not math.isnan(p[1])]
    left, right, top, bottom = 60, 150, 28, 36
    w, h = width - left - right, height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
    ]
    out.append(f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>')
    if not pts:
        out.append(f'<text x="{left}" y="{top + 20}">no data</text></svg>')
        return "".join(out)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(p[1] for p in pts) * 1.05 or 1.0
    x1 = x1 if x1 > x0 else x0 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + h - (y / y1) * h

    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
    for i in range(6):
        yv = y1 * i / 5
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        xv = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{sx(xv):.1f}" y="{top + h + 14}" text-anchor="middle">{xv:.0f}</text>')
    out.append(
        f'<text x="{left + w / 2}" y="{height - 4}" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    out.append(
        f'<text x="14" y="{top + h / 2}" transform="rotate(-90 14 {top + h / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    for i, (name, s) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s if not math.isnan(y))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4" points="{line}"/>')
        ly = top + 12 + i * 16
        out.append(
            f'<line x1="{left + w + 10}" x2="{left + w + 28}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + w + 32}" y="{ly}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _series(rows: Sequence[dict[str, Any]], x: str, y: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(float(r[x]), float(r[y]) * scale) for r in rows if y in r and r[y] is not None]


def run_charts(result: dict[str, Any]) -> list[str]:
    tl = result.get("timeline", [])
    samples = result.get("samples", [])
    charts = [
        svg_chart(
            "Ack latency per second (from intended start)",
            [(f"{k[:-3]}", _series(tl, "t", k)) for k in ("p50_ms", "p99_ms", "max_ms")],
            "ms",
        ),
        svg_chart(
            "Throughput",
            [("sent/s", _series(tl, "t", "sent")), ("answered/s", _series(tl, "t", "throughput"))],
            "requests/s",
        ),
    ]
    e2e = result.get("e2e_timeline", [])
    if e2e:
        charts.append(
            svg_chart(
                "Receipt -> processed",
                [("p50", _series(e2e, "t", "p50_ms")), ("p99", _series(e2e, "t", "p99_ms"))],
                "ms",
            )
        )
    if any("pending" in s for s in samples):
        charts.append(
            svg_chart("Backlog (pending inbox rows)", [("pending", _series(samples, "t", "pending"))], "rows")
        )
        charts.append(
            svg_chart(
                "Consumer lag (oldest pending row)", [("lag", _series(samples, "t", "lag_s", 1000))], "ms"
            )
        )
    if any("rss_mb" in s for s in samples):
        charts.append(svg_chart("Gateway resident memory", [("RSS", _series(samples, "t", "rss_mb"))], "MB"))
    return charts


def html_page(title: str, text_table: str, charts: Sequence[str], meta: dict[str, Any]) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:24px;max-width:1000px}pre{background:#f6f6f6;padding:12px}</style>"
        f"</head><body><h1>{html.escape(title)}</h1>"
        f"<pre>{html.escape(text_table)}</pre>"
        + "".join(f"<div>{c}</div>" for c in charts)
        + f"<h2>Parameters</h2><pre>{html.escape(json.dumps(meta, indent=2, default=str))}</pre>"
        "</body></html>"
    )


def write(
    result_dir: Path, stem: str, result: dict[str, Any], text_table: str, charts: Sequence[str]
) -> tuple[Path, Path]:
    result_dir.mkdir(parents=True, exist_ok=True)
    jpath = result_dir / f"{stem}.json"
    hpath = result_dir / f"{stem}.html"
    jpath.write_text(json.dumps(result, indent=2, default=str))
    hpath.write_text(html_page(stem, text_table, charts, result.get("parameters", {})))
    return jpath, hpath

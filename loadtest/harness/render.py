"""``python -m loadtest render FILE.json``: a saved result redacted and its page re-drawn."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.harness import ingest_report, pipeline_report, report


def render(json_path: Path, out_dir: Path | None = None) -> tuple[Path, Path, report.Verdict]:
    """Redact a saved result and re-draw its page (``python -m loadtest render FILE.json``):
    judged again where the command's judge works from the figures (run, bench-ingest,
    bench-pipeline), else with the verdict it was saved with."""
    result = json.loads(json_path.read_text())
    saved = result.pop("verdict", None)
    command = result.get("command")
    charts: list[str] = []
    if command == "bench-pipeline":
        verdict = pipeline_report.verdict(result)
        text = pipeline_report.table(result)
    elif command not in (None, "run", "bench-ingest"):
        verdict = report.Verdict.from_dict(saved or {})
        text = json.dumps({k: v for k, v in result.items() if k != "parameters"}, indent=2)
    elif "saturation" in result or "fixed" in result:  # a bench-ingest result
        verdict = ingest_report.bench_verdict(result)
        text, charts = ingest_report.bench_table(result), ingest_report.bench_charts(result)
    else:
        p = result.get("parameters") or {}
        verdict = report.run_verdict(
            result,
            p50_ms=float(p.get("target_p50_ms") or report.META_P50_MS),
            p99_ms=float(p.get("target_p99_ms") or report.META_P99_MS),
        )
        text, charts = report.run_table(result), report.run_charts(result, verdict)
    jpath, hpath = report.write(out_dir or json_path.parent, json_path.stem, result, text, charts, verdict)
    return jpath, hpath, verdict

"""The report of ``python -m loadtest bench-ingest``: its verdict against the targets, its
terminal table and its charts (also used to re-draw a saved result, loadtest.harness.render)."""

from __future__ import annotations

import statistics
from typing import Any

from loadtest.harness import fixed, report
from loadtest.harness.charts import bar_chart, complete_seconds, line_chart, series

TARGET_VS_BARE = 0.85
TARGET_VS_INSERT = 3.5
TARGET_P99_MS = 25.0
TARGET_P50_MS = 5.0
SERVERS = ("bare", "insert", "gateway")


def bench_verdict(result: dict[str, Any]) -> report.Verdict:
    """PASS when every target of the phases run is met (ratios against baselines of the same run)."""
    v = report.Verdict()
    t = result.get("targets") or {}
    if "gateway_vs_bare" in t:
        rounds = result.get("ratio_rounds") or {}
        for key, name, goal in (
            ("gateway_vs_bare", "gateway / bare throughput", TARGET_VS_BARE),
            ("gateway_vs_insert", "gateway / insert-per-request throughput", TARGET_VS_INSERT),
        ):
            per_round = tuple(rounds.get(key, ()))
            v.targets.append(report.Target(name, t[key]["value"], goal, ">=", "x", per_round))
    if "p99_ms_at_half" in t:
        v.targets += [
            report.Target(
                "gateway p99 ack at half load", t["p99_ms_at_half"]["value"], TARGET_P99_MS, "<=", " ms"
            ),
            report.Target(
                "gateway p50 ack at half load", t["p50_ms_at_half"]["value"], TARGET_P50_MS, "<=", " ms"
            ),
        ]
        errors = {name: h["errors"] for name, h in result["half"].items() if h.get("errors")}
        if errors.get("gateway"):
            v.failed_checks.append(f"gateway errors at half load: {errors['gateway']}")
    if "fixed" in result:
        fx = result["fixed"]
        for key, ratio in fx["ratios"].items():
            goal = fixed.TARGET_EDGE if key.startswith("edge") else fixed.TARGET_SERVE
            v.targets.append(report.Target.median(f"wrk {key} throughput", ratio["rounds"], goal, ">=", "x"))
        for key, ratio in fx.get("cost_ratios", {}).items():
            v.targets.append(
                report.Target.median(f"wrk {key}", ratio["rounds"], fixed.TARGET_SERVE_COST, "<=", "x")
            )
        for run in fx["runs"]:
            if run["non2xx"] or run["socket_errors"]:
                v.failed_checks.append(
                    f"wrk {run['server']} -c{run['connections']} round {run['round'] + 1}: "
                    f"{run['non2xx']} non-2xx, {run['socket_errors']} socket errors"
                )
            if run["server"] == "serve" and not fixed.kept_up(run):
                v.failed_checks.append(
                    f"serve -c{run['connections']} round {run['round'] + 1}: the consumers fell behind "
                    f"({run['backlog_end']} rows pending at the end of the run, at {run['rate']:.0f}/s)"
                )
    v.notes += list(result.get("restarts") or [])
    return v


def bench_charts(result: dict[str, Any]) -> list[str]:
    """The headline first: saturation throughput of the three servers, the targets as lines."""
    charts: list[str] = []
    if "fixed" in result:
        fx = result["fixed"]
        for c in fx["levels"]:
            runs = [r for r in fx["runs"] if r["connections"] == c]
            rates = {name: [r["rate"] for r in runs if r["server"] == name] for name in fixed.SERVERS}
            med = {name: statistics.median(v) if v else 0.0 for name, v in rates.items()}
            charts.append(
                bar_chart(
                    f"wrk -t1 -c{c}: requests/s (median of rounds)",
                    [(name, med[name]) for name in fixed.SERVERS],
                    "requests/s",
                    targets=[
                        (f"edge target {fixed.TARGET_EDGE} x bare", fixed.TARGET_EDGE * med["bare"]),
                        (f"serve target {fixed.TARGET_SERVE} x bare", fixed.TARGET_SERVE * med["bare"]),
                    ],
                    highlight="serve",
                )
            )
    if "saturation" not in result:
        return charts
    sat = result["saturation"]
    charts += [
        bar_chart(
            "Saturation throughput (closed loop, median of rounds)",
            [(name, sat[name]) for name in SERVERS],
            "requests/s",
            targets=[
                (f"target {TARGET_VS_BARE} x bare", TARGET_VS_BARE * sat["bare"]),
                (f"target {TARGET_VS_INSERT} x insert", TARGET_VS_INSERT * sat["insert"]),
            ],
            highlight="gateway",
        ),
    ]
    if not result.get("half"):
        return charts
    charts += [
        bar_chart(
            f"Ack p99 at {result['half_rate']:.0f}/s (half the gateway's saturation)",
            [(name, float(result["half"][name]["ack_ms"].get("p99") or 0.0)) for name in SERVERS],
            "ms (log scale)",
            targets=[("target gateway p99", TARGET_P99_MS)],
            highlight="gateway",
            value_fmt="{:,.1f}",
            log_y=True,
        ),
    ]
    for name, r in result["half"].items():
        tl = complete_seconds(r["timeline"], r.get("duration_s"))
        charts.append(
            line_chart(
                f"{name}: ack latency per second at {result['half_rate']:.0f}/s",
                [(k[:-3], series(tl, "t", k)) for k in ("p50_ms", "p99_ms", "max_ms")],
                "ms (log scale)",
                targets=[("target p99", TARGET_P99_MS), ("target p50", TARGET_P50_MS)]
                if name == "gateway"
                else [],
                log_y=True,
            )
        )
    return charts


def bench_table(r: dict[str, Any]) -> str:
    start, end = _load(r.get("load_average")), _load(r.get("load_average_after"))
    out = f"load average (1, 5, 15 min) at the start {start}, at the end {end}\n\n"
    if "saturation" in r:
        out += _closed_loop_table(r)
    if "fixed" in r:
        out += ("\n\n" if "saturation" in r else "") + fixed_table(r["fixed"])
    return out


def _load(avg: list[float] | None) -> str:
    return "-" if not avg else " / ".join(f"{x:.2f}" for x in avg)


def fixed_table(fx: dict[str, Any]) -> str:
    """One row per wrk run; then the ratios, taken within each round."""
    rows = []
    for run in fx["runs"]:
        cpu = run["cpu"]
        backlog = "-"
        if run["server"] == "serve":
            backlog = f"max {run['backlog_max']}, end {run['backlog_end']}, drained {run['drain_s']} s"
        rows.append(
            (
                f"{run['round'] + 1}",
                f"{run['connections']}",
                run["server"],
                f"{run['rate']:.0f}",
                f"{run['p50_ms']:.2f}",
                f"{run['p99_ms']:.2f}",
                " / ".join(f"{cpu.get(k, 0):.2f}" for k in ("server", "postgres", "machine", "steal")),
                " + ".join(f"{run.get('us_per_request', {}).get(k, 0):.0f}" for k in ("server", "postgres")),
                f"{run['non2xx']}/{run['socket_errors']}",
                str(run["repeats"]),
                backlog,
            )
        )
    out = (
        "fixed connections (wrk -t1; cores used: server tree / postgres / machine / stolen; CPU per request "
        "until the run's work is done)\n"
    )
    head = ("round", "conns", "server", "req/s", "p50 ms", "p99 ms", "cores", "us/req srv + pg", "non2xx/err",
            "repeats")  # fmt: skip
    out += report.table((*head, "backlog"), rows)
    ratio_rows = []
    for key, ratio in fx["ratios"].items():
        goal = fixed.TARGET_EDGE if key.startswith("edge") else fixed.TARGET_SERVE
        ratio_rows.append(
            (
                key,
                f"{ratio['median']:.2f}",
                " / ".join(f"{x:.2f}" for x in ratio["rounds"]),
                f">= {goal}",
                _yes(ratio["median"] >= goal),
            )
        )
    for key, ratio in fx.get("cost_ratios", {}).items():
        ratio_rows.append(
            (
                key,
                f"{ratio['median']:.2f}",
                " / ".join(f"{x:.2f}" for x in ratio["rounds"]),
                f"<= {fixed.TARGET_SERVE_COST}",
                _yes(ratio["median"] <= fixed.TARGET_SERVE_COST),
            )
        )
    return out + "\n\n" + report.table(("ratio", "median", "rounds", "goal", "met"), ratio_rows)


def _closed_loop_table(r: dict[str, Any]) -> str:
    sat_rows = []
    half_rows = []
    for name in SERVERS:
        cpu = r["saturation_cpu"][name]
        sat_rows.append(
            (
                name,
                f"{r['saturation'][name]:.0f}",
                " / ".join(f"{x:.0f}" for x in r["saturation_rounds"][name]),
                " / ".join(f"{c['server']:.2f}" for c in cpu),
                " / ".join(f"{c['postgres']:.2f}" for c in cpu),
                " / ".join(f"{c['machine']:.2f}" for c in cpu),
                " / ".join(f"{g:.2f}" for g in r["saturation_generator_cpu"][name]),
            )
        )
        h = r["half"][name]
        ack = h["ack_ms"]
        us = h["cpu_us_per_request"]
        half_rows.append(
            (
                name,
                f"{h['rate_reached']:.0f}",
                *(report.fmt_ms(ack.get(k)) for k in ("p50", "p90", "p99", "p99.9", "max")),
                " / ".join(report.fmt_ms(x["ack_ms"].get("p99")) for x in r["half_rounds"][name]),
                f"{us.get('server', 0):.0f} + {us.get('postgres', 0):.0f}",
                ", ".join(f"{k}={v}" for k, v in h["errors"].items()) or "-",
            )
        )
    out = table_head(r)
    out += "saturation (closed loop; cores used per round: server, postgres, whole machine, generator)\n"
    if not r.get("half"):
        return out + report.table(
            ("server", "median/s", "rounds/s", "server", "postgres", "machine", "generator"), sat_rows
        )
    out += report.table(
        ("server", "median/s", "rounds/s", "server", "postgres", "machine", "generator"), sat_rows
    )
    rounds = len(r["half_rounds"]["gateway"])
    out += f"\n\nopen model at {r['half_rate']:.0f}/s (the median-p99 round of {rounds})\n"
    out += report.table(
        (
            "server",
            "rate/s",
            "p50 ms",
            "p90",
            "p99",
            "p99.9",
            "max",
            "p99 rounds",
            "cpu us/req srv+pg",
            "errors",
        ),
        half_rows,
    )
    t = r["targets"]
    rr = r["ratio_rounds"]
    out += "\n\n" + report.table(
        ("target", "value", "rounds", "goal", "met"),
        [
            (
                "gateway / bare throughput",
                f"{t['gateway_vs_bare']['value']:.2f}",
                " / ".join(f"{x:.2f}" for x in rr["gateway_vs_bare"]),
                f">= {TARGET_VS_BARE}",
                _yes(t["gateway_vs_bare"]["met"]),
            ),
            (
                "gateway / insert-per-request",
                f"{t['gateway_vs_insert']['value']:.2f}x",
                " / ".join(f"{x:.2f}" for x in rr["gateway_vs_insert"]),
                f">= {TARGET_VS_INSERT}x",
                _yes(t["gateway_vs_insert"]["met"]),
            ),
            (
                "gateway p99 ack at half load",
                f"{report.fmt_ms(t['p99_ms_at_half']['value'])} ms",
                "",
                f"<= {TARGET_P99_MS} ms",
                _yes(t["p99_ms_at_half"]["met"]),
            ),
            (
                "gateway p50 ack at half load",
                f"{report.fmt_ms(t['p50_ms_at_half']['value'])} ms",
                "",
                f"<= {TARGET_P50_MS} ms",
                _yes(t["p50_ms_at_half"]["met"]),
            ),
        ],
    )
    for name in SERVERS:
        for run in r["half_rounds"][name]:
            for w in run["warnings"]:
                if not w.startswith("t="):
                    out += f"\nnote ({name}): {w}"
    return out


def table_head(r: dict[str, Any]) -> str:
    p = r["parameters"]
    return (
        f"ingest benchmark: scenario {p['scenario']}, mean request {r['mean_request_bytes']} bytes, "
        f"closed loop best of {p['concurrency']} clients x {p['duration']}s x {p['rounds']} rounds, "
        f"then {r['half_rate']:.0f}/s open model (half the gateway's saturation)\n\n"
    )


def _yes(b: bool) -> str:
    return "yes" if b else "NO"

"""The report of ``python -m loadtest bench-pipeline``: its judge (the targets and checks, from
the figures alone, so that a saved result can be judged again) and its terminal table."""

from __future__ import annotations

from typing import Any

from loadtest.harness import fixed, pgstat, report

TARGET_P99_MS = 100.0
TARGET_RSS_MB = 150.0
TARGET_COST = 2.0  # the gateway's CPU per webhook (its processes + PostgreSQL) / the bare relay's
TARGET_SATURATION = 0.6  # the pipeline's saturation / the bare relay's
CORES = ("server", "postgres", "machine", "steal")


def rss_verdict(
    rss: dict[str, list[tuple[float, float]]], seconds: float
) -> list[tuple[str, float, float, float]]:
    """Per process: (name, peak of the first minute, peak of the last minute, peak)."""
    out = []
    for name, series in rss.items():
        first = [v for t, v in series if t <= 60.0] or [series[0][1]]
        last = [v for t, v in series if t >= seconds - 60.0] or [series[-1][1]]
        out.append((name, max(first), max(last), max(v for _, v in series)))
    return out


def verdict(r: dict[str, Any]) -> report.Verdict:
    v = report.Verdict()
    cost = r.get("cost")
    if cost is not None:
        rounds = [x["ratio"] for x in cost["rounds"]]
        v.targets.append(
            report.Target.median(
                f"pipeline cost at {cost['rate']:.0f}/s: CPU per webhook, serve + PostgreSQL / bare relay",
                rounds, TARGET_COST, "<=", "x",
            )
        )  # fmt: skip
        for x in cost["rounds"]:
            for who in ("bare", "relay", "alone", "gateway"):
                if who not in x:
                    continue
                if x[who].get("errors"):
                    failed = x[who]["errors"]
                    v.failed_checks.append(f"cost round {x['round'] + 1}: {who}: {failed} webhooks failed")
                missing = {k: n for k, n in x[who]["missing"].items() if n}
                if missing:
                    v.failed_checks.append(
                        f"cost round {x['round'] + 1}: {who} left events undelivered: {missing}"
                    )
    pipe, relay = r.get("pipeline"), r.get("relay_saturation")
    if pipe is not None and relay is not None and relay["rate"]:
        v.targets.append(
            report.Target(
                "pipeline saturation / the bare relay's",
                pipe["rate"] / relay["rate"],
                TARGET_SATURATION,
                ">=",
                "x",
            )
        )
    lat = r.get("latency")
    if lat is not None:
        for name, d in lat["destinations"].items():
            v.targets.append(
                report.Target(
                    f"receipt -> {d['format']} destination 2xx p99 at {lat['rate']:.0f}/s", d["p99_ms"],
                    TARGET_P99_MS, "<=", " ms",
                )
            )  # fmt: skip
            for what in ("missing", "duplicates", "bad_signatures"):
                if d[what]:
                    v.failed_checks.append(f"{name}: {d[what]} {what.replace('_', ' ')}")
        if lat["acks"]["errors"]:
            v.failed_checks.append(f"webhooks not acknowledged: {lat['acks']['errors']}")
    if pipe is not None and not pipe["rate"]:
        v.failed_checks.append(f"the pipeline kept up at no rate probed (from {pipe['low']:.0f}/s)")
    sat = r.get("saturation")
    if sat is not None:
        for run in sat["runs"]:
            if not fixed.kept_up(run):
                v.failed_checks.append(f"saturation -c{run['connections']}: the consumers fell behind")
    if "soak" in r:
        s = r["soak"]
        seen: dict[str, int] = {}
        for process, first, last, peak in rss_verdict(s["rss"], s["seconds"]):
            role = process.split()[0]  # "worker 1234": the pid differs from run to run
            seen[role] = seen.get(role, 0) + 1
            name = role if seen[role] == 1 else f"{role} #{seen[role]}"
            v.targets.append(report.Target(f"RSS {name} peak", peak, TARGET_RSS_MB, "<=", " MB"))
            v.targets.append(
                report.Target(
                    f"RSS {name} last-minute growth", last - first, min(20.0, 0.1 * first), "<=", " MB"
                )
            )
        if r.get("deliveries_drained_s") is None:
            v.failed_checks.append("deliveries not drained within 120 s after the soak")
        if set(r["deliveries"]) - {"delivered"}:
            v.failed_checks.append(f"deliveries not all delivered: {r['deliveries']}")
    return v


def _cores(cpu: dict[str, float]) -> str:
    return " / ".join(f"{cpu.get(k, 0):.2f}" for k in CORES)


def _split_row(x: dict[str, Any]) -> tuple[str, ...]:
    """A --split cost round: receiving (the bare handler), the relay's POSTs on top of it,
    serve alone, storing (serve alone less receiving) and forwarding (serve less serve alone)."""
    bare, relay, alone, both = (x[k]["us"] for k in ("bare", "relay", "alone", "gateway"))
    share = f"{alone / relay:.2f}" if relay else "-"
    cells = (x["round"] + 1, bare, relay - bare, alone, alone - bare, both - alone)
    return (*(f"{v:.0f}" for v in cells), share)


def table(r: dict[str, Any]) -> str:
    out = ""
    if "saturation" in r:
        runs = r["saturation"]["runs"]
        out += "ingest saturation of the default serve (destinations disabled)\n" + report.table(
            ("conns", "req/s", "p99 ms", "backlog end", "drained s", "cores srv / pg / machine / stolen"),
            [
                (str(x["connections"]), f"{x['rate']:.0f}", f"{x['p99_ms']:.1f}", str(x["backlog_end"]),
                 str(x["drain_s"]), _cores(x["cpu"]))
                for x in runs
            ],
        )  # fmt: skip
    if "relay_saturation" in r:
        rs = r["relay_saturation"]
        out += "\n\nthe bare relay's saturation (wrk, both destinations)\n" + report.table(
            ("conns", "req/s", "p99 ms", "non-2xx / errors"),
            [(str(x["connections"]), f"{x['rate']:.0f}", f"{x['p99_ms']:.1f}", f"{x['non2xx']}/{x['errors']}")
             for x in rs["runs"]],
        )  # fmt: skip
    if "pipeline" in r:
        pipe = r["pipeline"]
        out += (
            f"\n\npipeline saturation (both destinations enabled): {pipe['rate']:.0f} webhooks/s "
            f"(kept up there; fell behind at {pipe['high']:.0f}/s)\n"
        )
        out += report.table(
            ("probe req/s", "staged left", "deliveries left", "errors", "kept up", "settled s"),
            [
                (f"{x['rate']:.0f}", str(x["pending"]), str(x["undelivered"]), str(x["errors"]),
                 "yes" if x["kept_up"] else "no", str(x["settled_s"]))
                for x in pipe["probes"]
            ],
        )  # fmt: skip
    if "cost" in r:
        c = r["cost"]
        out += (
            f"\n\npipeline cost at {c['rate']:.0f} webhooks/s for {c['seconds']:.0f} s, both destinations: "
            "CPU per webhook (us) until every event was delivered\n"
        )
        out += report.table(
            ("round", "relay", "serve", "postgres", "serve + pg", "ratio", "serve's roles (us)"),
            [
                (str(x["round"] + 1), f"{x['relay']['us']:.0f}", f"{x['gateway']['serve_us']:.0f}",
                 f"{x['gateway']['postgres_us']:.0f}", f"{x['gateway']['us']:.0f}", f"{x['ratio']:.2f}",
                 ", ".join(f"{k} {v:.0f}" for k, v in x["gateway"]["roles_us"].items()))
                for x in c["rounds"]
            ],
        )  # fmt: skip
        split = [x for x in c["rounds"] if "bare" in x and "alone" in x]
        if split:
            out += (
                "\n\nwhere it goes (--split; us per webhook): the bare handler receives and verifies; "
                "serve alone is serve with the destinations disabled\n"
            )
            out += report.table(
                ("round", "bare handler", "relay's POSTs", "serve alone", "storing", "forwarding",
                 "serve alone / relay"),
                [_split_row(x) for x in split],
            )  # fmt: skip
        if c.get("statements") is not None:
            webhooks = c["rounds"][-1]["gateway"]["webhooks"]
            out += "\n\n" + pgstat.describe(c["statements"], per=webhooks, when=" (serve, the last round)")
    lat = r.get("latency")
    if lat is not None:
        seconds = r["parameters"]["seconds"]
        out += (
            f"\n\nreceipt -> downstream 2xx at {lat['rate']:.0f} webhooks/s for {seconds:.0f} s "
            f"({lat['events']} events, each to both destinations)\n"
        )
        out += report.table(
            ("destination", "format", "p50 ms", "p90", "p99", "max", "processed", "missing", "dups", "bad sig"),  # noqa: E501
            [
                (name, d["format"], *(f"{d[k]:.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
                 str(d["processed"]), str(d["missing"]), str(d["duplicates"]), str(d["bad_signatures"]))
                for name, d in lat["destinations"].items()
            ],
        )  # fmt: skip
        out += "\n\nwhere the time went (every event and destination; the database's and receivers' clocks)\n"
        out += report.table(
            ("segment", "p50 ms", "p90", "p99", "max"),
            [
                (k, *(f"{v[q]:.1f}" if q in v else "-" for q in ("p50_ms", "p90_ms", "p99_ms", "max_ms")))
                for k, v in lat.get("segments", {}).items()
            ],
        )
        out += "\ncores used meanwhile: " + ", ".join(f"{k} {v:.2f}" for k, v in lat.get("cores", {}).items())
        out += " (steal: taken by the hypervisor)" if lat.get("cores", {}).get("steal") else ""
    if "soak" in r:
        s = r["soak"]
        out += f"\n\nsoak: {s['seconds']:.0f} s at {s['rate']:.0f}/s, {s['sent']} webhooks"
        out += f", errors {s['errors']}\n"
        out += report.table(
            ("process", "first minute peak MB", "last minute peak MB", "peak MB"),
            [(n, f"{a:.1f}", f"{b:.1f}", f"{c:.1f}") for n, a, b, c in rss_verdict(s["rss"], s["seconds"])],
        )
        out += f"\ndeliveries drained {r.get('deliveries_drained_s')} s after the soak"
    out += f"\ndeliveries by state: {r.get('deliveries')}"
    return out.lstrip("\n")

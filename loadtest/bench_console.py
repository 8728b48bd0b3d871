"""bench-console: every console page's time with 1 M dead items, 10 M outbox rows, 10 M
deliveries and 2 M webhooks staged today (the target: each page <= 200 ms).

The tables are filled server-side (generate_series), then a real `gateway console` process
serves the pages and a logged-in client asks each one several times, first pages and pages
deep inside each list (by their cursors), every filter, the detail pages and the confirmation
steps of bulk actions. A page's figure is the median of its timed requests (one warm-up
first); the stylesheet's time is the baseline of a request that does no database work. Prints
one line per page and exits 1 when any page misses the target.

Embedded PostgreSQL in a temporary directory, or DATABASE_URL (a scratch database is created
and dropped there).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg

from gateway.core.console import cursor
from gateway.store.db import connect, migrate
from gateway.testing.scratch import scratch_database
from loadtest.harness import contract, database, processes, report
from loadtest.harness.sql import queries

SQL = queries("console.sql")
HELP = "every console page's time with 1 M dead items, 10 M outbox rows, 10 M deliveries, 2 M webhooks today"
TARGET_MS = 200.0
TOKEN = "bench-token-0123456789abcdef"
CHUNK = 1_000_000
GROUP_COMMIT = 100  # staged webhooks per transaction, about what the group commit writes at load


@dataclass(frozen=True, slots=True)
class Page:
    name: str
    path: str
    form: dict[str, str] | None = None  # a POST (a confirmation step), with the session's CSRF


@dataclass(frozen=True, slots=True)
class Timing:
    name: str
    median_ms: float
    max_ms: float

    @property
    def ok(self) -> bool:
        return self.median_ms <= TARGET_MS


async def _chunks(
    conn: asyncpg.Connection, query: str, total: int, label: str, chunk: int = CHUNK
) -> None:
    started = time.monotonic()
    for lo in range(1, total + 1, chunk):
        hi = min(total, lo + chunk - 1)
        await conn.execute(SQL[query], lo, hi, total)
    print(f"  {label}: {total:,} rows in {time.monotonic() - started:.0f} s", flush=True)


async def fill(dsn: str, ns: argparse.Namespace) -> None:
    conn = await connect(dsn)
    try:
        await migrate(conn)
        await conn.execute("SET synchronous_commit = off; SET maintenance_work_mem = '1GB'")
        await conn.fetchval(SQL["console_fill_partitions"])
        indexes = await conn.fetch(SQL["console_secondary_indexes"])
        for ix in indexes:
            await conn.execute(f'DROP INDEX "{ix["name"]}"')
        await conn.execute(SQL["console_fill_destinations"])
        await _chunks(conn, "console_fill_dead_events", ns.dead, "dead events")
        await _chunks(conn, "console_fill_inbox", ns.dead // 5, "staged webhooks (every 10th dead)")
        if ns.inbox:
            await _chunks(
                conn, "console_fill_inbox_today", ns.inbox, "webhooks staged in the last hour", GROUP_COMMIT
            )
        await conn.execute(SQL["console_fill_read"])
        await _chunks(conn, "console_fill_outbox", ns.outbox, "outbox")
        await _chunks(conn, "console_fill_deliveries", ns.deliveries, "deliveries")
        await _chunks(conn, "console_fill_inbound", ns.dead, "inbound messages")
        await _chunks(conn, "console_fill_audit", 10_000, "audit entries")
        started = time.monotonic()
        for ix in indexes:
            await conn.execute(ix["def"])
        await conn.execute("VACUUM ANALYZE")
        print(
            f"  {len(indexes)} indexes built, VACUUM ANALYZE: {time.monotonic() - started:.0f} s", flush=True
        )
    finally:
        await conn.close()


async def pages(dsn: str) -> list[Page]:
    """What is measured, naming rows from the middle of each table."""
    conn = await connect(dsn)
    try:
        dead = await conn.fetchrow(SQL["console_pick_dead"])
        send = await conn.fetchrow(SQL["console_pick_send"])
        dl = await conn.fetchrow(SQL["console_pick_delivery"])
        msg = await conn.fetchrow(SQL["console_pick_message"])
        assert dead and send and dl and msg, "the fill left a table empty"
        await conn.execute(SQL["console_pick_statuses"], send["wamid"])
    finally:
        await conn.close()
    deep_dead = cursor(dead["received_at"], dead["id"])
    deep_dl = cursor(dl["received_at"], dl["id"])
    d = dl["name"]
    return [
        Page("overview", "/"),
        Page("dead items", "/dead"),
        Page("dead items, deep page", f"/dead?r={dead['id']}&e={deep_dead}"),
        Page("dead items, retrying", "/dead?state=retry"),
        Page("dead items, rare kind", "/dead?kind=account_error"),
        Page("dead items, kind none has", "/dead?kind=account_update"),
        Page("dead items, time range", "/dead?since=3d&until=2d"),
        Page("dead webhooks only", "/dead?kind=row"),
        Page("dead event", f"/dead/E{dead['id']}"),
        Page("outbox", "/outbox"),
        Page("outbox, deep page", f"/outbox?after={send['id']}"),
        Page("outbox review", "/outbox?state=review"),
        Page("outbox failed", "/outbox?state=failed"),
        Page("outbox cancelled, deep", f"/outbox?state=cancelled&after={send['id']}"),
        Page("outbox pending (scan)", "/outbox?state=pending"),
        Page("outbox rare tenant (scan)", "/outbox?tenant=tiny"),
        Page("outbox review of a tenant", "/outbox?state=review&tenant=tiny"),
        Page("outbox by recipient", f"/outbox?recipient={send['recipient']}"),
        Page("outbox by key", f"/outbox?key={send['idem_key']}"),
        Page("outbox by wamid", f"/outbox?wamid={send['wamid']}"),
        Page("a send's story", f"/outbox/send?tenant={send['tenant']}&key={send['idem_key']}"),
        Page("destinations", "/destinations"),
        Page("deliveries", f"/destinations/{d}"),
        Page("deliveries, deep page", f"/destinations/{d}?after={deep_dl}"),
        Page("deliveries failed", f"/destinations/{d}?state=failed"),
        Page("deliveries pending (scan)", f"/destinations/{d}?state=pending"),
        Page("deliveries, time range", f"/destinations/{d}?since=5d&until=4d"),
        Page("senders", "/senders"),
        Page("inbound", "/inbound"),
        Page("inbound, deep page", f"/inbound?after={msg['id']}"),
        Page("inbound by customer (scan)", f"/inbound?customer={msg['sender']}"),
        Page("inbound by wamid", f"/inbound?wamid={msg['wamid']}"),
        Page("an inbound message", f"/inbound/message?wamid={msg['wamid']}"),
        Page("audit log", "/audit"),
        Page("confirm: replay dead, 1 day", "/dead/replay", {"range": "yes", "since": "2d", "until": "1d"}),
        Page(
            "confirm: replay failed deliveries", "/deliveries/replay", {"destination": d, "state": "failed"}
        ),
        Page("confirm: release failed sends", "/outbox/bulk", {"action": "release", "state": "failed"}),
    ]


async def measure(base: str, todo: list[Page], rounds: int) -> tuple[list[Timing], float]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base}/login") as r:
            nonce = re.search(r'name="_nonce" value="([^"]+)"', await r.text())
        assert nonce
        async with http.post(f"{base}/login", data={"token": TOKEN, "_nonce": nonce.group(1)}) as r:
            page = await r.text()
        csrf = re.search(r'name="_csrf" value="([^"]+)"', page)
        assert csrf, "could not log in"

        async def once(p: Page) -> float:
            started = time.perf_counter()
            if p.form is None:
                req = http.get(f"{base}{p.path}")
            else:
                req = http.post(f"{base}{p.path}", data={**p.form, "_csrf": csrf.group(1)})
            async with req as r:
                body = await r.read()
                if r.status != 200:
                    raise SystemExit(f"{p.name}: {p.path} answered {r.status}: {body[:300]!r}")
            return (time.perf_counter() - started) * 1000

        out = []
        for p in todo:
            await once(p)
            times = [await once(p) for _ in range(rounds)]
            out.append(Timing(p.name, statistics.median(times), max(times)))
        baseline = [await once(Page("stylesheet", "/static/console.css")) for _ in range(rounds)]
    return out, statistics.median(baseline)


async def serve_and_measure(dsn: str, rounds: int, log_dir: Path) -> tuple[list[Timing], float]:
    todo = await pages(dsn)
    console = processes.start_console(dsn, TOKEN, log_dir)
    try:
        await console.wait_ready("/login")
        return await measure(console.url, todo, rounds)
    finally:
        console.stop()


async def bench(admin_dsn: str, ns: argparse.Namespace, run: contract.Run) -> str:
    async with scratch_database(admin_dsn, "bench_console") as dsn:
        print(
            f"filling: {ns.dead:,} dead events, {ns.outbox:,} outbox rows, {ns.deliveries:,} deliveries, "
            f"{ns.inbox:,} webhooks staged today",
            flush=True,
        )
        await fill(dsn, ns)
        timings, baseline = await serve_and_measure(dsn, ns.rounds, run.log_dir)
    width = max(len(t.name) for t in timings)
    lines = [f"{'page':{width}}  median    max  (median of {ns.rounds})"]
    lines += [f"{t.name:{width}}  {t.median_ms:6.1f}  {t.max_ms:6.1f}" for t in timings]
    lines.append(f"{'baseline: the stylesheet':{width}}  {baseline:6.1f}")
    slowest = max(timings, key=lambda t: t.median_ms)
    run.target(
        report.Target(f"the slowest console page ({slowest.name})", slowest.median_ms, TARGET_MS, "<=", " ms")
    )
    missed = [t.name for t in timings if not t.ok]
    run.check(f"every page within {TARGET_MS:.0f} ms", not missed, f"missed: {', '.join(missed)}")
    run.figures = {"pages": [dataclasses.asdict(t) for t in timings], "baseline_ms": baseline}
    return "\n".join(lines)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dead", type=int, default=1_000_000, help="dead events (and as many inbound messages)")
    p.add_argument("--outbox", type=int, default=10_000_000, help="outbox rows")
    p.add_argument("--deliveries", type=int, default=10_000_000, help="deliveries")
    p.add_argument(
        "--inbox", type=int, default=2_000_000, help="webhooks staged today, all read by the consumers"
    )
    p.add_argument("--rounds", type=int, default=7, help="timed requests per page")


async def main(ns: argparse.Namespace) -> int:
    run = contract.Run(ns)
    with database.server("bench-console") as (admin_dsn, embedded):
        if embedded:
            await database.configure(admin_dsn, database.BULK_FILL)
        text = await bench(admin_dsn, ns, run)
    return run.finish({}, text)

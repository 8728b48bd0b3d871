"""bench-console end to end on small tables: it fills them, serves the console, asks every
page (each must answer 200) and reports each page against the target. (It says nothing about
speed here: the figures come from a run at full size, docs/console.md.)"""

from __future__ import annotations

from tests.support.procs import run_loadtest


def test_bench_console_asks_every_page(pg_admin_dsn: str) -> None:
    args = ["bench-console", "--dead", "3000", "--outbox", "5000", "--deliveries", "5000", "--inbox", "2000"]
    args += ["--rounds", "1"]
    done = run_loadtest(*args, database_url=pg_admin_dsn)
    assert "answered" not in done.stdout + done.stderr, done.stdout + done.stderr  # every page: 200
    lines = done.stdout.splitlines()
    summary = lines[-1]  # the verdict
    assert summary == "PASS" or summary.startswith("FAIL: "), done.stdout[-2000:]
    assert done.returncode == (0 if summary == "PASS" else 1)
    assert any(line.startswith(("met ", "MISSED ")) and "slowest console page" in line for line in lines)
    for page in (
        "overview",
        "dead items, deep page",
        "outbox by recipient",
        "deliveries failed",
        "audit log",
    ):
        assert any(line.startswith(page + " ") for line in lines), page

"""A short self-contained run: `python -m loadtest run` starts `gateway serve` (and the fake
provider when it exists), drives it, verifies the database and writes its report."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from aiohttp.test_utils import TestServer

from tests.support.config import META_SECRET, TENASHI_SECRET


def test_self_contained_run_passes(db_dsn: str, tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "loadtest", "run",
        "--database-url", db_dsn,
        "--rate", "40", "--duration", "3",
        "--immediate", "0.1", "--delayed", "0.1", "--delay-s", "1", "--concurrent", "0.1",
        "--bad-signature", "0.1",
        "--drain-timeout", "30",
        "--results", str(tmp_path), "--name", "e2e", "--quiet",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
    (result_file,) = tmp_path.glob("e2e-*.json")
    result = json.loads(result_file.read_text())
    s = result["summary"]
    assert s["sent"] == 120 and s["answered"] == 120 and s["errors"] == {}
    assert result["verification"]["ok"]
    kinds = result["sent_by_kind"]
    assert kinds["bad_signature"] > 0 and kinds["immediate"] > 0 and kinds["concurrent"] > 0
    assert any(x.get("rss_mb", 0) > 0 for x in result["samples"])
    (page,) = tmp_path.glob("e2e-*.html")
    html = page.read_text()
    assert "<svg" in html and "<script" not in html


def test_a_run_forwarding_to_a_meta_format_destination(db_dsn: str, tmp_path: Path) -> None:
    """`run --forward --forward-format meta`: every Meta event reaches the receiver (verifying
    X-Hub-Signature-256, as a pywa bot does) once, with its receipt -> handler latency."""
    argv = [
        sys.executable, "-m", "loadtest", "run", "--database-url", db_dsn, "--rate", "30", "--duration", "2",
        "--forward", "--forward-format", "meta", "--drain-timeout", "30",
        "--results", str(tmp_path), "--name", "meta", "--quiet",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result_file,) = tmp_path.glob("meta-*.json")
    fwd = json.loads(result_file.read_text())["forwarding"]
    assert fwd["ok"] and fwd["bad_signatures"] == 0 and fwd["lost"] == 0
    lat = fwd["receipt_to_handler_ms"]
    assert lat["events"] == fwd["events"] > 0 and 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert "receipt -> handler latency" in proc.stdout


async def test_url_mode_against_a_running_gateway(gateway: TestServer, db_dsn: str, tmp_path: Path) -> None:
    """`--url` mode: secrets from flags, verification through --database-url (ingest only, as
    this gateway runs without consumers)."""
    from loadtest import cli

    parser = cli.build_parser()
    ns = parser.parse_args(
        [
            "run", "--url", str(gateway.make_url("/")).rstrip("/"),
            "--meta-secret", META_SECRET, "--tenashi-secret", TENASHI_SECRET,
            "--database-url", db_dsn, "--no-consumers",
            "--rate", "50", "--duration", "1", "--bad-signature", "0.2",
            "--results", str(tmp_path), "--name", "url", "--quiet",
        ]
    )  # fmt: skip
    from loadtest import run

    assert await run.main(ns) == 0
    (result_file,) = tmp_path.glob("url-*.json")
    result = json.loads(result_file.read_text())
    assert result["summary"]["sent"] == 50 and result["verification"]["ok"]
    assert {c["name"] for c in result["verification"]["checks"]} >= {"ingest: bad signatures not stored"}


async def test_url_mode_without_a_database_and_without_tenashi(
    gateway: TestServer, tmp_path: Path, monkeypatch: object, capsys: object
) -> None:
    """`--url` with no database (and `--no-verify`) runs and reports, unverified, Meta-only when no
    Tenashi secret is given; the secret appears in no report file."""
    import pytest

    from loadtest import cli, run

    assert isinstance(monkeypatch, pytest.MonkeyPatch) and isinstance(capsys, pytest.CaptureFixture)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("GATEWAY_TENASHI_SECRET", raising=False)
    base = str(gateway.make_url("/")).rstrip("/")
    errs = {}
    for extra, name in (([], "nodb"), (["--no-verify"], "noverify")):
        ns = cli.build_parser().parse_args(
            [
                "run", "--url", base, "--meta-secret", META_SECRET,
                "--rate", "40", "--duration", "1", "--scenario", "mixed",
                "--results", str(tmp_path), "--name", name, "--quiet", *extra,
            ]
        )  # fmt: skip
        assert await run.main(ns) == 0
        out = capsys.readouterr()
        errs[name] = out.err
        assert "PASS" in out.out and "not verified" in out.out
        (result_file,) = tmp_path.glob(f"{name}-*.json")
        result = json.loads(result_file.read_text())
        assert result["verification"] is None and result["summary"]["sent"] == 40
        assert not any(k.startswith("tenashi") for k in result["sent_by_kind"])
        for path in tmp_path.glob(f"{name}-*.*"):
            assert META_SECRET not in path.read_text(), path
    assert "--database-url 'postgresql://postgres@/gateway?host=" in errs["nodb"]  # says how to verify
    assert "--database-url" not in errs["noverify"]


def test_a_terminated_run_stops_the_gateway_it_started(db_dsn: str, tmp_path: Path) -> None:
    """SIGTERM to ``loadtest run`` (a test that fails mid-run sends it) stops the gateway and the
    fake provider it started, which run in sessions of their own and would outlive it."""
    argv = [
        sys.executable, "-m", "loadtest", "run", "--database-url", db_dsn,
        "--rate", "20", "--duration", "120", "--results", str(tmp_path), "--name", "term", "--quiet",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        started: list[psutil.Process] = []
        while time.monotonic() < deadline and not any(
            "gateway" in " ".join(p.cmdline()) and "serve" in p.cmdline() for p in started
        ):
            time.sleep(0.3)
            with contextlib.suppress(psutil.Error):
                started = psutil.Process(proc.pid).children(recursive=True)
        assert any("serve" in p.cmdline() for p in started), [p.cmdline() for p in started]
        time.sleep(2)  # webhooks flowing
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(started, timeout=10)
    for p in alive:  # not left behind when this fails
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated" in err
    assert not alive, [p.cmdline() for p in alive]


STUBBORN = """
import argparse, asyncio, sys
from loadtest import cli

async def stubborn():
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # a task that does not end when cancelled

async def main(ns):
    asyncio.get_running_loop().create_task(stubborn())
    print("returned", flush=True)
    return 0

sys.exit(asyncio.run(cli._until_terminated(argparse.Namespace(main=main))))
"""


def test_a_sigterm_after_the_command_returned_still_ends_the_process() -> None:
    """A task left running holds asyncio.run's shutdown (it waits for every task to end); the
    command's SIGTERM handler only cancels the command, which has returned by then. So the
    handler goes with the command, and SIGTERM ends the process as it would without one (a test
    that gives up on a run terminates it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "returned"
        time.sleep(0.5)  # into asyncio.run's wait for the stubborn task
        assert proc.poll() is None  # the stubborn task holds the shutdown
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM

"""`gateway serve --workers 2`: two processes answer on one port, /metrics counts both, and
SIGTERM to the parent stops every one of them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import asyncpg
import psutil
import pytest

from gateway.core.signature import sign_meta
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.config import META_SECRET
from tests.support.consume import lanes_held_by
from tests.support.forward import add, all_delivered, started_receiver, states, until
from tests.support.http import post_meta
from tests.support.procs import alive, free_port, kill_if_alive, spawn, wait_healthy

pytestmark = pytest.mark.slow
# Bounds on waits, not claims about speed (a process on a loaded machine is slow).
GIVE_UP_S = 60.0
UNRESPONSIVE_S = 6
DB_WAIT_S = 2  # a new worker's grace before its first answer, beyond UNRESPONSIVE_S


def stored(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if (
            line.startswith("gateway_webhook_requests_total{")
            and 'outcome="stored"' in line
            and "meta" in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _children(proc: subprocess.Popen[bytes], n: int) -> list[psutil.Process]:
    """The children of ``proc`` once there are at least ``n`` (within GIVE_UP_S)."""
    deadline = time.monotonic() + GIVE_UP_S
    while len(kids := psutil.Process(proc.pid).children()) < n:
        assert time.monotonic() < deadline, f"the children did not all start ({len(kids)} of {n})"
        await asyncio.sleep(0.1)
    return kids


async def test_two_workers_share_one_port_and_stop_together(db_dsn: str, pool: asyncpg.Pool) -> None:
    port, metrics_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_METRICS_PORT": str(metrics_port),
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_RUN_CONSUMERS": "false",
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_RUN_FORWARDER": "false",
    }
    proc = spawn(["serve", "--workers", "2"], env)
    children: list[psutil.Process] = []
    try:
        await wait_healthy(base, proc)
        # A new connection per request: the kernel spreads connections over the two listeners.
        pids: set[int] = set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            deadline = time.monotonic() + 30
            while len(pids) < 2 and time.monotonic() < deadline:
                async with http.get(f"{base}/healthz") as r:
                    pids.add((await r.json())["pid"])
            assert len(pids) == 2, pids
            assert proc.pid not in pids  # the parent only supervises
            children = psutil.Process(proc.pid).children()
            assert {c.pid for c in children} == pids

            bodies = [meta_bytes(message_payload(f"wamid.W{i}")) for i in range(20)]
            for body in bodies:
                assert (await post_meta(http, base, body))[0] == 200
            # Whichever worker is scraped (each listens on the metrics port too) reports the
            # requests of both; the public port serves no /metrics.
            seen = set()
            for _ in range(10):
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    seen.add(stored(await r.text()))
            assert seen == {20.0}
            async with http.get(f"{base}/metrics") as r:
                assert r.status == 404
        assert await pool.fetchval("SELECT count(*) FROM webhook_inbox") == 20

        # SO_REUSEPORT would let a second group share the port silently: it is refused.
        second = spawn(["serve", "--workers", "2"], env)
        assert await asyncio.to_thread(second.wait, 30) == 3

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        for c in children:
            assert not alive(c)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in children:
            kill_if_alive(c)


async def test_a_clean_start_logs_no_warning(db_dsn: str, tmp_path: Path) -> None:
    """Every process of a --workers start (the parent, two HTTP workers, the services and the
    forwarder apart) starts and stops without one WARNING or ERROR line: a warning that comes at
    every start (such as an unknown variable the supervisor set itself) teaches operators to
    ignore warnings."""
    port = free_port()
    log_path = tmp_path / "serve.log"
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_SERVE_SERVICES": "process",
        "GATEWAY_SERVE_FORWARDER": "apart",
    }
    proc = spawn(["serve", "--workers", "2"], env, str(log_path))
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        await _children(proc, 4)  # 2 workers, services, forwarder
        await asyncio.sleep(3)  # each child past its start-up
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = log_path.read_text().splitlines()
    assert lines, "nothing was logged"
    assert [line for line in lines if " WARNING " in line or " ERROR " in line] == []


def _counter(metrics_text: str, name: str, **labels: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _processed(pool: asyncpg.Pool, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await pool.fetchval("SELECT count(*) FROM processed_webhook_events") < n:
        assert time.monotonic() < deadline, f"fewer than {n} events processed in {timeout_s} s"
        await asyncio.sleep(0.1)


async def test_services_apart_from_the_http_worker(db_dsn: str, pool: asyncpg.Pool) -> None:
    """GATEWAY_SERVE_SERVICES=process (the default from two cores on): the HTTP worker runs
    no consumers; a process of their own does (and one more the forwarder: apart), its metrics are on
    the worker's /metrics, and it is started again when it dies (SIGKILL) without the worker
    noticing."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_METRICS_PORT": str(port),  # /metrics on the public port, as operators may ask
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_SERVE_SERVICES": "process",
        "GATEWAY_SERVE_FORWARDER": "apart",
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_CONSUMER_POLL_MS": "100",
    }
    proc = spawn(["serve"], env)
    kids: list[psutil.Process] = []

    def services_child() -> psutil.Process:
        found = [c for c in psutil.Process(proc.pid).children() if "--services" in c.cmdline()]
        assert len(found) == 1, found
        return found[0]

    async def post_all(http: aiohttp.ClientSession, wamids: list[str]) -> None:
        for wamid in wamids:
            assert (await post_meta(http, base, meta_bytes(message_payload(wamid))))[0] == 200

    try:
        await wait_healthy(base, proc)
        kids = psutil.Process(proc.pid).children()
        assert len(kids) == 3  # the forwarder apart too (GATEWAY_SERVE_FORWARDER=apart)
        worker = next(c for c in kids if "--worker" in c.cmdline())
        forwarder = next(c for c in kids if "--forwarder" in c.cmdline())
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as r:
                assert (await r.json())["pid"] == worker.pid  # the services process has no HTTP
            await post_all(http, [f"wamid.S{i}" for i in range(20)])
            await _processed(pool, 20)
            # Counted in the services process, reported by the worker (one metrics directory).
            deadline = time.monotonic() + 10
            while True:
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
                if _counter(text, "gateway_consumer_events_total", kind="message", outcome="processed") == 20:
                    break
                assert time.monotonic() < deadline, "the consumers' events never reached /metrics"
                await asyncio.sleep(0.2)

            first = services_child()
            first.kill()
            await post_all(http, [f"wamid.T{i}" for i in range(10)])  # the worker answers meanwhile
            await _processed(pool, 30)  # by the services process started again
            second = services_child()
            assert second.pid != first.pid and worker.is_running() and forwarder.is_running()
            kids = [worker, second, forwarder]

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        for c in kids:
            assert not alive(c)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in kids:
            kill_if_alive(c)


def _forwarding_in_services(db_dsn: str, port: int, *, poll_ms: int) -> dict[str, str]:
    """`gateway serve` on ``port`` forwarding in its services process (no sender), its
    consumers and forwarder polling every ``poll_ms``."""
    return {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_SERVE_SERVICES": "process",
        "GATEWAY_SERVE_FORWARDER": "with-services",
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_CONSUMER_POLL_MS": str(poll_ms),
        "GATEWAY_FORWARD_POLL_MS": str(poll_ms),
        "GATEWAY_FORWARD_ALLOW_PRIVATE": "1",
    }


async def test_the_forwarder_in_the_services_process_delivers_and_survives_its_kill(
    db_dsn: str, pool: asyncpg.Pool
) -> None:
    """GATEWAY_SERVE_FORWARDER=with-services (auto's choice below 4 cores): two children, the
    services process forwards what its consumers stage, and a SIGKILL of it mid-flow loses no
    delivery (each event reaches the receiver, a repeat with the same webhook-id at most)."""
    receiver = await started_receiver()
    await add(pool, "crm", receiver.url, ("message",))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**_forwarding_in_services(db_dsn, port, poll_ms=100), "GATEWAY_FORWARD_LEASE_S": "2"}
    proc = spawn(["serve"], env)
    kids: list[psutil.Process] = []
    try:
        await wait_healthy(base, proc)
        kids = await _children(proc, 2)
        flags = sorted(f for c in kids for f in ("--worker", "--services", "--forwarder") if f in c.cmdline())
        assert flags == ["--services", "--worker"]
        first = next(c for c in kids if "--services" in c.cmdline())
        async with aiohttp.ClientSession() as http:
            for i in range(20):
                assert (await post_meta(http, base, meta_bytes(message_payload(f"wamid.F{i}"))))[0] == 200
            assert await receiver.wait_for(20, GIVE_UP_S), receiver.state.processed.keys()
            # Killed while the next ones are staged and forwarded.
            for i in range(20, 40):
                assert (await post_meta(http, base, meta_bytes(message_payload(f"wamid.F{i}"))))[0] == 200
                if i == 22:
                    first.kill()
        assert await receiver.wait_for(40, GIVE_UP_S), len(receiver.state.processed)
        await until(lambda: all_delivered(pool), what="every delivery recorded as delivered")
        assert await states(pool) == {"delivered": 40}
        assert receiver.state.bad_signatures == 0
        kids = psutil.Process(proc.pid).children()
        assert len(kids) == 2 and first.pid not in {c.pid for c in kids}
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in kids:
            kill_if_alive(c)
        await receiver.close()


async def test_two_replicas_forward_what_either_stages_once_and_without_polling(
    db_dsn: str, pool: asyncpg.Pool
) -> None:
    """Two `gateway serve` replicas on one database, each forwarding in its services process:
    a replica's consumers kick their own forwarder and NOTIFY with its token, which the other
    replica's forwarder wakes on. Webhooks posted to both, alternately, each reach the receiver
    once, with the polls set to a minute (so only kicks and NOTIFYs can have moved them), and
    every delivery is recorded delivered once."""
    receiver = await started_receiver()
    await add(pool, "crm", receiver.url, ("message",))
    ports = [free_port(), free_port()]
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    procs = [spawn(["serve"], _forwarding_in_services(db_dsn, port, poll_ms=60_000)) for port in ports]
    try:
        for base, proc in zip(bases, procs, strict=True):
            await wait_healthy(base, proc)
        # Both replicas' consumers hold lanes before the webhooks come (a member joins, the
        # lanes are shared out at its next renewal).
        await until(lambda: lanes_held_by(pool, 2), GIVE_UP_S, "both replicas' consumers to hold lanes")
        n = 60
        async with aiohttp.ClientSession() as http:
            for i in range(n):
                body = meta_bytes(message_payload(f"wamid.R{i}"))
                assert (await post_meta(http, bases[i % 2], body))[0] == 200
        # Far below the minute's poll: only the wake-ups can have delivered them.
        assert await receiver.wait_for(n, 20.0), len(receiver.state.processed)
        await until(lambda: all_delivered(pool), what="every delivery recorded as delivered")
        assert await states(pool) == {"delivered": n}
        assert not receiver.state.duplicates and receiver.state.bad_signatures == 0
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await receiver.close()


async def test_a_stopped_worker_is_replaced_and_webhooks_keep_being_taken(db_dsn: str) -> None:
    """SIGSTOP one worker: it holds its listening socket and takes no request, so the parent,
    whose health check of it stops answering, kills it and starts another."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_RUN_CONSUMERS": "false",
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_RUN_FORWARDER": "false",
        # Bounds a live worker on a loaded machine keeps: answering its parent within 2 s
        # (a third of the bound) at least once in 6 s, and first within 8 s of its start.
        "GATEWAY_WORKER_UNRESPONSIVE_S": str(UNRESPONSIVE_S),
        "GATEWAY_DB_WAIT_S": str(DB_WAIT_S),
        "GATEWAY_ACK_DEADLINE_MS": "60000",
    }
    proc = spawn(["serve", "--workers", "2"], env)
    stopped: psutil.Process | None = None
    try:
        await wait_healthy(base, proc)
        workers = await _children(proc, 2)
        # Both answered their parent past their start-up grace and the bound: no false alarm.
        await asyncio.sleep(UNRESPONSIVE_S + DB_WAIT_S + 1)
        assert all(alive(w) for w in workers)
        stopped = workers[0]
        stopped.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + GIVE_UP_S
        while alive(stopped):
            assert time.monotonic() < deadline, "the stopped worker was not replaced"
            await asyncio.sleep(0.2)
        while len(psutil.Process(proc.pid).children()) < 2:
            assert time.monotonic() < deadline, "no worker took its place"
            await asyncio.sleep(0.2)
        await wait_healthy(base, proc)
        # Every connection reaches a live worker again.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            for i in range(20):
                body = meta_bytes(message_payload(f"wamid.S{i}"))
                headers = {"X-Hub-Signature-256": sign_meta(body, META_SECRET)}
                wait = aiohttp.ClientTimeout(total=GIVE_UP_S)
                async with http.post(f"{base}/webhooks/meta", data=body, headers=headers, timeout=wait) as r:
                    assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, GIVE_UP_S) == 0
    finally:
        if stopped is not None:
            kill_if_alive(stopped)
        if proc.poll() is None:
            proc.kill()
            proc.wait()

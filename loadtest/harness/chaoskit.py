"""What the chaos runs share (``python -m loadtest chaos``, with and without ``--failover``):
the processes under test, the send load, the fake provider's log, and the checks and figures
made from them."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.core.aio import wait_set
from gateway.core.events import Status, event_day
from gateway.core.messages import callback_data
from gateway.core.parsing import parse
from gateway.testing.ports import free_port
from loadtest.harness import driver, plan, processes, verify
from loadtest.harness.httpclient import Pool
from loadtest.harness.payloads import Delivery, PayloadFactory, Secrets, status_row
from loadtest.harness.scenarios import scenario
from loadtest.harness.schedule import arrivals, constant
from loadtest.harness.stats import Ledger

TENANT = "chaos"
API_KEY = "chaos-api-key-0123456789"
NUMBER = "100200300"
PAIR_SLACK_S = 0.25  # clock and network jitter between the claim and the fake's receipt


class TimedPool(Pool):
    """The load's pool, logging when each answer came and its status."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list[tuple[float, int]] = []
        self.failures: list[float] = []

    async def request(self, wire: bytes) -> int:
        try:
            status = await super().request(wire)
        except Exception:
            self.failures.append(time.monotonic())
            raise
        self.answers.append((time.monotonic(), status))
        return status


class Cast:
    """The processes under test; each role restarts under a new log file."""

    def __init__(
        self, dsn: str, secrets: Secrets, log_dir: Path, fake_url: str, pair_s: float, port: int | None = None
    ) -> None:
        self.dsn = dsn
        self.secrets = secrets
        self.log_dir = log_dir
        self.port = port or free_port()
        self.env = {
            "GATEWAY_GRAPH_URL": f"{fake_url}/v21.0",
            "GATEWAY_GRAPH_TOKEN": "chaos-token",
            "GATEWAY_API_KEYS": f"{TENANT}:{API_KEY}",
            "GATEWAY_PAIR_INTERVAL_S": str(pair_s),
            "GATEWAY_SEND_READ_TIMEOUT_MS": "2000",
            "GATEWAY_SEND_POLL_MS": "200",
            "GATEWAY_CONSUMER_POLL_MS": "200",
            "GATEWAY_LOG_LEVEL": "warning",
            # Maintenance passes every few seconds (a forgotten session meets several), and
            # poisoned events reach their last attempt within the run.
            "GATEWAY_PURGE_INTERVAL_S": "5",
            "GATEWAY_MAX_ATTEMPTS": "3",
            "GATEWAY_RETRY_MAX_MS": "2000",
        }
        self.procs: dict[str, processes.Proc] = {}
        self._n = itertools.count(1)

    def start(self, role: str) -> processes.Proc:
        command = {"gateway": "serve", "consumer": "consume", "sender": "send"}[role]
        port = self.port if role == "gateway" else free_port()
        env = processes.gateway_env(self.dsn, port, self.secrets, consumers=False, extra=self.env)
        argv = [sys.executable, "-m", "gateway", command]
        proc = processes.Proc(role, argv, env, self.log_dir / f"{role}-{next(self._n)}.log", port)
        self.procs[role] = proc
        return proc

    def kill(self, role: str) -> None:
        proc = self.procs[role]
        if proc.alive():
            proc.popen.kill()
        proc.stop()  # reaps it and closes its log

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.stop()


async def send_load(
    url: str, rate: float, recipients: int, stop: asyncio.Event, accepted: set[str], counts: Counter[str]
) -> None:
    """POST /v1/messages at ``rate``; a key not answered 202 is retried (same key, same body)."""
    retry: list[tuple[str, dict[str, Any]]] = []
    seq = itertools.count(1)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while not stop.is_set():
            if retry:
                key, body = retry.pop(0)
            else:
                i = next(seq)
                key = f"chaos-{i}"
                to = f"49151{i % recipients:07d}"
                body = {"to": to, "phone_number_id": NUMBER, "type": "text", "text": {"body": f"chaos {i}"}}
            try:
                async with http.post(
                    f"{url}/v1/messages", data=orjson.dumps(body), headers={**headers, "Idempotency-Key": key}
                ) as r:
                    counts[str(r.status)] += 1
                    if r.status in (200, 202):
                        accepted.add(key)
                    elif r.status >= 500 or r.status == 409:
                        retry.append((key, body))
            except (aiohttp.ClientError, TimeoutError):
                counts["error"] += 1
                retry.append((key, body))
            await wait_set(stop, 1 / rate)


async def fake_faults(fake_url: str, rules: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{fake_url}/_fake/faults", json=rules) as r:
        r.raise_for_status()


async def fake_received(fake_url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{fake_url}/_fake/received") as r:
        r.raise_for_status()
        data: list[dict[str, Any]] = await r.json()
        return data


def send_checks(
    received: list[dict[str, Any]], outbox: dict[str, str], accepted: set[str], pair_s: float
) -> tuple[list[verify.Check], dict[str, Any]]:
    """Pure: what customers received (the fake's log) against the outbox and the API's answers."""
    per_row = Counter(r["callback_data"] for r in received)
    twice = [c for c, n in per_row.items() if n > 1]
    orphans = [c for c in per_row if c not in outbox]
    missing = [k for k in accepted if callback_data(TENANT, k) not in outbox]
    by_to: dict[str, list[float]] = defaultdict(list)
    for r in received:
        by_to[r["to"]].append(float(r["at"]))
    pairs = [(to, a, b) for to, ts in by_to.items() for a, b in itertools.pairwise(sorted(ts))]
    gaps = [b - a for _to, a, b in pairs]
    close = [f"to {to} at {a:.2f}: {b - a:.2f} s" for to, a, b in pairs if b - a < pair_s - PAIR_SLACK_S]
    checks = [
        verify.Check(
            "sends: each row sent at most once",
            not twice,
            f"{len(twice)} rows received twice or more",
            tuple(twice[:3]),
        ),
        verify.Check(
            "sends: nothing received without its row",
            not orphans,
            f"{len(orphans)} unknown",
            tuple(orphans[:3]),
        ),
        verify.Check(
            "sends: every 202 in the outbox",
            not missing,
            f"{len(missing)} of {len(accepted)} missing",
            tuple(missing[:3]),
        ),
        verify.Check(
            "sends: pair interval kept",
            not close,
            f"{len(close)} gaps under {pair_s:g} s (min gap {min(gaps, default=float('nan')):.2f} s)",
            tuple(close[:3]),
        ),
    ]
    stats = {
        "accepted": len(accepted),
        "received": len(received),
        "outbox_states": dict(Counter(outbox.values())),
        "min_gap_s": round(min(gaps), 3) if gaps else None,
    }
    return checks, stats


def outage_figures(
    answers: list[tuple[float, int]], failures: list[float], stopped: float, started: float
) -> tuple[int, int, float]:
    """Pure: (503s, other failures) from the stop to the first 200 after the start, and the
    seconds from the start to that 200 (NaN if none)."""
    first = next((t for t, s in sorted(answers) if t > started and s == 200), float("nan"))
    end = first if first == first else float("inf")
    n503 = sum(1 for t, s in answers if stopped <= t <= end and s == 503)
    other = sum(1 for t in failures if stopped <= t <= end)
    return n503, other, first - started


async def fake_webhooks(fake_url: str, quiet_s: float = 2.0, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The status webhooks the fake posted back, once no more have come for ``quiet_s``."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            async with http.get(f"{fake_url}/_fake/webhooks") as r:
                r.raise_for_status()
                now: list[dict[str, Any]] = await r.json()
            if seen and len(now) == len(seen):
                return now
            seen = now
            await asyncio.sleep(quiet_s)
    return seen


def ledger_webhooks(ledger: Ledger, posted: list[dict[str, Any]]) -> None:
    """Enter the fake's status webhooks in the run's ledger, as the load's own are: each try
    sent (one answered 503 may still have been stored), a 200 acknowledged; their keys are
    what the gateway's own parser finds in them."""
    for hook in posted:
        body = str(hook["body"]).encode()
        source = "tenashi" if "tenashi" in str(hook["path"]) else "meta"
        events = parse(source, body)
        keys = tuple(ev.key for ev in events)
        statuses = tuple(
            status_row(ev.key, event_day(ev, source))
            for ev in events
            if isinstance(ev, Status) and ev.key.startswith("status:")
        )
        delivery = Delivery(
            source,
            str(hook["path"]),
            body,
            (),
            keys,
            msg_wamids=tuple(k[4:] for k in keys if k.startswith("msg:")),
            status_keys=statuses,
        )
        digest = b""
        for _ in range(max(1, int(hook.get("attempts", 1)))):
            digest = ledger.sent(delivery)
        if hook.get("status") == 200:
            ledger.acked(digest)


def webhook_load(
    secrets: Secrets, seed: int, rate: float, duration_s: float, tag: str, port: int
) -> tuple[PayloadFactory, Ledger, TimedPool, asyncio.Task[driver.OpenResult]]:
    """Steady signed webhooks at ``rate`` to the gateway on ``port`` (the ``mixed`` scenario,
    2 % immediate, 3 % delayed and 2 % concurrent redeliveries, 1 % bad signatures), started
    now: the factory, the ledger they are entered in, the timed pool and the running load."""
    factory = PayloadFactory(secrets, seed, run_tag=f"{tag}{os.getpid():x}{int(time.time()):x}")
    shots = plan.build(
        arrivals(constant(rate, duration_s)),
        scenario("mixed", factory),
        factory,
        plan.Mix(0.02, 0.03, 0.02, 0.01, 2.0),
        seed,
    )
    ledger = Ledger()
    pool = TimedPool("127.0.0.1", port, 256, 10.0)
    load = asyncio.create_task(
        driver.run_open(shots, pool, duration_s=duration_s, ledger=ledger, progress=False, prewarm=16)
    )
    return factory, ledger, pool, load

"""Locust users for teams that run Locust itself (``pip install -e '.[locust]'``), built on the
harness's payload factory and scenarios:

    GATEWAY_META_APP_SECRETS=... [GATEWAY_TENASHI_SECRET=...] [DATABASE_URL=...] \\
        locust -f loadtest/locustfile.py --host http://127.0.0.1:8080 --headless -u 50 -r 10 -t 60s

* One ``FastHttpUser`` per scenario, weighted as in ``loadtest.scenarios`` (``MetaInbound``,
  ``MetaStatuses``, ``MetaBatched``, ``TenashiEvents``); pick some with Locust's class arguments
  (``locust ... MetaInbound``). Every task is tagged with its provider, its scenario and its own
  name (``--tags inbound``, ``--exclude-tags redelivery bad-signature``). ``TenashiEvents`` runs
  only when ``GATEWAY_TENASHI_SECRET`` is set: Meta only by default.
* Each user aims at ``LOADTEST_USER_RATE`` requests/s (``constant_throughput``, default 1), so
  ``LOADTEST_PROFILE`` (the harness's syntax: ``ramp:0:200:30+const:200:60``,
  ``steps:50:20,100:20``) drives a ``LoadTestShape`` that sets users = rate / user rate, second
  by second, and stops at the end of the profile. Without it, ``-u``/``-r``/``-t`` as usual.
* Redeliveries (``LOADTEST_REDELIVER``, share of requests, default 0.05) post a body again and
  must get 200; badly signed copies (``LOADTEST_BAD_SIGNATURE``, default 0.01) must get 401.
* ``test_stop`` runs the harness's exactly-once verification (``python -m loadtest verify``, in
  its own process) against ``--database-url`` / ``DATABASE_URL`` and sets the exit code to 1 when
  the database does not match what was acknowledged. Local runs only: in a distributed run each
  worker holds part of the ledger.

Locust runs a closed model (a user waits for its answer), so a slow server lowers the offered
load; ``python -m loadtest run`` is the open-model tool for latencies. Importable only where
locust is installed (an optional extra; mypy checks this file without it).
"""

from __future__ import annotations

import logging
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from locust import FastHttpUser, LoadTestShape, constant_throughput, events, tag

from loadtest.harness import scenarios
from loadtest.harness.payloads import Delivery, PayloadFactory, Secrets
from loadtest.harness.schedule import parse_profile
from loadtest.harness.stats import Ledger

log = logging.getLogger("loadtest.locust")

SECRETS = Secrets(
    meta=os.environ.get("GATEWAY_META_APP_SECRETS", "").split(",")[0].strip(),
    tenashi=os.environ.get("GATEWAY_TENASHI_SECRET", "").strip(),
)
USER_RATE = float(os.environ.get("LOADTEST_USER_RATE", "1"))
PROFILE = os.environ.get("LOADTEST_PROFILE", "")
REDELIVER = float(os.environ.get("LOADTEST_REDELIVER", "0.05"))
BAD_SIGNATURE = float(os.environ.get("LOADTEST_BAD_SIGNATURE", "0.01"))
RECENT = 200  # deliveries each user keeps for redelivery

# What every user sent and what was acknowledged (gevent: one thread, no lock needed).
LEDGER = Ledger()
_run: dict[str, Any] = {"start_id": None}


def _tasks(source: type[scenarios.WebhookUser], *tags: str) -> Any:
    """Locust tasks (weights as in the harness scenario), each tagged with ``tags`` and its name,
    plus redelivery and bad-signature tasks at their configured shares.

    A ``{task: weight}`` dict, which Locust accepts though its stubs say list (hence ``Any``)."""
    out: dict[Callable[[Any], None], int] = {}
    for name, weight in source.tasks():

        def deliver(user: Any, _name: str = name) -> None:
            user.post(getattr(user.source, _name)(), _name, 200)

        deliver.__name__ = name
        # Scaled so that a share of 1 % stays 1 % in a class with a single weight-1 task.
        out[tag(*tags, name)(deliver)] = weight * 100
    total = sum(out.values())

    def redeliver(user: Any) -> None:
        if user.recent:
            user.post(random.choice(user.recent), "redelivery", 200)

    def bad_signature(user: Any) -> None:
        d = user.factory.with_bad_signature(getattr(user.source, random.choice(source.tasks())[0])())
        user.post(d, "bad signature", 401)

    for fn, share, label in (
        (redeliver, REDELIVER, "redelivery"),
        (bad_signature, BAD_SIGNATURE, "bad-signature"),
    ):
        w = scenarios.share_weight(total, share)
        if w:
            out[tag(*tags, label)(fn)] = w
    return out


class _Webhooks(FastHttpUser):
    """Posts the harness's deliveries for one scenario and records them in the ledger."""

    abstract = True
    source_class: type[scenarios.WebhookUser] = scenarios.WebhookUser
    wait_time = constant_throughput(USER_RATE)

    def on_start(self) -> None:
        run_tag = f"lc{os.getpid():x}{id(self):x}{int(time.time()):x}"
        self.factory = PayloadFactory(SECRETS, seed=random.randrange(1 << 30), run_tag=run_tag)
        self.source = self.source_class(self.factory)
        self.recent: list[Delivery] = []

    def post(self, d: Delivery, name: str, expect: int) -> None:
        digest = LEDGER.sent(d)
        with self.client.post(
            # bytes as they were signed; Locust's stubs say str, geventhttpclient sends bytes as is.
            d.path,
            data=cast(Any, d.body),
            headers=dict(d.headers),
            name=f"{d.path} {name}",
            catch_response=True,
        ) as r:
            if r.status_code == expect:
                r.success()
                if expect == 200:
                    LEDGER.acked(digest)
            else:
                r.failure(f"expected {expect}, got {r.status_code}")
        if expect == 200 and name != "redelivery":
            self.recent.append(d)
            del self.recent[:-RECENT]


class MetaInbound(_Webhooks):
    """Customers writing to the business: inbound messages of every common type."""

    weight = scenarios.MetaInboundUser.weight
    source_class = scenarios.MetaInboundUser
    tasks = _tasks(scenarios.MetaInboundUser, "meta", "inbound")


class MetaStatuses(_Webhooks):
    """Status webhooks for our outbound messages, group statuses included."""

    weight = scenarios.MetaStatusUser.weight
    source_class = scenarios.MetaStatusUser
    tasks = _tasks(scenarios.MetaStatusUser, "meta", "statuses")


class MetaBatched(_Webhooks):
    """Meta batching several entries and changes into one POST."""

    weight = scenarios.MetaBatchUser.weight
    source_class = scenarios.MetaBatchUser
    tasks = _tasks(scenarios.MetaBatchUser, "meta", "batched")


class TenashiEvents(_Webhooks):
    """Tenashi events; runs only with a Tenashi secret (Meta only by default)."""

    abstract = not SECRETS.tenashi
    weight = scenarios.TenashiUser.weight
    source_class = scenarios.TenashiUser
    tasks = _tasks(scenarios.TenashiUser, "tenashi")


if PROFILE:

    class ProfileShape(LoadTestShape):
        """``LOADTEST_PROFILE`` as users: rate(t) / LOADTEST_USER_RATE, then stop."""

        profile = parse_profile(PROFILE)

        def tick(self) -> tuple[int, float] | None:
            t = float(cast(Any, self).get_run_time())  # untyped in Locust's stubs
            if t >= self.profile.duration:
                return None
            users = max(1, math.ceil(self.profile.rate_at(t) / USER_RATE))
            return users, float(max(users, 1))


@events.init_command_line_parser.add_listener
def _arguments(parser: Any, **_kw: Any) -> None:
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", ""),
        help="the gateway's database: test_stop verifies every acknowledged event there",
    )
    parser.add_argument(
        "--no-consumers", action="store_true", help="verify the ingest edge only (gateway without consumers)"
    )
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for consumers")


def _loadtest(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtest", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _is_local(environment: Any) -> bool:
    return type(environment.runner).__name__ == "LocalRunner"


@events.test_start.add_listener
def _test_start(environment: Any, **_kw: Any) -> None:
    if not SECRETS.meta:
        log.error("GATEWAY_META_APP_SECRETS is not set: every request would be refused")
        environment.process_exit_code = 2
        environment.runner.quit()
        return
    if not SECRETS.tenashi:
        log.info("no GATEWAY_TENASHI_SECRET: Meta users only")
    dsn = environment.parsed_options.database_url
    if dsn and _is_local(environment):
        done = _loadtest("verify", "--database-url", dsn, "--mark", timeout=60)
        if done.returncode == 0:
            _run["start_id"] = int(done.stdout.strip())
        else:
            log.error("could not read the inbox high-water mark: %s", done.stderr.strip()[-500:])


@events.test_stop.add_listener
def _test_stop(environment: Any, **_kw: Any) -> None:
    """The exactly-once verification; a mismatch sets the exit code to 1."""
    opts = environment.parsed_options
    if not opts.database_url:
        from loadtest.harness.database import no_database_hint

        log.warning(no_database_hint())
        return
    if not _is_local(environment):
        log.warning("not verified: a distributed run's ledger is split across its workers")
        return
    if _run["start_id"] is None:
        log.error("not verified: no high-water mark was taken at the start")
        environment.process_exit_code = 1
        return
    with tempfile.TemporaryDirectory(prefix="locust-ledger-") as tmp:
        path = Path(tmp) / "ledger.json"
        path.write_bytes(LEDGER.to_json())
        args = ["verify", "--database-url", opts.database_url, "--ledger", str(path)]
        args += ["--start-id", str(_run["start_id"]), "--drain-timeout", str(opts.drain_timeout)]
        if opts.no_consumers:
            args.append("--no-consumers")
        done = _loadtest(*args, timeout=opts.drain_timeout + 120)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        log.error("exactly-once verification failed: %s", (done.stderr or done.stdout).strip()[-2000:])
        environment.process_exit_code = 1

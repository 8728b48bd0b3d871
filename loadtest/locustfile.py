"""Locust users for teams that run Locust itself (``pip install -e '.[locust]'``), sharing the
harness's payload factory and scenarios:

    GATEWAY_META_APP_SECRETS=... GATEWAY_TENASHI_SECRET=... \\
        locust -f loadtest/locustfile.py --host http://127.0.0.1:8080

Locust runs a closed model (each user waits for its answer before the next task), so a slow
server lowers the offered load; use ``python -m loadtest run`` for open-model latencies and
the database verification. This module imports only where locust is installed.
"""

from __future__ import annotations

import os
import random
import time

from locust import FastHttpUser, between, task

from loadtest.payloads import Delivery, PayloadFactory, Secrets
from loadtest.scenarios import SCENARIOS, Scenario

SECRETS = Secrets(
    meta=os.environ.get("GATEWAY_META_APP_SECRETS", "").split(",")[0].strip(),
    tenashi=os.environ.get("GATEWAY_TENASHI_SECRET", ""),
)
SCENARIO = os.environ.get("LOADTEST_SCENARIO", "mixed")
REDELIVER = float(os.environ.get("LOADTEST_REDELIVER", "0.05"))
BAD_SIGNATURE = float(os.environ.get("LOADTEST_BAD_SIGNATURE", "0.01"))


class WebhookSender(FastHttpUser):
    """Posts the harness's scenario deliveries; redelivers some, signs a few wrongly."""

    wait_time = between(0.0, 0.05)

    def on_start(self) -> None:
        tag = f"lc{os.getpid():x}{id(self):x}{int(time.time()):x}"
        self.factory = PayloadFactory(SECRETS, seed=random.randrange(1 << 30), run_tag=tag)
        self.scenario = Scenario(SCENARIOS[SCENARIO], self.factory)
        self.sent: list[Delivery] = []

    def _post(self, d: Delivery, name: str, expect: int) -> None:
        with self.client.post(
            d.path, data=d.body, headers=dict(d.headers), name=name, catch_response=True
        ) as r:
            if r.status_code == expect:
                r.success()
            else:
                r.failure(f"expected {expect}, got {r.status_code}")

    @task(20)
    def deliver(self) -> None:
        d = self.scenario.next()
        self._post(d, f"{d.path} {d.kind}", 200)
        self.sent.append(d)
        del self.sent[:-200]

    @task(1)
    def redeliver(self) -> None:
        if self.sent and random.random() < REDELIVER * 20:
            self._post(random.choice(self.sent), "redelivery", 200)

    @task(1)
    def bad_signature(self) -> None:
        if random.random() < BAD_SIGNATURE * 20:
            self._post(self.factory.with_bad_signature(self.scenario.next()), "bad signature", 401)

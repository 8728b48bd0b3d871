"""The reconciler: sends whose fate is unknown, and the send API's expired keys.

A row left ``sending`` past the lease belongs to a sender that died mid-request and becomes
``unknown``; an ``unknown`` row whose status webhook has not come within the window follows
its policy (``resend`` → ``pending`` once, ``review`` → parked for a person).

"Has not come" is only known once every webhook received up to the end of the window has been
processed: a status proving delivery may be staged but not yet consumed (consumers behind) or
parked dead. Until then the row waits; how many wait and for how long is a gauge and a log line.
A row with a wamid or a delivery status is never resent. Time comes from an injectable clock so
tests can run it without waiting.
"""

from __future__ import annotations

import logging
import time

import asyncpg

from gateway import metrics
from gateway.core.clock import Clock, SystemClock
from gateway.core.limits import LogThrottle
from gateway.core.settings import Settings
from gateway.store import idempotency, outbox, pacing

log = logging.getLogger(__name__)

BATCH = 1000
MAX_PURGE_ROUNDS = 20
PACING_HORIZON_S = 3600.0


class Reconciler:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, *, clock: Clock | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.clock = clock or SystemClock()
        # A backlog lasts minutes: one line a minute says it (the gauges say it continuously).
        self._waiting_log = LogThrottle(60.0)

    async def run_once(self) -> dict[str, int]:
        """One pass; returns counts, for tests and logs."""
        now = self.clock.now()
        s = self.settings
        expired = await outbox.expire_sending(
            self.pool, now=now, lease_s=s.send_lease_s, limit=BATCH, key_window_s=s.tenashi_key_window_s
        )
        reconciled, waiting = await outbox.reconcile_unknown(
            self.pool, now=now, window_s=float(s.reconcile_window_s), limit=BATCH
        )
        for r in reconciled:
            log.info("reconciled %s/%s: unknown -> %s", r.tenant, r.idem_key[:80], r.state)
        lag = max(0.0, now - waiting.oldest_unprocessed) if waiting.oldest_unprocessed is not None else 0.0
        metrics.RECONCILE_WAITING.set(waiting.rows)
        metrics.RECONCILE_WATERMARK_LAG.set(lag)
        held = self._waiting_log.allow("waiting", time.monotonic()) if waiting.rows else None
        if held is not None:
            log.warning(
                "reconciler waiting on %d unknown row(s): webhooks received %.0f s ago are unprocessed%s%s",
                waiting.rows,
                lag,
                " (some are dead: replay them with `gateway dead replay`)" if waiting.dead else "",
                self._waiting_log.suffix(held),
            )
        # Pacing keys an hour past their time pace nothing any more.
        async with self.pool.acquire() as conn, conn.transaction():
            forgotten = await pacing.purge(conn, before=now - PACING_HORIZON_S, limit=BATCH * 10)
        purged = 0
        for _ in range(MAX_PURGE_ROUNDS):
            n = await idempotency.purge_expired(self.pool, limit=s.purge_batch)
            purged += n
            if n < s.purge_batch:
                break
        return {
            "expired_sending": len(expired),
            "reconciled": len(reconciled),
            "waiting": waiting.rows,
            "purged_keys": purged,
            "pacing_keys_forgotten": forgotten,
        }

"""Database-wide gauges (inbox depth and lag, dead rows, outbox states, unknown age, forwarding
backlog and breakers), refreshed by one process at a time.

Every process that runs maintenance jobs competes for an advisory lock on a dedicated
connection; the holder refreshes the gauges every few seconds and is the only one that exports
them (see ``gateway.metrics``), so a dashboard summing replicas does not over-count. The lock
is the session's: it is released when the leader exits or its connection breaks, and another
process takes over at its next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from gateway import metrics
from gateway.core.delivery_outcomes import BREAKER_GAUGE, BreakerState
from gateway.store import dead_events, deliveries, inbox, leader, outbox, pacing
from gateway.store.db import Conn, connect

log = logging.getLogger(__name__)


# Counts run on partial indexes and stop at this many rows, so a refresh never scans a large
# table: a gauge at the cap reads "at least this many" (a backlog that large is an incident).
# Rows in terminal outbox states (accepted, cancelled), the bulk of the table, are not counted:
# gateway_sends_total counts them as they happen.
GAUGE_CAP = 100_000
# The longest a refresh may take (its counts stop at GAUGE_CAP rows: seconds at most).
PASS_BOUND_S = 30.0
# The gauges' session plans by index only, as their counts are meant to run: on partial
# indexes, stopped at the cap (the inbox's count sets this itself, inbox_pending_count: any
# session that counts it must not read today's whole partition).
GAUGE_SESSION = "SET enable_seqscan = off"


async def refresh_inbox(conn: Conn) -> None:
    metrics.INBOX_DEPTH.set(await inbox.depth(conn, cap=GAUGE_CAP))
    metrics.CONSUMER_LAG.set(await inbox.lag_seconds(conn))
    metrics.DEAD_ROWS.set(await inbox.dead_count(conn))
    st = await dead_events.stats(conn)
    metrics.DEAD_EVENTS.labels("retry").set(st.retry)
    metrics.DEAD_EVENTS.labels("dead").set(st.dead)
    metrics.DEAD_EVENTS_OLDEST_RETRY.set(st.oldest_retry_s)
    metrics.db_gauges_refreshed()


async def refresh_outbox(conn: Conn, now: float | None = None) -> None:
    for state, n in (await outbox.count_open(conn, cap=GAUGE_CAP)).items():
        metrics.OUTBOX_ROWS.labels(state.value).set(n)
    oldest = await outbox.oldest_unknown(conn)
    now = time.time() if now is None else now
    metrics.OLDEST_UNKNOWN.set(max(0.0, now - oldest) if oldest is not None else 0.0)
    for b in await pacing.list_breakers(conn):
        metrics.BREAKER_STATE.labels(b["scope"], b["provider"], b["key"]).set(BREAKER_LEVEL[b["state"]])
    metrics.db_gauges_refreshed()


BREAKER_LEVEL = {"closed": 0, "half_open": 1, "open": 2}


_destinations: set[str] = set()


async def refresh_forward(conn: Conn) -> None:
    """Backlog, oldest due delivery and breaker state per destination; a removed destination's
    series go away."""
    names = set()
    for g in await deliveries.gauges(conn, cap=GAUGE_CAP):
        names.add(g.name)
        metrics.FORWARD_BACKLOG.labels(g.name).set(g.backlog)
        metrics.FORWARD_OLDEST_DUE.labels(g.name).set(g.oldest_due_s)
        metrics.FORWARD_BREAKER.labels(g.name).set(BREAKER_GAUGE[BreakerState(g.breaker_state)])
        metrics.FORWARD_ENABLED.labels(g.name).set(1 if g.enabled else 0)
    for gone in _destinations - names:
        for gauge in (
            metrics.FORWARD_BACKLOG,
            metrics.FORWARD_OLDEST_DUE,
            metrics.FORWARD_BREAKER,
            metrics.FORWARD_ENABLED,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(gone)
    _destinations.clear()
    _destinations.update(names)
    metrics.db_gauges_refreshed()


class GaugeLeader:
    """Refreshes the database-wide gauges while this process holds the leader lock.

    The gauges' queries run on the lock's own connection, never on the pool the send API
    and the consumers need.
    """

    def __init__(self, dsn: str, *, timeout_s: float = 5.0, lock_id: int = leader.GAUGE_LEADER_LOCK_ID):
        self.dsn = dsn
        self.timeout_s = timeout_s
        self.lock_id = lock_id
        self._conn: asyncpg.Connection | None = None
        self.leading = False

    async def run_once(self) -> bool:
        """Try to lead (if not yet), then refresh; returns whether this process leads. A pass
        is bounded: a server frozen or cut off closes nothing, and the lock's connection would
        wait on it for good; dropped, it is made again (to the primary of the moment) next time,
        and the lock taken there."""
        try:
            async with asyncio.timeout(PASS_BOUND_S):
                return await self._pass()
        except BaseException:
            await self._drop()
            raise

    async def _pass(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect(self.dsn, timeout=self.timeout_s)
            self.leading = False
            await self._conn.execute(GAUGE_SESSION)
        if not self.leading:
            self.leading = await leader.try_lock(self._conn, lock_id=self.lock_id)
            if not self.leading:
                return False
            log.info("this process now exports the database-wide gauges")
        await refresh_inbox(self._conn)
        await refresh_outbox(self._conn)
        await refresh_forward(self._conn)
        return True

    async def _drop(self) -> None:
        if self.leading:
            log.warning("this process no longer exports the database-wide gauges")
        self.leading = False
        metrics.db_gauges_withdrawn()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        """Release the lock (by closing its session) and stop exporting."""
        if self.leading:
            metrics.db_gauges_withdrawn()
        self.leading = False
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()

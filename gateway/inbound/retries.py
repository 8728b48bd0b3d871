"""Retrying what a consumer moved aside: webhooks in ``inbox_parked`` (the whole row again, as
a batch of one) and events in ``dead_events`` (rebuilt from their raw fragment), each in its
own savepoint, with backoff; dead after ``max_attempts``."""

from __future__ import annotations

import logging
from collections.abc import Callable

import asyncpg

from gateway.core.backoff import backoff_delay
from gateway.core.errors import describe
from gateway.core.faults import ConsumerHealth, Fault, Verdict, verdict
from gateway.core.planning import plan_event
from gateway.core.settings import Settings
from gateway.inbound import triage
from gateway.inbound.applier import Applier, Conn, Deferred
from gateway.inbound.dead_items import Rebuilder, error_text
from gateway.store import db, dead_events, inbox

# The consumer's log: its lines keep the consumer's name wherever the code that writes them is.
log = logging.getLogger("gateway.inbound.consumer")
# Most items one retry claims (fewer when GATEWAY_CONSUMER_BATCH is lower): they go one savepoint
# each in one transaction that holds their claims, and an item that fails again may take a
# handler's whole timeout, so a claim stays far smaller than a backlog's batch.
RETRY_CLAIM = 200


class Retries:
    """One consumer's retries of the webhooks and events moved aside and due."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        applier: Applier,
        *,
        rand: Callable[[], float],
        health: ConsumerHealth,
        tx_settings: str,
        on_deliveries: Callable[[], None] | None,
    ) -> None:
        self._pool = pool
        self._s = settings
        self._apply = applier
        self._rand = rand
        self._health = health
        self._tx_settings = tx_settings
        self._on_deliveries = on_deliveries
        self._claim = min(settings.consumer_batch, RETRY_CLAIM)

    async def due(self) -> int:
        """Retry due webhooks moved aside, then due dead items, each in its own savepoint;
        returns how many were claimed."""
        return await self._retry_parked() + await self._retry_dead_events()

    async def _retry_parked(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(self._tx_settings)
            # On Citus a claim (FOR UPDATE of a reference table) locks the table on every node
            # for this transaction even when it finds nothing: look without a lock first.
            if await self._apply.on_citus(conn) and not await inbox.parked_due(conn):
                return 0
            rows = await inbox.parked_claim(conn, limit=self._claim)
            done: list[int] = []
            forwarded = False
            for i, row in enumerate(rows):
                try:
                    async with conn.transaction():
                        forwards = await self._apply.handle(conn, [row], None, None)
                except Deferred as d:
                    rest = [r.id for r in rows[i:]]
                    await inbox.parked_defer(conn, ids=rest, delay_s=d.delay, error=describe(d.cause))
                    break
                except Exception as exc:
                    if conn.is_closed():
                        raise
                    s = self._s
                    delay = backoff_delay(
                        row.attempts + 1, s.retry_base_ms / 1000, s.retry_max_ms / 1000, self._rand
                    )
                    await triage.parked_attempt(
                        conn, inbox_id=row.id, max_attempts=s.max_attempts, delay_s=delay, exc=exc
                    )
                else:
                    done.append(row.id)
                    forwarded = forwarded or forwards
            if done:  # (on Citus inbox_parked is a reference table: a write locks it on every node)
                await inbox.parked_done(conn, ids=done)
        self._forwarded(forwarded)
        self._apply.claimed = []
        if rows:
            self._health.succeeded([r.id for r in rows])
        return len(rows)

    async def _retry_dead_events(self) -> int:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(self._tx_settings)
            if await self._apply.on_citus(conn) and not await dead_events.due(conn):
                return 0
            claimed = await dead_events.claim(conn, limit=self._claim)
            if not claimed:
                return 0
            try:
                async with conn.transaction():
                    await self._retry_items(conn, claimed)
            except Exception as exc:
                if conn.is_closed():
                    raise
                cause = triage.cause(exc)
                delay = self._apply.fault(cause)
                for it in claimed:
                    await dead_events.failed(
                        conn,
                        item_id=it.id,
                        state=dead_events.RETRY,
                        attempts=0,
                        deferrals=1,
                        delay_s=delay,
                        error=describe(cause),
                    )
                return len(claimed)
        # Their events may have queued deliveries (not told apart here: a round finds out).
        self._forwarded(True)
        self._health.succeeded()
        return len(claimed)

    def _forwarded(self, forwarded: bool) -> None:
        """After the commit: the forwarder of this process, which the transaction named (its
        NOTIFY does not wake it), is woken here."""
        if forwarded and self._on_deliveries is not None:
            self._on_deliveries()

    async def _retry_items(self, conn: Conn, claimed: list[dead_events.Claimed]) -> None:
        done: list[int] = []
        failures: list[tuple[dead_events.Claimed, BaseException, Fault]] = []
        citus = (await db.citus_state(conn))[0]
        rebuild = Rebuilder()
        for it in sorted(claimed, key=lambda it: (it.inbox_id, it.path)):
            try:
                async with conn.transaction():
                    for ev in rebuild(it):
                        result = await inbox.apply_plan(
                            conn, plan_event(ev, it.inbox_id, it.source), citus=citus
                        )
                        if result.fresh_keys and b"\\u" in it.fragment:
                            await dead_events.record_fragments(
                                conn,
                                keys=[ev.key],
                                inbox_ids=[it.inbox_id],
                                paths=[it.path],
                                fragments=[it.fragment],
                            )
                        if self._apply.handlers and result.fresh_keys:
                            await self._apply.run_handlers(conn, ev, result.callers)
            except Exception as exc:
                failures.append((it, exc, await self._apply.event_fault(conn, exc, it.kind)))
            else:
                done.append(it.id)
        await dead_events.done(conn, ids=done)
        s = self._s
        for it, error, fault in failures:
            v = verdict(fault, probe_failed=False)
            attempts = it.attempts + (v is Verdict.ATTEMPT)
            dead = v is Verdict.DEAD or (v is Verdict.ATTEMPT and attempts >= s.max_attempts)
            delay = self._apply.item_delay(v, attempts, it.deferrals + 1)
            await dead_events.failed(
                conn,
                item_id=it.id,
                state=dead_events.DEAD if dead else dead_events.RETRY,
                attempts=int(v is not Verdict.DEFER),
                deferrals=int(v is Verdict.DEFER),
                delay_s=delay,
                error=error_text(error),
            )
            self._apply.count_item(
                dead_events.DEAD if dead else dead_events.RETRY, v is Verdict.DEFER, it.kind
            )
            if dead:
                log.error(
                    "dead item %d (%s) parked after %d attempts: %s", it.id, it.event_key, attempts, error
                )

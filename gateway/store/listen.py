"""LISTEN with reconnection: how the consumers, the sender, the forwarder and the outcome
waiter are woken.

NOTIFY only shortens waits: each of those loops also polls, so a lost LISTEN connection costs
latency, never work. One loop here keeps the listener up for as long as the process runs. A
registration lives in the server session that made it: after a failover, or any lost
connection, the loop connects again (to the new primary: ``gateway.store.db.connect_any``),
LISTENs again, and wakes its owner once to catch up on what was published meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import asyncpg

from gateway.core.aio import first_set, setter, sleep_unless_stopped
from gateway.core.backoff import backoff_delay
from gateway.core.errors import describe
from gateway.core.heartbeat import HEARTBEATS, Beat
from gateway.store import db
from gateway.store.db import connect

log = logging.getLogger(__name__)

Opener = Callable[[], AbstractAsyncContextManager[Any]]
# An idle LISTEN connection is asked this often whether it is still there (a server frozen or
# cut off closes nothing: only an unanswered question finds it out).
KEEPALIVE_S = 10.0
# Reconnection backoff: 0.5 s doubling to this. Short: a failover's new primary should be
# listened to within seconds of its promotion, and a try costs one connection attempt.
MAX_BACKOFF_S = 5.0
# A listener's application_name: this and its channel (a channel name is an identifier).
LISTENER_NAME = "gateway LISTEN "


@contextlib.asynccontextmanager
async def own_connection(dsn: str, timeout_s: float) -> AsyncIterator[asyncpg.Connection]:
    """A connection for LISTEN alone (a pooled one would be reset when given back)."""
    conn = await connect(dsn, timeout=timeout_s)
    try:
        yield conn
    finally:
        if not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)


async def listen(
    open_conn: Opener,
    channel: str,
    on_notify: Callable[[], None],
    stop: asyncio.Event,
    on_payload: Callable[[str], None] | None = None,
    *,
    on_down: Callable[[], None] | None = None,
    keepalive_s: float = KEEPALIVE_S,
    liveness_s: float = 120.0,
) -> None:
    """Call ``on_notify`` on every NOTIFY on ``channel`` (``on_payload`` with its payload
    instead, when given), and ``on_notify`` once on each (re)connection (rows may have come
    while nobody listened), until ``stop`` is set; ``on_down`` when a try to listen failed or a
    session was lost (nothing is heard until the next ``on_notify``). A failed or lost
    connection is retried with backoff (0.5 s doubling to ``MAX_BACKOFF_S``), one warning per
    failure, one line when listening again; ``gateway.store.db.observers`` are told
    ("listen_up" / "listen_down", ``channel``: the metrics count them). An idle connection is
    asked ``SELECT 1`` every ``keepalive_s``: a half-open one (a peer gone without a word) never
    reports its loss, and would stop the wake-ups for good; each answer is a heartbeat."""

    def callback(_conn: object, _pid: object, _channel: object, payload: object) -> None:
        if on_payload is None:
            on_notify()
        else:
            on_payload(str(payload))

    beat = HEARTBEATS.loop(f"LISTEN {channel}", liveness_s + 2 * keepalive_s + MAX_BACKOFF_S)
    attempt = 0
    down_since: float | None = None  # when the last LISTEN session was lost (None: never)
    try:
        while not stop.is_set():
            beat()
            up = False
            try:
                async with open_conn() as conn:
                    lost = asyncio.Event()
                    on_lost = setter(lost)
                    conn.add_termination_listener(on_lost)
                    await conn.add_listener(channel, callback)
                    # Operators (and the failover test) find the listeners in pg_stat_activity.
                    await conn.execute(f"SET application_name = '{LISTENER_NAME}{channel}'")
                    attempt, up = 0, True
                    db.observe("listen_up", channel)
                    if down_since is not None:
                        log.info(
                            "LISTEN %s: listening again after %.1f s (catching up by a poll)",
                            channel,
                            time.monotonic() - down_since,
                        )
                    on_notify()
                    try:
                        await _hold(conn, stop, lost, keepalive_s, beat)
                    finally:
                        conn.remove_termination_listener(on_lost)
                        if not conn.is_closed():
                            with contextlib.suppress(Exception):
                                await conn.remove_listener(channel, callback)
                if not stop.is_set():
                    raise ConnectionError("connection lost")
            except Exception as exc:
                attempt += 1
                log.warning("LISTEN %s failed (%s); polling meanwhile", channel, describe(exc))
                if on_down is not None:
                    on_down()
            finally:
                if up:
                    db.observe("listen_down", channel)
                    down_since = time.monotonic()
            if not stop.is_set():
                await sleep_unless_stopped(stop, backoff_delay(max(attempt, 1), 0.5, MAX_BACKOFF_S))
    finally:
        beat.done()


async def _hold(conn: Any, stop: asyncio.Event, lost: asyncio.Event, every_s: float, beat: Beat) -> None:
    """Until ``stop`` or the connection's loss; raises if a keep-alive gets no answer in time."""
    while True:
        beat()
        try:
            async with asyncio.timeout(every_s):
                await first_set(stop, lost)
            return
        except TimeoutError:
            async with asyncio.timeout(every_s):
                await conn.fetchval("SELECT 1")

"""The forwarder: POSTs each delivery's body to its destination, signed per Standard Webhooks (or,
to a Meta-format destination, as Meta signs its webhooks).

Deliveries are queued by the consumers in the same transaction as their event's key (see
``inbox_apply_batch``). A forwarder works in rounds, one statement each (``forward_round()``,
serialised across forwarders so per-destination limits hold), on a connection of its own:
write the outcomes of finished attempts (a delivered one leaves the queue; every attempt is
appended to the log), claim due deliveries (``FOR UPDATE SKIP LOCKED``) and record what it
holds in its leases (``delivery_leases``; a claim writes no queue row).
It is woken by ``LISTEN deliveries``, by its posters when the queue needs refilling or enough
outcomes wait, with polling as a fallback; in a process whose consumers queue deliveries, by
their ``kick`` after each commit: a round then starts at once (the consumers' batches are
spaced already), and the NOTIFY of that commit, which names this forwarder, is skipped.
``forward_concurrency`` posters (tasks that each send one request at a time) take claimed
deliveries from a queue (up to a batch waits there, so a finished request's slot is refilled
without a database round trip) and POST them. What an answer means is
``gateway.core.delivery_outcomes.decide``; signing is ``gateway.core.stdwebhooks``; both pure. The
circuit breaker lives in the ``destinations`` row, so every forwarder sees the same state.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp
import asyncpg
from prometheus_client import Counter, Histogram

from gateway import __version__, metrics
from gateway.core import addresses, stdwebhooks
from gateway.core.aio import sleep_unless_stopped, wait_set
from gateway.core.backoff import backoff_delay
from gateway.core.clock import Clock, SystemClock
from gateway.core.delivery_outcomes import DeliveryOutcome, breaker_tally, decide, merge_tallies
from gateway.core.faults import missing_partition
from gateway.core.heartbeat import HEARTBEATS
from gateway.core.settings import Settings
from gateway.core.signature import sign_meta
from gateway.core.spacing import Spacing
from gateway.outbound.egress import GuardedResolver, RefusedAddress, warn_refused
from gateway.store import deliveries, lanes, retention
from gateway.store.db import citus_state, connect
from gateway.store.deliveries import Tx
from gateway.store.listen import listen, own_connection

log = logging.getLogger(__name__)

USER_AGENT = f"whatsapp-webhook-gateway/{__version__} (+standard-webhooks)"
MAX_ERROR_BODY = 200
# Expired leases and cooled-down breakers are looked at this often, not on every claim.
HOUSEKEEPING_S = 0.5
# Outcomes waiting to be written are written within this long, however few.
FLUSH_S = 0.05
STOP_GRACE_S = 5.0
# Or, when longer, this many times the consumers' largest batch gap.
FLUSH_GAPS = 1.5
# A round on the forwarder's own connection gets as long as a pooled statement would
# (command_timeout): a silent network must not hang the loop. A timed-out round is
# cancelled, which terminates the connection and so rolls the round back.
ROUND_TIMEOUT_S = 60.0
NO_BODY = "not sent: its event's body is gone"


class Attempt:
    """What one POST came back with."""

    __slots__ = ("claimed", "error", "finished", "retry_after", "status")

    def __init__(self, claimed: deliveries.Claimed) -> None:
        self.claimed = claimed
        self.status: int | None = None
        self.error: str | None = None
        self.retry_after: str | None = None
        self.finished = 0.0


class Forwarder:
    """Forwards deliveries (a service: gateway.runtime.services)."""

    name = "forwarder"
    # It bounds its own stop: requests in flight get STOP_GRACE_S, the last outcomes one round.
    stop_grace_s: float | None = None

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.clock = clock or SystemClock()
        self.rand = rand
        self.wake = asyncio.Event()
        # Set by ``kick``: consumers of this process committed deliveries.
        self._kicked = asyncio.Event()
        # Names this forwarder's leases (a restarted one holds nothing of its predecessor's).
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        # What the transactions of the consumers that kick it name it by (deliveries.woken_by):
        # the NOTIFY of their commits carries it, and is not a wake-up for this forwarder.
        self.token = secrets.token_hex(8)
        # Outcomes wait this long for a round: the consumers' batches are up to their gap
        # apart, and the round each one wakes writes what waits (a round of their own would
        # cost its fixed work, and hold the next batch's claim back by the round gap).
        self._flush_s = max(FLUSH_S, FLUSH_GAPS * settings.consumer_batch_gap_ms / 1000)
        # Claimed deliveries waiting for a poster, and how many posters are posting one.
        self._queue: asyncio.Queue[deliveries.Claimed] = asyncio.Queue()
        self._busy = 0
        self._idle = asyncio.Event()  # set while no poster is posting
        self._idle.set()
        self._posters: list[asyncio.Task[None]] = []
        self._done: list[Attempt] = []
        self._flush: asyncio.TimerHandle | None = None  # wakes the loop _flush_s after an outcome
        # Deliveries claimed and not yet recorded: its leases hold these (the rounds say so).
        self._held: set[deliveries.Ref] = set()
        # A round refills the queue when it is down to this; written outcomes wait for this many.
        self._refill_at = self._flush_at = max(1, settings.forward_batch // 2)
        self._backlog = False  # the last claim was as large as allowed: more is likely due
        self._keys: dict[str, bytes] = {}
        self._refused: dict[str, str | None] = {}
        # Per destination: its delivered counter and latency histogram (labels() is a locked
        # dict lookup; once per delivery it shows in a profile).
        self._ok_metrics: dict[str, tuple[Counter, Histogram]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._conn: asyncpg.Connection | None = None
        self._housekept = 0.0
        self._free_before = 0
        self.again = False  # the last round freed work only the next one can claim
        self._spacing = Spacing(settings.forward_round_gap_ms / 1000, settings.forward_round_gather)
        self._gone: set[int] = set()  # destinations that answered 410, until a round disables them
        # Destinations that answered 410: what is claimed for them is not sent. True once a
        # round has disabled it: a later round's claim for it means it was enabled again.
        self._skip: dict[int, bool] = {}
        self._unwritten: tuple[list[deliveries.Result], list[tuple[int, bool, int]]] = ([], [])
        # On a Citus coordinator, the lanes of each shard of the lanes group: a round names one
        # shard's lanes (its statements are planned there, sql/functions/forward_round.sql).
        # Empty: one PostgreSQL, a round of every lane. Asked once, by the first round.
        self._shards: list[list[int]] | None = None
        self._shard_of: dict[int, int] = {}  # lane -> index in _shards
        self._lanes: dict[deliveries.Ref, int] = {}  # on Citus: the lane of each delivery held
        self._next_shard = 0  # the shard a step's rounds start with (each in turn)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            s = self.settings
            # Unless allowed, names resolving to loopback / private / link-local are refused.
            resolver = None if s.forward_allow_private else GuardedResolver()
            connector = aiohttp.TCPConnector(
                limit=s.forward_concurrency, ttl_dns_cache=300, resolver=resolver
            )
            timeout = aiohttp.ClientTimeout(total=s.forward_timeout_ms / 1000)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, headers={"User-Agent": USER_AGENT}
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)

    def kick(self) -> None:
        """Consumers of this process committed deliveries: a round now. Their batches are
        spaced already (``GATEWAY_CONSUMER_BATCH_GAP_MS``): a round per batch claims what the
        batch queued and writes the outcomes of the one before, and a round gap after it would
        only add latency."""
        self._kicked.set()
        self.wake.set()

    def _notified(self, payload: str) -> None:
        """A NOTIFY deliveries; one naming this forwarder came from a commit that kicked it."""
        if payload != self.token:
            self.wake.set()

    @property
    def in_flight(self) -> int:
        """Claimed deliveries not finished yet: being posted or queued for a poster."""
        return self._busy + self._queue.qsize()

    @contextlib.asynccontextmanager
    async def _db(self) -> AsyncIterator[Tx]:
        """The connection of a round: the forwarder's own (a pool's would be reset, one more
        round trip, after every round), opened on first use and again after a failure."""
        dsn = self.settings.database_url
        if dsn is None:  # only a pool to go by
            async with self.pool.acquire() as conn:
                yield conn
            return
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect(dsn, timeout=self.settings.db_connect_timeout_s)
        yield self._conn

    async def _made_day(self, exc: BaseException) -> bool:
        """A round failed because today has no partition of the table it writes (the job that
        makes them days ahead never reached this one): make it now. False when none was made
        (another process did, or it could not be): the failure is waited out as any other."""
        table = missing_partition(exc)
        if table is None:
            return False
        try:
            async with self.pool.acquire() as conn:
                made = await retention.ensure_today(conn, table=table)
        except Exception as failed:
            log.warning("%s has no partition for today and none could be made: %s", table, failed)
            return False
        log.warning("%s had no partition for today: %s", table, "made it" if made else "it exists now")
        return made

    # --- one round: write outcomes, claim, start requests -------------------------------------

    async def step(self) -> int:
        """Write finished attempts, claim what free slots allow and start them; claimed count."""
        s = self.settings
        results, breakers = self._outcomes()
        if self._unwritten[0]:  # outcomes a failed round could not write: try them again
            results = self._unwritten[0] + results
            breakers = merge_tallies(self._unwritten[1], breakers)
            self._unwritten = ([], [])
        # Claimed deliveries queue for a poster, up to one claim (forward_batch) beyond what
        # the posters hold: a finished request's poster takes the next one at once, and a
        # round (a few round trips, each behind a busy event loop) refills the queue before
        # the posters empty it.
        free = s.forward_concurrency + s.forward_batch - self.in_flight
        self._free_before = free
        limit = min(free, s.forward_batch)
        now = time.monotonic()
        housekeeping = now - self._housekept >= HOUSEKEEPING_S
        if housekeeping:
            self._housekept = now
        if not results and limit <= 0 and not housekeeping:
            return 0
        gone = set(self._gone)
        disabled = {d for d, written in self._skip.items() if written}
        held = self._held.difference(r.ref for r in results)
        try:
            async with asyncio.timeout(ROUND_TIMEOUT_S), self._db() as conn:
                claimed, changes, half_open = await self._cycle(
                    conn,
                    held=held,
                    results=results,
                    breakers=breakers,
                    limit=limit,
                    lease_s=s.forward_lease_s,
                    cooldown_s=s.forward_breaker_cooldown_s,
                    housekeeping=housekeeping,
                    gone=gone,
                )
        except BaseException:
            self._unwritten = (results, breakers)
            raise
        self._held = held.union(c.ref for c in claimed)
        self._backlog = 0 < limit == len(claimed)
        self._gone -= gone
        for dest in gone:
            self._skip[dest] = True
        for c in claimed:
            if c.destination_id in disabled:
                del self._skip[c.destination_id]  # enabled again since
                disabled.discard(c.destination_id)
        for name, old, new in changes:
            if new == "gone":
                log.warning("destination %s disabled: it answered 410 Gone", name)
                metrics.FORWARD_DISABLED.labels(name, "gone").inc()
                continue
            log.warning("destination %s: breaker %s -> %s", name, old, new)
        for name in half_open:
            log.info("destination %s: breaker half-open, probing", name)
        for c in claimed:
            self._queue.put_nowait(c)
        # The round's claim came before its housekeeping turned a breaker half-open: the probe
        # is claimed by the next round.
        self.again = bool(half_open)
        return len(claimed)

    async def _cycle(
        self,
        conn: Tx,
        *,
        held: set[deliveries.Ref],
        results: list[deliveries.Result],
        breakers: list[tuple[int, bool, int]],
        limit: int,
        lease_s: float,
        cooldown_s: float,
        housekeeping: bool,
        gone: set[int],
    ) -> tuple[list[deliveries.Claimed], list[tuple[str, str, str]], list[str]]:
        """One round on one PostgreSQL; on a Citus coordinator one round per shard of the lanes
        group that has outcomes to write or while the claim wants more, each shard in turn
        first (breaker counts, 410s and housekeeping go with the first round). A later round's
        leases must still name what an earlier one claimed, and the outcomes not written yet."""
        if self._shards is None:
            self._shards = await self._lane_shards(conn)
        cycle = functools.partial(
            deliveries.cycle, conn, forwarder=self.id, threshold=self.settings.forward_breaker_failures,
            lease_s=lease_s, cooldown_s=cooldown_s,
        )  # fmt: skip
        if not self._shards:
            return await cycle(
                held=held, results=results, breakers=breakers, limit=limit,
                housekeeping=housekeeping, gone=gone,
            )  # fmt: skip
        n = len(self._shards)
        by_shard: dict[int, list[deliveries.Result]] = {}
        for r in results:
            by_shard.setdefault(self._shard_of.get(self._lanes.get(r.ref, 0), 0), []).append(r)
        unwritten = {r.ref for r in results}
        claimed: list[deliveries.Claimed] = []
        changes: list[tuple[str, str, str]] = []
        half_open: list[str] = []
        start, self._next_shard = self._next_shard, (self._next_shard + 1) % n
        first = True
        for i in (start + k for k in range(n)):
            mine = by_shard.get(i % n, [])
            if not first and not mine and len(claimed) >= limit:
                continue
            unwritten.difference_update(r.ref for r in mine)
            got, ch, half = await cycle(
                held=held | unwritten | {c.ref for c in claimed},
                results=mine,
                breakers=breakers if first else [],
                limit=max(0, limit - len(claimed)),
                housekeeping=housekeeping and first,
                gone=gone if first else set(),
                lanes=self._shards[i % n],
            )
            first = False
            claimed += got
            changes += ch
            half_open += half
        for r in results:
            self._lanes.pop(r.ref, None)
        for c in claimed:
            self._lanes[c.ref] = c.lane
        return claimed, changes, half_open

    async def _lane_shards(self, conn: Tx) -> list[list[int]]:
        """On a Citus coordinator with the gateway's tables distributed, the lanes of each shard
        of the lanes group; otherwise none."""
        if not (await citus_state(conn))[1]:
            return []
        by_shard: dict[int, list[int]] = {}
        for lane, shard in sorted((await lanes.shards(conn)).items()):
            by_shard.setdefault(shard, []).append(lane)
        shards = [by_shard[k] for k in sorted(by_shard)]
        self._shard_of = {lane: i for i, ls in enumerate(shards) for lane in ls}
        return shards

    def _host_refused(self, url: str) -> str | None:
        """An IP literal or localhost name the resolver would never see (cached per URL)."""
        if url not in self._refused:
            why = addresses.host_refused(urlsplit(url).hostname or "")
            self._refused[url] = None if why is None else f"{why} (GATEWAY_FORWARD_ALLOW_PRIVATE)"
        return self._refused[url]

    def _key(self, secret: str) -> bytes:
        key = self._keys.get(secret)
        if key is None:
            key = self._keys[secret] = stdwebhooks.secret_key(secret)
        return key

    async def _poster(self) -> None:
        """Post claimed deliveries one after another until cancelled."""
        queue = self._queue
        while True:
            # get_nowait first: a poster almost always finds one waiting (no coroutine to make)
            try:
                c = queue.get_nowait()
            except asyncio.QueueEmpty:
                c = await queue.get()
            self._busy += 1
            self._idle.clear()
            try:
                await self._attempt(c)
            finally:
                self._busy -= 1
                if not self._busy:
                    self._idle.set()

    async def _attempt(self, c: deliveries.Claimed) -> None:
        a = Attempt(c)
        if c.body is None:  # its event's body is gone (dropped by hand?): nothing to send
            a.error, a.finished = NO_BODY, self.clock.now()
            self._finished(a)
            return
        if c.destination_id in self._skip:
            # Claimed before its destination answered 410: back to pending, unsent.
            a.error, a.finished = "not sent: the destination answered 410 Gone", -1.0
            self._finished(a)
            return
        try:
            if not self.settings.forward_allow_private and (why := self._host_refused(c.url)):
                raise RefusedAddress(errno.EACCES, why)
            if c.meta:
                # As Meta signs its webhooks (one signature: see docs/forwarding.md), and the
                # webhook-id a receiver may deduplicate on.
                headers = {"webhook-id": c.webhook_id, "X-Hub-Signature-256": sign_meta(c.body, c.secret)}
            else:
                ts = int(self.clock.now())
                previous = None if c.previous_secret is None else self._key(c.previous_secret)
                headers = stdwebhooks.headers(self._key(c.secret), c.webhook_id, ts, c.body, previous)
            headers["Content-Type"] = "application/json"
            async with self.session.post(c.url, data=c.body, headers=headers, allow_redirects=False) as resp:
                a.status = resp.status
                if not 200 <= resp.status < 300:
                    a.retry_after = resp.headers.get("Retry-After")
                    if resp.status == 410:
                        self._skip.setdefault(c.destination_id, False)
                    text = await resp.content.read(MAX_ERROR_BODY)
                    a.error = " ".join(text.decode("utf-8", "replace").split())[:MAX_ERROR_BODY] or None
        except TimeoutError:
            a.error = "timeout"
        except RefusedAddress as exc:
            a.error = f"refused: {exc.strerror}"[:MAX_ERROR_BODY]
        except aiohttp.ClientError as exc:
            a.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_BODY]
        except stdwebhooks.BadSecret as exc:  # a secret edited by hand in the table
            a.error = f"bad secret: {exc}"
        except asyncio.CancelledError:
            a.error = "forwarder stopped"
            a.finished = -1.0  # not the receiver's fault: no breaker count, retry at once
            self._done.append(a)
            raise
        a.finished = self.clock.now()
        self._finished(a)

    @property
    def _refill_due(self) -> bool:
        """The queue needs refilling while a backlog is due (the last claim was full)."""
        return self._backlog and self._queue.qsize() <= self._refill_at

    def _finished(self, a: Attempt) -> None:
        """Keep an outcome for the next round, and wake the loop when a round is worth it: the
        queue needs refilling while a backlog is due, enough outcomes wait, or a conversation's
        next delivery waits on this one. Otherwise the outcomes go with the next round a kick
        or a NOTIFY calls for, or within ``_flush_s``: a round per burst of finished requests
        (at a few hundred webhooks a second, a burst per consumer commit) would cost the
        database a round's fixed work for a handful of outcomes that nothing waits for."""
        self._done.append(a)
        if self._refill_due or len(self._done) >= self._flush_at or a.claimed.ordered:
            self.wake.set()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self._flush_s, self.wake.set)

    def _outcomes(self) -> tuple[list[deliveries.Result], list[tuple[int, bool, int]]]:
        """Finished attempts as rows to write, and per destination (any success, failures after
        the last success) for its breaker. Metrics are counted here."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self._done:
            return [], []
        done, self._done = self._done, []
        s = self.settings
        results: list[deliveries.Result] = []
        per_dest: dict[int, list[bool]] = {}
        delivered: dict[str, int] = {}  # per destination, counted once a round
        now = self.clock.now()
        for a in done:
            c = a.claimed
            if c.body is None:
                results.append(deliveries.Result(c.destination_id, c.id, "failed", None, None, a.error))
                log.warning("delivery %d (%s) to %s failed: %s", c.id, c.webhook_id, c.destination, a.error)
                continue
            if a.finished < 0:
                results.append(deliveries.Result(c.destination_id, c.id, "pending", 0.0, None, a.error))
                continue
            status = a.status
            if status is not None and 200 <= status < 300:
                # The common case, without decide()'s retry arithmetic (what it would say).
                results.append(deliveries.Result(c.destination_id, c.id, "delivered", None, status, None))
                per_dest.setdefault(c.destination_id, []).append(True)
                delivered[c.destination] = delivered.get(c.destination, 0) + 1
                self._delivered_metrics(c.destination)[1].observe(max(0.0, a.finished - c.received_at))
                continue
            d = decide(
                status=status,
                error=a.error,
                retry_after=a.retry_after,
                now=now,
                first_attempt_at=c.window_start,
                backoff_s=backoff_delay(
                    c.attempts, s.forward_retry_base_ms / 1000, s.forward_retry_max_ms / 1000, self.rand
                ),
                retry_window_s=s.forward_retry_h * 3600,
            )
            results.append(
                deliveries.Result(c.destination_id, c.id, d.state.value, d.delay_s, status, d.error)
            )
            metrics.FORWARD_DELIVERIES.labels(c.destination, d.outcome.value).inc()
            if d.outcome is DeliveryOutcome.GONE:
                # Not an outage to count towards the breaker: the endpoint says it is gone.
                if c.destination_id not in self._gone:
                    self._gone.add(c.destination_id)
                    log.warning(
                        "destination %s answered delivery %d (%s) with %s: disabling it; its "
                        "deliveries wait (gateway destinations enable %s when it is back)",
                        c.destination, c.id, c.webhook_id, d.error, c.destination,
                    )  # fmt: skip
                continue
            per_dest.setdefault(c.destination_id, []).append(d.outcome is DeliveryOutcome.DELIVERED)
            if d.outcome is DeliveryOutcome.FAILED:
                log.warning(
                    "delivery %d (%s) to %s failed after %d attempts: %s",
                    c.id, c.webhook_id, c.destination, c.attempts, d.error,
                )  # fmt: skip
        for name, n in delivered.items():
            self._delivered_metrics(name)[0].inc(n)
        return results, [(dest, *breaker_tally(oks)) for dest, oks in per_dest.items()]

    def _delivered_metrics(self, destination: str) -> tuple[Counter, Histogram]:
        m = self._ok_metrics.get(destination)
        if m is None:
            m = self._ok_metrics[destination] = (
                metrics.FORWARD_DELIVERIES.labels(destination, DeliveryOutcome.DELIVERED.value),
                metrics.FORWARD_LATENCY.labels(destination),
            )
        return m

    # --- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Forward until ``stop`` is set; then let requests in flight finish (briefly) and record them."""
        # Beside the loop, not before it: looking up every destination may take seconds.
        check = asyncio.create_task(warn_refused(self.pool, self.settings))
        listener = asyncio.create_task(self._listen(stop))
        # A stop wakes the loop, which may be waiting up to a whole poll interval.
        stopped = asyncio.create_task(stop.wait())
        stopped.add_done_callback(lambda _: self.wake.set())
        n = self.settings.forward_concurrency
        self._posters = [asyncio.create_task(self._poster()) for _ in range(n)]
        poll_s = self.settings.forward_poll_ms / 1000
        # A turn: one claim round (its statements), then at most a poll interval.
        beat = HEARTBEATS.loop("forwarder", self.settings.liveness_s + poll_s)
        clock = asyncio.get_running_loop().time
        reserved = False  # this round's start was reserved after a wake-up
        try:
            while not stop.is_set():
                beat()
                self.wake.clear()
                self._kicked.clear()
                if not reserved:
                    self._spacing.started(clock())
                reserved = False
                try:
                    claimed = await self.step()
                    self._spacing.counted(clock(), claimed)
                except Exception as exc:
                    if await self._made_day(exc):
                        continue  # the round again at once, with the outcomes it could not write
                    log.warning("forwarder step failed: %s: %s", type(exc).__name__, exc)
                    claimed = 0
                    await sleep_unless_stopped(stop, poll_s)
                    continue
                full = claimed and claimed == min(self.settings.forward_batch, self._free_before)
                if full and self._queue.qsize() <= self._refill_at:
                    continue  # a full claim and room for more: more may be due right now
                if self.again:
                    continue
                await wait_set(self.wake, min(poll_s, self._flush_s) if self._done else poll_s)
                if self._refill_due or self._kicked.is_set():
                    continue  # what it claims is due already, or was gathered by the consumers
                reserved = True
                delay = self._spacing.reserve(clock())
                if delay > 0 and not stop.is_set():
                    # At most the gap (a stop is seen right after), or until a kick.
                    await wait_set(self._kicked, delay)
        finally:
            beat.done()
            stopped.cancel()
            check.cancel()
            await self._drain()
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _drain(self) -> None:
        """At stop: queued deliveries go back at once (nothing was sent), requests in flight get
        a short grace and are then cancelled; every outcome is written if the database lets."""
        while not self._queue.empty():
            a = Attempt(self._queue.get_nowait())
            a.error, a.finished = "forwarder stopped", -1.0  # not the receiver's fault: retry at once
            self._done.append(a)
        await wait_set(self._idle, STOP_GRACE_S)
        for p in self._posters:
            p.cancel()
        await asyncio.gather(*self._posters, return_exceptions=True)
        self._posters = []
        if self._done or self._unwritten[0] or self._gone:
            results, breakers = self._outcomes()
            results = self._unwritten[0] + results
            breakers = merge_tallies(self._unwritten[1], breakers)
            n = len(results)
            try:
                async with asyncio.timeout(ROUND_TIMEOUT_S), self._db() as conn:
                    await self._cycle(
                        conn, held=self._held.difference(r.ref for r in results),
                        results=results, breakers=breakers,
                        limit=0, lease_s=0, cooldown_s=0, housekeeping=False, gone=self._gone,
                    )  # fmt: skip
            except Exception as exc:  # their leases run out and another forwarder retries them
                log.warning("could not record %d outcomes at stop: %s", n, exc)

    async def _listen(self, stop: asyncio.Event) -> None:
        """Wake on NOTIFY deliveries (polling covers the gaps)."""
        dsn = self.settings.database_url
        assert dsn
        opener = functools.partial(own_connection, dsn, self.settings.db_connect_timeout_s)
        liveness_s = self.settings.liveness_s
        await listen(opener, deliveries.CHANNEL, self.wake.set, stop, self._notified, liveness_s=liveness_s)

"""The forwarder's rounds: outcomes and the next claim in one statement on a connection of its
own, workers fed from a queue. What these must not cost: ordering or a half-open probe waiting
for the poll, a lost connection stopping forwarding, a stop sending or losing queued work."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import datetime

import asyncpg
import pytest
from aiohttp import ClientConnectorError, ClientSession, TCPConnector
from aiohttp.abc import AbstractResolver, ResolveResult

from gateway.core.settings import Settings
from gateway.inbound.consumer import Consumer
from gateway.outbound.egress import GuardedResolver, RefusedAddress, warn_refused
from gateway.outbound.forwarder import Forwarder
from gateway.store import deliveries
from gateway.testing.fake_receiver import FakeReceiver, Scripted
from gateway.testing.payloads import message_obj, messages_payload, to_bytes
from tests.support import deliveries as moved
from tests.support.config import DESTINATION_SECRET
from tests.support.consume import read_all, stage
from tests.support.forward import (
    add,
    all_delivered,
    fast,
    forwarding,
    order_per_customer,
    process_messages,
    queue_rebuilt,
    states,
    until,
)

# Far longer than any wait below: only NOTIFY and the forwarder's own re-rounds can wake it.
NO_POLL = {"forward_poll_ms": 600_000}


async def test_an_ordered_conversation_flows_without_waiting_for_the_poll(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # One customer, six messages, one in flight at a time: each next one is claimable only
    # after its predecessor's outcome is written, which the claim of the same round cannot
    # see. The forwarder must run the next round itself; a NOTIFY comes only once, up front.
    await add(pool, "bot", receiver.url, ("message",), ordered=True)
    await process_messages(pool, settings, 6, customers=1)
    async with forwarding(pool, fast(settings, **NO_POLL)):
        await until(lambda: all_delivered(pool), timeout_s=15, what="all six delivered without polling")
    seq = [
        int(receiver.state.processed[i]["data"]["wamid"].removeprefix("wamid.F"))
        for i in receiver.state.order
    ]
    assert seq == list(range(6))


async def test_ordering_holds_per_customer_across_rounds(pool: asyncpg.Pool, settings: Settings) -> None:
    r = FakeReceiver(DESTINATION_SECRET, latency_ms=5)
    await r.start()
    try:
        await add(pool, "bot", r.url, ("message",), max_in_flight=8, ordered=True)
        await process_messages(pool, settings, 60, customers=6)
        async with forwarding(pool, fast(settings, forward_batch=4, forward_concurrency=4, **NO_POLL)):
            await until(lambda: all_delivered(pool), what="every delivery delivered")
        per_customer = order_per_customer(r)
        assert len(per_customer) == 6
        assert all(seq == sorted(seq) for seq in per_customer.values())
        assert len(r.state.attempts) == 60  # no faults: each posted once
    finally:
        await r.close()


async def test_a_half_open_probe_is_claimed_in_the_round_right_after(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # Housekeeping runs after the round's claim; the round that turns a breaker half-open
    # asks for another at once (the loop does not wait for a wake-up or the poll).
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 3)
    await pool.execute(
        "UPDATE destinations SET breaker_state = 'open', breaker_changed_at = now() - interval '1 minute'"
    )
    fw = Forwarder(pool, fast(settings, forward_breaker_cooldown_s=1.0))
    try:
        assert await fw.step() == 0  # the breaker was open when the claim ran
        assert fw.again
        assert await pool.fetchval("SELECT breaker_state FROM destinations") == "half_open"
        assert await fw.step() == 1  # one probe
        assert not fw.again
        assert await fw.step() == 0  # and only one while it is out
    finally:
        await fw.close()


async def test_forwarding_goes_on_after_its_database_connections_are_killed(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "crm", receiver.url)
    await process_messages(pool, settings, 5, prefix="wamid.A")
    async with forwarding(pool, fast(settings)):
        await until(lambda: all_delivered(pool), what="first five delivered")
        # Every other session of this database: the forwarder's round connection and its
        # LISTEN connection among them (and the pool's idle ones, which the pool replaces).
        killed = await pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert killed >= 2
        await process_messages(pool, settings, 5, prefix="wamid.B")
        await until(lambda: all_delivered(pool), what="the next five delivered after reconnecting")
    assert len(receiver.state.processed) == 10
    assert not receiver.state.duplicates


async def test_stop_returns_queued_deliveries_at_once_and_lets_requests_in_flight_finish(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    r = FakeReceiver(DESTINATION_SECRET, latency_ms=400)
    await r.start()
    try:
        await add(pool, "crm", r.url)
        await process_messages(pool, settings, 5)
        fw = Forwarder(pool, fast(settings, forward_concurrency=1, forward_batch=4, forward_timeout_ms=5000))
        stop = asyncio.Event()
        task = asyncio.create_task(fw.run(stop))
        try:
            # One request in flight (400 ms at the receiver), four claimed ones queued for it.
            await until(lambda: _is_in_flight(fw, 5), what="five claimed")
            stop.set()
            await asyncio.wait_for(task, 10)
        finally:
            await fw.close()
        assert len(r.state.attempts) == 1  # the queued ones were never sent
        assert await states(pool) == {"delivered": 1, "pending": 4}
        rows = await pool.fetch(
            "SELECT last_error, next_attempt_at <= clock_timestamp() AS due FROM deliveries"
        )
        assert (
            sorted((x["last_error"], x["due"]) for x in rows if x["last_error"])
            == [("forwarder stopped", True)] * 4
        )
        # Not the receiver's fault: no breaker count.
        assert await pool.fetchval("SELECT consecutive_failures FROM destinations") == 0
    finally:
        await r.close()


async def _is_in_flight(fw: Forwarder, n: int) -> bool:
    return fw.in_flight == n


async def _round(
    pool: asyncpg.Pool,
    forwarder: str,
    held: set[deliveries.Ref],
    results: list[deliveries.Result] | None = None,
    breakers: list[tuple[int, bool, int]] | None = None,
) -> list[deliveries.Claimed]:
    """One round of ``forwarder`` holding ``held`` besides ``results``, as a Forwarder runs it."""
    async with pool.acquire() as conn:
        claimed, _, _ = await deliveries.cycle(
            conn, forwarder=forwarder, held=held, results=results or [], breakers=breakers or [],
            threshold=5, limit=10, lease_s=60, cooldown_s=30, housekeeping=False,
        )  # fmt: skip
    return claimed


def _ids(claimed: list[deliveries.Claimed]) -> list[int]:
    return sorted(c.id for c in claimed)


async def test_one_round_writes_outcomes_frees_room_and_claims_again(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # The statement's claim sees the rows it writes as still delivering: the room they free
    # must be added back, or a full destination would claim nothing in the round that freed it.
    dest = await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=2)
    await process_messages(pool, settings, 4)

    held: set[deliveries.Ref] = set()  # what the forwarder holds, as a Forwarder keeps it

    async def cycle(results: list[deliveries.Result]) -> list[deliveries.Claimed]:
        nonlocal held
        held = held.difference(r.ref for r in results)
        breakers = [(dest, True, 0)] if results else []
        claimed = await _round(pool, "test", held, results, breakers=breakers)
        held = held.union(c.ref for c in claimed)
        return claimed

    first = await cycle([])
    assert len(first) == 2  # max_in_flight
    assert await cycle([]) == []  # full
    done = [deliveries.Result(c.destination_id, c.id, "delivered", None, 204, None) for c in first]
    second = await cycle(done)
    assert len(second) == 2 and {c.id for c in second}.isdisjoint(c.id for c in first)
    assert await states(pool) == {"delivered": 2, "delivering": 2}
    assert all(isinstance(c.body, bytes) and c.received_at > 0 and c.window_start > 0 for c in second)


async def test_a_claim_whose_answer_never_arrived_is_due_again_and_never_claimed_twice(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A round that committed but whose answer was lost (a cancelled or timed-out call): the
    # forwarder does not know it holds those deliveries. Its next round names what it holds;
    # the lease keeps only that, so they are due again, not held (renewed) forever.
    await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=10)
    await process_messages(pool, settings, 3)
    claims = await _round(pool, "a", set())
    lost = _ids(claims)
    assert len(lost) == 3
    # Meanwhile no other forwarder may claim them, nor write an outcome for one.
    stale = [deliveries.Result(claims[0].destination_id, lost[0], "delivered", None, 200, None)]
    assert _ids(await _round(pool, "b", set(), stale)) == []
    assert await states(pool) == {"delivering": 3}
    # The next round of "a" names nothing it holds.
    assert _ids(await _round(pool, "a", set())) == []
    assert await states(pool) == {"pending": 3}
    assert _ids(await _round(pool, "b", set())) == lost  # due again, each claimed once
    assert await pool.fetchval("SELECT sum(attempts) FROM deliveries") == 0


async def test_fake_receiver_wait_answers_when_enough_are_processed(receiver: FakeReceiver) -> None:
    from gateway.core import stdwebhooks

    key = stdwebhooks.secret_key(DESTINATION_SECRET)
    base = receiver.url.removesuffix("/hooks")
    async with ClientSession() as http:

        async def post(i: int) -> None:
            body = b'{"n": %d}' % i
            headers = stdwebhooks.headers(key, f"wh_{i}", int(time.time()), body)
            async with http.post(receiver.url, data=body, headers=headers) as r:
                assert r.status == 204

        async def wait(n: int, timeout_s: float) -> int:
            params = {"processed": str(n), "timeout": str(timeout_s)}
            async with http.get(f"{base}/_fake/wait", params=params) as r:
                return int((await r.json())["processed"])

        waiting = asyncio.create_task(wait(3, 30))
        for i in range(3):
            assert not waiting.done()
            await post(i)
        assert await asyncio.wait_for(waiting, 10) == 3
        assert await wait(5, 0.05) == 3  # the timeout answers with what there is


async def test_410_gone_disables_the_destination_and_its_deliveries_wait(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    from prometheus_client import REGISTRY

    from gateway.maintenance import gauges

    other = FakeReceiver(DESTINATION_SECRET)
    await other.start()
    try:
        await add(pool, "gone", receiver.url, ("message",))
        await add(pool, "fine", other.url, ("message",))
        receiver.script.append(Scripted(410))
        labels = {"destination": "gone", "reason": "gone"}
        before = REGISTRY.get_sample_value("gateway_forward_destinations_disabled_total", labels) or 0
        await process_messages(pool, settings, 4)
        async with forwarding(pool, fast(settings, forward_concurrency=1, forward_batch=1)):
            await until(lambda: _delivered_to(pool, "fine", 4), what="the other destination served")
            await until(lambda: _is_disabled(pool, "gone"), what="disabled by the 410")
            await asyncio.sleep(0.3)  # a few more rounds: nothing more goes to it
        assert len(receiver.state.attempts) == 1  # one 410, no retries
        rows = await pool.fetch(
            "SELECT dl.state, dl.last_status, dl.attempts FROM deliveries dl"
            " JOIN destinations d ON d.id = dl.destination_id WHERE d.name = 'gone' ORDER BY dl.id"
        )
        assert [r["state"] for r in rows] == ["pending"] * 4  # nothing failed or lost
        assert sorted(r["last_status"] for r in rows if r["last_status"]) == [410]
        dest = {d.name: d for d in await deliveries.list_destinations(pool)}
        assert dest["gone"].gone and not dest["gone"].enabled
        assert (dest["gone"].breaker_state, dest["gone"].consecutive_failures) == ("closed", 0)
        assert not dest["fine"].gone
        assert REGISTRY.get_sample_value("gateway_forward_destinations_disabled_total", labels) == before + 1
        await gauges.refresh_forward(pool)
        assert REGISTRY.get_sample_value("gateway_forward_destination_enabled", {"destination": "gone"}) == 0
        assert REGISTRY.get_sample_value("gateway_forward_destination_enabled", {"destination": "fine"}) == 1
        # Back: enabled by an operator, the waiting deliveries go out.
        assert await deliveries.set_enabled(pool, name="gone", enabled=True)
        async with forwarding(pool, fast(settings)):
            await until(lambda: _delivered_to(pool, "gone", 4), what="the backlog sent after enable")
        assert len(receiver.state.processed) == 4
        assert not (await deliveries.list_destinations(pool))[0].gone
    finally:
        await other.close()


async def _delivered_to(pool: asyncpg.Pool, name: str, n: int) -> bool:
    got = await pool.fetchval(
        "SELECT count(*) FROM deliveries dl JOIN destinations d ON d.id = dl.destination_id"
        " WHERE d.name = $1 AND dl.state = 'delivered'",
        name,
    )
    return bool(got == n)


async def _is_disabled(pool: asyncpg.Pool, name: str) -> bool:
    return bool(await pool.fetchval("SELECT NOT enabled FROM destinations WHERE name = $1", name))


async def test_a_rotated_secret_keeps_signing_with_the_old_one_until_the_grace_ends(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    from gateway.core import stdwebhooks

    new = stdwebhooks.generate_secret()
    old_side = FakeReceiver(DESTINATION_SECRET)  # a receiver that has not switched yet
    new_side = FakeReceiver(new)  # one that already has
    await old_side.start()
    await new_side.start()
    try:
        await add(pool, "old", old_side.url, ("message",))
        await add(pool, "new", new_side.url, ("message",))
        for name in ("old", "new"):
            until_ = await deliveries.rotate_secret(pool, name=name, secret=new, grace_s=3600)
            assert until_ is not None
        assert await deliveries.rotate_secret(pool, name="nope", secret=new, grace_s=1) is None
        await process_messages(pool, settings, 3, prefix="wamid.R")
        async with forwarding(pool, fast(settings)):
            await until(lambda: all_delivered(pool), what="both receivers accept during the grace")
        for r in (old_side, new_side):
            assert len(r.state.processed) == 3 and not r.state.bad_signatures
        # The grace is over: only the new secret signs; the receiver that kept the old one refuses.
        await pool.execute("UPDATE destinations SET previous_secret_until = now() - interval '1 second'")
        listed = {d.name: d for d in await deliveries.list_destinations(pool)}
        assert listed["old"].previous_secret is None  # expired: not shown, not used
        await process_messages(pool, settings, 2, prefix="wamid.S")
        async with forwarding(pool, fast(settings, forward_breaker_failures=1000)):
            await until(lambda: _delivered_to(pool, "new", 5), what="the switched receiver served")
            await until(lambda: _bad_signatures(old_side), what="the old secret refused")
        assert len(old_side.state.processed) == 3
    finally:
        await old_side.close()
        await new_side.close()


async def _bad_signatures(r: FakeReceiver) -> bool:
    return r.state.bad_signatures > 0


class _StaticResolver(AbstractResolver):
    """DNS as a test sets it: name -> addresses (the real lookups stay the default's)."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(hostname=host, host=a, port=port, family=family, proto=0, flags=0)
            for a in self.table[host]
        ]

    async def close(self) -> None:
        pass


async def test_the_resolver_refuses_names_that_resolve_inside(receiver: FakeReceiver) -> None:
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    table = {"intranet.example": ["127.0.0.1"], "mixed.example": ["93.184.215.14", "10.0.0.7"]}
    guarded = GuardedResolver(_StaticResolver(table))
    async with ClientSession(connector=TCPConnector(resolver=guarded)) as http:
        with pytest.raises(ClientConnectorError, match="loopback"):
            await http.post(f"http://intranet.example:{port}/hooks", data=b"{}")
    assert not receiver.state.attempts  # refused before connecting
    with pytest.raises(RefusedAddress, match="private"):
        await guarded.resolve("mixed.example", 443)  # all or nothing
    assert await GuardedResolver(_StaticResolver({"crm.example": ["93.184.215.14"]})).resolve("crm.example")


async def test_the_resolver_judges_a_nat64_or_6to4_answer_by_the_ipv4_address_it_carries() -> None:
    """A name whose AAAA record is 64:ff9b::a9fe:a9fe reaches 169.254.169.254 (the metadata
    endpoint) through a NAT64 gateway, as 2002:7f00:1:: reaches 127.0.0.1 through 6to4."""
    table = {
        "nat64.example": ["64:ff9b::a9fe:a9fe"],
        "sixtofour.example": ["2002:7f00:1::1"],
        "public.example": ["64:ff9b::5db8:d70e"],  # NAT64 of a public address: fine
    }
    guarded = GuardedResolver(_StaticResolver(table))
    with pytest.raises(RefusedAddress, match=r"carries 169\.254\.169\.254, a link-local"):
        await guarded.resolve("nat64.example", 443, socket.AF_INET6)
    with pytest.raises(RefusedAddress, match=r"carries 127\.0\.0\.1, a loopback"):
        await guarded.resolve("sixtofour.example", 443, socket.AF_INET6)
    assert await guarded.resolve("public.example", 443, socket.AF_INET6)


async def test_the_forwarder_refuses_private_destinations_unless_allowed(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    await add(pool, "inside", receiver.url, ("message",))  # http://127.0.0.1:PORT/hooks
    await process_messages(pool, settings, 2)
    guarded = fast(
        settings, forward_allow_private=False, forward_retry_base_ms=5000, forward_retry_max_ms=5000
    )
    async with forwarding(pool, guarded):
        await until(lambda: _attempted_all(pool, 2), what="both attempted")
    assert not receiver.state.attempts  # nothing reached the receiver
    errors = await pool.fetch("SELECT state, last_error FROM deliveries")
    assert all(r["state"] == "pending" and "loopback" in r["last_error"] for r in errors), errors
    await moved.due(pool, "now()")
    async with forwarding(pool, fast(settings)):  # allowed: delivered
        await until(lambda: all_delivered(pool), what="delivered once allowed")
    assert len(receiver.state.processed) == 2


async def _attempted_all(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM deliveries WHERE last_error IS NOT NULL") == n)


async def test_start_up_names_the_destinations_the_guard_will_refuse(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Destinations added before the guard (or with it off) would fail quietly: each is named once."""
    await add(pool, "inside", receiver.url, ("message",))  # http://127.0.0.1:PORT/hooks
    await add(pool, "outside", "https://93.184.215.14/hooks", ("message",))
    await add(pool, "off", "http://10.0.0.7/hooks", ("message",))
    await deliveries.set_enabled(pool, name="off", enabled=False)
    with caplog.at_level("WARNING", logger="gateway.outbound.egress"):
        assert await warn_refused(pool, fast(settings, forward_allow_private=False)) == ["inside"]
    assert "destination inside is refused" in caplog.text and "loopback" in caplog.text
    assert await warn_refused(pool, fast(settings)) == []  # allowed: nothing to say


async def test_a_large_lease_stays_on_one_page_round_after_round(pool: asyncpg.Pool) -> None:
    # A lease row holds up to forward_concurrency + forward_batch ids and every round rewrites
    # it. Inline, a row of 600 ids (4.8 KB) left no room on its page for its next version:
    # the table grew a page per round until autovacuum, and every round's scans read them all.
    dest = await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=1000)
    await queue_rebuilt(pool, dest, "L", 1300)
    held: set[deliveries.Ref] = set()
    for _ in range(30):  # each round: 20 outcomes, 20 new claims, about 600 held
        done = sorted(held)[:20]
        held.difference_update(done)
        results = [deliveries.Result(d, i, "delivered", None, 200, None) for d, i in done]
        async with pool.acquire() as conn:
            claimed, _, _ = await deliveries.cycle(
                conn, forwarder="big", held=held, results=results, breakers=[], threshold=5,
                limit=600 - len(held), lease_s=60, cooldown_s=30, housekeeping=False,
            )  # fmt: skip
        held.update(c.ref for c in claimed)
    assert len(held) == 600
    assert await pool.fetchval("SELECT cardinality(ids) FROM delivery_leases") == 600
    assert await pool.fetchval("SELECT pg_relation_size('delivery_leases') / 8192") <= 2


async def test_claims_start_at_due_from_and_housekeeping_lowers_it_for_a_late_commit(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A claim starts at its destination's due_from (past the dead index entries delivered rows
    # leave); housekeeping keeps it at most 10 s back and below every pending delivery.
    dest = await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=10)
    await queue_rebuilt(pool, dest, "DF", 2)

    async def housekeeping(held: set[deliveries.Ref]) -> list[deliveries.Claimed]:
        async with pool.acquire() as conn:
            claimed, _, _ = await deliveries.cycle(
                conn, forwarder="hk", held=held, results=[], breakers=[], threshold=5,
                limit=0, lease_s=60, cooldown_s=30, housekeeping=True,
            )  # fmt: skip
        return claimed

    assert await housekeeping(set()) == []
    lag = await pool.fetchval("SELECT extract(epoch FROM clock_timestamp() - due_from) FROM destinations")
    assert 9 < lag < 12  # the newest pending delivery is younger than 10 s: 10 s back
    # A delivery whose transaction committed long after it was written: below due_from.
    await queue_rebuilt(pool, dest, "LATE", 1)
    [late] = await moved.due(pool, "now() - interval '1 minute'", "msg:wamid.LATE0")
    held = {c.ref for c in await _round(pool, "a", set())}
    assert len(held) == 2 and late not in {r.id for r in held}  # not seen by the claim
    await housekeeping(set())  # lowers due_from to it
    assert _ids(await _round(pool, "a", held)) == [late]


async def test_deliveries_committed_within_the_gap_after_a_round_share_the_next_one(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # Every consumer commit NOTIFYs and every finished request may call for a round: one round
    # per wake-up would pay a round's fixed cost for a delivery or two. A woken round starts
    # GATEWAY_FORWARD_ROUND_GAP_MS after the last one began.
    gap_s = 1.5
    await add(pool, "bot", receiver.url, ("message",))

    async with forwarding(pool, fast(settings, forward_round_gap_ms=gap_s * 1000, **NO_POLL)) as [fw]:
        claims = _counting_claims(fw)
        await process_messages(pool, settings, 1, prefix="wamid.GAP")
        await until(lambda: _delivered(pool, 1), what="the first delivery")
        started = time.monotonic()
        for i in range(5):  # five consumer commits, five NOTIFYs, well within the gap
            await process_messages(pool, settings, 1, prefix=f"wamid.GAP{i}-")
        assert time.monotonic() - started < gap_s / 2, "the five commits took too long to test this"
        await until(lambda: _delivered(pool, 6), what="the five deliveries")
    assert [n for n in claims if n] == [1, 5], claims


async def test_a_kick_starts_a_round_at_once_and_the_notify_of_its_commit_wakes_nobody_else(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # gateway serve's consumers kick the forwarder of their process after each commit that
    # queued deliveries: their batches are spaced already, so the round starts without the
    # round gap. Their transactions name that forwarder, and the NOTIFY of the commit, which
    # names it, does not wake it (else a second round per batch).
    gap_s = 1.5
    await add(pool, "bot", receiver.url, ("message",))
    tuned = fast(settings, forward_round_gap_ms=gap_s * 1000, **NO_POLL)
    async with forwarding(pool, tuned) as [fw]:
        claims = _counting_claims(fw)
        kicking = Consumer(pool, settings, on_deliveries=fw.kick, woken=fw.token)
        silent = Consumer(pool, settings, woken=fw.token)  # names it, kicks nobody

        async def commit(consumer: Consumer, wamid: str) -> None:
            await stage(pool, to_bytes(messages_payload(message_obj(wamid))))
            assert await consumer.process_batch() == 1

        await commit(kicking, "wamid.KICK0")
        await until(lambda: _delivered(pool, 1), what="the first delivery")
        started = time.monotonic()
        await commit(kicking, "wamid.KICK1")  # within the gap of the first round: at once
        await until(lambda: _posted(receiver, 2), timeout_s=gap_s, what="the kicked delivery")
        assert time.monotonic() - started < gap_s / 2
        # Its outcome waits for a round (written within the gap): then nothing is left to do.
        await until(lambda: _delivered(pool, 2), timeout_s=3 * gap_s, what="its outcome")
        rounds = len(claims)
        await commit(silent, "wamid.KICK2")  # its NOTIFY names the forwarder: no round
        await asyncio.sleep(2 * gap_s + fw._flush_s)
        assert (await states(pool)).get("pending") == 1
        assert [n for n in claims[rounds:] if n] == [], claims
        await commit(kicking, "wamid.KICK3")  # the next kick's round claims both, at once
        await until(lambda: _posted(receiver, 4), timeout_s=gap_s, what="both deliveries")
        await until(lambda: _delivered(pool, 4), timeout_s=3 * gap_s, what="their outcomes")
    assert [n for n in claims if n] == [1, 1, 2], claims


async def test_a_notify_from_a_commit_that_names_no_forwarder_still_wakes_one(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # Another process's consumers, a replay, an enabled destination: their NOTIFY names no
    # forwarder (or another one), and every forwarder listening wakes for it.
    await add(pool, "bot", receiver.url, ("message",))
    async with forwarding(pool, fast(settings, **NO_POLL)) as [fw]:
        await asyncio.sleep(0.5)  # its first rounds (start, LISTEN up) are done: only NOTIFY wakes it
        other = Consumer(pool, settings, woken="0123abcd")  # another process's forwarder
        await stage(pool, to_bytes(messages_payload(message_obj("wamid.OTHER0"))))
        assert await other.process_batch() == 1
        await until(lambda: _delivered(pool, 1), timeout_s=5, what="the delivery")
        assert fw.token != "0123abcd"


async def test_a_retried_webhook_kicks_the_forwarder_after_its_commit(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # The retries' transactions name the forwarder too (its NOTIFY does not wake it): they kick
    # it once committed, not per webhook before the commit (a round then would find nothing,
    # and no poll comes here).
    await add(pool, "bot", receiver.url, ("message",))
    inbox_id = await stage(pool, to_bytes(messages_payload(message_obj("wamid.PARKED"))))
    await read_all(pool)  # its lane's cursor passed it: only the retry applies it
    await pool.execute(
        "INSERT INTO inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts,"
        " next_attempt_at) SELECT id, received_at, source, delivery_id, body, 'retry', 1,"
        " clock_timestamp() - interval '1 second' FROM webhook_inbox WHERE id = $1",
        inbox_id,
    )
    async with forwarding(pool, fast(settings, **NO_POLL)) as [fw]:
        await asyncio.sleep(0.2)  # its first rounds (start, LISTEN up) are done
        consumer = Consumer(pool, settings, on_deliveries=fw.kick, woken=fw.token)
        assert await consumer.process_items() == 1
        await until(lambda: _posted(receiver, 1), timeout_s=5, what="the retried webhook's delivery")


async def test_a_backlogs_refill_rounds_do_not_wait_for_the_gap(
    pool: asyncpg.Pool, settings: Settings, receiver: FakeReceiver
) -> None:
    # The gap gathers what arrives meanwhile; a backlog is due already. A round called for by
    # the posters emptying the queue while the last claim was full starts at once: waiting a
    # gap there throttled a drain to a claim per gap.
    gap_s = 1.5
    await add(pool, "bot", receiver.url, ("message",), max_in_flight=100)
    await process_messages(pool, settings, 40, prefix="wamid.REFILL")
    started = time.monotonic()
    tuned = fast(
        settings, forward_round_gap_ms=gap_s * 1000, forward_batch=4, forward_concurrency=4, **NO_POLL
    )
    async with forwarding(pool, tuned) as [fw]:
        claims = _counting_claims(fw)
        await until(lambda: _delivered(pool, 40), timeout_s=30, what="the backlog")
    took = time.monotonic() - started
    # Forty deliveries, four claimed a round: a gap before each refill took ten gaps (15 s).
    assert took < 2 * gap_s, (took, claims)


async def _posted(receiver: FakeReceiver, n: int) -> bool:
    return len(receiver.state.attempts) >= n


async def _delivered(pool: asyncpg.Pool, n: int) -> bool:
    return (await states(pool)).get("delivered") == n


def _counting_claims(fw: Forwarder) -> list[int]:
    """The claims of ``fw``'s rounds from now on, as they happen (one per round)."""
    claims: list[int] = []
    step = fw.step

    async def counted() -> int:
        n = await step()
        claims.append(n)
        return n

    fw.step = counted  # type: ignore[method-assign]
    return claims


async def test_an_idle_round_writes_no_lease_until_a_tenth_of_it_is_used(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    """Leases are written when what a forwarder holds changes, or to renew them: an idle round
    writes nothing (on Citus delivery_leases is a reference table: a write is a two-phase commit
    on every node)."""
    await add(pool, "crm", "http://127.0.0.1:9/x", max_in_flight=2)
    await process_messages(pool, settings, 2)

    async def lease() -> tuple[list[int], datetime, int]:
        row = await pool.fetchrow(
            "SELECT ids, lease_until, xmin::text::bigint AS version FROM delivery_leases"
            " WHERE forwarder = 'idle'"
        )
        assert row is not None
        return sorted(row["ids"]), row["lease_until"], row["version"]

    claimed = await _round(pool, "idle", set())
    held = {c.ref for c in claimed}
    assert len(held) == 2
    first = await lease()
    for _ in range(3):  # holding the same, nothing to claim: the row is not written again
        assert await _round(pool, "idle", held) == []
    assert await lease() == first
    # A tenth of the lease used (60 s: 6 s): renewed, holding the same.
    await pool.execute("UPDATE delivery_leases SET lease_until = lease_until - interval '7 seconds'")
    aged = await lease()
    await _round(pool, "idle", held)
    renewed = await lease()
    assert renewed[0] == first[0] and renewed[1] > aged[1] and renewed[2] != aged[2]
    # A forwarder that holds nothing and claims nothing (the destination is full) writes none.
    assert await _round(pool, "other", set()) == []
    assert await pool.fetchval("SELECT count(*) FROM delivery_leases WHERE forwarder = 'other'") == 0
    # What it holds changes (an answer never came for one): written at once.
    dropped = min(held)
    await _round(pool, "idle", held - {dropped})
    assert (await lease())[0] == [max(held).id]

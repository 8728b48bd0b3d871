"""The operator console over real HTTP (its own listener): logins, sessions, CSRF, headers,
escaping, keyset pages. The browser scenarios are in tests/process/test_console_browser.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import aiohttp
import asyncpg
import pytest

from gateway.core.settings import Settings
from gateway.web.console.app import CSP, console_listener
from tests.support.config import replace

OPS = "ops-token-0123456789abcdef"
VIEWER = "viewer-token-0123456789abcdef"
XSS = b'{"id":"wamid.X","text":{"body":"</pre><script>alert(1)</script><img src=x onerror=alert(2)>"}}'


def console_settings(settings: Settings, tokens: str = f"ops:{OPS},viewer:{VIEWER}:ro") -> Settings:
    parsed = Settings.from_env({"GATEWAY_CONSOLE_TOKENS": tokens}).console_tokens
    return replace(settings, console_port=0, console_tokens=parsed)


@pytest.fixture
async def console(settings: Settings) -> AsyncIterator[str]:
    s = console_settings(settings)
    async with console_listener(s) as listening:
        yield f"http://127.0.0.1:{listening.port}"


async def log_in(http: aiohttp.ClientSession, base: str, token: str) -> aiohttp.ClientResponse:
    async with http.get(f"{base}/login") as r:
        nonce = re.search(r'name="_nonce" value="([^"]+)"', await r.text())
    assert nonce
    return await http.post(
        f"{base}/login", data={"token": token, "_nonce": nonce.group(1)}, allow_redirects=False
    )


async def csrf_of(http: aiohttp.ClientSession, base: str) -> str:
    async with http.get(f"{base}/") as r:
        found = re.search(r'name="_csrf" value="([^"]+)"', await r.text())
    assert found
    return found.group(1)


@pytest.fixture
async def ops(console: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        r = await log_in(http, console, OPS)
        assert r.status == 303
        yield http


async def seed(pool: asyncpg.Pool) -> int:
    await pool.execute(
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state)"
        " VALUES ('acme', 'order-7', 'cb-7', '4915100000001', '{}', 'review')"
    )
    return int(
        await pool.fetchval(
            "INSERT INTO dead_events (inbox_id, position, path, event_key, kind, source, received_at, unit,"
            " fragment, state, last_error) VALUES (1, 0, '/entry/0', 'msg:wamid.X', 'message', 'meta', now(),"
            " 'message', $1, 'dead', '<b>boom</b>') RETURNING id",
            XSS,
        )
    )


@pytest.mark.citus
async def test_every_page_renders_and_escapes_what_came_from_a_webhook(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    item = await seed(pool)
    for path in (
        "/", "/dead", "/dead?kind=message&since=2h", f"/dead/E{item}", "/outbox", "/outbox?state=review",
        "/outbox?recipient=4915100000001", "/outbox?key=order-7", "/outbox?tenant=acme&state=pending",
        "/outbox/send?tenant=acme&key=order-7", "/destinations", "/senders", "/inbound",
        "/inbound?customer=49", "/audit", "/static/console.css",
    ):  # fmt: skip
        async with ops.get(f"{console}{path}") as r:
            assert r.status == 200, path
            page = await r.text()
            assert "<script" not in page, path
    async with ops.get(f"{console}/dead/E{item}") as r:
        page = await r.text()
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;b&gt;boom&lt;/b&gt;" in page and "<b>boom" not in page
    async with ops.get(f"{console}/dead/E{item}/raw") as r:
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert r.headers["Content-Disposition"].startswith("attachment")
        assert await r.read() == XSS
    async with ops.get(f"{console}/dead?since=yesterday") as r:
        assert r.status == 400 and "not a time" in await r.text()


async def test_headers_and_cookie_flags(console: str) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{console}/login") as r:
            assert r.headers["Content-Security-Policy"] == CSP
            assert "script-src" not in CSP and "default-src 'none'" in CSP
            assert r.headers["X-Frame-Options"] == "DENY" and r.headers["Cache-Control"] == "no-store"
        done = await log_in(http, console, OPS)
        cookie = done.headers.getall("Set-Cookie")
        session = next(c for c in cookie if c.startswith("gw_console="))
        assert "HttpOnly" in session and "SameSite=Strict" in session and "Secure" not in session
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
        http.get(f"{console}/login", headers={"X-Forwarded-Proto": "https"}) as r,
    ):
        assert "Secure" in r.headers["Set-Cookie"]
        assert "Strict-Transport-Security" in r.headers


async def test_nobody_gets_past_the_login_page(pool: asyncpg.Pool, console: str) -> None:
    await seed(pool)
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/outbox/send?tenant=acme&key=order-7", "/dead/E1/raw", "/audit", "/no-such-page"):
            async with http.get(f"{console}{path}", allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"].startswith("/login?next="), path
        async with http.post(f"{console}/outbox/release", data={"tenant": "acme", "key": "order-7"}) as r:
            assert r.status == 403
        forged = {"gw_console": "eyJuIjoib3BzIn0.forged.sig"}
        async with http.get(f"{console}/", cookies=forged, allow_redirects=False) as r:
            assert r.status == 303
    assert await pool.fetchval("SELECT state FROM outbox") == "review"


@pytest.mark.citus
async def test_csrf_origin_and_read_only_are_refused_and_change_nothing(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    await seed(pool)
    form = {"tenant": "acme", "key": "order-7"}
    async with ops.post(f"{console}/outbox/release", data=form) as r:
        assert r.status == 403 and "stale or forged" in await r.text()
    csrf = await csrf_of(ops, console)
    async with ops.post(f"{console}/outbox/release", data={**form, "_csrf": "0" * 64}) as r:
        assert r.status == 403
    headers = {"Origin": "https://evil.example"}
    async with ops.post(f"{console}/outbox/release", data={**form, "_csrf": csrf}, headers=headers) as r:
        assert r.status == 403 and "another site" in await r.text()
    async with ops.post(
        f"{console}/outbox/release", data={**form, "_csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"}
    ) as r:
        assert r.status == 403
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as viewer:
        assert (await log_in(viewer, console, VIEWER)).status == 303
        viewer_csrf = await csrf_of(viewer, console)
        async with viewer.post(f"{console}/outbox/release", data={**form, "_csrf": viewer_csrf}) as r:
            assert r.status == 403 and "read-only" in await r.text()
    assert await pool.fetchval("SELECT state FROM outbox") == "review"
    assert await pool.fetchval("SELECT count(*) FROM operator_actions") == 0
    # With everything right, it goes (and is audited under the token's name).
    async with ops.post(f"{console}/outbox/release", data={**form, "_csrf": csrf}) as r:
        assert r.status == 200 and "now pending" in await r.text()
    assert await pool.fetchval("SELECT actor FROM operator_actions") == "ops"


@pytest.mark.citus
async def test_an_unknown_send_inside_its_window_needs_the_box_ticked(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    await seed(pool)
    await pool.execute("UPDATE outbox SET state = 'unknown', unknown_at = now() - interval '30 seconds'")
    async with ops.get(f"{console}/outbox/send?tenant=acme&key=order-7") as r:
        page = await r.text()
    assert 'id="early"' in page and 'name="may_duplicate"' in page and "required" in page
    csrf = await csrf_of(ops, console)
    form = {"tenant": "acme", "key": "order-7", "_csrf": csrf}
    async with ops.post(f"{console}/outbox/release", data=form) as r:
        refused = await r.text()
    assert (
        r.status == 409 and "may be released from" in refused and "I know the customer may get it" in refused
    )
    assert await pool.fetchval("SELECT state FROM outbox") == "unknown"
    async with ops.post(
        f"{console}/outbox/bulk", data={"action": "release", "state": "unknown", "_csrf": csrf}
    ) as r:
        confirm = await r.text()
    assert 'name="may_duplicate"' in confirm and "less than the reconcile window" in confirm
    bulk = {"action": "release", "state": "unknown", "confirm": "yes", "_csrf": csrf}
    async with ops.post(f"{console}/outbox/bulk", data=bulk) as r:
        assert r.status == 200 and "1 row(s) not released yet" in await r.text()
    async with ops.post(f"{console}/outbox/release", data={**form, "may_duplicate": "yes"}) as r:
        assert r.status == 200 and "may be sent twice" in await r.text()
    assert await pool.fetchval("SELECT state FROM outbox") == "pending"
    logged = await pool.fetch("SELECT action, rows, params FROM operator_actions ORDER BY id")
    assert [(e["action"], e["rows"]) for e in logged] == [
        ("outbox.release", 0),
        ("outbox.release_bulk", 0),
        ("outbox.release", 1),
    ]
    assert logged[2]["params"]["may_duplicate"] is True


async def test_hostile_text_is_refused_as_such_never_reaching_the_database(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    """A newline, a NUL or 10 kB in a form field, a filter or a path: a 400 (or 404) that says
    what was wrong, not a 503 'database unavailable' from PostgreSQL refusing a NUL."""
    await seed(pool)
    csrf = await csrf_of(ops, console)
    for bad in ("order-7\x00", "ord\ner-7", "x" * 10_000):
        async with ops.post(
            f"{console}/outbox/release", data={"tenant": "acme", "key": bad, "_csrf": csrf}
        ) as r:
            page = await r.text()
            assert r.status == 400, (bad[:20], r.status)
            assert "key" in page and bad not in page
        async with ops.get(f"{console}/outbox", params={"key": bad}) as r:
            assert r.status == 400, (bad[:20], r.status)
    for path in ("/destinations/a%00b", "/destinations/a%0Ab", "/destinations/" + "x" * 100):
        async with ops.get(f"{console}{path}") as r:
            assert r.status == 404, path
        async with ops.post(f"{console}{path}/disable", data={"_csrf": csrf}) as r:
            assert r.status in (403, 404), path
    assert await pool.fetchval("SELECT state FROM outbox") == "review"
    assert await pool.fetchval("SELECT count(*) FROM operator_actions") == 0


async def test_failed_logins_are_rate_limited(console: str) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        for _ in range(10):
            assert (await log_in(http, console, "wrong-token-0123456789")).status == 401
        limited = await log_in(http, console, OPS)  # even the right token waits now
        assert limited.status == 429 and int(limited.headers["Retry-After"]) > 0


def from_address(address: str) -> aiohttp.ClientSession:
    """A client whose connections come from ``address`` (any of 127.0.0.0/8 on Linux)."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.CookieJar(unsafe=True))


async def test_failures_from_other_addresses_never_lock_out_the_right_token(console: str) -> None:
    """200 failed logins from 20 addresses (each its own guesses), then the right token from an
    address that has not failed logs in; the addresses that failed stay locked out."""
    for n in range(2, 22):
        async with from_address(f"127.0.0.{n}") as http:
            for attempt in range(10):
                assert (await log_in(http, console, f"guess-{n}-{attempt}-0123456789")).status == 401
            locked = await log_in(http, console, OPS)
            assert locked.status == 429 and int(locked.headers["Retry-After"]) > 0
    async with from_address("127.0.0.99") as http:
        assert (await log_in(http, console, OPS)).status == 303
        async with http.get(f"{console}/") as r:
            assert r.status == 200 and "Overview" in await r.text()


async def test_guesses_sent_at_once_are_counted_before_any_is_read(console: str) -> None:
    """50 guesses from one address whose bodies are still coming when they are checked: only
    10 are read and refused as wrong tokens, the others wait (429) without being compared."""
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
        http.get(f"{console}/login") as r,
    ):
        found = re.search(r'name="_nonce" value="([^"]+)"', await r.text())
        cookie = r.cookies["gw_console_login"].value
    assert found
    host, port = console.removeprefix("http://").split(":")

    async def start(i: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        body = urlencode({"token": f"guess-{i}-0123456789abcdef", "_nonce": found.group(1)}).encode()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /login HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
            f"Cookie: gw_console_login={cookie}\r\n\r\n".encode()
            + body[:10]
        )
        await writer.drain()
        return reader, writer, body[10:]

    async def finish(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]) -> int:
        reader, writer, rest = conn
        writer.write(rest)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return int(answer.split(b" ", 2)[1])

    conns = [await start(i) for i in range(50)]
    await asyncio.sleep(0.5)  # every request's head has been read and checked
    statuses = await asyncio.gather(*(finish(c) for c in conns))
    assert statuses.count(401) == 10 and statuses.count(429) == 40, statuses


async def test_a_wrong_token_replayed_from_many_addresses_is_held_back(console: str) -> None:
    for n in range(30, 40):
        async with from_address(f"127.0.0.{n}") as http:
            assert (await log_in(http, console, "the-same-stale-token-0123")).status == 401
    async with from_address("127.0.0.40") as http:
        held = await log_in(http, console, "the-same-stale-token-0123")
        assert held.status == 429 and int(held.headers["Retry-After"]) > 0
        assert (await log_in(http, console, OPS)).status == 303  # the source itself never failed


async def test_a_session_ends_when_its_token_changes(settings: Settings) -> None:
    before = console_settings(settings)
    after = console_settings(settings, tokens=f"ops:{'n' * 24}")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with console_listener(before) as one:
            base = f"http://127.0.0.1:{one.port}"
            assert (await log_in(http, base, OPS)).status == 303
            cookie = http.cookie_jar.filter_cookies(base)["gw_console"].value
        async with console_listener(after) as two:
            base = f"http://127.0.0.1:{two.port}"
            async with http.get(f"{base}/", cookies={"gw_console": cookie}, allow_redirects=False) as r:
                assert r.status == 303  # the old token's session is not the new token's


async def test_dead_items_page_through_both_kinds_without_gaps_or_repeats(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    await pool.execute(
        "INSERT INTO inbox_parked (inbox_id, source, body, state, attempts, received_at)"
        " SELECT i, 'meta', 'not json', 'dead', 1, now() - i * interval '1 minute'"
        " FROM generate_series(1, 37) i"
    )
    await pool.execute(
        "INSERT INTO dead_events (inbox_id, position, path, kind, source, received_at, unit, fragment, state)"
        " SELECT i, 0, '/x', 'bad', 'meta', now() - i * interval '40 seconds', 'message', '{}', 'dead'"
        " FROM generate_series(1, 88) i"
    )
    seen: list[str] = []
    url: str | None = f"{console}/dead"
    while url:
        async with ops.get(url) as r:
            page = await r.text()
        seen += re.findall(r'href="/dead/([RE]\d+)"', page)
        more = re.search(r'href="(/dead\?[^"]+)" id="next"', page)
        url = f"{console}{more.group(1).replace('&amp;', '&')}" if more else None
    assert len(seen) == 37 + 88 and len(set(seen)) == len(seen)


async def test_keys_and_wamids_with_any_visible_character_have_working_links(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    key = "a/b?c#d&e=%2F"
    await pool.execute(
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state)"
        " VALUES ('acme', $1, 'cb-odd', '4915100000001', '{}', 'review')",
        key,
    )
    async with ops.get(f"{console}/outbox?state=review") as r:
        link = re.search(r'href="(/outbox/send\?[^"]+)"', await r.text())
    assert link
    async with ops.get(f"{console}{link.group(1).replace('&amp;', '&')}") as r:
        assert r.status == 200 and "a/b?c#d&amp;e=%2F" in await r.text()
    for bad in ("/outbox?after=99999999999999999999", "/outbox?after=-1", "/outbox/send?tenant=acme"):
        async with ops.get(f"{console}{bad}") as r:
            assert r.status == 400, bad


async def test_a_failing_database_is_a_503_page_without_details(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    await pool.execute("ALTER TABLE outbox RENAME TO outbox_away")
    async with ops.get(f"{console}/outbox?state=review") as r:
        page = await r.text()
    assert r.status == 503 and r.headers["Retry-After"] == "5"
    assert "Database unavailable" in page and "outbox" not in page.split("<main>")[1].split("</main>")[0]


async def test_a_customer_is_found_by_phone_or_bsuid(
    pool: asyncpg.Pool, console: str, ops: aiohttp.ClientSession
) -> None:
    phone, bsuid = "4915100000009", "US.13491208655302741918"
    await pool.execute(
        "INSERT INTO customer_ids (phone_number_id, user_id, wa_id) VALUES ('1111', $1, $2)", bsuid, phone
    )
    await pool.execute(
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state) VALUES"
        " ('acme', 'by-phone', 'cb-p', $1, '{}', 'accepted'),"
        " ('acme', 'by-bsuid', 'cb-b', $2, '{}', 'accepted'),"
        " ('acme', 'someone-else', 'cb-x', '4915100000001', '{}', 'accepted')",
        phone,
        bsuid,
    )
    await pool.execute(
        "INSERT INTO inbound_messages (wamid, sender, user_id, message, subject)"
        " VALUES ('wamid.U1', NULL, $1, '{}', 'wamid.U1')",
        bsuid,
    )
    for who in (phone, bsuid):
        async with ops.get(f"{console}/outbox", params={"recipient": who}) as r:
            page = await r.text()
        assert "by-phone" in page and "by-bsuid" in page and "someone-else" not in page, who
    async with ops.get(f"{console}/inbound", params={"customer": phone}) as r:
        assert "wamid.U1" in await r.text()


@pytest.mark.citus
async def test_deliveries_pages_and_a_messages_story_read_the_queue_and_the_log(
    pool: asyncpg.Pool, settings: Settings, console: str, ops: aiohttp.ClientSession
) -> None:
    """Deliveries in every state — delivered (the log), pending and failed (the queue) — on
    their destination's pages, by state, and in the story of the message they came from."""
    from tests.support.forward import add, fast, forwarding, process_messages, started_receiver, states, until

    receiver = await started_receiver()
    try:
        await add(pool, "crm", receiver.url, ("message",))
        await add(pool, "down", "http://127.0.0.1:9/nothing-listens", ("message",))
        await process_messages(pool, settings, 3, prefix="wamid.C")
        slow = fast(settings, forward_retry_base_ms=60_000, forward_retry_max_ms=60_000)

        async def attempted() -> bool:
            s = await states(pool)
            return s.get("delivered") == 3 and await pool.fetchval(
                "SELECT count(*) = 3 FROM delivery_queue WHERE attempts > 0") is True  # fmt: skip

        async with forwarding(pool, slow):
            await until(attempted, what="crm delivered, down attempted")
        first = await pool.fetchval("SELECT min(event_id) FROM delivery_queue")
        await pool.execute("UPDATE delivery_queue SET failed = true WHERE event_id = $1", first)
    finally:
        await receiver.close()

    async def rows(path: str) -> list[str]:
        async with ops.get(f"{console}{path}") as r:
            assert r.status == 200, path
            page = await r.text()
        table = page.split('id="deliveries"', 1)[1].split("</table>", 1)[0]
        # Each row names its event and webhook id, read beside the page's rows.
        keyed = re.findall(
            r'"mono">wh_[0-9a-f]{32}</td><td class="mono">msg:wamid\.C\d</td><td>message</td>', table
        )
        states = re.findall(r"<td>(pending|delivered|failed)</td>", table)
        assert len(keyed) == len(states), table
        return states

    assert await rows("/destinations/crm") == ["delivered"] * 3
    assert await rows("/destinations/crm?state=delivered") == ["delivered"] * 3
    assert await rows("/destinations/crm?state=pending") == []
    assert sorted(await rows("/destinations/down")) == ["failed", "pending", "pending"]
    assert await rows("/destinations/down?state=failed") == ["failed"]
    assert await rows("/destinations/down?state=pending") == ["pending", "pending"]
    # A reply claimed for the message, sent through the outbox: on Citus the two are on
    # different shards.
    await pool.execute(
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state, wamid)"
        " VALUES ('acme', 'reply-c1', 'cb-c1', '4915100000001', '{}', 'accepted', 'wamid.OUT1')"
    )
    await pool.execute(
        "INSERT INTO reply_claims (inbound_wamid, claimed_by, tenant, idem_key)"
        " VALUES ('wamid.C1', 'bot', 'acme', 'reply-c1')"
    )
    async with ops.get(f"{console}/inbound/message?wamid=wamid.C1") as r:
        assert r.status == 200
        page = await r.text()
    story = page.split('id="story"', 1)[1].split("</table>", 1)[0]
    replies = page.split('id="replies"', 1)[1].split("</table>", 1)[0]
    assert "acme/reply-c1" in replies and "<td>accepted</td>" in replies, replies
    assert re.search(r"<td>delivery</td><td class=\"mono\">crm</td><td>delivered</td>", story), story
    assert re.search(r"<td>delivery</td><td class=\"mono\">down</td><td>(pending|failed)</td>", story), story

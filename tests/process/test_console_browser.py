"""The operator console driven in a real headless Chromium (Debian's chromium and its driver,
installed by .ci/run), against a real ``gateway serve`` with its console listener.

With GATEWAY_CONSOLE_SCREENSHOTS=<directory> the same run writes a PNG of each page there
(docs/console/ is made that way); an ordinary run writes nothing."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.core.signature import sign_meta
from gateway.testing.payloads import CUSTOMER, message_obj, meta_bytes, meta_envelope, meta_value
from gateway.testing.ports import free_port
from tests.support.procs import spawn

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
META_SECRET = "meta-secret-console-test"
OPS = "ops-token-0123456789abcdef"
VIEWER = "viewer-token-0123456789abcdef"
XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'
SHOTS = os.environ.get("GATEWAY_CONSOLE_SCREENSHOTS")


def db(dsn: str, sql: str, *args: Any) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def wait_until(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(what)


@pytest.fixture
def served(db_dsn: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """`gateway serve` with its consumers, a handler module and the console."""
    port, console_port = free_port(), free_port()
    db(
        db_dsn,
        "CREATE TABLE handled (event_key text NOT NULL, handler text NOT NULL, at timestamptz DEFAULT now())",
    )
    db(db_dsn, "CREATE TABLE handler_broken ()")  # wamid.BROKEN* fail while it exists
    env = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_PORT": str(port),
        "GATEWAY_CONSOLE_PORT": str(console_port),
        "GATEWAY_CONSOLE_TOKENS": f"ops:{OPS},viewer:{VIEWER}:ro",
        "GATEWAY_META_APP_SECRETS": META_SECRET,
        "GATEWAY_HANDLERS": "tests.support.handlers",
        "GATEWAY_MAX_ATTEMPTS": "1",
        "GATEWAY_RUN_SENDER": "false",
        "GATEWAY_RUN_FORWARDER": "false",
    }
    proc = spawn(["serve"], env, str(tmp_path / "serve.log"))
    base, console = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{console_port}"
    try:
        wait_until(lambda: _up(f"{base}/readyz") and _up(f"{console}/login"), 60, "gateway and console up")
        yield {"base": base, "console": console, "dsn": db_dsn}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - a local test URL
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver must be installed (.ci/run installs them)")
        pytest.skip(
            "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium never downloads a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1360,1000", f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.implicitly_wait(10)  # an element of the next page: wait for the page
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def log_in(driver: Any, console: str, token: str, then: str = "/") -> None:
    driver.get(f"{console}{then}")
    assert "/login" in driver.current_url  # nobody gets past the login page without a session
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "login").click()
    try:
        wait_until(lambda: "/login" not in driver.current_url, 10, "logged in")
    except TimeoutError:
        main = driver.find_element(By.TAG_NAME, "main").text
        raise TimeoutError(f"not logged in: {driver.current_url} {main}") from None


def post_webhook(base: str, body: bytes) -> int:
    req = urllib.request.Request(  # noqa: S310
        f"{base}/webhooks/meta",
        data=body,
        headers={"Content-Type": "application/json", "X-Hub-Signature-256": sign_meta(body, META_SECRET)},
    )
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
        return int(r.status)


def absent(driver: Any, by: str, selector: str) -> bool:
    """Nothing matches (asked at once, not after the implicit wait)."""
    driver.implicitly_wait(0)
    try:
        return driver.find_elements(by, selector) == []
    finally:
        driver.implicitly_wait(10)


def text_of(driver: Any, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def test_a_dead_event_is_found_read_and_replayed(served: dict[str, str], browser: Any) -> None:
    """A bad webhook makes a dead event (its handler fails); the operator finds it, reads its
    exact bytes (an XSS payload, shown as text), fixes the cause and replays it: processed."""
    console, dsn = served["console"], served["dsn"]
    # A good message beside it: the failure is this event's own, so it is parked dead (a
    # failure with no success of its kind beside it would be taken for the system's).
    value = meta_value(
        messages=[message_obj("wamid.OK1", "fine"), message_obj("wamid.BROKEN1", XSS)],
        contacts=[{"profile": {"name": "Jörg"}, "wa_id": CUSTOMER}],
    )
    body = meta_bytes(meta_envelope([("waba-1", [("messages", value)])]))
    assert post_webhook(served["base"], body) == 200
    wait_until(lambda: bool(db(dsn, "SELECT 1 FROM dead_events WHERE state = 'dead'")), 30, "a dead event")
    [item] = db(dsn, "SELECT id, fragment FROM dead_events")

    browser.get(f"{console}/login")
    shot(browser, "login")
    log_in(browser, console, OPS)
    assert "dead item" in text_of(browser, "needs")
    shot(browser, "overview")
    browser.get(f"{console}/dead")
    shot(browser, "dead-items")
    browser.find_element(By.LINK_TEXT, f"E{item['id']}").click()
    for shown in (text_of(browser, "raw"), text_of(browser, "pretty")):
        # The attacker's bytes, as text (JSON escapes the quotes).
        assert '<script>alert(\\"x\\")</script><img src=x onerror=alert(1)>' in shown
    # Nothing of them became markup: no script or image element on the page, no alert.
    assert absent(browser, By.TAG_NAME, "script") and absent(browser, By.CSS_SELECTOR, "main img")
    assert "cannot handle wamid.BROKEN1" in text_of(browser, "error")
    shot(browser, "dead-item")

    db(dsn, "DROP TABLE handler_broken")  # the operator fixed the cause
    browser.find_element(By.ID, "replay").click()
    assert "replayed 1 event(s)" in text_of(browser, "result")
    wait_until(
        lambda: bool(db(dsn, "SELECT 1 FROM dead_events WHERE state = 'done'")),
        30,
        "the replayed event processed",
    )
    assert db(dsn, "SELECT count(*) AS n FROM inbound_messages WHERE wamid = 'wamid.BROKEN1'")[0]["n"] == 1
    browser.get(f"{console}/dead/E{item['id']}")
    assert text_of(browser, "state") == "done"
    browser.get(f"{console}/inbound/message?wamid=wamid.BROKEN1")
    assert "msg:wamid.BROKEN1" in text_of(browser, "story")
    shot(browser, "inbound-message")
    browser.get(f"{console}/inbound")
    shot(browser, "inbound")
    browser.get(f"{console}/audit")
    assert "dead.replay" in text_of(browser, "audit") and "ops" in text_of(browser, "audit")
    shot(browser, "audit-log")


def test_a_review_row_is_released_and_a_bulk_replay_asks_first(served: dict[str, str], browser: Any) -> None:
    console, dsn = served["console"], served["dsn"]
    db(
        dsn,
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state, last_error)"
        " VALUES ('acme', 'order-42', 'cb-42', '4915100000001', '{\"type\":\"text\"}', 'review',"
        " 'read timeout'), ('acme', 'order-43', 'cb-43', '4915100000002', '{}', 'accepted', NULL)",
    )
    db(
        dsn,
        "INSERT INTO destinations (name, url, events, secret)"
        " VALUES ('crm', 'http://127.0.0.1:9/h', '{message}', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')",
    )
    db(
        dsn,
        "WITH e AS (INSERT INTO delivery_events (lane, received_at, event_key, kind, body)"
        " SELECT 0, now(), 'msg:w' || i, 'message', '{}' FROM generate_series(1, 3) i RETURNING id, day)"
        " INSERT INTO delivery_queue"
        " (destination_id, event_id, received_at, event_day, lane, failed, last_status)"
        " SELECT d.id, e.id, now(), e.day, 0, true, 500 FROM destinations d, e",
    )
    log_in(browser, console, OPS, "/outbox?state=review")
    assert "order-42" in text_of(browser, "outbox-list")
    shot(browser, "outbox")
    browser.find_element(By.LINK_TEXT, "order-42").click()
    shot(browser, "outbox-send")
    browser.find_element(By.ID, "release").click()
    assert "now pending" in text_of(browser, "result")
    assert db(dsn, "SELECT state FROM outbox WHERE idem_key = 'order-42'")[0]["state"] == "pending"

    browser.get(f"{console}/destinations")
    assert "whsec_MfKQ" not in text_of(browser, "destinations")  # masked as the CLI masks it
    shot(browser, "destinations")
    browser.find_element(By.ID, "replay-deliveries").click()
    assert "3 failed deliveries" in text_of(browser, "count")  # asks first, with how many
    assert db(dsn, "SELECT count(*) AS n FROM deliveries WHERE state = 'failed'")[0]["n"] == 3
    shot(browser, "confirm")
    browser.find_element(By.ID, "confirm").click()
    assert "replayed 3 failed deliveries" in text_of(browser, "result")
    assert db(dsn, "SELECT count(*) AS n FROM deliveries WHERE state = 'failed'")[0]["n"] == 0
    browser.get(f"{console}/destinations/crm")
    shot(browser, "deliveries")
    browser.get(f"{console}/senders")
    shot(browser, "senders")
    entries = db(dsn, "SELECT actor, via, action, rows FROM operator_actions ORDER BY id")
    assert [tuple(e) for e in entries] == [
        ("ops", "console", "outbox.release", 1),
        ("ops", "console", "deliveries.replay", 3),
    ]


def test_forged_and_read_only_requests_are_refused_and_change_nothing(
    served: dict[str, str], browser: Any
) -> None:
    console, dsn = served["console"], served["dsn"]
    db(
        dsn,
        "INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state)"
        " VALUES ('acme', 'order-7', 'cb-7', '4915100000001', '{}', 'review')",
    )
    # Unauthenticated: every page leads to the login page, and shows nothing else.
    send = "/outbox/send?tenant=acme&key=order-7"
    for path in ("/", "/outbox?state=review", send, "/dead/E1/raw", "/audit", "/nope"):
        browser.get(f"{console}{path}")
        assert "/login" in browser.current_url, path
        main = browser.find_element(By.TAG_NAME, "main").text
        assert main.startswith("Log in") and "4915100000001" not in browser.page_source, path

    log_in(browser, console, OPS, "/outbox/send?tenant=acme&key=order-7")
    # The form without its CSRF token (removed through the driver, past the page's CSP).
    browser.execute_script("document.querySelector('form[action=\"/outbox/release\"] [name=_csrf]').remove()")
    browser.find_element(By.ID, "release").click()
    assert "stale or forged" in text_of(browser, "why")
    browser.delete_all_cookies()

    log_in(browser, console, VIEWER, "/outbox/send?tenant=acme&key=order-7")
    assert absent(browser, By.ID, "release")  # a read-only login sees no action
    # The same form, forged with the viewer's own valid CSRF token: refused too.
    csrf = browser.find_element(By.CSS_SELECTOR, "form[action='/logout'] [name=_csrf]").get_attribute("value")
    browser.execute_script(
        "const f = document.createElement('form'); f.method = 'post'; f.action = '/outbox/release';"
        "for (const [k, v] of [['_csrf', arguments[0]], ['tenant', 'acme'], ['key', 'order-7']]) {"
        "  const i = document.createElement('input'); i.name = k; i.value = v; f.appendChild(i); }"
        "document.body.appendChild(f); f.submit();",
        csrf,
    )
    wait_until(lambda: "read-only" in browser.page_source, 10, "refused")
    assert "viewer is a read-only login" in text_of(browser, "why")
    assert db(dsn, "SELECT state FROM outbox")[0]["state"] == "review"
    assert db(dsn, "SELECT count(*) AS n FROM operator_actions")[0]["n"] == 0

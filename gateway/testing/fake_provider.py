"""A local stand-in for the Graph API send endpoint and Tenashi's API, for tests, demo and load.

It records every message a customer would have received, injects scripted faults per request,
and posts signed status webhooks back to the gateway (with duplicates and reordering, as Meta
does). ``FakeProvider`` is the Python API; ``gateway fake-provider`` serves it alone.

Control endpoints (no auth: loopback only): ``GET/DELETE /_fake/received``,
``GET/POST/DELETE /_fake/faults`` (POST a rule or a list of rules), ``POST /_fake/config``,
``GET /_fake/webhooks``.

A fault rule: ``{"to": "<recipient>" (optional: any), "times": 1, "action": ...}`` where action is
``latency`` (``latency_ms``, then normal), ``hang`` (the message is delivered, the answer never
comes), ``http`` (``status``, e.g. 503, nothing delivered), ``error`` (``code`` from Meta's
error-code reference, in Meta's error shape, nothing delivered), ``drop`` (connection closed,
nothing delivered) or ``fail_status`` (accepted, then a ``failed`` status webhook with ``code``).
Rules are matched in order; a matching rule is used ``times`` times, then dropped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import logging
import random
import secrets
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.core.settings import Settings
from gateway.core.signature import sign_meta, sign_tenashi
from gateway.testing import payloads

log = logging.getLogger(__name__)

TENASHI_REPLAY_S = 24 * 3600

# HTTP status Meta answers with per error code (our reading of the docs; the gateway
# classifies by code, never by status).
META_ERRORS: dict[int, tuple[int, str, str]] = {
    2: (503, "OAuthException", "Service temporarily unavailable"),
    4: (400, "OAuthException", "Application request limit reached"),
    100: (400, "OAuthException", "Invalid parameter"),
    190: (401, "OAuthException", "Access token has expired"),
    368: (403, "OAuthException", "Temporarily blocked for policies violations"),
    80007: (400, "OAuthException", "Rate limit issues"),
    130429: (400, "OAuthException", "Rate limit hit"),
    131000: (500, "OAuthException", "Something went wrong"),
    131016: (503, "OAuthException", "Service unavailable"),
    131026: (400, "OAuthException", "Message undeliverable"),
    131047: (400, "OAuthException", "Re-engagement message"),
    131048: (400, "OAuthException", "Spam rate limit hit"),
    131049: (400, "OAuthException", "Meta chose not to deliver"),
    131050: (400, "OAuthException", "User has stopped marketing messages"),
    131056: (400, "OAuthException", "(Business Account, Consumer Account) pair rate limit hit"),
    131057: (500, "OAuthException", "Account in maintenance mode"),
    133004: (503, "OAuthException", "Server temporarily unavailable"),
    133010: (400, "OAuthException", "Phone number not registered"),
}
ACTIONS = ("latency", "hang", "http", "error", "drop", "fail_status")


def meta_error_body(code: int, subcode: int | None = None) -> tuple[int, bytes]:
    status, typ, message = META_ERRORS.get(code, (400, "OAuthException", "Error"))
    err: dict[str, Any] = {
        "message": f"(#{code}) {message}",
        "type": typ,
        "code": code,
        "error_data": {"messaging_product": "whatsapp", "details": message},
        "fbtrace_id": "A" + secrets.token_hex(11),
    }
    if subcode is not None:
        err["error_subcode"] = subcode
    return status, orjson.dumps({"error": err})


@dataclass
class Fault:
    action: str
    to: str | None = None
    times: int = 1
    latency_ms: float = 0.0
    status: int = 503
    code: int = 131000
    subcode: int | None = None
    hang_ms: float | None = None  # None: until the fake stops

    @classmethod
    def parse(cls, raw: Any) -> Fault:
        if not isinstance(raw, dict) or raw.get("action") not in ACTIONS:
            raise ValueError(f"a fault needs action in {ACTIONS}")
        known = {f for f in cls.__dataclass_fields__}
        extra = set(raw) - known
        if extra:
            raise ValueError(f"unknown fault fields: {sorted(extra)}")
        fault = cls(**raw)
        if fault.times < 1:
            raise ValueError("times must be >= 1")
        return fault


@dataclass
class Received:
    """One message a customer would have received."""

    provider: str
    phone_number_id: str
    to: str
    message: dict[str, Any]
    id: str
    callback_data: str | None
    at: float


@dataclass
class FakeConfig:
    webhook_url: str = ""  # gateway base URL: posts go to /webhooks/meta and /webhooks/tenashi
    app_secret: str = ""
    tenashi_secret: str = ""
    graph_token: str = ""  # empty: any bearer token is accepted
    tenashi_token: str = ""
    statuses: tuple[str, ...] = ("sent", "delivered", "read")
    duplicates: int = 0  # extra copies of each status webhook
    reorder: bool = False
    webhook_delay_ms: float = 0.0
    seed: int | None = None


@dataclass
class _TenashiKey:
    fingerprint: str
    state: str  # in_progress | done
    status: int = 0
    body: bytes = b""
    at: float = field(default_factory=time.monotonic)


class FakeProvider:
    """The fake; ``await start()`` serves it on a real port, ``url`` is its base URL."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.received: list[Received] = []
        self.faults: list[Fault] = []
        self.requests = 0
        self.webhooks: list[dict[str, Any]] = []  # what was posted, for tests
        self._tenashi: dict[str, _TenashiKey] = {}
        self._seq = itertools.count(1)
        self._rng = random.Random(self.config.seed)
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.app = self._build_app()

    # --- Python API ---------------------------------------------------------------------

    def add_fault(self, action: str, **kwargs: Any) -> None:
        self.faults.append(Fault.parse({"action": action, **kwargs}))

    def received_by(self, to: str) -> list[Received]:
        return [r for r in self.received if r.to == to]

    def count(self, callback_data: str) -> int:
        return sum(1 for r in self.received if r.callback_data == callback_data)

    def reset(self) -> None:
        self.received.clear()
        self.faults.clear()
        self.webhooks.clear()
        self._tenashi.clear()

    async def drain_webhooks(self, timeout: float = 10.0) -> None:
        """Wait until every scheduled status webhook has been posted."""
        async with asyncio.timeout(timeout):
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        sockets = self._runner.addresses
        bound_port = sockets[0][1]
        self.url = f"http://{host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # --- app --------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/messages", self._tenashi_send)
        app.router.add_post("/{version}/{phone_number_id}/messages", self._meta_send)
        app.router.add_get("/_fake/received", self._get_received)
        app.router.add_delete("/_fake/received", self._reset)
        app.router.add_get("/_fake/faults", self._get_faults)
        app.router.add_post("/_fake/faults", self._post_faults)
        app.router.add_delete("/_fake/faults", self._clear_faults)
        app.router.add_post("/_fake/config", self._post_config)
        app.router.add_get("/_fake/webhooks", self._get_webhooks)

        async def on_shutdown(_app: web.Application) -> None:
            self._stopping.set()

        app.on_shutdown.append(on_shutdown)
        return app

    def _take_fault(self, to: str) -> Fault | None:
        for i, fault in enumerate(self.faults):
            if fault.to is None or fault.to == to:
                fault.times -= 1
                if fault.times <= 0:
                    del self.faults[i]
                return fault
        return None

    async def _hang(self, fault: Fault) -> None:
        timeout = None if fault.hang_ms is None else fault.hang_ms / 1000
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout)

    @staticmethod
    def _drop(request: web.Request) -> web.Response:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)

    def _wamid(self, to: str) -> str:
        raw = f"{to}:{next(self._seq)}:{secrets.token_hex(6)}".encode()
        return "wamid." + base64.b64encode(b"HBgM" + raw).decode()

    # --- Meta -----------------------------------------------------------------------------

    async def _meta_send(self, request: web.Request) -> web.Response:
        self.requests += 1
        token = request.headers.get("Authorization", "")
        want = self.config.graph_token
        if not token.startswith("Bearer ") or (
            want and not hmac.compare_digest(token[7:].encode(), want.encode())
        ):
            status, body = meta_error_body(190)
            return web.Response(body=body, status=status, content_type="application/json")
        try:
            msg = orjson.loads(await request.read())
            to = msg["to"]
            if msg.get("messaging_product") != "whatsapp" or not isinstance(to, str) or "type" not in msg:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            status, body = meta_error_body(100)
            return web.Response(body=body, status=status, content_type="application/json")
        number = request.match_info["phone_number_id"]
        fault = self._take_fault(to)
        if fault is not None:
            if fault.action == "latency":
                await asyncio.sleep(fault.latency_ms / 1000)
            elif fault.action == "http":
                return web.Response(status=fault.status, text="upstream error")
            elif fault.action == "error":
                status, body = meta_error_body(fault.code, fault.subcode)
                return web.Response(body=body, status=status, content_type="application/json")
            elif fault.action == "drop":
                return self._drop(request)
        wamid = self._wamid(to)
        callback = msg.get("biz_opaque_callback_data")
        message = {k: v for k, v in msg.items() if k not in ("to", "messaging_product", "recipient_type")}
        self.received.append(Received("meta", number, to, message, wamid, callback, time.time()))
        failed_code = fault.code if fault is not None and fault.action == "fail_status" else None
        self._schedule_meta_statuses(number, to, wamid, callback, failed_code)
        if fault is not None and fault.action == "hang":
            await self._hang(fault)
        body = orjson.dumps(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": wamid}],
            }
        )
        return web.Response(body=body, content_type="application/json")

    def _status_list(self, failed_code: int | None) -> list[str]:
        if failed_code is not None:
            return ["sent", "failed"]
        return list(self.config.statuses)

    def _spread(
        self, events: list[tuple[str, bytes, dict[str, str]]]
    ) -> list[tuple[str, bytes, dict[str, str]]]:
        out = [e for e in events for _ in range(1 + self.config.duplicates)]
        if self.config.reorder:
            self._rng.shuffle(out)
        return out

    def _schedule_meta_statuses(
        self, number: str, to: str, wamid: str, callback: str | None, failed_code: int | None
    ) -> None:
        if not self.config.webhook_url:
            return
        events = []
        for status in self._status_list(failed_code):
            st: dict[str, Any] = {
                "id": wamid,
                "status": status,
                "timestamp": str(int(time.time())),
                "recipient_id": to,
            }
            if callback is not None:
                st["biz_opaque_callback_data"] = callback
            if status == "failed" and failed_code is not None:
                _s, _t, title = META_ERRORS.get(failed_code, (400, "", "Error"))
                st["errors"] = [
                    {"code": failed_code, "title": title, "message": title, "error_data": {"details": title}}
                ]
            elif status != "failed":
                st["conversation"] = {"id": secrets.token_hex(16), "origin": {"type": "utility"}}
                st["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "utility"}
            value = payloads.meta_value(statuses=[st], phone_number_id=number, display="15550000000")
            # Meta escapes non-ASCII: sign exactly the bytes sent.
            body = payloads.meta_bytes(payloads.meta_envelope([("fake-waba", [("messages", value)])]))
            headers = {"Content-Type": "application/json"}
            if self.config.app_secret:
                headers["X-Hub-Signature-256"] = sign_meta(body, self.config.app_secret)
            events.append(("/webhooks/meta", body, headers))
        self._spawn(self._post_all(self._spread(events)))

    # --- Tenashi ---------------------------------------------------------------------------

    async def _tenashi_send(self, request: web.Request) -> web.Response:
        self.requests += 1
        token = request.headers.get("Authorization", "")
        want = self.config.tenashi_token
        if not token.startswith("Bearer ") or (
            want and not hmac.compare_digest(token[7:].encode(), want.encode())
        ):
            return web.json_response({"error": {"code": "unauthorized"}}, status=401)
        key = request.headers.get("Idempotency-Key")
        if not key or len(key) > 255:
            return web.json_response({"error": {"code": "idempotency_key_required"}}, status=400)
        raw = await request.read()
        try:
            # The documented body: {"to": "+<E.164>", "text": "..."} (the number is the token's).
            msg = orjson.loads(raw)
            to, text = msg["to"], msg["text"]
            if set(msg) != {"to", "text"} or not isinstance(to, str) or not to.startswith("+"):
                raise ValueError
            if not isinstance(text, str) or not text:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": {"code": "invalid_request"}}, status=400)
        to, number, message = to[1:], "", {"type": "text", "text": {"body": text}}
        fp = hashlib.sha256(raw).hexdigest()
        now = time.monotonic()
        held = self._tenashi.get(key)
        if held is not None and now - held.at < TENASHI_REPLAY_S:
            if held.fingerprint != fp:
                return web.json_response({"error": {"code": "idempotency_key_reused"}}, status=422)
            if held.state == "in_progress":
                return web.json_response({"error": {"code": "idempotency_in_progress"}}, status=409)
            return web.Response(
                body=held.body,
                status=held.status,
                content_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        entry = self._tenashi[key] = _TenashiKey(fp, "in_progress", at=now)
        fault = self._take_fault(to)
        if fault is not None:
            if fault.action == "latency":
                await asyncio.sleep(fault.latency_ms / 1000)
            elif fault.action in ("http", "error", "drop"):
                # Not stored: Tenashi says to retry server errors with the same key (and, as
                # Stripe's keys, a request refused before it ran stores no result).
                del self._tenashi[key]
                if fault.action == "drop":
                    return self._drop(request)
                status = fault.status if fault.action == "http" else 400
                return web.json_response({"error": {"code": f"error_{fault.code}"}}, status=status)
        msg_id = "msg_" + secrets.token_hex(12)
        self.received.append(Received("tenashi", str(number), to, message, msg_id, key, time.time()))
        entry.state, entry.status = "done", 202
        entry.body = orjson.dumps({"id": msg_id, "status": "accepted"})
        failed_code = fault.code if fault is not None and fault.action == "fail_status" else None
        self._schedule_tenashi_statuses(to, msg_id, key, failed_code)
        if fault is not None and fault.action == "hang":
            await self._hang(fault)
        return web.Response(body=entry.body, status=202, content_type="application/json")

    def _schedule_tenashi_statuses(self, to: str, msg_id: str, key: str, failed_code: int | None) -> None:
        if not self.config.webhook_url:
            return
        events = []
        for status in self._status_list(failed_code):
            evt_id = "evt_" + secrets.token_hex(12)
            errors = [{"code": failed_code}] if status == "failed" else []
            body = orjson.dumps(
                {
                    "id": evt_id,
                    "type": "message.status",
                    "created": int(time.time()),
                    "data": {
                        "message_id": msg_id,
                        "status": status,
                        "idempotency_key": key,
                        "recipient": to,
                        "errors": errors,
                    },
                }
            )
            headers = {"Content-Type": "application/json", "X-Tenashi-Delivery": evt_id}
            if self.config.tenashi_secret:
                headers["X-Tenashi-Signature"] = sign_tenashi(body, self.config.tenashi_secret)
            events.append(("/webhooks/tenashi", body, headers))
        self._spawn(self._post_all(self._spread(events)))

    # --- webhooks out ------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post_all(self, events: list[tuple[str, bytes, dict[str, str]]]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        for path, body, headers in events:
            if self.config.webhook_delay_ms:
                await asyncio.sleep(self.config.webhook_delay_ms / 1000)
            status = 0
            # Meta retries; a few quick tries are enough for a fake.
            for attempt in range(3):
                try:
                    async with self._session.post(
                        self.config.webhook_url + path, data=body, headers=headers
                    ) as resp:
                        status = resp.status
                    if status == 200:
                        break
                except aiohttp.ClientError:
                    status = -1
                await asyncio.sleep(0.05 * (attempt + 1))
            self.webhooks.append({"path": path, "body": body.decode(), "status": status})

    # --- control endpoints ------------------------------------------------------------------

    async def _get_received(self, request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps([asdict(r) for r in self.received]), content_type="application/json"
        )

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.Response(
            body=orjson.dumps([asdict(f) for f in self.faults]), content_type="application/json"
        )

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            raw = orjson.loads(await request.read())
            items = raw if isinstance(raw, list) else [raw]
            self.faults.extend(Fault.parse(item) for item in items)
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"queued": len(self.faults)})

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return web.json_response({"ok": True})

    async def _post_config(self, request: web.Request) -> web.Response:
        raw = orjson.loads(await request.read())
        allowed = {"webhook_url", "duplicates", "reorder", "webhook_delay_ms", "statuses"}
        if not isinstance(raw, dict) or set(raw) - allowed:
            return web.json_response({"error": f"config keys: {sorted(allowed)}"}, status=400)
        for name, value in raw.items():
            setattr(self.config, name, tuple(value) if name == "statuses" else value)
        return web.json_response({"ok": True})

    async def _get_webhooks(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.webhooks), content_type="application/json")


@dataclass(frozen=True)
class FakeSettings:
    """``gateway fake-provider``'s own variables (GATEWAY_FAKE_*), beside the gateway's secrets."""

    host: str
    port: int
    config: FakeConfig


def _env_int(environ: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}: must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name}: must be between {lo} and {hi}, got {value}")
    return value


def settings_from(settings: Settings, environ: Mapping[str, str]) -> FakeSettings:
    """GATEWAY_FAKE_HOST/PORT (listen), _WEBHOOK_URL (the gateway it posts statuses to),
    _APP_SECRET (default: the first Meta secret), _WEBHOOK_DUPLICATES, _WEBHOOK_REORDER."""
    reorder = environ.get("GATEWAY_FAKE_WEBHOOK_REORDER", "").strip().lower()
    if reorder not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"GATEWAY_FAKE_WEBHOOK_REORDER: must be true or false, got {reorder!r}")
    config = FakeConfig(
        webhook_url=environ.get("GATEWAY_FAKE_WEBHOOK_URL", "").strip().rstrip("/"),
        app_secret=environ.get("GATEWAY_FAKE_APP_SECRET", "").strip()
        or (settings.meta_app_secrets[0] if settings.meta_app_secrets else ""),
        tenashi_secret=settings.tenashi_secret,
        graph_token=settings.graph_token,
        tenashi_token=settings.tenashi_token,
        duplicates=_env_int(environ, "GATEWAY_FAKE_WEBHOOK_DUPLICATES", 0, 0, 10),
        reorder=reorder in ("1", "true", "yes", "on"),
    )
    return FakeSettings(
        host=environ.get("GATEWAY_FAKE_HOST", "127.0.0.1").strip() or "127.0.0.1",
        port=_env_int(environ, "GATEWAY_FAKE_PORT", 8090, 0, 65535),
        config=config,
    )


async def serve(fs: FakeSettings) -> int:
    """Serve the fake until SIGTERM or SIGINT (``gateway fake-provider``)."""
    fake = FakeProvider(fs.config)
    url = await fake.start(fs.host, fs.port)
    print(f"fake provider listening on {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await fake.stop()
    return 0

"""A local stand-in for the Graph API and Tenashi's API, for tests, demo and load.

It records every message a customer would have received, injects scripted faults per request
(``gateway.testing.fake_faults``), and posts signed status webhooks back to the gateway (with
duplicates and reordering, as Meta does). The Graph API part is ``gateway.testing.fake_meta``,
Tenashi's ``gateway.testing.fake_tenashi``. ``FakeProvider`` is the Python API; ``gateway
fake-provider`` serves it alone.

Control endpoints (no auth: loopback only): ``GET/DELETE /_fake/received``,
``GET/POST/DELETE /_fake/faults`` (POST a rule or a list of rules), ``POST /_fake/config``,
``GET /_fake/webhooks``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.core.settings import Settings
from gateway.testing.fake_faults import Fault
from gateway.testing.fake_hub import FakeConfig, Hub, Received
from gateway.testing.fake_meta import MetaGraph
from gateway.testing.fake_tenashi import TenashiApi

__all__ = ["FakeConfig", "FakeProvider", "Fault", "Received"]


class FakeProvider(Hub):
    """The fake; ``await start()`` serves it on a real port, ``url`` is its base URL."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        super().__init__(config)
        self.meta = MetaGraph(self)
        self.tenashi = TenashiApi(self)
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
        self.read_receipts.clear()
        self.tenashi.reset()

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
        await self.close()  # hung answers end, webhook posts are cancelled
        if self._runner is not None:
            await self._runner.cleanup()

    # --- app --------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application()
        app.add_routes(self.tenashi.routes())
        app.add_routes(self.meta.routes())
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
    _APP_SECRET (default: the first Meta secret), _WEBHOOK_DUPLICATES, _WEBHOOK_REORDER,
    _WEBHOOK_RETRY_S (how long a status webhook answered 5xx is retried)."""
    reorder = environ.get("GATEWAY_FAKE_WEBHOOK_REORDER", "").strip().lower()
    if reorder not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"GATEWAY_FAKE_WEBHOOK_REORDER: must be true or false, got {reorder!r}")
    config = FakeConfig(
        webhook_url=environ.get("GATEWAY_FAKE_WEBHOOK_URL", "").strip().rstrip("/"),
        app_secret=environ.get("GATEWAY_FAKE_APP_SECRET", "").strip()
        or (settings.meta_app_secrets[0] if settings.meta_app_secrets else ""),
        tenashi_secret=settings.tenashi_secret,
        graph_token=settings.graph_token,
        number_tokens=dict(settings.graph_tokens),
        tenashi_token=settings.tenashi_token,
        duplicates=_env_int(environ, "GATEWAY_FAKE_WEBHOOK_DUPLICATES", 0, 0, 10),
        reorder=reorder in ("1", "true", "yes", "on"),
        retry_s=_env_int(environ, "GATEWAY_FAKE_WEBHOOK_RETRY_S", 0, 0, 3600),
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

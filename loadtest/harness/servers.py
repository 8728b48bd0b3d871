"""Baselines of the benchmarks, each run as its own process like the gateway:

* ``bare``: verifies the signature and answers 200 (the ceiling: no durability at all);
* ``insert``: verifies, then one INSERT (its own transaction) per request before answering;
* ``relay``: verifies, then POSTs the body to two receivers, signed as each destination format
  requires (Standard Webhooks to ``--std-url``, ``X-Hub-Signature-256`` to ``--meta-url``),
  and answers 200 once both answered 2xx (502 otherwise): no storage, the physical limit of
  forwarding a webhook to both destinations (bench-pipeline's baseline).

Same treatment as the gateway: aiohttp, uvloop, one process, no access log, same body limit,
same signature code, same pool size.

    python -m loadtest.harness.servers bare|insert|relay --port P --dsn DSN --secret S
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
from aiohttp import web

from gateway.core import stdwebhooks
from gateway.core.settings import Settings
from gateway.core.signature import sign_meta, verify_meta, verify_tenashi
from gateway.store.db import create_pool
from loadtest.harness.sql import q

POOL = web.AppKey("pool", asyncpg.Pool)
HTTP = web.AppKey("http", aiohttp.ClientSession)
MAX_BODY = Settings().max_body_bytes


def build(kind: str, dsn: str, meta_secret: str, tenashi_secret: str, pool_max: int) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    secrets = (meta_secret,)
    insert_sql = q("lt_inbox_insert_one")

    async def store(request: web.Request, source: str, body: bytes, delivery_id: str | None) -> web.Response:
        if kind == "insert":
            await request.app[POOL].fetchval(insert_sql, source, body, delivery_id)
        return web.Response(text="OK")

    async def meta(request: web.Request) -> web.Response:
        body = await request.read()
        if not verify_meta(body, request.headers.get("X-Hub-Signature-256"), secrets):
            return web.json_response({"title": "bad signature"}, status=401)
        return await store(request, "meta", body, None)

    async def tenashi(request: web.Request) -> web.Response:
        body = await request.read()
        if not verify_tenashi(body, request.headers.get("X-Tenashi-Signature"), tenashi_secret):
            return web.json_response({"title": "bad signature"}, status=401)
        return await store(request, "tenashi", body, request.headers.get("X-Tenashi-Delivery"))

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ready")

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        if kind == "insert":
            app[POOL] = await create_pool(dsn, 2, pool_max)
        yield
        if kind == "insert":
            await app[POOL].close()

    app.cleanup_ctx.append(pool_ctx)
    app.router.add_post("/webhooks/meta", meta)
    app.router.add_post("/webhooks/tenashi", tenashi)
    app.router.add_get("/readyz", ready)
    return app


def build_relay(
    meta_secret: str, std_url: str, std_secret: str, meta_url: str, meta_dest_secret: str
) -> web.Application:
    """The bare relay: verify, POST to both destinations, answer."""
    app = web.Application(client_max_size=MAX_BODY)
    key = stdwebhooks.secret_key(std_secret)

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        if not verify_meta(body, request.headers.get("X-Hub-Signature-256"), (meta_secret,)):
            return web.json_response({"title": "bad signature"}, status=401)
        # One id per webhook, as a receiver deduplicates on it (the gateway's is per event).
        msg_id = "relay_" + hashlib.sha256(body).hexdigest()[:40]
        std = {**stdwebhooks.headers(key, msg_id, int(time.time()), body), "Content-Type": "application/json"}
        meta = {"webhook-id": msg_id, "X-Hub-Signature-256": sign_meta(body, meta_dest_secret),
                "Content-Type": "application/json"}  # fmt: skip
        http = request.app[HTTP]
        answers = await asyncio.gather(
            http.post(std_url, data=body, headers=std), http.post(meta_url, data=body, headers=meta)
        )
        for r in answers:
            r.release()
        ok = all(200 <= r.status < 300 for r in answers)
        return web.Response(text="OK") if ok else web.Response(status=502)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ready")

    async def client(app: web.Application) -> AsyncIterator[None]:
        app[HTTP] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        yield
        await app[HTTP].close()

    app.cleanup_ctx.append(client)
    app.router.add_post("/webhooks/meta", relay)
    app.router.add_get("/readyz", ready)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.harness.servers")
    p.add_argument("kind", choices=("bare", "insert", "relay"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--tenashi-secret", default="")
    p.add_argument("--pool-max", type=int, default=Settings().db_pool_max)
    p.add_argument("--std-url", help="relay: the Standard Webhooks destination")
    p.add_argument("--std-secret", help="relay: its whsec_ secret")
    p.add_argument("--meta-url", help="relay: the Meta-format destination")
    p.add_argument("--meta-dest-secret", help="relay: its secret")
    ns = p.parse_args(argv)
    from gateway.runtime.process import install_uvloop

    install_uvloop()
    if ns.kind == "relay":
        app = build_relay(ns.secret, ns.std_url, ns.std_secret, ns.meta_url, ns.meta_dest_secret)
    else:
        app = build(ns.kind, ns.dsn, ns.secret, ns.tenashi_secret, ns.pool_max)
    # The gateway's listen backlog (GATEWAY_LISTEN_BACKLOG's default), so that a burst of new
    # connections meets the same accept queue on both sides of a ratio.
    backlog = Settings().listen_backlog
    web.run_app(app, host=ns.host, port=ns.port, access_log=None, print=None, backlog=backlog)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Every error the app answers is a problem document, a crash included (and its traceback is logged)."""

from __future__ import annotations

import logging

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from gateway.httpkit import problem_errors


async def _crash(request: web.Request) -> web.Response:
    raise RuntimeError("secret internals")


async def _teapot(request: web.Request) -> web.Response:
    raise web.HTTPRequestEntityTooLarge(max_size=1, actual_size=2)


async def test_crash_and_raised_errors_are_problems(
    http: ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    app = web.Application(middlewares=[problem_errors])
    app.router.add_get("/crash", _crash)
    app.router.add_get("/big", _teapot)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        with caplog.at_level(logging.ERROR, logger="gateway.httpkit"):
            async with http.get(server.make_url("/crash")) as r:
                assert r.status == 500
                assert r.content_type == "application/problem+json"
                body = await r.text()
        assert "secret internals" not in body
        assert "secret internals" in caplog.text  # the traceback went to the log, not the client
        async with http.get(server.make_url("/big")) as r:
            assert r.status == 413 and r.content_type == "application/problem+json"
        async with http.post(server.make_url("/crash")) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"
            assert (await r.json())["title"] == "Method Not Allowed"
    finally:
        await server.close()

"""A lean HTTP/1.1 keep-alive client for pre-built requests, so the generator is not the bottleneck.

Each request is written as ready-made bytes (built and signed before the run); the
response is parsed only as far as the status line and ``Content-Length`` (its body is kept
as bytes for a caller that reads it). One request at
a time per connection (no pipelining, as Meta's senders behave); connections are opened
on demand up to ``max_connections`` and reused.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast


class HttpError(Exception):
    """A transport failure; ``kind`` names it for the report (connect, reset, timeout, protocol)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self._need = -1  # bytes needed for the current response, -1 until the head is parsed
        self._status = 0
        self._close_after = False
        self._body_at = 0
        self.body = b""  # the last response's body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_exception(HttpError("reset", "connection closed before the response"))

    def send(self, wire: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiter = fut
        self._need = -1
        self.transport.write(wire)
        return fut

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._need < 0:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).lower()
            i = head.find(b"\ncontent-length:")
            if i < 0:
                self._fail(HttpError("protocol", "response without Content-Length"))
                return
            j = head.find(b"\r", i + 1)
            try:
                self._status = int(head[9:12])
                length = int(head[i + 16 : j if j > 0 else len(head)])
            except ValueError:
                self._fail(HttpError("protocol", "unparsable response head"))
                return
            self._close_after = b"\nconnection: close" in head
            self._body_at = end + 4
            self._need = end + 4 + length
        if len(self._buf) >= self._need:
            self.body = bytes(self._buf[self._body_at : self._need])
            del self._buf[: self._need]
            self._need = -1
            w, self._waiter = self._waiter, None
            if self._close_after and self.transport is not None:
                self.closed = True
                self.transport.close()
            if w is not None and not w.done():
                w.set_result(self._status)

    def _fail(self, exc: HttpError) -> None:
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Pool:
    """Keep-alive connections to one host:port; ``request(wire)`` returns the HTTP status,
    ``exchange(wire)`` the status and the body."""

    def __init__(self, host: str, port: int, max_connections: int = 512, timeout_s: float = 10.0) -> None:
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._idle: deque[_Conn] = deque()
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def open_connections(self) -> int:
        return self._open

    async def _acquire(self) -> _Conn:
        while True:
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    return c
                self._open -= 1
            if self._open < self.max_connections:
                self._open += 1
                try:
                    _, proto = await asyncio.get_running_loop().create_connection(_Conn, self.host, self.port)
                except OSError as exc:
                    self._open -= 1
                    self._wake()
                    raise HttpError("connect", type(exc).__name__) from exc
                return proto
            w: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(w)
            await w

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _release(self, c: _Conn) -> None:
        if c.closed:
            self._open -= 1
        else:
            self._idle.append(c)
        self._wake()

    async def request(self, wire: bytes) -> int:
        return (await self.exchange(wire))[0]

    async def exchange(self, wire: bytes) -> tuple[int, bytes]:
        """The response's status and body."""
        conn = await self._acquire()
        try:
            async with asyncio.timeout(self.timeout_s):
                status = await conn.send(wire)
                return status, conn.body
        except TimeoutError:
            conn.abort()
            raise HttpError("timeout", f"no response within {self.timeout_s}s") from None
        except BaseException:
            conn.abort()
            raise
        finally:
            self._release(conn)

    async def prewarm(self, n: int) -> None:
        """Open ``n`` connections before the clock starts: a burst of connects mid-run can
        overflow the server's accept queue, and a dropped SYN costs a 1 s retransmit."""
        n = min(n, self.max_connections) - self._open
        if n <= 0:
            return
        conns = await asyncio.gather(*(self._acquire() for _ in range(n)), return_exceptions=True)
        for c in conns:
            if isinstance(c, _Conn):
                self._release(c)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()

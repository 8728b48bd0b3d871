"""Reading the body of an HTTP answer from a provider, whole and bounded.

``StreamReader.read(n)`` answers as soon as some bytes are there, so an answer that arrives
in two pieces (TCP segments, TLS records, chunks) would be cut at the first; ``read()`` has
no bound, so a confused proxy or endpoint could fill the gateway's memory. This reads until
the end of the answer, and stops at ``limit`` bytes.
"""

from __future__ import annotations

import aiohttp

# Graph and Tenashi answers are a few hundred bytes; anything near this is no answer of theirs.
ANSWER_LIMIT = 64 * 1024


async def read_answer(resp: aiohttp.ClientResponse, limit: int = ANSWER_LIMIT) -> bytes | None:
    """The answer's body, whole; None when it is longer than ``limit`` bytes (the rest is not
    read: the connection is then not reused)."""
    if resp.content_length is not None and resp.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(limit + 1):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)

"""wrk as a fixed-connection load generator: ``wrk -t1 -cN -dS`` posting pre-built, pre-signed
requests in turn (each sent once while there are more than the run needs).

wrk is Debian's package (``apt-get install wrk``); a benchmark that needs it says so and exits
non-zero when it is missing. Its per-request cost is a few microseconds of C, so a run measures
the server, where the Python generator of ``loadtest.harness.driver`` costs about as much as
a bare handler. The requests are the exact bytes of each POST (``Delivery.wire``), written to
one file that the script below reads once, before the run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

INSTALL = "wrk is not installed: it is Debian's package `wrk` (apt-get install wrk)"

# Length-prefixed requests ("<bytes>\n<request>"), read once per thread in init(); done()
# prints one JSON line with what wrk counted.
SCRIPT = r"""
local reqs, n, i = {}, 0, 0
init = function(args)
  local f = assert(io.open(args[1], "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local nl = data:find("\n", pos, true)
    local len = tonumber(data:sub(pos, nl - 1))
    n = n + 1
    reqs[n] = data:sub(nl + 1, nl + len)
    pos = nl + 1 + len
  end
end
request = function()
  i = i % n + 1
  return reqs[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests":%d,"duration_us":%d,"non2xx":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"timeout":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def path() -> str | None:
    """The wrk binary, or None when it is not installed."""
    return shutil.which("wrk")


def write_requests(target: Path, wires: Iterable[bytes]) -> int:
    """Write requests for ``SCRIPT``; returns how many."""
    n = 0
    with target.open("wb") as f:
        for wire in wires:
            f.write(b"%d\n" % len(wire))
            f.write(wire)
            n += 1
    return n


@dataclass(frozen=True, slots=True)
class Result:
    requests: int
    seconds: float
    non2xx: int
    socket_errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class Wrk:
    """Runs wrk with the script against one request file."""

    def __init__(self, requests: Path, binary: str) -> None:
        self.requests = requests
        self.binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix="wrk-"))
        self.script = self._dir / "post.lua"
        self.script.write_text(SCRIPT)

    async def run(self, port: int, connections: int, seconds: float, threads: int = 1) -> Result:
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(self.script),
            f"http://127.0.0.1:{port}/",
            "--",
            str(self.requests),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("WRK ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"wrk failed (rc={proc.returncode}): {err.decode(errors='replace')[-500:]}")
        w = json.loads(lines[-1][4:])
        return Result(
            requests=w["requests"],
            seconds=w["duration_us"] / 1e6,
            non2xx=w["non2xx"],
            socket_errors=w["connect"] + w["read"] + w["write"] + w["timeout"],
            p50_ms=w["p50_us"] / 1000,
            p99_ms=w["p99_us"] / 1000,
            max_ms=w["max_us"] / 1000,
        )

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

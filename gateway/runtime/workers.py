"""``gateway serve`` as several processes: one parent, N HTTP workers on one port and, by
default on two cores or more, processes of their own for the background services.

The parent resolves the database once (it starts the embedded PostgreSQL, if any, and
applies the migrations), then starts the children: N with ``gateway serve --worker``, each
binding the same host:port with SO_REUSEPORT (the kernel spreads connections over them) with
its own group committer; and, when the services run apart (``layout``), one with ``gateway
serve --services``: the consumers, sender and maintenance jobs that serve runs (GATEWAY_RUN_*),
with no HTTP, and, from 4 cores on (GATEWAY_SERVE_FORWARDER=auto; or always with apart), one
more with ``gateway serve --forwarder`` for the forwarder (else it runs in the services
process, where the consumers wake it right after their commits instead of by NOTIFY). Apart, a
worker's event loop only serves requests, and the forwarder's HTTP client work (the costliest
per event when destinations are configured) does not delay the consumers' batches. Inline,
each worker runs the services too. The parent supervises: a child that dies is started again
(after a pause), SIGTERM/SIGINT is forwarded to every child, and the parent exits once all of
them have. Each child also serves ``/healthz`` on a Unix socket of its own
(``GATEWAY_WORKER_HEALTH_SOCKET``, in the metrics directory; the shared port would reach any
worker), which the parent asks every few seconds: a child whose health has not answered 200
for ``GATEWAY_WORKER_UNRESPONSIVE_S`` (stopped, its event loop stuck, a loop of it stuck: see
``gateway.core.heartbeat``) is killed with SIGKILL (a stopped process takes no SIGTERM) and
started again, since the kernel keeps handing a worker connections on the shared port. A
child whose parent disappears (even by SIGKILL) gets SIGTERM from the kernel
(PR_SET_PDEATHSIG) and stops.

Metrics: the children share one PROMETHEUS_MULTIPROC_DIR (made fresh by the parent, removed
on exit), so ``/metrics`` on any of them reports every worker (see gateway.metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client import multiprocess

from gateway.core.aio import wait_set
from gateway.core.settings import WORKER_HEALTH_SOCKET, Settings
from gateway.runtime.startup import EXIT_STARTUP, LISTEN_ERRNOS, listen_error

log = logging.getLogger("gateway")

RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 20.0
# Each worker's /healthz on a Unix socket of its own, asked this often by the parent.
HEALTH_SOCKET_ENV = WORKER_HEALTH_SOCKET
HEALTH_EVERY_S = 2.0
UNRESPONSIVE_S = 20.0
PR_SET_PDEATHSIG = 1
# The services a child's GATEWAY_RUN_<role> turns on or off.
ROLES = ("CONSUMERS", "SENDER", "FORWARDER")
# GATEWAY_SERVE_FORWARDER=auto: the forwarder in a process of its own from this many cores.
FORWARDER_APART_CORES = 4


@dataclass(frozen=True, slots=True)
class Layout:
    """The processes of ``gateway serve``."""

    http: int  # HTTP workers
    services_apart: bool  # the background services in a process of their own
    forwarder_apart: bool = False  # and the forwarder in one more

    @property
    def processes(self) -> int:
        return self.http + self.services_apart + self.forwarder_apart


def layout(
    cores: int, workers: int, services: str, has_services: bool, forwarder: str | None = None
) -> Layout:
    """The processes for ``cores`` cores: ``workers`` HTTP workers (0: by core count) and the
    services (GATEWAY_SERVE_SERVICES: process, inline or auto) apart or inside each worker;
    apart, the forwarder (``forwarder``: GATEWAY_SERVE_FORWARDER, or None when it does not run
    beside another service) in a process of its own for apart, or from FORWARDER_APART_CORES
    cores on for auto.

    Auto puts the services apart from two cores on: their CPU then runs beside the HTTP
    workers instead of taking turns with requests on their event loops, and there is a core
    for it. On one core a second process would only add switches between them. The forwarder
    apart keeps its HTTP client work from delaying the consumers' batches, which pays near
    saturation; at ordinary rates it costs a process's wake-up per batch and a NOTIFY where an
    in-process call did (bench-pipeline on 2 cores: ~10 % more CPU per webhook), so auto keeps
    it with the services until there are cores to spare. Counted by core count, the HTTP
    workers are one per core, less one for the services process (the forwarder's is not
    counted: without destinations it is idle)."""
    apart = has_services and (services == "process" or (services == "auto" and cores >= 2))
    own = apart and (forwarder == "apart" or (forwarder == "auto" and cores >= FORWARDER_APART_CORES))
    if workers > 0:
        return Layout(workers, apart, own)
    return Layout(max(1, cores - 1) if apart else max(1, cores), apart, own)


def plan(settings: Settings, asked: int | None, has_services: bool, forwarder_beside: bool = False) -> Layout:
    """The layout of this machine: ``--workers`` (else GATEWAY_WORKERS), GATEWAY_SERVE_SERVICES
    and, when the forwarder runs beside other services (``forwarder_beside``),
    GATEWAY_SERVE_FORWARDER."""
    n = settings.workers if asked is None else asked
    forwarder = settings.serve_forwarder if forwarder_beside else None
    return layout(os.cpu_count() or 1, n, settings.serve_services, has_services, forwarder)


def die_with_parent() -> None:
    """In a child: SIGTERM when the parent exits, however it exits (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def child_env(settings: Settings, metrics_dir: str, *, services_apart: bool = False) -> dict[str, str]:
    """The environment of an HTTP worker (without the services when they run apart)."""
    assert settings.database_url
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": settings.database_url,
            "GATEWAY_MIGRATE_ON_START": "false",  # the parent did
            "GATEWAY_WORKERS": "1",
            "GATEWAY_CONSOLE_PORT": "0",  # the parent serves the console, once for all
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
        }
    )
    if services_apart:
        env.update({f"GATEWAY_RUN_{role}": "false" for role in ROLES})
    return env


def services_env(
    settings: Settings, metrics_dir: str, *, runs: tuple[str, ...] | None = None
) -> dict[str, str]:
    """The environment of a services process: its metrics are reported by the workers'
    /metrics (the shared directory), so it listens on no port of its own. ``runs``: only
    these of GATEWAY_RUN_* (CONSUMERS, SENDER, FORWARDER) that are on; None: all that are."""
    env = child_env(settings, metrics_dir)
    env["GATEWAY_METRICS_PORT"] = "0"
    if runs is not None:
        env.update({f"GATEWAY_RUN_{role}": "false" for role in ROLES if role not in runs})
    return env


# A child that exits with these could not start (bad configuration, port taken): starting it
# again would fail the same way, so the parent stops every worker and exits with the code.
FATAL_EXITS = (2, EXIT_STARTUP)


def check_free(host: str, port: int, variable: str) -> None:
    """Refuse to start when something already listens on host:port. The workers bind with
    SO_REUSEPORT, which would otherwise let a second gateway share the port silently."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return  # the workers will say why
    family, kind, proto, _name, addr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            if exc.errno in LISTEN_ERRNOS:
                raise listen_error(exc, host, port, variable) from None
            raise


@dataclass(frozen=True, slots=True)
class Child:
    """What one slot of the supervisor runs."""

    name: str
    flag: str  # gateway serve --worker | --services
    env: dict[str, str]


def children(settings: Settings, lay: Layout, metrics_dir: str) -> list[Child]:
    workers = [
        Child(f"worker {i}", "--worker", child_env(settings, metrics_dir, services_apart=lay.services_apart))
        for i in range(lay.http)
    ]
    if lay.forwarder_apart:
        workers.append(
            Child("services", "--services", services_env(settings, metrics_dir, runs=("CONSUMERS", "SENDER")))
        )
        workers.append(
            Child("forwarder", "--forwarder", services_env(settings, metrics_dir, runs=("FORWARDER",)))
        )
    elif lay.services_apart:
        workers.append(Child("services", "--services", services_env(settings, metrics_dir)))
    return workers


class Supervisor:
    """Starts, restarts and stops the child processes, and replaces one whose health stops
    answering."""

    def __init__(
        self,
        slots: list[Child],
        metrics_dir: str,
        unresponsive_s: float = UNRESPONSIVE_S,
        startup_s: float = 0.0,
    ) -> None:
        self.slots = slots
        self.metrics_dir = metrics_dir
        self.unresponsive_s = unresponsive_s
        # A worker first waits for the database (GATEWAY_DB_WAIT_S) and only then answers.
        self.startup_s = startup_s
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.fatal: int | None = None  # the exit code of a child that could not start
        self.replaced = 0  # children killed because their health stopped answering

    def health_socket(self, slot: int) -> str:
        return os.path.join(self.metrics_dir, f"child-{slot}.sock")

    async def _start(self, slot: int) -> None:
        child = self.slots[slot]
        sock = self.health_socket(slot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock)  # a killed child's
        env = {**child.env, HEALTH_SOCKET_ENV: sock}
        argv = (sys.executable, "-m", "gateway", "serve", child.flag)
        proc = await asyncio.create_subprocess_exec(*argv, env=env)
        self.procs[slot] = proc
        log.info("%s started (pid %d)", child.name, proc.pid)

    async def _watch(self, slot: int, proc: asyncio.subprocess.Process) -> None:
        """Ask the child's health every few seconds; kill it when it has not answered 200 for
        ``unresponsive_s`` (before its first answer: ``startup_s`` more, its wait for the
        database)."""
        every = min(HEALTH_EVERY_S, self.unresponsive_s / 3)
        last_ok = time.monotonic() + self.startup_s
        connector = aiohttp.UnixConnector(path=self.health_socket(slot))
        async with aiohttp.ClientSession(connector=connector) as http:
            while proc.returncode is None:
                await asyncio.sleep(every)
                try:
                    timeout = aiohttp.ClientTimeout(total=every)
                    async with http.get("http://child/healthz", timeout=timeout) as r:
                        if r.status == 200:
                            last_ok = time.monotonic()
                except (aiohttp.ClientError, OSError, TimeoutError):
                    pass
                silent = time.monotonic() - last_ok
                if silent > self.unresponsive_s and proc.returncode is None:
                    log.error(
                        "%s (pid %d): its health has not answered 200 for %.0f s; replacing it",
                        self.slots[slot].name,
                        proc.pid,
                        silent,
                    )
                    self.replaced += 1
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    return

    async def _keep(self, slot: int, stop: asyncio.Event) -> None:
        """Run slot ``slot`` until ``stop``: start it, and again whenever it dies."""
        while not stop.is_set():
            await self._start(slot)
            proc = self.procs[slot]
            watch = asyncio.create_task(self._watch(slot, proc))
            try:
                code = await proc.wait()
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            multiprocess.mark_process_dead(proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
            if stop.is_set():
                break
            if code in FATAL_EXITS:
                self.fatal = code  # it said why on stderr; the others are stopped
                stop.set()
                break
            name = self.slots[slot].name
            log.error("%s (pid %d) exited with %s; starting it again", name, proc.pid, code)
            await wait_set(stop, RESTART_DELAY_S)

    async def run(self, stop: asyncio.Event) -> None:
        slots = [asyncio.create_task(self._keep(i, stop)) for i in range(len(self.slots))]
        await stop.wait()
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        _done, pending = await asyncio.wait(slots, timeout=STOP_TIMEOUT_S)
        if pending:
            log.error("%d child(ren) did not stop in %.0f s: killing them", len(pending), STOP_TIMEOUT_S)
            for proc in self.procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.wait(pending)


def make_metrics_dir() -> str:
    return tempfile.mkdtemp(prefix="gateway-metrics-")


def remove_metrics_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)

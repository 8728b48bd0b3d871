"""The commands as operators run them: start-up errors, worker metrics, JSON logs without secrets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import aiohttp
import asyncpg

from gateway.core.signature import sign_meta
from gateway.testing.payloads import message_payload, meta_bytes
from tests.support.procs import closed_port, free_port, run_cli, spawn, wait_healthy

SECRETS = {
    "GATEWAY_META_APP_SECRETS": "meta-secret-QX7Z-current,meta-secret-QX7Z-previous",
    "GATEWAY_TENASHI_SECRET": "tenashi-secret-QX7Z",
    "GATEWAY_API_KEYS": "acme:acme-apikey-QX7Z-0123456789",
    "GATEWAY_GRAPH_TOKEN": "graph-token-QX7Z",
    "GATEWAY_TENASHI_TOKEN": "tenashi-token-QX7Z",
    "GATEWAY_META_VERIFY_TOKEN": "verify-token-QX7Z",
}
SECRET_VALUES = [v for raw in SECRETS.values() for v in raw.replace("acme:", "").split(",")]


def clean_env(**env: str) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k != "DATABASE_URL"}
    full.update(env)
    return full


def test_unreachable_database_is_retried_then_one_line(tmp_path: Path) -> None:
    port = closed_port()
    env = clean_env(
        DATABASE_URL=f"postgresql://gw:db-pass-QX7Z@127.0.0.1:{port}/gateway",
        GATEWAY_DB_WAIT_S="1.5",
        GATEWAY_DB_CONNECT_TIMEOUT_S="0.5",
    )
    for command in ("serve", "consume", "send", "migrate"):
        done = run_cli(command, env=env)
        assert done.returncode == 3, (command, done.stderr)
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"gateway: database at 127.0.0.1:{port}/gateway unreachable after 1.5s")
        assert "Traceback" not in done.stderr
        assert "retrying in" in done.stderr  # one line per try
        assert "db-pass-QX7Z" not in done.stderr + done.stdout


def test_malformed_dsn_and_refusing_to_run_without_one() -> None:
    done = run_cli("serve", env=clean_env(DATABASE_URL="postgresql://u:p@db:port/x"))
    assert done.returncode == 2
    assert "DATABASE_URL: has an invalid host or port" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_cli("serve", env=clean_env(GATEWAY_EMBEDDED="0"))
    assert done.returncode == 3
    assert done.stderr.strip() == (
        "gateway: DATABASE_URL is not set and GATEWAY_EMBEDDED=0: set DATABASE_URL to your PostgreSQL "
        "(or GATEWAY_EMBEDDED=1 for a throwaway embedded database)"
    )


def test_busy_port_is_one_line(db_dsn: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli("serve", env=clean_env(DATABASE_URL=db_dsn, GATEWAY_PORT=str(port)))
        assert done.returncode == 3, done.stderr
        assert done.stderr.strip().splitlines()[-1] == (
            f"gateway: cannot listen on 127.0.0.1:{port} (GATEWAY_PORT): address already in use "
            "(another gateway or program listens there)"
        )
        done = run_cli("consume", env=clean_env(DATABASE_URL=db_dsn, GATEWAY_METRICS_PORT=str(port)))
        assert done.returncode == 3, done.stderr
        assert f"cannot listen on 127.0.0.1:{port} (GATEWAY_METRICS_PORT)" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_typo_in_a_variable_is_reported() -> None:
    done = run_cli("settings", env=clean_env(GATEWAY_PROT="9000", GATEWAY_FAKE_PORT="1"))
    assert done.returncode == 0
    assert "unknown variable GATEWAY_PROT is ignored (did you mean GATEWAY_PORT?)" in done.stderr
    assert "GATEWAY_FAKE_PORT" not in done.stderr


async def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def wait_metrics(port: int, proc: subprocess.Popen[bytes], needle: str, timeout: float = 30) -> str:
    for _ in range(int(timeout / 0.1)):
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            status, text = await scrape(port)
            if status == 200 and needle in text:
                return text
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{needle} not on :{port}/metrics")


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


async def test_serve_consume_send_json_logs_metrics_and_no_secret(
    db_dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """Every process serves metrics; one exports the database-wide gauges; no secret in any log."""
    web_port, serve_metrics, consume_metrics, send_metrics = (free_port() for _ in range(4))
    base = {
        "DATABASE_URL": db_dsn,
        "GATEWAY_LOG_FORMAT": "json",
        "GATEWAY_LOG_LEVEL": "debug",
        "GATEWAY_GRAPH_URL": f"http://127.0.0.1:{closed_port()}/v21.0",
        **SECRETS,
    }
    logs = {name: tmp_path / f"{name}.log" for name in ("serve", "consume", "send")}
    serve = spawn(
        ["serve"],
        {
            **base,
            "GATEWAY_PORT": str(web_port),
            "GATEWAY_METRICS_PORT": str(serve_metrics),
            "GATEWAY_RUN_CONSUMERS": "0",
            "GATEWAY_RUN_SENDER": "0",
        },
        str(logs["serve"]),
    )
    consume = spawn(["consume"], {**base, "GATEWAY_METRICS_PORT": str(consume_metrics)}, str(logs["consume"]))
    send = spawn(["send"], {**base, "GATEWAY_METRICS_PORT": str(send_metrics)}, str(logs["send"]))
    procs = {"serve": serve, "consume": consume, "send": send}
    try:
        url = f"http://127.0.0.1:{web_port}"
        await wait_healthy(url, serve)
        body = meta_bytes(message_payload("wamid.QX7Z"))
        async with aiohttp.ClientSession() as http:
            secret = SECRETS["GATEWAY_META_APP_SECRETS"].split(",")[0]
            async with http.post(
                f"{url}/webhooks/meta", data=body, headers={"X-Hub-Signature-256": sign_meta(body, secret)}
            ) as r:
                assert r.status == 200
            async with http.post(
                f"{url}/webhooks/meta", data=body, headers={"X-Hub-Signature-256": "x"}
            ) as r:
                assert r.status == 401
            params = {"hub.mode": "subscribe", "hub.verify_token": "verify-token-QX7Z", "hub.challenge": "42"}
            async with http.get(f"{url}/webhooks/meta", params=params) as r:
                assert await r.text() == "42"
            api = {"Authorization": "Bearer acme-apikey-QX7Z-0123456789", "Idempotency-Key": "k-QX7Z"}
            msg = {"to": "4915100000001", "phone_number_id": "1111", "type": "text", "text": {"body": "hi"}}
            async with http.post(f"{url}/v1/messages", json=msg, headers=api) as r:
                assert r.status == 202
            async with http.post(f"{url}/v1/messages", data=b"{", headers=api) as r:
                assert r.status == 400
            async with http.get(f"{url}/metrics") as r:
                assert r.status == 404  # metrics are on their own port
        # A malformed request (a scanner): one DEBUG line, no traceback.
        with socket.create_connection(("127.0.0.1", web_port)) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
            raw.recv(1000)
        for port, needle in (
            (serve_metrics, 'gateway_webhook_requests_total{outcome="stored",source="meta"} 1.0'),
            (consume_metrics, "gateway_consumer_batch_rows_count"),
            (send_metrics, 'gateway_sends_total{code="",outcome="unknown",provider="meta"}'),
        ):
            proc = next(p for p in procs.values() if p.poll() is None)
            await wait_metrics(port, proc, needle)
            assert (await scrape(port, "/healthz"))[0] == 200
        # Exactly one process exports the database-wide gauges (serve competes too: it runs the
        # forwarder in-process, and with it the maintenance jobs).
        leaders = []
        for _ in range(100):
            texts = [(await scrape(p))[1] for p in (serve_metrics, consume_metrics, send_metrics)]
            leaders = [t for t in texts if "gateway_gauge_leader 1.0" in t]
            if leaders:
                break
            await asyncio.sleep(0.1)
        assert len(leaders) == 1
        assert "gateway_outbox_rows{state=" in leaders[0] and "gateway_inbox_depth" in leaders[0]
    finally:
        codes = {name: stop(p) for name, p in procs.items()}
    assert codes == {"serve": 0, "consume": 0, "send": 0}
    access = []
    for name, path in logs.items():
        text = path.read_text()
        for secret in SECRET_VALUES:
            assert secret not in text, f"{secret} in {name}.log"
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
        assert "Traceback" not in text
        access += [line for line in lines if line["logger"] == "gateway.access"]
        # Each long-running process collects garbage with the server's settings (tune_gc).
        assert any(line["message"].startswith("garbage collector:") for line in lines), name
    outcomes = {(a["source"], a["outcome"]) for a in access}
    assert {("meta", "stored"), ("meta", "bad_signature"), ("api", "ok"), ("api", "rejected")} <= outcomes
    assert all(a["request_id"] and a["latency_ms"] >= 0 for a in access)
    serve_lines = [json.loads(line) for line in logs["serve"].read_text().splitlines() if line.strip()]
    malformed = [line for line in serve_lines if "Error handling request" in line["message"]]
    assert malformed and all(line["level"] == "DEBUG" for line in malformed)


def test_operator_commands_print_no_secret(db_dsn: str) -> None:
    """Every operator command, with every secret configured and debug logs on."""
    env = clean_env(DATABASE_URL=db_dsn, GATEWAY_LOG_LEVEL="debug", GATEWAY_LOG_FORMAT="json", **SECRETS)
    for args in (
        ["settings"],
        ["migrate"],
        ["dead", "list"],
        ["outbox", "list", "--state", "review"],
        ["senders", "list"],
        ["destinations", "list"],
        ["deliveries", "list"],
        ["serve", "--help"],
    ):
        done = run_cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr[-500:])
        for secret in SECRET_VALUES:
            assert secret not in done.stdout + done.stderr, (args, secret)

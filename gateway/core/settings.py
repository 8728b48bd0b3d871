"""One frozen settings object, built from ``GATEWAY_*`` environment variables."""

from __future__ import annotations

import dataclasses
import difflib
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gateway.core import dsn
from gateway.core.enums import Provider

T = TypeVar("T")

MIN_DEDUP_RETENTION_DAYS = 7  # Meta redelivers for up to 7 days.
META_MAX_PAYLOAD = 3 * 1024 * 1024


class SettingsError(ValueError):
    """Raised with one line per bad variable."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


def _env(name: str, default: Any, parse: Callable[[str], Any] | None = None, doc: str = "") -> Any:
    return field(default=default, metadata={"env": name, "parse": parse, "doc": doc})


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"must be an integer, got {raw!r}") from None
        if lo is not None and value < lo:
            raise ValueError(f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise ValueError(f"must be <= {hi}, got {value}")
        return value

    return parse


def _float(lo: float | None = None, hi: float | None = None) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(f"must be a number, got {raw!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"must be finite, got {raw!r}")
        if lo is not None and value < lo:
            raise ValueError(f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise ValueError(f"must be <= {hi}, got {value}")
        return value

    return parse


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true or false, got {raw!r}")


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _modules(raw: str) -> tuple[str, ...]:
    items = _csv(raw)
    for item in items:
        if not all(part.isidentifier() for part in item.split(".")):
            raise ValueError(f"{item!r} is not a module name (package.module)")
    return items


def _secrets(raw: str) -> tuple[str, ...]:
    items = _csv(raw)
    for item in items:
        if len(item) < 8:
            # Never echo the secret itself.
            raise ValueError("each secret must be at least 8 characters")
    return items


def _pairs(raw: str) -> tuple[tuple[str, str], ...]:
    """Parse ``a:b,c:d`` into pairs; the value may itself contain ':'."""
    out: list[tuple[str, str]] = []
    for item in _csv(raw):
        left, sep, right = item.partition(":")
        if not sep or not left.strip() or not right.strip():
            raise ValueError("must be comma-separated name:value pairs")
        out.append((left.strip(), right.strip()))
    return tuple(out)


def _api_keys(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = _pairs(raw)
    for _, key in pairs:
        if len(key) < 16:
            raise ValueError("each API key must be at least 16 characters")
    return pairs


_CONSOLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def _console_tokens(raw: str) -> tuple[tuple[str, str, str], ...]:
    """``name:token[:ro],...`` as (name, token, "rw" or "ro"); the token is never echoed."""
    out: list[tuple[str, str, str]] = []
    for item in _csv(raw):
        name, _, rest = item.partition(":")
        token, _, role = rest.partition(":")
        if not _CONSOLE_NAME.fullmatch(name.strip()):
            raise ValueError("each entry is name:token[:ro], the name 1..64 of A-Z a-z 0-9 _ . @ -")
        if len(token.strip()) < 16:
            raise ValueError(f"the token of {name.strip()!r} must be at least 16 characters")
        if role.strip() not in ("", "ro", "rw"):
            raise ValueError(f"the role of {name.strip()!r} must be ro (read-only) or nothing")
        out.append((name.strip(), token.strip(), role.strip() or "rw"))
    return tuple(out)


def _graph_tokens(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = _pairs(raw)
    numbers = [n for n, _ in pairs]
    if len(set(numbers)) != len(numbers):
        raise ValueError("a phone_number_id is given twice")
    for number, token in pairs:
        if not number.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"{number!r} is not a phone_number_id")
        if len(token) < 8:
            raise ValueError(f"the token of {number} is too short")  # never echo the token
    return pairs


def _choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def _log_level(raw: str) -> str:
    return _choice("debug", "info", "warning", "error")(raw).upper()


def _url(raw: str) -> str:
    value = raw.strip().rstrip("/")
    if not (value.startswith("http://") or value.startswith("https://")):
        raise ValueError(f"must be an http(s) URL, got {raw!r}")
    return value


def _dsn(raw: str) -> str:
    """A PostgreSQL URL; checked here so a typo is one line at start-up, not a driver traceback."""
    value = raw.strip()
    if not value:
        return value  # set but empty: the same as unset
    scheme, sep, _ = value.partition("://")
    if not sep or scheme not in ("postgres", "postgresql"):
        raise ValueError("must be a postgresql://user:password@host:port/database URL")
    hosts = dsn.per_host(value)
    try:
        for one in hosts:
            urllib.parse.urlsplit(one).port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(
            "has an invalid host or port (a password with special characters must be percent-encoded)"
        ) from None
    attrs = urllib.parse.parse_qs(urllib.parse.urlsplit(hosts[0]).query).get("target_session_attrs", [""])[-1]
    if len(hosts) > 1 and attrs not in ("read-write", "primary"):
        # Every connection writes: with several hosts, only the primary of the moment will do.
        raise ValueError("lists several hosts: add ?target_session_attrs=read-write (the gateway writes)")
    return value


def _path(raw: str) -> Path:
    return Path(raw.strip())


def _str(raw: str) -> str:
    return raw.strip()


@dataclass(frozen=True, slots=True)
class Settings:
    # Database
    database_url: str | None = _env(
        "DATABASE_URL",
        None,
        _dsn,
        "PostgreSQL URL (postgresql://user:password@host:port/db; a primary and its standbys: "
        "host1:port,host2:port/db?target_session_attrs=read-write); unset: the embedded server",
    )
    data_dir: Path = _env(
        "GATEWAY_DATA_DIR",
        Path("./var"),
        _path,
        "where the embedded PostgreSQL keeps its data (only without DATABASE_URL)",
    )
    db_pool_min: int = _env(
        "GATEWAY_DB_POOL_MIN", 2, _int(1, 200), "database connections each process keeps open"
    )
    db_pool_max: int = _env(
        "GATEWAY_DB_POOL_MAX", 10, _int(1, 200), "most database connections a process's pool opens"
    )
    db_connect_timeout_s: float = _env(
        "GATEWAY_DB_CONNECT_TIMEOUT_S",
        5.0,
        _float(0.1, 120),
        "seconds to wait for one database connection to open (per host of a multi-host DATABASE_URL)",
    )
    migrate_on_start: bool = _env(
        "GATEWAY_MIGRATE_ON_START",
        True,
        _bool,
        "apply pending migrations when a process starts (false: wait for gateway migrate to apply them)",
    )
    db_wait_s: float = _env(
        "GATEWAY_DB_WAIT_S",
        30.0,
        _float(0, 3600),
        "at start-up, wait this many seconds for the database (and for its schema, when not migrating)",
    )
    embedded: bool = _env(
        "GATEWAY_EMBEDDED",
        True,
        _bool,
        "without DATABASE_URL, start an embedded PostgreSQL ([embedded] extra); false: refuse to start",
    )

    # HTTP
    host: str = _env(
        "GATEWAY_HOST", "127.0.0.1", _str, "address the HTTP server (and the metrics listener) binds to"
    )
    port: int = _env(
        "GATEWAY_PORT", 8080, _int(0, 65535), "port for webhooks, the send API and health checks"
    )
    max_body_bytes: int = _env(
        "GATEWAY_MAX_BODY_BYTES",
        4 * 1024 * 1024,
        _int(META_MAX_PAYLOAD),
        "largest request body accepted (413 above; Meta's payloads reach 3 MB)",
    )
    max_inflight_body_bytes: int = _env(
        "GATEWAY_MAX_INFLIGHT_BODY_BYTES",
        64 * 1024 * 1024,
        _int(1),
        "webhook body bytes read at once; 503 past it",
    )
    header_timeout_s: float = _env(
        "GATEWAY_HEADER_TIMEOUT_S",
        15.0,
        _float(0.5, 3600),
        "idle keep-alive plus request headers, per connection",
    )
    body_timeout_s: float = _env(
        "GATEWAY_BODY_TIMEOUT_S", 15.0, _float(0.5, 3600), "to read a webhook body; 408 past it"
    )
    max_connections: int = _env("GATEWAY_MAX_CONNECTIONS", 1024, _int(1, 1_000_000), "open HTTP connections")
    listen_backlog: int = _env(
        "GATEWAY_LISTEN_BACKLOG",
        1024,
        _int(1, 65_535),
        "connections the kernel completes and queues before they are accepted (capped by"
        " net.core.somaxconn); past it a client's SYN is dropped and it retries a second later",
    )
    log_level: str = _env("GATEWAY_LOG_LEVEL", "INFO", _log_level, "debug, info, warning or error")
    log_format: str = _env(
        "GATEWAY_LOG_FORMAT",
        "text",
        _choice("text", "json"),
        "text (for a terminal) or json (one object per line, for containers)",
    )
    access_log_rate: float = _env(
        "GATEWAY_ACCESS_LOG_RATE",
        50.0,
        _float(0),
        "access-log lines per second before sampling (5xx always logged); 0: no access log",
    )
    metrics_port: int = _env(
        "GATEWAY_METRICS_PORT",
        0,
        _int(0, 65535),
        "/metrics + /healthz on a listener of their own (serve, consume, send, forward); 0: none. "
        "The public port never serves /metrics (it names destinations and phone-number ids) unless "
        "this is GATEWAY_PORT itself",
    )

    # Group commit of the ingest edge
    commit_window_ms: float = _env(
        "GATEWAY_COMMIT_WINDOW_MS",
        1.0,
        _float(0, 1000),
        "while a group-commit batch is being written, how long new webhooks wait for it before "
        "they are written as a batch of their own (shorter than a commit, so that under load "
        "commits overlap instead of queueing one behind the other)",
    )
    commit_linger_ms: float = _env(
        "GATEWAY_COMMIT_LINGER_MS",
        12.0,
        _float(0, 100),
        "most time a webhook that arrives while no batch is being written waits for others to "
        "share its commit: only at rates that likely bring half a webhook in that time, while "
        "more than one connection sends, and no longer than GATEWAY_COMMIT_LINGER_GATHER more "
        "take to come (so not at all below ~42 webhooks/s, 0.8 ms at 5 000/s); 0: none",
    )
    commit_linger_gather: int = _env(
        "GATEWAY_COMMIT_LINGER_GATHER",
        4,
        _int(1, 1000),
        "webhooks a lingering one waits for at most: its linger is the time the recent rate takes "
        "to bring this many, at most GATEWAY_COMMIT_LINGER_MS",
    )
    commit_max_batch: int = _env(
        "GATEWAY_COMMIT_MAX_BATCH",
        256,
        _int(1, 10000),
        "most webhooks written in one group-commit transaction",
    )
    commit_max_inflight: int = _env(
        "GATEWAY_COMMIT_MAX_INFLIGHT",
        4,
        _int(1, 100),
        "group-commit batches written at once (each on its own connection)",
    )
    ack_deadline_ms: int = _env(
        "GATEWAY_ACK_DEADLINE_MS",
        3000,
        _int(10, 60000),
        "a webhook not committed within this many ms gets 503 (the sender retries)",
    )

    # Meta
    meta_app_secrets: tuple[str, ...] = _env(
        "GATEWAY_META_APP_SECRETS",
        (),
        _secrets,
        "Meta app secrets, comma-separated (several during rotation); empty: every Meta POST gets 401",
    )
    meta_verify_token: str = _env(
        "GATEWAY_META_VERIFY_TOKEN",
        "",
        _str,
        "token Meta echoes in the subscription handshake; empty: handshake refused",
    )
    graph_url: str = _env(
        "GATEWAY_GRAPH_URL",
        "https://graph.facebook.com/v21.0",
        _url,
        "Graph API base URL for sends (with its version)",
    )
    graph_token: str = _env(
        "GATEWAY_GRAPH_TOKEN", "", _str, "Graph API token of every number GATEWAY_GRAPH_TOKENS does not name"
    )
    graph_tokens: tuple[tuple[str, str], ...] = _env(
        "GATEWAY_GRAPH_TOKENS",
        (),
        _graph_tokens,
        "phone_number_id:token,...: the Graph API token of each sending number (sends, read receipts, media)",
    )
    media_max_bytes: int = _env(
        "GATEWAY_MEDIA_MAX_BYTES",
        100 * 1024 * 1024,
        _int(1),
        "largest media file GET /v1/media streams or POST /v1/media uploads (Meta's limit: 100 MB)",
    )
    media_timeout_s: float = _env(
        "GATEWAY_MEDIA_TIMEOUT_S",
        120.0,
        _float(1, 3600),
        "whole-transfer timeout of one media download or upload through the Graph API",
    )
    graph_compat_wait_ms: int = _env(
        "GATEWAY_GRAPH_COMPAT_WAIT_MS",
        3000,
        _int(0, 600000),
        "how long POST /{version}/{phone_number_id}/messages waits for the send's outcome (pacing "
        "included) before answering 202 with the gateway's key; below the client's timeout (httpx: 5 s)",
    )

    # Tenashi
    tenashi_secret: str = _env("GATEWAY_TENASHI_SECRET", "", _str, "secret Tenashi signs its webhooks with")
    tenashi_signature_header: str = _env(
        "GATEWAY_TENASHI_SIGNATURE_HEADER", "X-Tenashi-Signature", _str, "header carrying Tenashi's signature"
    )
    tenashi_signature_scheme: str = _env(
        "GATEWAY_TENASHI_SIGNATURE_SCHEME",
        "hmac-sha256-hex",
        _choice("hmac-sha256-hex", "hmac-sha256-base64"),
        "hmac-sha256-hex or hmac-sha256-base64",
    )
    tenashi_signature_prefix: str = _env(
        "GATEWAY_TENASHI_SIGNATURE_PREFIX",
        "sha256=",
        _str,
        "text before the digest in Tenashi's signature header",
    )
    tenashi_url: str = _env(
        "GATEWAY_TENASHI_URL", "https://api.tenashi.example", _url, "Tenashi API base URL for sends"
    )
    tenashi_token: str = _env("GATEWAY_TENASHI_TOKEN", "", _str, "Tenashi API token for sends")

    # Send API
    api_keys: tuple[tuple[str, str], ...] = _env(
        "GATEWAY_API_KEYS",
        (),
        _api_keys,
        "send API keys as tenant:key pairs, comma-separated (keys of 16+ characters)",
    )

    # The operator console: its own listener, never the public port.
    console_port: int = _env(
        "GATEWAY_CONSOLE_PORT",
        0,
        _int(0, 65535),
        "operator console listener (gateway serve, gateway console); 0: no console",
    )
    console_host: str = _env(
        "GATEWAY_CONSOLE_HOST", "127.0.0.1", _str, "address the operator console binds to"
    )
    console_tokens: tuple[tuple[str, str, str], ...] = _env(
        "GATEWAY_CONSOLE_TOKENS",
        (),
        _console_tokens,
        "console logins as name:token[:ro], comma-separated (tokens of 16+ characters; ro: read-only)",
    )
    console_session_h: float = _env(
        "GATEWAY_CONSOLE_SESSION_H", 8.0, _float(0.01, 24 * 7), "hours a console login lasts"
    )

    # Processes of `gateway serve`: HTTP workers, each with its own group committer, and the
    # background services below, either in a process of their own or inside each worker
    # (sizes are per process). 0 workers: by core count (gateway.runtime.workers.layout).
    workers: int = _env(
        "GATEWAY_WORKERS",
        0,
        _int(0, 256),
        "gateway serve HTTP processes sharing the port (SO_REUSEPORT); 0: by core count "
        "(one per core, less the services process)",
    )
    serve_services: str = _env(
        "GATEWAY_SERVE_SERVICES",
        "auto",
        _choice("auto", "process", "inline"),
        "where gateway serve runs consumers, sender and forwarder: process (one of their own beside "
        "the HTTP workers), inline (inside each HTTP worker), auto (process with 2+ cores, else inline)",
    )
    serve_forwarder: str = _env(
        "GATEWAY_SERVE_FORWARDER",
        "auto",
        _choice("auto", "apart", "with-services"),
        "when gateway serve runs the services in a process of their own: the forwarder in one more "
        "process (apart: its HTTP client work does not hold up the consumers' batches), in theirs "
        "(with-services: woken in-process, fewer wake-ups per event), auto (apart from 4 cores)",
    )
    worker_unresponsive_s: float = _env(
        "GATEWAY_WORKER_UNRESPONSIVE_S",
        20.0,
        _float(1, 3600),
        "the serve parent replaces a child process whose /healthz has not answered 200 for this long",
    )
    liveness_s: float = _env(
        "GATEWAY_LIVENESS_S",
        120.0,
        _float(1, 86400),
        "a long-running loop silent this long (beyond its own wait) makes /healthz answer 503",
    )
    # Which background services `gateway serve` runs in-process.
    run_consumers: bool = _env("GATEWAY_RUN_CONSUMERS", True, _bool, "run the consumers inside gateway serve")
    run_sender: bool = _env(
        "GATEWAY_RUN_SENDER", True, _bool, "run the sender and reconciler inside gateway serve"
    )
    run_forwarder: bool = _env("GATEWAY_RUN_FORWARDER", True, _bool, "run the forwarder inside gateway serve")

    # Consumers
    consumer_concurrency: int = _env(
        "GATEWAY_CONSUMER_CONCURRENCY",
        1,
        _int(1, 64),
        "consumer loops per process (more overlap batches whose handlers take their time; one keeps "
        "batches large and the process's event loop free for the forwarder)",
    )
    consumer_batch: int = _env(
        "GATEWAY_CONSUMER_BATCH",
        1000,
        _int(1, 10000),
        "most staged webhooks one consumer batch reads (a backlog is read in batches this large; at "
        "ordinary rates a batch holds what the batch gap gathers)",
    )
    consumer_batch_bytes: int = _env(
        "GATEWAY_CONSUMER_BATCH_BYTES", 16 * 1024 * 1024, _int(1), "most body bytes one consumer batch reads"
    )
    consumer_batch_gap_ms: float = _env(
        "GATEWAY_CONSUMER_BATCH_GAP_MS",
        60.0,
        _float(0, 1000),
        "most time between the starts of two batches a process's consumers begin on a wake-up, so "
        "that webhooks staged meanwhile share one (a backlog is claimed at once); 0: none",
    )
    consumer_batch_gap_min_ms: float = _env(
        "GATEWAY_CONSUMER_BATCH_GAP_MIN_MS",
        10.0,
        _float(0, 1000),
        "least time between the starts of two woken batches however high the rate, so that "
        "batches near saturation stay large enough to keep up; at most GATEWAY_CONSUMER_BATCH_GAP_MS",
    )
    consumer_batch_gather: int = _env(
        "GATEWAY_CONSUMER_BATCH_GATHER",
        20,
        _int(0, 10000),
        "events a woken batch waits to gather: the gap between batches is the time the recent "
        "rate of events takes to bring this many, at most GATEWAY_CONSUMER_BATCH_GAP_MS; 0: "
        "always that gap",
    )
    consumer_lane_lease_s: float = _env(
        "GATEWAY_CONSUMER_LANE_LEASE_S",
        10.0,
        _float(1, 3600),
        "how long a consumer process's hold on its lanes lasts unrenewed (renewed every third of "
        "it): a process that hangs loses its lanes to the others after this; one that dies or "
        "stops, at once",
    )
    consumer_poll_ms: int = _env(
        "GATEWAY_CONSUMER_POLL_MS",
        1000,
        _int(10, 600000),
        "consumers poll this often when no NOTIFY wakes them",
    )
    max_attempts: int = _env(
        "GATEWAY_MAX_ATTEMPTS", 8, _int(1, 1000), "processing attempts before a staged webhook is parked dead"
    )
    retry_base_ms: int = _env(
        "GATEWAY_RETRY_BASE_MS", 1000, _int(1, 3600000), "first retry delay (jittered exponential backoff)"
    )
    retry_max_ms: int = _env("GATEWAY_RETRY_MAX_MS", 600000, _int(1, 86400000), "longest retry delay")
    fault_backoff_max_ms: int = _env(
        "GATEWAY_FAULT_BACKOFF_MAX_MS",
        30000,
        _int(1, 3600000),
        "backoff cap while the database is failing (retried forever, no attempt counted)",
    )
    handlers: tuple[str, ...] = _env(
        "GATEWAY_HANDLERS", (), _modules, "modules whose handlers run in the consumer's transaction"
    )
    handler_timeout_ms: int = _env("GATEWAY_HANDLER_TIMEOUT_MS", 5000, _int(1, 600000), "per handler call")
    dedup_retention_days: int = _env(
        "GATEWAY_DEDUP_RETENTION_DAYS",
        30,
        _int(1),
        "days processed event keys are kept (at least 7: Meta redelivers for 7 days)",
    )
    inbox_retention_days: int = _env(
        "GATEWAY_INBOX_RETENTION_DAYS",
        7,
        _int(1),
        "days processed staged webhooks (and exact bytes of escaped events) are kept",
    )
    status_retention_days: int = _env(
        "GATEWAY_STATUS_RETENTION_DAYS", 90, _int(1), "days message status history is kept"
    )
    inbound_retention_days: int = _env(
        "GATEWAY_INBOUND_RETENTION_DAYS", 30, _int(1), "days inbound_messages (the downstream feed) is kept"
    )
    account_retention_days: int = _env(
        "GATEWAY_ACCOUNT_RETENTION_DAYS", 90, _int(1), "days account_errors and account_updates are kept"
    )
    outbox_retention_days: int = _env(
        "GATEWAY_OUTBOX_RETENTION_DAYS",
        30,
        _int(1),
        "days accepted/failed/cancelled outbox rows are kept after their state last changed (delivery "
        "reports do not count; at least the idempotency window)",
    )
    partitions_ahead_days: int = _env(
        "GATEWAY_PARTITIONS_AHEAD_DAYS", 3, _int(2, 60), "day partitions created ahead of time"
    )
    purge_interval_s: int = _env(
        "GATEWAY_PURGE_INTERVAL_S", 3600, _int(1), "seconds between retention passes"
    )
    purge_batch: int = _env(
        "GATEWAY_PURGE_BATCH", 5000, _int(1, 1000000), "rows deleted per retention statement"
    )

    # Sender
    send_connect_timeout_ms: int = _env(
        "GATEWAY_SEND_CONNECT_TIMEOUT_MS",
        3000,
        _int(1),
        "provider connect timeout (a send that never connected is retried)",
    )
    send_read_timeout_ms: int = _env(
        "GATEWAY_SEND_READ_TIMEOUT_MS",
        15000,
        _int(1),
        "provider read timeout (past it the send's fate is unknown)",
    )
    send_batch: int = _env("GATEWAY_SEND_BATCH", 100, _int(1, 10000), "outbox rows one sender claim takes")
    send_concurrency: int = _env(
        "GATEWAY_SEND_CONCURRENCY", 64, _int(1, 10000), "sends in flight per sender process"
    )
    send_poll_ms: int = _env(
        "GATEWAY_SEND_POLL_MS", 500, _int(10, 600000), "the sender polls the outbox this often"
    )
    pair_interval_s: float = _env(
        "GATEWAY_PAIR_INTERVAL_S", 6.0, _float(0), "at most one message per recipient per this many seconds"
    )
    number_rate_per_s: float = _env(
        "GATEWAY_NUMBER_RATE_PER_S", 80.0, _float(0.1), "sends per second per sending number"
    )
    tenashi_key_window_h: float = _env(
        "GATEWAY_TENASHI_KEY_WINDOW_H",
        23.0,
        _float(0.01, 24),
        "Tenashi honours an Idempotency-Key for 24 h: a send is not retried later than this after "
        "its first attempt that may have reached Tenashi (it goes to review)",
    )
    tenashi_number_interval_s: float = _env(
        "GATEWAY_TENASHI_NUMBER_INTERVAL_S",
        12.0,
        _float(0),
        "Tenashi: seconds between sends from one number (it paces 4-12 s itself)",
    )
    breaker_backoff_s: float = _env(
        "GATEWAY_BREAKER_BACKOFF_S", 30.0, _float(0.1), "first wait of an open breaker before a probe"
    )
    breaker_max_backoff_s: float = _env(
        "GATEWAY_BREAKER_MAX_BACKOFF_S", 1800.0, _float(0.1), "cap of the doubling breaker wait"
    )
    reconcile_window_s: int = _env(
        "GATEWAY_RECONCILE_WINDOW_S",
        600,
        _int(1),
        "how long an unknown send waits for its status webhook before its policy applies",
    )
    send_max_attempts: int = _env(
        "GATEWAY_SEND_MAX_ATTEMPTS", 8, _int(1, 1000), "retryable provider rejections before a send is failed"
    )
    send_loops: int = _env("GATEWAY_SEND_LOOPS", 2, _int(1, 64), "claim/send loops per sender process")
    idempotency_ttl_h: int = _env(
        "GATEWAY_IDEMPOTENCY_TTL_H", 72, _int(1), "hours a send API Idempotency-Key is remembered"
    )
    tenant_providers: tuple[tuple[str, str], ...] = _env(
        "GATEWAY_TENANT_PROVIDERS",
        (),
        _pairs,
        "tenant:meta or tenant:tenashi pairs, comma-separated; unlisted tenants use meta",
    )
    tenant_numbers: tuple[tuple[str, str], ...] = _env(
        "GATEWAY_TENANT_NUMBERS",
        (),
        _pairs,
        "tenant:phone_number_id,...: the numbers each tenant may send from; unset: any (warned)",
    )
    reply_per_bot_tenants: tuple[str, ...] = _env(
        "GATEWAY_REPLY_PER_BOT_TENANTS",
        (),
        _csv,
        "tenants whose bots may each answer one inbound message once (default: one reply per "
        "message, whatever the bot); handler replies are tenant 'handlers'",
    )

    # Forwarding to downstream destinations (gateway destinations / gateway forward)
    forward_retry_h: float = _env(
        "GATEWAY_FORWARD_RETRY_H", 24.0, _float(0, 24 * 30), "hours a delivery is retried before it is failed"
    )
    delivery_retention_days: int = _env(
        "GATEWAY_DELIVERY_RETENTION_DAYS",
        30,
        _int(1),
        "days delivery attempts are kept (their bodies: these, the retry window and a day); open ones, failed"
        " included, stay queued",
    )
    forward_retry_base_ms: int = _env(
        "GATEWAY_FORWARD_RETRY_BASE_MS",
        1000,
        _int(1, 3600000),
        "first forwarding retry delay (jittered exponential backoff)",
    )
    forward_retry_max_ms: int = _env(
        "GATEWAY_FORWARD_RETRY_MAX_MS", 3600000, _int(1, 86400000), "longest forwarding retry delay"
    )
    forward_timeout_ms: int = _env(
        "GATEWAY_FORWARD_TIMEOUT_MS", 15000, _int(1, 600000), "whole-request timeout of one delivery"
    )
    forward_concurrency: int = _env(
        "GATEWAY_FORWARD_CONCURRENCY", 64, _int(1, 10000), "deliveries in flight per forwarder"
    )
    forward_batch: int = _env(
        "GATEWAY_FORWARD_BATCH", 100, _int(1, 10000), "deliveries one forwarder claim takes"
    )
    forward_allow_private: bool = _env(
        "GATEWAY_FORWARD_ALLOW_PRIVATE",
        False,
        _bool,
        "let destinations reach loopback, private and link-local addresses (refused at add and connect)",
    )
    forward_round_gap_ms: float = _env(
        "GATEWAY_FORWARD_ROUND_GAP_MS",
        30.0,
        _float(0, 1000),
        "most time between the starts of two forwarder rounds begun on a wake-up, so that "
        "deliveries and outcomes arriving meanwhile share one (a backlog is claimed at once); 0: none",
    )
    forward_round_gather: int = _env(
        "GATEWAY_FORWARD_ROUND_GATHER",
        20,
        _int(0, 10000),
        "deliveries a woken round waits to gather: the gap between rounds is the time the recent "
        "rate of deliveries takes to bring this many, at most GATEWAY_FORWARD_ROUND_GAP_MS; 0: "
        "always that gap",
    )
    forward_poll_ms: int = _env(
        "GATEWAY_FORWARD_POLL_MS",
        1000,
        _int(10, 600000),
        "the forwarder polls this often when no NOTIFY wakes it",
    )
    forward_lease_set_s: float = _env(
        "GATEWAY_FORWARD_LEASE_S",
        0.0,
        _float(0, 86400),
        "seconds a dead forwarder's claims stay held (a live one's rounds renew them); "
        "0: twice GATEWAY_FORWARD_TIMEOUT_MS + 60",
    )
    forward_breaker_failures: int = _env(
        "GATEWAY_FORWARD_BREAKER_FAILURES",
        5,
        _int(1, 100000),
        "consecutive failures that open a destination's breaker",
    )
    forward_breaker_cooldown_s: float = _env(
        "GATEWAY_FORWARD_BREAKER_COOLDOWN_S",
        30.0,
        _float(0, 86400),
        "seconds an open breaker waits before one half-open probe",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        problems: list[str] = []
        for f in dataclasses.fields(cls):
            name = f.metadata["env"]
            raw = environ.get(name)
            if raw is None:
                continue
            parse = f.metadata["parse"]
            try:
                values[f.name] = parse(raw)
            except ValueError as exc:
                problems.append(f"{name}: {exc}")
        if not problems:
            settings = cls(**values)
            problems.extend(settings.check())
        if problems:
            raise SettingsError(problems)
        return settings

    def check(self) -> list[str]:
        """Cross-field rules."""
        problems: list[str] = []
        if self.dedup_retention_days < MIN_DEDUP_RETENTION_DAYS:
            problems.append(
                f"GATEWAY_DEDUP_RETENTION_DAYS: must be >= {MIN_DEDUP_RETENTION_DAYS} "
                f"(Meta redelivers for 7 days), got {self.dedup_retention_days}"
            )
        if self.outbox_retention_days * 24 < self.idempotency_ttl_h:
            problems.append(
                "GATEWAY_OUTBOX_RETENTION_DAYS: must cover GATEWAY_IDEMPOTENCY_TTL_H "
                f"({self.idempotency_ttl_h} h), got {self.outbox_retention_days} days"
            )
        if self.db_pool_min > self.db_pool_max:
            problems.append("GATEWAY_DB_POOL_MIN: must not exceed GATEWAY_DB_POOL_MAX")
        if self.forward_retry_base_ms > self.forward_retry_max_ms:
            problems.append("GATEWAY_FORWARD_RETRY_BASE_MS: must not exceed GATEWAY_FORWARD_RETRY_MAX_MS")
        if self.max_inflight_body_bytes < self.max_body_bytes:
            problems.append("GATEWAY_MAX_INFLIGHT_BODY_BYTES: must be at least GATEWAY_MAX_BODY_BYTES")
        if self.retry_base_ms > self.retry_max_ms:
            problems.append("GATEWAY_RETRY_BASE_MS: must not exceed GATEWAY_RETRY_MAX_MS")
        for tenant, provider in self.tenant_providers:
            if provider not in tuple(Provider):
                problems.append(f"GATEWAY_TENANT_PROVIDERS: provider for {tenant!r} must be meta or tenashi")
        if self.breaker_backoff_s > self.breaker_max_backoff_s:
            problems.append("GATEWAY_BREAKER_BACKOFF_S: must not exceed GATEWAY_BREAKER_MAX_BACKOFF_S")
        keys = [k for _, k in self.api_keys]
        if len(set(keys)) != len(keys):
            problems.append("GATEWAY_API_KEYS: the same key is given twice")
        if self.console_port and not self.console_tokens:
            problems.append(
                "GATEWAY_CONSOLE_TOKENS: must be set when GATEWAY_CONSOLE_PORT is (nobody could log in)"
            )
        names = [n for n, _, _ in self.console_tokens]
        tokens = [t for _, t, _ in self.console_tokens]
        if len(set(names)) != len(names) or len(set(tokens)) != len(tokens):
            problems.append("GATEWAY_CONSOLE_TOKENS: a name or a token is given twice")
        if self.console_port and self.console_port in (self.port, self.metrics_port):
            problems.append("GATEWAY_CONSOLE_PORT: must differ from GATEWAY_PORT and GATEWAY_METRICS_PORT")
        return problems

    @property
    def tenashi_key_window_s(self) -> float:
        return self.tenashi_key_window_h * 3600

    @property
    def metrics_public(self) -> bool:
        """``gateway serve`` answers /metrics on the public port (GATEWAY_METRICS_PORT is
        GATEWAY_PORT), not on a listener of its own."""
        return bool(self.metrics_port) and self.metrics_port == self.port

    @property
    def send_lease_s(self) -> float:
        """After this long a row still ``sending`` belongs to a sender that died mid-request.

        The sender's whole-request timeout (connect + 2 x read) plus a minute of slack.
        """
        return self.send_connect_timeout_ms / 1000 + 2 * self.send_read_timeout_ms / 1000 + 60.0

    @property
    def forward_lease_s(self) -> float:
        """A forwarder lease not renewed for this long belongs to a forwarder that died.

        A round renews it when it changes what it holds or a tenth of the lease has passed (a
        round runs at least once a poll interval, or a round's timeout when the database is
        slow): unless GATEWAY_FORWARD_LEASE_S sets it, twice the request timeout, plus a minute
        of slack.
        """
        if self.forward_lease_set_s > 0:
            return self.forward_lease_set_s
        return 2 * self.forward_timeout_ms / 1000 + 60.0

    def redacted(self) -> dict[str, Any]:
        """Settings safe to log: secrets replaced by their count or a marker."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in {"meta_app_secrets", "api_keys", "console_tokens", "graph_tokens"}:
                value = f"<{len(value)} set>"
            elif f.name in _SINGLE_SECRETS:
                value = "<set>" if value else "<unset>"
            elif f.name == "database_url" and value:
                value = dsn.redact(value)
            out[f.name] = value
        return out

    def secret_values(self) -> tuple[str, ...]:
        """Every secret configured (and the database password), for scrubbing log lines."""
        found: list[str] = [*self.meta_app_secrets, *(key for _, key in self.api_keys)]
        found += [token for _, token, _ in self.console_tokens]
        found += [token for _, token in self.graph_tokens]
        found += [getattr(self, name) for name in sorted(_SINGLE_SECRETS)]
        if self.database_url:
            found += dsn.passwords(self.database_url)
        # Very short values would blank out ordinary words; settings reject short secrets anyway.
        return tuple(sorted({v for v in found if len(v) >= 4}, key=len, reverse=True))


_SINGLE_SECRETS = {"tenashi_secret", "graph_token", "tenashi_token", "meta_verify_token"}


# Read by other parts than Settings: the fake provider (gateway fake-provider) reads its own.
KNOWN_PREFIXES = ("GATEWAY_FAKE_",)
# Set by `gateway serve --workers N` for each child it starts (the path of the child's /healthz
# socket): the supervisor's own, not a setting, so never reported as unknown.
WORKER_HEALTH_SOCKET = "GATEWAY_WORKER_HEALTH_SOCKET"
INTERNAL_VARIABLES = frozenset({WORKER_HEALTH_SOCKET})


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``GATEWAY_*`` variables no setting reads, each with the closest known name (a typo's fix)."""
    known = {f.metadata["env"] for f in dataclasses.fields(Settings)} | INTERNAL_VARIABLES
    out: list[tuple[str, str | None]] = []
    for name in sorted(environ):
        if not name.startswith("GATEWAY_") or name in known or name.startswith(KNOWN_PREFIXES):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        out.append((name, close[0] if close else None))
    return out


def plain(value: Any) -> str:
    """A setting's value as an operator writes it in the environment."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, Path):
        text = value.as_posix()
        return text if value.is_absolute() or text.startswith(".") else f"./{text}"
    if isinstance(value, tuple):
        items = [":".join(v) if isinstance(v, tuple) else str(v) for v in value]
        return ",".join(items) if items else "(empty)"
    text = str(value)
    return text if text else "(empty)"


def env_names() -> list[tuple[str, str, str]]:
    """(variable, default as written in the environment, what it does) for every setting."""
    return [(f.metadata["env"], plain(f.default), f.metadata["doc"]) for f in dataclasses.fields(Settings)]

"""The secrets and keys the test settings use, the tests' settings, and a typed ``replace``."""

from __future__ import annotations

import dataclasses

from gateway.core.settings import Settings

META_SECRET = "meta-secret-current"
META_OLD_SECRET = "meta-secret-previous"
TENASHI_SECRET = "tenashi-secret-1"
VERIFY_TOKEN = "verify-token-xyz"
API_KEYS = (("acme", "acme-api-key-0123456789"), ("globex", "globex-api-key-0123456789"))
# The forwarding tests' destination secret (a fixed, valid whsec_ secret: 32 bytes).
DESTINATION_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def gateway_settings(database_url: str) -> Settings:
    """The settings the tests' gateway runs with: no consumers, sender or forwarder of its own."""
    return Settings(
        database_url=database_url,
        meta_app_secrets=(META_SECRET, META_OLD_SECRET),
        meta_verify_token=VERIFY_TOKEN,
        tenashi_secret=TENASHI_SECRET,
        api_keys=API_KEYS,
        run_consumers=False,
        run_sender=False,
        run_forwarder=False,
        migrate_on_start=False,
        forward_allow_private=True,  # the fake receivers listen on 127.0.0.1
    )


def replace(s: Settings, **changes: object) -> Settings:
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def public_metrics(s: Settings) -> Settings:
    """``/metrics`` on the public port, as GATEWAY_METRICS_PORT=GATEWAY_PORT asks (a test server
    listens on a port of its own whatever ``port`` says: what matters is that the two agree)."""
    return dataclasses.replace(s, metrics_port=s.port)

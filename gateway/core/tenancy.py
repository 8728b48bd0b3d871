"""Who sends through what, as the settings configure it: a tenant's provider
(GATEWAY_TENANT_PROVIDERS), the numbers it may send from (GATEWAY_TENANT_NUMBERS) and whether its
bots may each reply (GATEWAY_REPLY_PER_BOT_TENANTS); a sending number's Graph API token
(GATEWAY_GRAPH_TOKENS, else GATEWAY_GRAPH_TOKEN) and the key of that token's breaker."""

from __future__ import annotations

from gateway.core.enums import Provider
from gateway.core.settings import Settings

# The key of the breaker of GATEWAY_GRAPH_TOKEN (and of Tenashi's token).
DEFAULT_TOKEN = "default"  # noqa: S105 - a breaker key, not a secret


def provider_for(settings: Settings, tenant: str) -> Provider:
    """The provider ``tenant`` sends through (Meta unless GATEWAY_TENANT_PROVIDERS says otherwise)."""
    return Provider(dict(settings.tenant_providers).get(tenant, Provider.META))


def graph_token_for(settings: Settings, phone_number_id: str) -> str:
    """The Graph API token of a sending number: its own (GATEWAY_GRAPH_TOKENS), else the
    default (GATEWAY_GRAPH_TOKEN)."""
    return dict(settings.graph_tokens).get(phone_number_id, settings.graph_token)


def token_key(settings: Settings, provider: str, phone_number_id: str) -> str:
    """Which token a send from ``phone_number_id`` uses, as its breaker's key: the first number
    GATEWAY_GRAPH_TOKENS lists with that token, or "default" (GATEWAY_GRAPH_TOKEN, and
    Tenashi's one token)."""
    token = dict(settings.graph_tokens).get(phone_number_id) if provider == Provider.META else None
    if token is None:
        return DEFAULT_TOKEN
    return next(n for n, t in settings.graph_tokens if t == token)


def numbers_of(settings: Settings, tenant: str) -> frozenset[str] | None:
    """The numbers bound to ``tenant`` (GATEWAY_TENANT_NUMBERS); None when no binding is set
    (every tenant may use every number)."""
    if not settings.tenant_numbers:
        return None
    return frozenset(n for t, n in settings.tenant_numbers if t == tenant)


def may_send_from(settings: Settings, tenant: str, phone_number_id: str) -> bool:
    """Whether ``tenant`` may send from ``phone_number_id`` (anyone may when no binding is set)."""
    if not settings.tenant_numbers:
        return True
    return (tenant, phone_number_id) in settings.tenant_numbers


def reply_per_bot(settings: Settings, tenant: str) -> bool:
    """Whether ``tenant``'s bots may each answer a message (else one reply per message)."""
    return tenant in settings.reply_per_bot_tenants

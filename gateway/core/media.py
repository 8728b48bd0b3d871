"""Media through the Graph API, decided without I/O: which media ids a message names, and
whether a download URL Graph returned may be fetched (and how).

Downloading an inbound media file takes two requests (Meta's "Media" reference): ``GET
/<media_id>`` with the number's token answers a short-lived ``url``, and a ``GET`` of that url,
with the same token, answers the bytes. The url comes from Graph, not from the client, but it
is still an address the gateway is told to fetch with a secret: it is fetched only from the
Graph host the gateway is configured with, or over https from Meta's media hosts (whose names
must then resolve to public addresses), never following redirects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Hosts Meta serves media downloads from (lookaside.fbsbx.com and its CDNs).
META_MEDIA_DOMAINS = ("fbsbx.com", "facebook.com", "fbcdn.net", "whatsapp.net")
MEDIA_FIELDS = ("image", "audio", "video", "document", "sticker")


# The file types WhatsApp takes, each with its largest size (Meta's "Supported media types").
_MB = 1024 * 1024
SUPPORTED: dict[str, int] = {
    **dict.fromkeys(("audio/aac", "audio/amr", "audio/mpeg", "audio/mp4", "audio/ogg"), 16 * _MB),
    **dict.fromkeys(("image/jpeg", "image/png"), 5 * _MB),
    "image/webp": 500 * 1024,  # stickers (animated; a static one is at most 100 KB)
    **dict.fromkeys(("video/3gpp", "video/mp4"), 16 * _MB),
    **dict.fromkeys(
        (
            "text/plain",
            "application/pdf",
            "application/vnd.ms-powerpoint",
            "application/msword",
            "application/vnd.ms-excel",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            "application/vnd.openxmlformats-officedocument.presentationml.presentation",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        ),
        100 * _MB,
    ),
}


def upload_limit(mime_type: str) -> int | None:
    """The largest file of this type WhatsApp takes; None: not a type it takes."""
    return SUPPORTED.get(mime_type.split(";", 1)[0].strip().lower())


@dataclass(frozen=True, slots=True)
class Target:
    """A download URL that may be fetched; ``trusted``: it is on the configured Graph host (the
    private-address guard does not apply: the operator chose that host)."""

    url: str
    trusted: bool


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port or default


def download_target(url: Any, graph_url: str) -> Target | str:
    """The Target for a download URL Graph returned, or why it is refused."""
    if not isinstance(url, str) or not url or len(url) > 4096:
        return "Graph answered no usable media URL"
    try:
        scheme, host, port = _origin(url)
    except ValueError:
        return "Graph answered a malformed media URL"
    if not host or any(c in url for c in "\r\n\t "):
        return "Graph answered a malformed media URL"
    if (scheme, host, port) == _origin(graph_url):
        return Target(url, trusted=True)
    if scheme != "https":
        return "the media URL is not https"
    if not any(host == d or host.endswith("." + d) for d in META_MEDIA_DOMAINS):
        return f"the media URL's host {host[:100]!r} is not one of Meta's media hosts"
    return Target(url, trusted=False)


def media_ids(message: dict[str, Any]) -> Iterator[str]:
    """Every media id a validated outbound message names: its image/audio/video/document/sticker,
    an interactive header's media, a template parameter's media (cards included)."""
    kind = message.get("type")
    body = message.get(kind) if isinstance(kind, str) else None
    if kind in MEDIA_FIELDS:
        yield from _id(body)
    elif kind == "interactive" and isinstance(body, dict):
        header = body.get("header")
        if isinstance(header, dict):
            for f in ("image", "video", "document"):
                yield from _id(header.get(f))
    elif kind == "template" and isinstance(body, dict):
        yield from _component_ids(body.get("components"))


def _id(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict) and isinstance(obj.get("id"), str):
        yield obj["id"]


def _component_ids(components: Any) -> Iterator[str]:
    for c in components if isinstance(components, list) else []:
        if not isinstance(c, dict):
            continue
        for p in c.get("parameters") or []:
            if isinstance(p, dict) and p.get("type") in ("image", "video", "document"):
                yield from _id(p.get(p["type"]))
        for card in c.get("cards") or []:
            if isinstance(card, dict):
                yield from _component_ids(card.get("components"))

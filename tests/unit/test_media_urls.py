"""Media decisions without I/O: which download URLs Graph may send the gateway to, and which media
ids an outbound message names."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.media import Target, download_target, media_ids
from gateway.testing.messages import EXAMPLES, MEDIA_ID

GRAPH = "https://graph.facebook.com/v21.0"
FAKE = "http://127.0.0.1:8090/v21.0"


@pytest.mark.parametrize(
    ("url", "graph", "expected"),
    [
        # Meta's media host: fetched over https, through the private-address guard.
        (
            "https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1&ext=2&hash=3",
            GRAPH,
            Target("https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1&ext=2&hash=3", False),
        ),
        (
            "https://scontent.whatsapp.net/v/t61/x.jpg",
            GRAPH,
            Target("https://scontent.whatsapp.net/v/t61/x.jpg", False),
        ),
        # The configured Graph host itself (e.g. the fake provider on loopback) is trusted.
        ("http://127.0.0.1:8090/_fake/media/1", FAKE, Target("http://127.0.0.1:8090/_fake/media/1", True)),
        ("https://graph.facebook.com:443/x", GRAPH, Target("https://graph.facebook.com:443/x", True)),
        # Anything else is refused: another host, plain http, look-alike names, other ports.
        ("http://lookaside.fbsbx.com/x", GRAPH, "the media URL is not https"),
        (
            "https://169.254.169.254/latest/meta-data/",
            GRAPH,
            "the media URL's host '169.254.169.254' is not one of Meta's media hosts",
        ),
        (
            "https://evilfbsbx.com/x",
            GRAPH,
            "the media URL's host 'evilfbsbx.com' is not one of Meta's media hosts",
        ),
        (
            "https://fbsbx.com.evil.example/x",
            GRAPH,
            "the media URL's host 'fbsbx.com.evil.example' is not one of Meta's media hosts",
        ),
        ("http://127.0.0.1:8091/_fake/media/1", FAKE, "the media URL is not https"),
        ("https://localhost/x", GRAPH, "the media URL's host 'localhost' is not one of Meta's media hosts"),
        ("file:///etc/passwd", GRAPH, "Graph answered a malformed media URL"),
        ("https://lookaside.fbsbx.com/x\r\nX-Evil: 1", GRAPH, "Graph answered a malformed media URL"),
        ("https://[::1/x", GRAPH, "Graph answered a malformed media URL"),
        (None, GRAPH, "Graph answered no usable media URL"),
        ("https://lookaside.fbsbx.com/" + "a" * 5000, GRAPH, "Graph answered no usable media URL"),
    ],
)
def test_download_target(url: Any, graph: str, expected: Target | str) -> None:
    assert download_target(url, graph) == expected


@pytest.mark.parametrize(
    ("message", "ids"),
    [
        (EXAMPLES["image_by_id"], [MEDIA_ID]),
        (EXAMPLES["image_by_link"], []),
        (EXAMPLES["audio"], [MEDIA_ID]),
        (EXAMPLES["sticker"], [MEDIA_ID]),
        (EXAMPLES["text"], []),
        (
            {
                "type": "interactive",
                "interactive": {"type": "button", "header": {"type": "video", "video": {"id": "7"}}},
            },
            ["7"],
        ),
        (
            {
                "type": "template",
                "template": {
                    "components": [
                        {"type": "header", "parameters": [{"type": "document", "document": {"id": "8"}}]},
                        {
                            "type": "carousel",
                            "cards": [
                                {
                                    "card_index": 0,
                                    "components": [
                                        {
                                            "type": "header",
                                            "parameters": [{"type": "image", "image": {"id": "9"}}],
                                        }
                                    ],
                                }
                            ],
                        },
                    ]
                },
            },
            ["8", "9"],
        ),
    ],
)
def test_media_ids(message: dict[str, Any], ids: list[str]) -> None:
    assert list(media_ids(message)) == ids

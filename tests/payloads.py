"""Meta-shaped payloads for tests, serialised the way Meta sends them."""

from __future__ import annotations

import json
from typing import Any


def meta_bytes(payload: dict[str, Any], escape_slash: bool = False) -> bytes:
    """Meta escapes non-ASCII as \\uXXXX (emoji as surrogate pairs) and may escape '/'."""
    text = json.dumps(payload, ensure_ascii=True, separators=(",", ":"))
    if escape_slash:
        text = text.replace("/", "\\/")
    return text.encode()


def message_payload(wamid: str, text: str = "hi", phone_number_id: str = "1111") -> dict[str, Any]:
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "waba-1",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": "15550001111",
                                "phone_number_id": phone_number_id,
                            },
                            "contacts": [{"profile": {"name": "Jörg"}, "wa_id": "4915112345678"}],
                            "messages": [
                                {
                                    "from": "4915112345678",
                                    "id": wamid,
                                    "timestamp": "1764460800",
                                    "type": "text",
                                    "text": {"body": text},
                                }
                            ],
                        },
                    }
                ],
            }
        ],
    }

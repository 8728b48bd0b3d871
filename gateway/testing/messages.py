"""One outbound message of every shape the send API takes (Meta's Cloud API message object),
for the tests and the demo: ``EXAMPLES[name] = {"type": t, t: {...}}``."""

from __future__ import annotations

from typing import Any

LINK = "https://example.com/files/menu.pdf"
MEDIA_ID = "1234567890123456"

EXAMPLES: dict[str, dict[str, Any]] = {
    "text": {
        "type": "text",
        "text": {"body": "Your order shipped: https://example.com/o/42", "preview_url": True},
    },
    "image_by_id": {"type": "image", "image": {"id": MEDIA_ID, "caption": "Your receipt"}},
    "image_by_link": {"type": "image", "image": {"link": "https://example.com/img/receipt.png"}},
    "audio": {"type": "audio", "audio": {"id": MEDIA_ID}},
    "video": {"type": "video", "video": {"link": "https://example.com/v/howto.mp4", "caption": "How to"}},
    "document": {"type": "document", "document": {"link": LINK, "filename": "menu.pdf", "caption": "Menu"}},
    "sticker": {"type": "sticker", "sticker": {"id": MEDIA_ID}},
    "location": {
        "type": "location",
        "location": {
            "latitude": 52.5200,
            "longitude": 13.4050,
            "name": "Shop",
            "address": "Unter den Linden 1",
        },
    },
    "contacts": {
        "type": "contacts",
        "contacts": [
            {
                "name": {"formatted_name": "Ana Support", "first_name": "Ana"},
                "phones": [{"phone": "+49 30 1234567", "type": "WORK", "wa_id": "49301234567"}],
                "emails": [{"email": "support@example.com", "type": "WORK"}],
            }
        ],
    },
    "interactive_button": {
        "type": "interactive",
        "interactive": {
            "type": "button",
            "header": {"type": "text", "text": "Delivery"},
            "body": {"text": "Is tomorrow 10:00 fine?"},
            "footer": {"text": "Reply with a button"},
            "action": {
                "buttons": [
                    {"type": "reply", "reply": {"id": "yes", "title": "Yes"}},
                    {"type": "reply", "reply": {"id": "later", "title": "Later"}},
                ]
            },
        },
    },
    "interactive_list": {
        "type": "interactive",
        "interactive": {
            "type": "list",
            "body": {"text": "Pick a slot"},
            "action": {
                "button": "Slots",
                "sections": [
                    {
                        "title": "Tomorrow",
                        "rows": [
                            {"id": "t10", "title": "10:00", "description": "Morning"},
                            {"id": "t14", "title": "14:00"},
                        ],
                    }
                ],
            },
        },
    },
    "interactive_cta_url": {
        "type": "interactive",
        "interactive": {
            "type": "cta_url",
            "body": {"text": "Track your parcel"},
            "action": {
                "name": "cta_url",
                "parameters": {"display_text": "Track", "url": "https://example.com/t/42"},
            },
        },
    },
    "interactive_flow": {
        "type": "interactive",
        "interactive": {
            "type": "flow",
            "body": {"text": "Tell us how we did"},
            "action": {
                "name": "flow",
                "parameters": {
                    "flow_message_version": "3",
                    "flow_token": "survey-42",
                    "flow_id": "1234567890",
                    "flow_cta": "Start",
                    "flow_action": "navigate",
                    "flow_action_payload": {"screen": "RATE", "data": {"order": "42"}},
                },
            },
        },
    },
    "interactive_product": {
        "type": "interactive",
        "interactive": {
            "type": "product",
            "body": {"text": "Back in stock"},
            "action": {"catalog_id": "354160437058781", "product_retailer_id": "SKU-42"},
        },
    },
    "interactive_product_list": {
        "type": "interactive",
        "interactive": {
            "type": "product_list",
            "header": {"type": "text", "text": "Our picks"},
            "body": {"text": "For you"},
            "action": {
                "catalog_id": "354160437058781",
                "sections": [{"title": "Shoes", "product_items": [{"product_retailer_id": "SKU-1"}]}],
            },
        },
    },
    "interactive_location_request": {
        "type": "interactive",
        "interactive": {
            "type": "location_request_message",
            "body": {"text": "Where should we deliver?"},
            "action": {"name": "send_location"},
        },
    },
    "reaction": {
        "type": "reaction",
        "reaction": {"message_id": "wamid.HBgLNDkxNTExMjM0NTY3OBUCABIYFjNFQjA", "emoji": "👍"},
    },
    "template": {
        "type": "template",
        "template": {
            "name": "order_shipped",
            "language": {"code": "en_US"},
            "components": [
                {
                    "type": "header",
                    "parameters": [{"type": "image", "image": {"link": "https://example.com/p.png"}}],
                },
                {
                    "type": "body",
                    "parameters": [
                        {"type": "text", "text": "Ana"},
                        {
                            "type": "currency",
                            "currency": {"fallback_value": "EUR 42.00", "code": "EUR", "amount_1000": 42000},
                        },
                        {"type": "date_time", "date_time": {"fallback_value": "1 December 2026"}},
                    ],
                },
                {
                    "type": "button",
                    "sub_type": "url",
                    "index": "0",
                    "parameters": [{"type": "text", "text": "42"}],
                },
                {
                    "type": "button",
                    "sub_type": "quick_reply",
                    "index": 1,
                    "parameters": [{"type": "payload", "payload": "STOP"}],
                },
            ],
        },
    },
}

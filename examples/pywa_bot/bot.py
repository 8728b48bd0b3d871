"""A pywa bot behind the gateway: it answers every text and reports its messages' statuses.

Written against Meta's webhooks and Graph API as any pywa bot is; behind the gateway only two
settings differ from running it against Meta directly:

- ``WA_TOKEN``: a gateway API key (``GATEWAY_API_KEYS``) instead of a Meta access token;
- ``GRAPH_URL``: the gateway's base URL (pywa always builds graph.facebook.com URLs, so its
  httpx session sends them to the gateway instead).

The gateway delivers Meta's webhooks to it as a Meta-format destination, signed with the app
secret it already verifies::

    gateway destinations add pywa http://127.0.0.1:8000/ --events message,status \\
        --format meta --secret "$WA_APP_SECRET"

Run (``pip install "pywa[server]"``)::

    WA_PHONE_ID=1111 WA_TOKEN=<gateway API key> WA_APP_SECRET=<app secret> \\
    WA_VERIFY_TOKEN=<any> GRAPH_URL=http://127.0.0.1:8080 python examples/pywa_bot/bot.py

It prints one JSON line per update it handled (what the tests read).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import httpx
from pywa import WhatsApp, types


def graph_session(base_url: str) -> httpx.Client:
    """An httpx session whose Graph API requests go to ``base_url`` (the gateway)."""
    gateway = httpx.URL(base_url)

    def to_gateway(request: httpx.Request) -> None:
        if request.url.host == "graph.facebook.com":
            request.url = request.url.copy_with(scheme=gateway.scheme, host=gateway.host, port=gateway.port)
            request.headers["Host"] = gateway.netloc.decode()

    return httpx.Client(event_hooks={"request": [to_gateway]}, timeout=10.0)


# pywa runs sync handlers in a thread pool, so updates arriving together are handled at once;
# print() writes a line and its newline separately, and two threads' lines would interleave.
_stdout = threading.Lock()


def say(**fields: object) -> None:
    line = json.dumps(fields) + "\n"
    with _stdout:
        sys.stdout.write(line)
        sys.stdout.flush()


wa = WhatsApp(
    phone_id=os.environ["WA_PHONE_ID"],
    token=os.environ["WA_TOKEN"],
    session=graph_session(os.environ.get("GRAPH_URL", "https://graph.facebook.com")),
    verify_token=os.environ["WA_VERIFY_TOKEN"],
    app_secret=os.environ["WA_APP_SECRET"],
)


@wa.on_message()
def on_message(_: WhatsApp, msg: types.Message) -> None:
    # A quoted reply: the gateway lets each message be answered once (its reply guard).
    sent = msg.reply_text(f"you said: {msg.text}", quote=True, tracker=f"reply-to:{msg.id}")
    user = msg.from_user
    say(handled="message", id=msg.id, text=msg.text, bsuid=user.bsuid, phone=user.wa_id, reply=sent.id)


@wa.on_message_status()
def on_status(_: WhatsApp, status: types.MessageStatus) -> None:
    say(handled="status", id=status.id, status=status.status.value, tracker=status.tracker)


if __name__ == "__main__":
    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    wa.run(host=host, port=port, log_level="warning")

"""Order updater: keeps an ``orders`` table in step with delivery statuses.

The order system sends its confirmation through ``POST /v1/messages`` with the order id as
the ``Idempotency-Key``; the gateway puts ``<tenant>:<key>`` in Meta's
``biz_opaque_callback_data`` and every status webhook carries it back. This handler moves
the order's ``delivery`` forward (sent < delivered < read < played < failed, by the
gateway's ``delivery_rank`` SQL function, so statuses arriving out of order never move it
back) and keeps the errors of a failed delivery. It runs in the consumer's transaction: the
order row changes exactly once per status, together with the status's key.

Create the table once (``psql "$DATABASE_URL" -f examples/order_updater.sql``), insert an
order with its ``callback_data`` (``<tenant>:<order id>``) when you send its confirmation,
and run the consumers with ``GATEWAY_HANDLERS=examples.order_updater``.
"""

from __future__ import annotations

from typing import Any

from gateway.core.events import Status
from gateway.handlers import on

# Statuses arrive out of order: only a further one moves the order; failed keeps its errors.
UPDATE = """
UPDATE orders SET
    delivery = $2,
    delivery_errors = CASE WHEN $2 = 'failed' THEN $3::jsonb ELSE delivery_errors END,
    wamid = coalesce(wamid, $4),
    updated_at = now()
WHERE callback_data = $1
  AND delivery_rank($2) > delivery_rank(delivery)
"""


@on.status()
async def track_delivery(event: Status, conn: Any) -> None:
    if event.callback_data is None:
        return  # not one of ours (sent outside the gateway, or from another system)
    await conn.execute(UPDATE, event.callback_data, event.status, event.errors, event.wamid)

-- The table examples/order_updater.py keeps in step with delivery statuses (your own table:
-- create it once with psql; the gateway's migrations do not touch it).
CREATE TABLE IF NOT EXISTS orders (
    id              text        PRIMARY KEY,
    callback_data   text        NOT NULL UNIQUE,   -- '<tenant>:<Idempotency-Key of the send>'
    wamid           text,
    delivery        text,                          -- sent, delivered, read, played, failed
    delivery_errors jsonb,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

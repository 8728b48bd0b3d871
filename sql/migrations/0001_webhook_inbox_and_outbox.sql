-- Staged raw webhook deliveries: the source of truth; everything else is derived from `body`.
CREATE TABLE webhook_inbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source          text        NOT NULL CHECK (source IN ('meta', 'tenashi')),
    body            bytea       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivery_id     text,
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'done', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error      text,
    processed_at    timestamptz
);

-- Consumers claim due pending rows in id order.
CREATE INDEX webhook_inbox_due ON webhook_inbox (next_attempt_at, id) WHERE state = 'pending';
CREATE INDEX webhook_inbox_dead ON webhook_inbox (id) WHERE state = 'dead';
CREATE INDEX webhook_inbox_processed ON webhook_inbox (processed_at) WHERE state = 'done';

-- One NOTIFY per inserting statement (one per group-commit batch), not per row.
-- Superseded: the current source is sql/functions/webhook_inbox_notify.sql (this body is kept as released).
CREATE FUNCTION webhook_inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('webhook_inbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER webhook_inbox_notify
    AFTER INSERT ON webhook_inbox
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_inbox_notify();

-- One row per business event to send; (tenant, idem_key) is the business key.
-- callback_data travels as biz_opaque_callback_data and comes back in status webhooks.
CREATE TABLE outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant          text        NOT NULL,
    idem_key        text        NOT NULL,
    callback_data   text        NOT NULL UNIQUE,
    provider        text        NOT NULL DEFAULT 'meta' CHECK (provider IN ('meta', 'tenashi')),
    phone_number_id text        NOT NULL DEFAULT '',
    recipient       text        NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'sending', 'accepted', 'unknown',
                                                 'failed', 'review', 'cancelled')),
    unknown_policy  text        NOT NULL DEFAULT 'review' CHECK (unknown_policy IN ('resend', 'review')),
    resent          boolean     NOT NULL DEFAULT false,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error      text,
    last_error_code integer,
    wamid           text,
    delivery_status text,
    delivery_errors jsonb,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    sending_at      timestamptz,
    unknown_at      timestamptz,
    accepted_at     timestamptz,
    UNIQUE (tenant, idem_key)
);

CREATE INDEX outbox_due ON outbox (next_attempt_at, id) WHERE state = 'pending';
CREATE INDEX outbox_unknown ON outbox (unknown_at) WHERE state = 'unknown';
CREATE INDEX outbox_wamid ON outbox (wamid) WHERE wamid IS NOT NULL;

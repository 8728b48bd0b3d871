-- Idempotency keys of the send API: one row per (tenant, key), claimed with
-- INSERT ... ON CONFLICT DO NOTHING; the first response is stored once and replayed.
CREATE TABLE idempotency_keys (
    tenant           text        NOT NULL,
    key              text        NOT NULL,
    fingerprint      text        NOT NULL,
    state            text        NOT NULL DEFAULT 'in_progress' CHECK (state IN ('in_progress', 'done')),
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- When the current holder claimed it: a claim left behind by a crashed request can be
    -- taken over after a short lease instead of answering 409 until the key expires.
    locked_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, key)
);

CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);

-- The reconciler finds sends whose process died mid-request.
CREATE INDEX outbox_sending ON outbox (sending_at) WHERE state = 'sending';
-- Operators list parked rows.
CREATE INDEX outbox_review ON outbox (updated_at) WHERE state IN ('review', 'failed');

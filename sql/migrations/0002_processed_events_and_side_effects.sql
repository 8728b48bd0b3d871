-- Exactly-once processing of staged webhooks: dedup keys, the downstream feed, the reply
-- guard, status history and account-level records.

-- One row per event key ever processed (msg:<wamid>, status:<wamid>:<status>:<participant>,
-- evt:<id>, ...). The key is inserted in the same transaction as the event's side effect.
CREATE TABLE processed_webhook_events (
    event_key    text        PRIMARY KEY,
    inbox_id     bigint,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Retention deletes the oldest keys in bounded batches.
CREATE INDEX processed_webhook_events_processed_at ON processed_webhook_events (processed_at);

-- The downstream feed: one row per inbound message. Listeners: LISTEN inbound_messages
-- (payload = the highest id committed by that statement); pollers: WHERE id > last seen.
CREATE TABLE inbound_messages (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    wamid           text        NOT NULL UNIQUE,
    source          text        NOT NULL DEFAULT 'meta',
    phone_number_id text,
    sender          text,
    type            text,
    timestamp       timestamptz,
    contact_name    text,
    message         jsonb       NOT NULL,
    inbox_id        bigint,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbound_messages_received_at ON inbound_messages (received_at);

-- One NOTIFY per inserting statement (one per consumer batch), only when rows landed.
-- Superseded: the current source is sql/functions/inbound_messages_notify.sql (this body is kept as released).
CREATE FUNCTION inbound_messages_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    top bigint;
BEGIN
    SELECT max(id) INTO top FROM new_rows;
    IF top IS NOT NULL THEN
        PERFORM pg_notify('inbound_messages', top::text);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER inbound_messages_notify
    AFTER INSERT ON inbound_messages
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION inbound_messages_notify();

-- A bot's right to answer an inbound message: at most one claim per wamid, so two
-- automatic replies to one message are impossible. Claim with
--   SELECT claim_reply('<inbound wamid>', '<bot name>');   -- true: yours; false: taken
-- in the same transaction that enqueues the reply (so a rollback releases the claim).
CREATE TABLE reply_claims (
    inbound_wamid text        PRIMARY KEY,
    claimed_by    text        NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now()
);

-- Superseded: the current source is sql/functions/claim_reply.sql (this body is kept as released).
CREATE FUNCTION claim_reply(p_inbound_wamid text, p_claimed_by text) RETURNS boolean
LANGUAGE sql AS $$
    WITH ins AS (
        INSERT INTO reply_claims (inbound_wamid, claimed_by)
        VALUES (p_inbound_wamid, p_claimed_by)
        ON CONFLICT (inbound_wamid) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM ins);
$$;

-- Status history: every status event (Meta and Tenashi) as it arrived, in any order.
-- Purged in bounded batches by recorded_at.
CREATE TABLE message_statuses (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key     text        NOT NULL,
    source        text        NOT NULL DEFAULT 'meta',
    wamid         text        NOT NULL,
    status        text        NOT NULL,
    participant   text        NOT NULL DEFAULT '',
    recipient     text,
    timestamp     timestamptz,
    callback_data text,
    errors        jsonb,
    raw           jsonb       NOT NULL,
    inbox_id      bigint,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX message_statuses_wamid ON message_statuses (wamid);
CREATE INDEX message_statuses_recorded_at ON message_statuses (recorded_at);

-- Delivery states only move forward. failed is terminal and kept with its errors;
-- statuses we do not know rank 0 and never move the state (they stay in the history).
-- Superseded: the current source is sql/functions/delivery_rank.sql (this body is kept as released).
CREATE FUNCTION delivery_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status
        WHEN 'sent' THEN 1
        WHEN 'delivered' THEN 2
        WHEN 'read' THEN 3
        WHEN 'played' THEN 4
        WHEN 'failed' THEN 5
        ELSE 0
    END;
$$;

-- Account-level errors (value.errors: no message id) for operators.
CREATE TABLE account_errors (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key       text        NOT NULL,
    waba_id         text,
    phone_number_id text,
    field           text        NOT NULL,
    errors          jsonb       NOT NULL,
    raw             jsonb       NOT NULL,
    inbox_id        bigint,
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX account_errors_recorded_at ON account_errors (recorded_at);

-- Changes of other fields (template status, account updates, ...) and Tenashi events of
-- other types: recorded as they came, for operators.
CREATE TABLE account_updates (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key   text        NOT NULL,
    waba_id     text,
    field       text        NOT NULL,
    value       jsonb,
    inbox_id    bigint,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX account_updates_recorded_at ON account_updates (recorded_at);

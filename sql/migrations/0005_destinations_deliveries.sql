-- Signed forwarding to downstream HTTP endpoints: where to send (destinations, with their
-- circuit breaker) and what to send (deliveries: a transactional outbox towards downstream,
-- written by the consumers' batch statement in the same transaction as the event's key).

CREATE TABLE destinations (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                 text        NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    url                  text        NOT NULL,
    -- Which event kinds it receives: any of message, status, account.
    events               text[]      NOT NULL
        CHECK (cardinality(events) > 0 AND events <@ ARRAY['message', 'status', 'account']),
    -- whsec_<base64>: the Standard Webhooks signing secret. Never printed in full.
    secret               text        NOT NULL CHECK (secret LIKE 'whsec\_%'),
    enabled              boolean     NOT NULL DEFAULT true,
    -- At most this many deliveries in flight at once, across every forwarder.
    max_in_flight        integer     NOT NULL DEFAULT 16 CHECK (max_in_flight BETWEEN 1 AND 10000),
    -- One delivery in flight per customer (conversation) when true.
    ordered              boolean     NOT NULL DEFAULT false,
    -- The circuit breaker, shared by every forwarder: closed -> open after N consecutive
    -- failures; open -> half_open (one probe) after a cool-down; the probe decides.
    breaker_state        text        NOT NULL DEFAULT 'closed'
        CHECK (breaker_state IN ('closed', 'open', 'half_open')),
    consecutive_failures integer     NOT NULL DEFAULT 0,
    breaker_changed_at   timestamptz NOT NULL DEFAULT now(),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE deliveries (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination_id   bigint      NOT NULL REFERENCES destinations (id) ON DELETE CASCADE,
    event_key        text        NOT NULL,
    -- 'wh_' + 32 hex of sha256('<destination name>/<event key>'): stable for the pair, so a
    -- receiver can deduplicate on it (gateway.core.stdwebhooks.webhook_id computes the same).
    webhook_id       text        NOT NULL,
    kind             text        NOT NULL CHECK (kind IN ('message', 'status', 'account')),
    conversation     text        NOT NULL DEFAULT '',
    envelope         jsonb       NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivering', 'delivered', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A delivering row whose lease ran out belongs to a forwarder that died mid-request.
    lease_until      timestamptz,
    -- When the gateway received the event (the webhook's staging time): the time axis of
    -- list, replay and the receipt -> downstream latency.
    received_at      timestamptz NOT NULL DEFAULT now(),
    -- The retry window (GATEWAY_FORWARD_RETRY_H) counts from here; a replay restarts it.
    window_start     timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_status      integer,
    last_error       text,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (destination_id, event_key)
);
-- The claim: due pending rows of one destination in order.
CREATE INDEX deliveries_due ON deliveries (destination_id, next_attempt_at, id) WHERE state = 'pending';
-- In-flight counts per destination, expired leases.
CREATE INDEX deliveries_delivering ON deliveries (destination_id, lease_until) WHERE state = 'delivering';
-- Per-conversation ordering: is an earlier delivery of this customer still open?
CREATE INDEX deliveries_open_conversation ON deliveries (destination_id, conversation, id)
    WHERE state IN ('pending', 'delivering');
-- list / replay by time range.
CREATE INDEX deliveries_received ON deliveries (destination_id, received_at);

-- Wake the forwarders: one NOTIFY per inserting statement, only when rows landed.
-- Superseded: the current source is sql/functions/deliveries_notify.sql (this body is kept as released).
CREATE FUNCTION deliveries_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify('deliveries', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER deliveries_notify
    AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION deliveries_notify();

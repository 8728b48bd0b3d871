-- Send side across processes: the reconciler's processed watermark, cluster-wide pacing,
-- circuit breakers per sending number and per tenant token, and the sender's wake-up.

-- The reconciler asks "is any webhook received in this period still unprocessed?" for every
-- unknown row it considers; this keeps that question an index probe (pending and dead rows
-- are few next to done ones).
CREATE INDEX webhook_inbox_unprocessed ON webhook_inbox (received_at) WHERE state IN ('pending', 'dead');

-- Pacing shared by every sender: one row per key ('pair:<provider>:<number>:<recipient>' holds
-- the earliest next send to that pair; 'num:<provider>:<number>' the number's theoretical
-- arrival time, GCRA). Read and written only under pg_try_advisory_xact_lock of the key, in
-- the transaction that claims the rows it paces. Epoch seconds of the senders' clock.
CREATE TABLE send_pacing (
    key        text   PRIMARY KEY,
    at         float8 NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The reconciler forgets keys whose time has long passed.
CREATE INDEX send_pacing_at ON send_pacing (at);

-- Circuit breakers: scope 'number' (key = phone_number_id) or 'token' (key = tenant), per
-- provider. Account-level errors open one; while open its rows stay pending; after the
-- backoff one probe is let through (half_open); its outcome closes or reopens it.
CREATE TABLE send_breakers (
    scope      text        NOT NULL CHECK (scope IN ('number', 'token')),
    provider   text        NOT NULL,
    key        text        NOT NULL,
    state      text        NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    failures   integer     NOT NULL DEFAULT 0,
    code       integer,
    error      text,
    opened_at  timestamptz,
    retry_at   float8,           -- open: when a probe may go; half_open: when the probe is lost
    probe_id   bigint,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (scope, provider, key)
);

-- Wake the senders when the send API (or anything else) enqueues: one NOTIFY per statement.
-- Superseded: outbox_notify() is dropped by 0022_outbox_wake_after_commit (this body is kept as released).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify
    AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

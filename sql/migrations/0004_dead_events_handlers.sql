-- Per-event isolation: one bad event of a POST no longer holds the rest hostage.
--
-- dead_events: one row per event (or malformed fragment) that failed on its own while the
-- rest of its webhook_inbox row committed. It keeps the fragment's exact bytes and what is
-- needed to rebuild the event from them (unit + context), so it can be retried, inspected
-- and replayed even after its inbox row has been purged.
--   state 'retry': due again at next_attempt_at (attempts counted only for failures that
--                  are this event's own; a failing system only defers it: deferrals)
--   state 'dead' : parked after GATEWAY_MAX_ATTEMPTS or at once when it can never be an
--                  event (kind 'bad'); `gateway dead replay` sends it back
--   state 'done' : processed by a retry or a replay (kept for the record)
CREATE TABLE dead_events (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_id        bigint      NOT NULL,
    position        integer     NOT NULL,            -- the fragment's place in the body
    path            text        NOT NULL,            -- JSON Pointer of the fragment in the body
    event_key       text,                            -- NULL: the fragment is no event (kind 'bad')
    kind            text        NOT NULL,            -- message, status, account_error, account_update, bad
    source          text        NOT NULL,
    received_at     timestamptz NOT NULL,            -- when its webhook arrived (for --since/--until)
    unit            text        NOT NULL,            -- message, status, change, entry, event
    context         jsonb       NOT NULL DEFAULT '{}',
    fragment        bytea       NOT NULL,            -- the bytes exactly as the provider sent them
    state           text        NOT NULL DEFAULT 'retry' CHECK (state IN ('retry', 'dead', 'done')),
    attempts        integer     NOT NULL DEFAULT 0,
    deferrals       integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- One item per event of an inbox row, however often the row is (re)processed.
CREATE UNIQUE INDEX dead_events_item ON dead_events (inbox_id, path, coalesce(event_key, ''));
CREATE INDEX dead_events_due ON dead_events (next_attempt_at, id) WHERE state = 'retry';
CREATE INDEX dead_events_received ON dead_events (received_at);
-- Retention purges items a retry or a replay finished.
CREATE INDEX dead_events_done ON dead_events (updated_at) WHERE state = 'done';

-- The exact bytes of events whose stored JSON had to be altered because PostgreSQL cannot
-- store a value they contain (U+0000, a lone surrogate, a number beyond a double): the
-- stored JSON shows such a character as the text of its escape (\u0000), this keeps what
-- the customer sent, byte for byte. One row per event key, written with the key.
CREATE TABLE event_fragments (
    event_key   text        PRIMARY KEY,
    inbox_id    bigint      NOT NULL,
    path        text        NOT NULL,
    fragment    bytea       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Operators: the audit log of their actions, the last maintenance pass, and the indexes the
-- console's lists page through (keyset pagination: every page is a range scan of an index,
-- however large the table).

-- Every operator action, from the console or the command line, written in the same
-- transaction as the action itself: no action without its entry, no entry for an action
-- that rolled back. actor: a console token's name, or the command line's user (--actor).
CREATE TABLE operator_actions (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor   text        NOT NULL,
    via     text        NOT NULL CHECK (via IN ('console', 'cli')),
    action  text        NOT NULL,            -- e.g. dead.replay, outbox.release, destination.disable
    target  text        NOT NULL DEFAULT '', -- what it named: a key, a destination, a breaker, a range
    params  jsonb       NOT NULL DEFAULT '{}',
    rows    bigint      NOT NULL DEFAULT 0,  -- how many rows it changed
    outcome text        NOT NULL DEFAULT ''  -- the one-line result the operator was shown
);
CREATE INDEX operator_actions_actor ON operator_actions (actor, id);
CREATE INDEX operator_actions_action ON operator_actions (action, id);

-- The last pass of each maintenance job that ran (the replica that held its lock), for the
-- console's overview: a pass that keeps failing needs a person.
CREATE TABLE maintenance_passes (
    job            text        PRIMARY KEY,
    last_ok_at     timestamptz,
    last_failed_at timestamptz,
    last_error     text,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Dead items newest first, per state (dead, or waiting for a retry), and per kind.
CREATE INDEX dead_events_open ON dead_events (state, received_at, id) WHERE state <> 'done';
CREATE INDEX dead_events_open_kind ON dead_events (state, kind, received_at, id) WHERE state <> 'done';

-- The outbox by recipient (the support question: "did this customer get it?"), and the rows
-- that need a person, by state. The partial index holds none of the happy path's rows
-- (pending -> sending -> accepted never enters it), so sends do not pay for it.
CREATE INDEX outbox_recipient ON outbox (recipient, id);
CREATE INDEX outbox_attention ON outbox (state, id) WHERE state IN ('unknown', 'review', 'failed', 'cancelled');

-- Failed deliveries per destination, newest first (what an operator replays); a delivery that
-- succeeds never enters it.
CREATE INDEX deliveries_failed ON deliveries (destination_id, received_at, id) WHERE state = 'failed';

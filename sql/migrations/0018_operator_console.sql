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
CREATE INDEX operator_actions_target ON operator_actions (target, id);

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

-- Every send attempt's outcome (a send's story: what the provider answered each time), one row
-- per row that leaves 'sending', whoever moves it (the sender's result, a status webhook that
-- overtook it, the lease expiring). Written by one statement-level trigger per UPDATE, from
-- its transition tables: the statements that change outbox rows stay as they are.
CREATE TABLE outbox_attempts (
    outbox_id bigint      NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
    sent_at   timestamptz,                   -- when the attempt went out
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    outcome   text        NOT NULL,          -- the state it left the row in
    code      integer,
    error     text,
    wamid     text
);
CREATE INDEX outbox_attempts_row ON outbox_attempts (outbox_id, at);

-- Superseded: the current source is sql/functions/outbox_attempts_record.sql (this body is kept as released).
CREATE FUNCTION outbox_attempts_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_attempts (outbox_id, sent_at, outcome, code, error, wamid)
    SELECT n.id, o.sending_at, n.state, n.last_error_code, n.last_error, n.wamid
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state = 'sending' AND n.state <> 'sending';
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_attempts
    AFTER UPDATE ON outbox
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_attempts_record();

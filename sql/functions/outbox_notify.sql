-- Trigger of outbox: wake the senders when the send API (or anything else) enqueues, one
-- NOTIFY per statement.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;

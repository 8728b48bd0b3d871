-- Trigger of webhook_inbox: one NOTIFY per inserting statement (one per group-commit batch),
-- not per row.
CREATE OR REPLACE FUNCTION webhook_inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('webhook_inbox', '');
    RETURN NULL;
END;
$$;

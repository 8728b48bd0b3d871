-- Trigger of inbound_messages: one NOTIFY per inserting statement (one per consumer batch),
-- only when rows landed; the payload is the highest id inserted.
CREATE OR REPLACE FUNCTION inbound_messages_notify() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- Trigger of deliveries: wake the forwarders, one NOTIFY per inserting statement, only when
-- rows landed. The payload is the setting gateway.forwarder of the inserting transaction ('' when
-- unset): a consumer whose process runs a forwarder names that forwarder there, wakes it itself
-- right after the commit, and the forwarder ignores the NOTIFY that names it (a second wake-up
-- would cost it a round). Every other forwarder wakes on any payload.
CREATE OR REPLACE FUNCTION deliveries_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify('deliveries', coalesce(current_setting('gateway.forwarder', true), ''));
    END IF;
    RETURN NULL;
END;
$$;

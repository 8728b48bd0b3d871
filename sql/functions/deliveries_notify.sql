-- Trigger of deliveries: wake the forwarders, one NOTIFY per inserting statement, only when
-- rows landed.
CREATE OR REPLACE FUNCTION deliveries_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify('deliveries', '');
    END IF;
    RETURN NULL;
END;
$$;

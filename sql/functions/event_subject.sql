-- A dedup key's subject (the distribution column kept ready for Citus): a pure function of
-- the key, so a redelivery brings the same subject and meets the key it stored before. It
-- must agree with gateway.core.events.subject_of (tests/support/subjects.py holds the table
-- both are tested against).
CREATE OR REPLACE FUNCTION event_subject(event_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN event_key LIKE 'msg:%' OR event_key LIKE 'evt:%' THEN substr(event_key, 5)
        -- The wamid is everything between 'status:' and the last two ':' (status, participant).
        WHEN event_key ~ '^status:.*:[^:]*:[^:]*$' THEN substring(event_key FROM '^status:(.*):[^:]*:[^:]*$')
        ELSE event_key
    END;
$$;

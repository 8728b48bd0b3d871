-- Citus-ready keys (docs/scaling.md, "Past one machine"): every "events" table gets the
-- event's subject, the value its dedup key is built from, and carries it in its primary key
-- or unique key (a distributed table needs its distribution column in every unique
-- constraint); webhook_inbox gets a lane (id mod 32), the distribution column of the
-- staging table, with a claim index per lane.
--
--   subject of a key (event_subject below; gateway/core/events.py: subject_of is the same rule):
--     msg:<wamid>                            -> <wamid>
--     status:<wamid>:<status>:<participant>  -> <wamid>
--     evt:<id>  (Tenashi)                    -> <id>
--     anything else (acct-error:, change:)   -> the key itself
--
-- A redelivery has the same key, so the same subject: ON CONFLICT still meets the key it
-- stored before. The subject goes last in each key: Citus needs the distribution column in
-- the key, not first, and every existing lookup by the key's prefix (event_key, id) keeps
-- its index.
--
-- Existing rows are rewritten once (ALTER COLUMN ... TYPE ... USING rewrites each table and
-- rebuilds its indexes in one pass, without the dead tuples an UPDATE would leave): on a
-- large database, run `gateway migrate` in a quiet window, as for 0007.

-- Superseded: the current source is sql/functions/event_subject.sql (this body is kept as released).
CREATE FUNCTION event_subject(event_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN event_key LIKE 'msg:%' OR event_key LIKE 'evt:%' THEN substr(event_key, 5)
        -- The wamid is everything between 'status:' and the last two ':' (status, participant).
        WHEN event_key ~ '^status:.*:[^:]*:[^:]*$' THEN substring(event_key FROM '^status:(.*):[^:]*:[^:]*$')
        ELSE event_key
    END;
$$;

-- Dedup keys: PK (event_key, event_day, subject).
ALTER TABLE processed_webhook_events ADD COLUMN subject text;
ALTER TABLE processed_webhook_events
    ALTER COLUMN subject TYPE text USING event_subject(event_key),
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT processed_webhook_events_pkey,
    ADD CONSTRAINT processed_webhook_events_pkey PRIMARY KEY (event_key, event_day, subject);

-- The feed: a Meta message's subject is its wamid; a Tenashi message's is its event id,
-- found beside it in processed_webhook_events (same transaction, same inbox row), else the
-- wamid (the key is gone: only where the row would live on Citus depends on it).
ALTER TABLE inbound_messages ADD COLUMN subject text;
ALTER TABLE inbound_messages ALTER COLUMN subject TYPE text USING wamid;
UPDATE inbound_messages m SET subject = p.subject
FROM processed_webhook_events p
WHERE m.source <> 'meta' AND p.inbox_id = m.inbox_id AND p.event_key LIKE 'evt:%';
ALTER TABLE inbound_messages
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT inbound_messages_pkey,
    ADD CONSTRAINT inbound_messages_pkey PRIMARY KEY (id, received_at, subject);

ALTER TABLE message_statuses ADD COLUMN subject text;
ALTER TABLE message_statuses
    ALTER COLUMN subject TYPE text USING event_subject(event_key),
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT message_statuses_pkey,
    ADD CONSTRAINT message_statuses_pkey PRIMARY KEY (id, recorded_at, subject);

ALTER TABLE account_errors ADD COLUMN subject text;
ALTER TABLE account_errors
    ALTER COLUMN subject TYPE text USING event_subject(event_key),
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT account_errors_pkey,
    ADD CONSTRAINT account_errors_pkey PRIMARY KEY (id, recorded_at, subject);

ALTER TABLE account_updates ADD COLUMN subject text;
ALTER TABLE account_updates
    ALTER COLUMN subject TYPE text USING event_subject(event_key),
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT account_updates_pkey,
    ADD CONSTRAINT account_updates_pkey PRIMARY KEY (id, recorded_at, subject);

-- Deliveries: one per (destination, event) as before; the subject rides in both keys.
ALTER TABLE deliveries ADD COLUMN subject text;
ALTER TABLE deliveries
    ALTER COLUMN subject TYPE text USING event_subject(event_key),
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT deliveries_pkey,
    ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id, subject),
    DROP CONSTRAINT deliveries_destination_id_event_key_key,
    ADD CONSTRAINT deliveries_destination_id_event_key_key UNIQUE (destination_id, event_key, subject);

-- Exact bytes of escaped events, stored with their key: colocated with it too.
ALTER TABLE event_fragments ADD COLUMN subject text;
ALTER TABLE event_fragments
    ALTER COLUMN subject TYPE text USING event_subject(event_key),
    ALTER COLUMN subject SET NOT NULL,
    DROP CONSTRAINT event_fragments_pkey,
    ADD CONSTRAINT event_fragments_pkey PRIMARY KEY (event_key, subject);
-- Retention: fragments go with the raw bodies (GATEWAY_INBOX_RETENTION_DAYS), in bounded
-- DELETE batches on this index (the table holds only the rare escaped events).
CREATE INDEX event_fragments_recorded_at ON event_fragments (recorded_at);

-- Staging lanes: a fixed 32 (changing it rewrites the table). Stored, so it can be indexed
-- and distributed on; computed from the identity, so no writer has to know about it.
ALTER TABLE webhook_inbox ADD COLUMN lane smallint GENERATED ALWAYS AS ((id % 32)::smallint) STORED;
-- A consumer that owns lanes claims `WHERE state = 'pending' AND lane = $1` on this index.
CREATE INDEX webhook_inbox_lane_due ON webhook_inbox (lane, next_attempt_at, id) WHERE state = 'pending';

-- New day partitions are created LIKE their parent and then attached: the stored lane must
-- come along as a generated column, or ATTACH refuses the partition.
-- Superseded: the current source is sql/functions/partition_ensure_day.sql (this body is kept as released).
CREATE OR REPLACE FUNCTION partition_ensure_day(parent text, day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    child text := parent || '_p' || to_char(day, 'YYYYMMDD');
    keytype text;
    lo text;
    hi text;
BEGIN
    IF to_regclass(child) IS NOT NULL THEN
        RETURN false;
    END IF;
    SELECT format_type(a.atttypid, a.atttypmod) INTO keytype
    FROM pg_partitioned_table p
    JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
    WHERE p.partrelid = parent::regclass;
    IF keytype = 'date' THEN
        lo := quote_literal(day::text);
        hi := quote_literal((day + 1)::text);
    ELSE
        lo := quote_literal(day::text || ' 00:00:00+00');
        hi := quote_literal((day + 1)::text || ' 00:00:00+00');
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
                   'INCLUDING GENERATED INCLUDING STORAGE)', child, parent);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', parent, child, lo, hi);
    RETURN true;
END;
$$;

-- Time partitions (native declarative partitioning, one partition per UTC day) so that
-- retention drops whole partitions instead of DELETEing rows, and bounds for every table.
--
--   webhook_inbox             by received_at (day of receipt)      PK (id, received_at)
--   inbound_messages          by received_at                       PK (id, received_at)
--   message_statuses          by recorded_at                       PK (id, recorded_at)
--   account_errors            by recorded_at                       PK (id, recorded_at)
--   account_updates           by recorded_at                       PK (id, recorded_at)
--   processed_webhook_events  by event_day: the UTC day of the event's own timestamp
--                             (Meta's message/status `timestamp`), PK (event_key, event_day);
--                             events with no usable timestamp use the sentinel day
--                             1970-01-01, kept in one partition trimmed by bounded DELETEs.
--
-- A redelivery carries the same timestamp, so it computes the same day and meets its key in
-- the same partition: ON CONFLICT (event_key, event_day) still deduplicates. See
-- docs/scaling.md for the rules (gateway/core/events.py: event_day).
--
-- The conversion is generic so that columns, indexes and triggers added to these tables by
-- earlier migrations survive: each table is renamed, a partitioned parent is created
-- LIKE it (defaults, constraints, identity), the rows are moved, then the indexes and
-- triggers the old table had are re-created on the parent (primary keys and unique keys
-- get the partition column; indexes made pointless by partitioning are not re-created).

-- Partition helpers, used here and by the maintenance job (gateway/maintenance/partitions.py).

-- The day partition of `parent` for `day` (named <parent>_pYYYYMMDD); false if it existed.
-- Partition bounds are UTC days, for date and timestamptz partition keys alike. Created
-- standalone and then ATTACHed: ATTACH PARTITION takes only SHARE UPDATE EXCLUSIVE on the
-- parent, so inserts and claims go on (CREATE TABLE ... PARTITION OF would lock them out);
-- the parent's indexes are built on the empty table and its identity is shared.
-- Superseded: the current source is sql/functions/partition_ensure_day.sql (this body is kept as released).
CREATE FUNCTION partition_ensure_day(parent text, day date) RETURNS boolean
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
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                   child, parent);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', parent, child, lo, hi);
    RETURN true;
END;
$$;

-- The days of `parent`'s day partitions, oldest first (the sentinel partition is not a day).
-- Superseded: the current source is sql/functions/partition_days.sql (this body is kept as released).
CREATE FUNCTION partition_days(parent text) RETURNS SETOF date
LANGUAGE sql STABLE AS $$
    SELECT to_date(right(c.relname, 8), 'YYYYMMDD') AS day
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
      AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
    ORDER BY day;
$$;

-- The oldest day partition of `parent` whose day is before `cutoff` (NULL: none), and
-- whether an interrupted DETACH ... CONCURRENTLY left it pending. The job detaches it
-- CONCURRENTLY (no lock that blocks writers) and drops the detached table; neither can run
-- inside a function, so the statements are in sql/queries/retention.sql.
-- Superseded: the current source is sql/functions/partition_oldest_before.sql (this body is kept as released).
CREATE FUNCTION partition_oldest_before(parent text, cutoff date, OUT name text, OUT detach_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text, i.inhdetachpending
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
      AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
      AND to_date(right(c.relname, 8), 'YYYYMMDD') < cutoff
    ORDER BY c.relname
    LIMIT 1;
$$;

-- Convert one table (run by this migration only, then dropped).
CREATE FUNCTION pg_temp.partition_convert(tbl text, keycol text, pk text, skip_indexes text[],
                                          extra_column text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    old text := tbl || '_unpartitioned';
    r record;
    idx text[] := '{}';
    trg text[] := '{}';
    def text;
    seq text;
    nextid bigint;
BEGIN
    -- Something that depends on the table (a view, a foreign key into it) would be lost or
    -- block the swap: fail loudly rather than drop it silently.
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE confrelid = tbl::regclass) THEN
        RAISE EXCEPTION '0007: a foreign key references %; partitioning it needs a decision', tbl;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid
               WHERE d.refobjid = tbl::regclass AND w.ev_class <> tbl::regclass) THEN
        RAISE EXCEPTION '0007: a view depends on %; re-create it after this migration', tbl;
    END IF;
    -- Indexes other than the ones this migration defines itself.
    FOR r IN
        SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def, i.indisunique
        FROM pg_index i
        WHERE i.indrelid = tbl::regclass AND NOT i.indisprimary
    LOOP
        CONTINUE WHEN r.name = ANY (skip_indexes);
        IF r.indisunique THEN
            RAISE EXCEPTION '0007: unique index % on % lacks the partition column %', r.name, tbl, keycol;
        END IF;
        idx := idx || r.def;
    END LOOP;
    FOR r IN SELECT pg_get_triggerdef(t.oid) AS def FROM pg_trigger t
             WHERE t.tgrelid = tbl::regclass AND NOT t.tgisinternal
    LOOP
        trg := trg || r.def;
    END LOOP;

    EXECUTE format('ALTER TABLE %I RENAME TO %I', tbl, old);
    -- Its indexes (and the constraints they back) step aside so the parent can reuse the names.
    FOR r IN SELECT i.indexrelid::regclass::text AS name FROM pg_index i WHERE i.indrelid = old::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.name, left(r.name, 59) || '_old');
    END LOOP;
    EXECUTE format(
        'CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY '
        'INCLUDING GENERATED INCLUDING STORAGE INCLUDING COMMENTS%s) PARTITION BY RANGE (%I)',
        tbl, old, coalesce(', ' || extra_column, ''), keycol);

    -- A partition for every day that has rows, plus today and the next three.
    IF extra_column IS NULL THEN
        FOR r IN EXECUTE format(
            'SELECT DISTINCT (%I AT TIME ZONE ''UTC'')::date AS day FROM %I', keycol, old)
        LOOP
            PERFORM partition_ensure_day(tbl, r.day);
        END LOOP;
        FOR r IN SELECT d::date AS day FROM generate_series(current_date - 1, current_date + 3, '1 day') d
        LOOP
            PERFORM partition_ensure_day(tbl, r.day);
        END LOOP;
        EXECUTE format('INSERT INTO %I OVERRIDING SYSTEM VALUE SELECT * FROM %I', tbl, old);
    END IF;

    -- Identity columns continue after the old sequence (feed pollers read WHERE id > last).
    FOR r IN SELECT a.attname FROM pg_attribute a
             WHERE a.attrelid = tbl::regclass AND a.attidentity <> '' AND NOT a.attisdropped
    LOOP
        seq := pg_get_serial_sequence(old, r.attname);
        EXECUTE format('SELECT greatest((SELECT max(%I) FROM %I), (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s))',
                       r.attname, old, seq) INTO nextid;
        IF nextid IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I ALTER COLUMN %I RESTART WITH %s', tbl, r.attname, nextid + 1);
        END IF;
    END LOOP;

    IF extra_column IS NULL THEN
        EXECUTE format('DROP TABLE %I', old);
    END IF;
    -- The new identity sequence takes the old name back (<table>_<column>_seq).
    FOR r IN SELECT a.attname FROM pg_attribute a
             WHERE a.attrelid = tbl::regclass AND a.attidentity <> '' AND NOT a.attisdropped
    LOOP
        seq := pg_get_serial_sequence(tbl, r.attname);
        IF to_regclass(tbl || '_' || r.attname || '_seq') IS NULL THEN
            EXECUTE format('ALTER SEQUENCE %s RENAME TO %I', seq, tbl || '_' || r.attname || '_seq');
        END IF;
    END LOOP;

    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (%s)', tbl, tbl || '_pkey', pk);
    -- Captured before the rename, these definitions already name the parent.
    FOREACH def IN ARRAY idx || trg LOOP
        EXECUTE def;
    END LOOP;
END;
$$;

-- processed_webhook_events: every existing key gets the day a consumer would compute for a
-- redelivery of its event. Meta message and status keys take their timestamp from the side
-- effect they produced (inbound_messages.timestamp, message_statuses.timestamp); a Meta key
-- whose side-effect row is gone is copied into every day a redelivery inside Meta's 7-day
-- window could compute (and the sentinel), so no key is forgotten; every other key
-- (Tenashi evt:, acct-error:, change:) is untimed.
SELECT pg_temp.partition_convert(
    'processed_webhook_events', 'event_day', 'event_key, event_day',
    ARRAY['processed_webhook_events_processed_at'],
    'event_day date NOT NULL');

CREATE TABLE processed_webhook_events_untimed PARTITION OF processed_webhook_events
    FOR VALUES FROM (MINVALUE) TO ('1970-01-02');
-- Only the untimed keys are trimmed by DELETE (by age); day partitions are dropped whole.
CREATE INDEX processed_webhook_events_untimed_processed_at
    ON processed_webhook_events_untimed (processed_at);

CREATE TEMP TABLE key_days ON COMMIT DROP AS
WITH ts AS (
    SELECT k.event_key,
           CASE
               WHEN k.event_key LIKE 'msg:%' THEN
                   (SELECT m.timestamp FROM inbound_messages m
                    WHERE m.wamid = substr(k.event_key, 5) AND m.source = 'meta' LIMIT 1)
           END AS msg_ts,
           k.event_key LIKE 'msg:%' OR k.event_key LIKE 'status:%' AS meta_timed
    FROM processed_webhook_events_unpartitioned k
), st AS (
    SELECT event_key, min(timestamp) AS ts, count(*) AS n
    FROM message_statuses WHERE event_key LIKE 'status:%' GROUP BY event_key
)
SELECT ts.event_key,
       CASE
           WHEN NOT ts.meta_timed THEN 'untimed'
           WHEN coalesce(ts.msg_ts, st.ts) IS NOT NULL THEN 'timed'
           WHEN ts.event_key LIKE 'msg:%' AND EXISTS (
                    SELECT 1 FROM inbound_messages m
                    WHERE m.wamid = substr(ts.event_key, 5) AND m.source = 'meta') THEN 'untimed'
           WHEN st.n IS NOT NULL THEN 'untimed'
           ELSE 'unknown'
       END AS kind,
       (coalesce(ts.msg_ts, st.ts) AT TIME ZONE 'UTC')::date AS day
FROM ts LEFT JOIN st ON st.event_key = ts.event_key;

-- A timestamp outside [today - 366 days, today + 1 day] is not a day a consumer would use.
UPDATE key_days SET kind = 'untimed'
WHERE kind = 'timed' AND (day > current_date + 1 OR day < current_date - 366);

SELECT partition_ensure_day('processed_webhook_events', d)
FROM (SELECT DISTINCT day AS d FROM key_days WHERE kind = 'timed'
      UNION SELECT g::date FROM generate_series(current_date - 8, current_date + 3, '1 day') g) days;

INSERT INTO processed_webhook_events
SELECT o.*, CASE WHEN k.kind = 'timed' THEN k.day ELSE DATE '1970-01-01' END
FROM processed_webhook_events_unpartitioned o JOIN key_days k USING (event_key);

-- Unknown day: one copy per day a redelivery could compute (processed before today, so its
-- event day is at most today + 1, and Meta stops retrying 7 days after the event).
INSERT INTO processed_webhook_events
SELECT o.*, g::date
FROM processed_webhook_events_unpartitioned o
JOIN key_days k USING (event_key)
CROSS JOIN generate_series(current_date - 8, current_date + 1, '1 day') g
WHERE k.kind = 'unknown';

DROP TABLE processed_webhook_events_unpartitioned;

-- The side-effect tables and the staging table, by day of receipt.
-- inbound_messages.wamid was UNIQUE: a unique key must contain the partition column, so it
-- becomes a plain index; exactly-once rests on processed_webhook_events (msg:<wamid>), and
-- inbox_apply_batch skips a wamid already recorded in the last 8 days.
SELECT pg_temp.partition_convert('webhook_inbox', 'received_at', 'id, received_at',
                                 ARRAY['webhook_inbox_processed']);
SELECT pg_temp.partition_convert('inbound_messages', 'received_at', 'id, received_at',
                                 ARRAY['inbound_messages_wamid_key', 'inbound_messages_received_at']);
CREATE INDEX inbound_messages_wamid ON inbound_messages (wamid);
SELECT pg_temp.partition_convert('message_statuses', 'recorded_at', 'id, recorded_at',
                                 ARRAY['message_statuses_recorded_at']);
SELECT pg_temp.partition_convert('account_errors', 'recorded_at', 'id, recorded_at',
                                 ARRAY['account_errors_recorded_at']);
SELECT pg_temp.partition_convert('account_updates', 'recorded_at', 'id, recorded_at',
                                 ARRAY['account_updates_recorded_at']);

DROP FUNCTION pg_temp.partition_convert(text, text, text, text[], text);

-- Unpartitioned tables get a bound too, trimmed by bounded DELETEs on these indexes.
-- Reply claims: after the dedup window a message cannot come back to be answered again.
CREATE INDEX reply_claims_claimed_at ON reply_claims (claimed_at);
-- Terminal outbox rows: deleted after GATEWAY_OUTBOX_RETENTION_DAYS (>= the idempotency window).
CREATE INDEX outbox_terminal ON outbox (updated_at) WHERE state IN ('accepted', 'failed', 'cancelled');

-- The gateway's tables on a Citus cluster: what `gateway migrate --citus` applies on the
-- coordinator after the migrations and functions, in one transaction, every time it runs
-- (each step checks first: a second run changes nothing). docs/scaling.md says why each table
-- is placed where it is; the limitations met on the way are listed there too.
--
-- Three colocation groups of 32 shards and one group on a single shard:
--   events     (subject)        processed_webhook_events, inbound_messages, message_statuses,
--                               account_errors, account_updates, event_fragments, reply_claims
--   lanes      (lane, 0..31)    webhook_inbox, delivery_events, delivery_queue, delivery_log
--   tenants    (one shard)      outbox, outbox_attempts, idempotency_keys
--   reference  (every node)     the small tables read beside the others
--   (inbox_lanes, the lanes' cursors, is in the lanes group: the staging INSERT reads its
--   lane's row there, so that it runs on one worker alone)
-- schema_migrations and schema_functions stay on the coordinator (only `migrate` reads them),
-- and consumer_members too: its rows name the coordinator's sessions (pg_stat_activity).
-- The caller sets citus.enable_unsafe_triggers (Citus refuses a table with triggers without it).

-- A cluster distributed before inbox_heads existed changes its inbox trigger and function in
-- the same transaction as it distributes the heads: Citus then needs one connection per node
-- for the whole transaction.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'webhook_inbox'::regclass)
       AND NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'inbox_heads'::regclass) THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END;
$$;

-- Triggers that NOTIFY would run on a worker, inside the shard's transaction: no listener
-- (they are on the coordinator) hears a worker's NOTIFY, and a transaction that also wrote
-- another node is prepared (two-phase commit), which PostgreSQL refuses after a NOTIFY. The
-- statements that need a wake-up send it from the coordinator (inbox_insert_batch), the
-- others are found by polling (docs/scaling.md).
DROP TRIGGER IF EXISTS webhook_inbox_notify ON webhook_inbox;
DROP TRIGGER IF EXISTS inbound_messages_notify ON inbound_messages;
DROP TRIGGER IF EXISTS deliveries_notify ON delivery_queue;
DROP TRIGGER IF EXISTS outbox_outcome_notify ON outbox;

-- On the cluster a lane numbers its own rows (inbox_heads): webhook_inbox.txid is the lane's
-- next number, taken from the lane's head row on the same shard, which stays locked until the
-- staging transaction ends. So numbers are given in commit order within a lane, a reader that
-- sees a head sees every row numbered up to it, and the numbers go on where they were when a
-- shard moves to another worker with its head. (Transaction ids, the single node's numbers, are
-- counted by each worker on its own: a lane moved to a worker that had counted fewer would have
-- its new rows numbered below its cursor, and skipped.) The trigger runs on the shards, where
-- the row lands; it finds the head's shard from Citus's metadata, which every worker holds.
-- (Statements that Citus passes on to the shards run from EXECUTE: Citus sends the text of the
-- command it was given, which would otherwise be this whole file.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgrelid = 'webhook_inbox'::regclass AND tgname = 'webhook_inbox_txid') THEN
        EXECUTE 'DROP TRIGGER webhook_inbox_txid ON webhook_inbox';
    END IF;
    EXECUTE 'DROP FUNCTION IF EXISTS webhook_inbox_txid()';
END;
$$;
CREATE OR REPLACE FUNCTION webhook_inbox_number() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n xid8;
BEGIN
    EXECUTE format('UPDATE %s SET seq = seq + 1 WHERE lane = $1 RETURNING seq::text::xid8',
                   shard_name('inbox_heads'::regclass,
                              get_shard_id_for_distribution_column('inbox_heads', NEW.lane)))
        INTO n USING NEW.lane;
    IF n IS NULL THEN
        RAISE EXCEPTION 'lane % has no head (inbox_heads)', NEW.lane;
    END IF;
    NEW.txid := n;
    RETURN NEW;
END;
$$;

-- outbox's attempts: a statement trigger's transition tables are not visible to the statement
-- Citus runs for the trigger's INSERT on the worker ("could not find named tuplestore"); a row
-- trigger with the same condition records the same rows.
CREATE OR REPLACE FUNCTION outbox_attempts_record_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_attempts (outbox_id, sent_at, outcome, code, error, wamid)
    VALUES (NEW.id, OLD.sending_at, NEW.state, NEW.last_error_code, NEW.last_error, NEW.wamid);
    RETURN NULL;
END;
$$;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
               WHERE t.tgrelid = 'outbox'::regclass AND t.tgname = 'outbox_attempts'
                 AND p.proname = 'outbox_attempts_record') THEN
        DROP TRIGGER outbox_attempts ON outbox;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'outbox'::regclass AND tgname = 'outbox_attempts') THEN
        CREATE TRIGGER outbox_attempts AFTER UPDATE ON outbox
            FOR EACH ROW WHEN (OLD.state = 'sending' AND NEW.state <> 'sending')
            EXECUTE FUNCTION outbox_attempts_record_row();
    END IF;
END;
$$;

DO $$
DECLARE
    t record;
    inbox_moved boolean := NOT EXISTS (SELECT 1 FROM pg_dist_partition
                                       WHERE logicalrelid = 'webhook_inbox'::regclass);
BEGIN
    -- The inbox log's positions are transaction ids and snapshots of one server: those of a
    -- single PostgreSQL mean nothing on the workers (each counts its own). So the log is
    -- distributed only once every staged row has been read (nothing is lost: the operator
    -- stops ingest and lets the consumers finish, docs/scaling.md), its rows leave the log
    -- (txid NULL: no cursor reads them again; they stay for `gateway dead`, replay and
    -- retention), and each lane's cursor starts at its worker's snapshot (citus_lanes_restart,
    -- run by `migrate` once this transaction has committed: the workers' own sessions cannot
    -- see shards made by a transaction still open).
    IF inbox_moved THEN
        IF EXISTS (SELECT 1 FROM inbox_unread()) THEN
            RAISE EXCEPTION 'webhook_inbox has rows no consumer has read yet: stop ingest, let the consumers read every staged webhook (gateway lanes), then run gateway migrate --citus again'
                USING ERRCODE = 'GWC01';
        END IF;
        UPDATE webhook_inbox SET txid = NULL WHERE txid IS NOT NULL;
    END IF;
    -- Each lane's head starts above every number its rows and cursor hold: on a cluster
    -- distributed before inbox_heads existed, the worker's transaction ids. Staging waits
    -- meanwhile (the lock, until this transaction ends), so no row is numbered the old way
    -- after the heads are read from the rows.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'inbox_heads'::regclass) THEN
        IF NOT inbox_moved THEN
            LOCK TABLE webhook_inbox IN SHARE MODE;
        END IF;
        INSERT INTO inbox_heads (lane, seq)
        SELECT l.lane,
               greatest(3, pg_snapshot_xmax(l.done_snap)::text::bigint,
                        coalesce(pg_snapshot_xmax(l.win_snap)::text::bigint, 0),
                        coalesce(m.top, 0))
        FROM inbox_lanes l
        LEFT JOIN (SELECT w.lane, max(w.txid::text::bigint) AS top FROM webhook_inbox w
                   GROUP BY w.lane) m ON m.lane = l.lane
        ON CONFLICT (lane) DO UPDATE SET seq = greatest(inbox_heads.seq, excluded.seq);
    END IF;
    -- Reference tables first: delivery_leases has a foreign key to destinations.
    FOR t IN SELECT * FROM unnest(ARRAY[
            'destinations', 'delivery_leases', 'inbox_parked',
            'dead_events', 'customer_ids', 'media', 'send_pacing', 'send_breakers',
            'maintenance_passes', 'operator_actions']) AS r(name)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = t.name::regclass) THEN
            PERFORM create_reference_table(t.name);
        END IF;
    END LOOP;
    FOR t IN SELECT * FROM (VALUES
            ('processed_webhook_events', 'subject', 'none'),
            ('inbound_messages', 'subject', 'processed_webhook_events'),
            ('message_statuses', 'subject', 'processed_webhook_events'),
            ('account_errors', 'subject', 'processed_webhook_events'),
            ('account_updates', 'subject', 'processed_webhook_events'),
            ('event_fragments', 'subject', 'processed_webhook_events'),
            ('reply_claims', 'inbound_wamid', 'processed_webhook_events'),
            ('webhook_inbox', 'lane', 'none'),
            ('inbox_lanes', 'lane', 'webhook_inbox'),
            ('inbox_heads', 'lane', 'webhook_inbox'),
            ('delivery_events', 'lane', 'webhook_inbox'),
            ('delivery_queue', 'lane', 'webhook_inbox'),
            ('delivery_log', 'lane', 'webhook_inbox'),
            ('outbox', NULL, 'none'),
            ('outbox_attempts', NULL, 'outbox'),
            ('idempotency_keys', NULL, 'outbox')) AS d(name, col, colocate)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = t.name::regclass) THEN
            IF t.col IS NULL OR t.colocate <> 'none' THEN
                PERFORM create_distributed_table(t.name, t.col, colocate_with => t.colocate);
            ELSE
                PERFORM create_distributed_table(t.name, t.col, shard_count => 32, colocate_with => 'none');
            END IF;
        END IF;
    END LOOP;
END;
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'webhook_inbox'::regclass AND tgname = 'webhook_inbox_number') THEN
        CREATE TRIGGER webhook_inbox_number BEFORE INSERT ON webhook_inbox
            FOR EACH ROW EXECUTE FUNCTION webhook_inbox_number();
    END IF;
END;
$$;

-- A consumer reads the lanes of one shard per statement (inbox_read must be a router query:
-- its snapshot is the worker's): lanes in the same shard share a `shard` number here.
UPDATE inbox_lanes l SET shard = s.n
FROM (SELECT g.i::smallint AS lane,
             dense_rank() OVER (ORDER BY get_shard_id_for_distribution_column('webhook_inbox', g.i::smallint))::int - 1 AS n
      FROM generate_series(0, 31) AS g(i)) s
WHERE l.lane = s.lane AND l.shard IS DISTINCT FROM s.n;

-- Citus cannot plan a LANGUAGE sql function over distributed or reference tables when it is
-- called ("parameterized queries for SQL functions referencing distributed tables are not
-- supported"), while PL/pgSQL's RETURN QUERY is planned as a plain statement. On one
-- PostgreSQL these stay LANGUAGE sql (inlined: a caller's LIMIT or EXISTS stops the scan);
-- on a coordinator the same bodies (sql/functions/) run as PL/pgSQL. Their meaning holds on a
-- cluster: each row is judged by its own lane's cursor, on the lane's worker (webhook_inbox
-- and inbox_lanes are colocated by lane); the least xmax over every lane is only a lower
-- bound of the scan, and a bound lower than a worker's own only scans more.
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid, p.proname, p.prosrc FROM pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace
               AND p.proname IN ('inbox_unread', 'inbox_row_states', 'inbox_unprocessed')
               AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql')
    LOOP
        EXECUTE format(
            'CREATE OR REPLACE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql STABLE AS %L',
            f.proname, pg_get_function_arguments(f.oid), pg_get_function_result(f.oid),
            E'#variable_conflict use_column\nBEGIN\nRETURN QUERY ' || rtrim(f.prosrc, E' \n;') || E';\nEND');
    END LOOP;
END;
$$;

-- The forwarder's round (a round of one shard's lanes): its statements are planned with the
-- round's values (Citus needs them to find the shard of the round's lanes; a generic plan's
-- parameters are refused there), and it writes the reference table destinations after reading
-- the queue's shards, which Citus allows over one connection per node only.
ALTER FUNCTION forward_round(text, delivery_outcome[], delivery_ref[], breaker_tally[], bigint[], integer,
                             smallint[], float8, integer, boolean, float8)
    SET plan_cache_mode = force_custom_plan;
-- (Planned per call, with the tables' sizes as they are: the seq scans a kept plan must avoid
-- are left to Citus's planner.)
ALTER FUNCTION forward_round(text, delivery_outcome[], delivery_ref[], breaker_tally[], bigint[], integer,
                             smallint[], float8, integer, boolean, float8)
    RESET enable_seqscan;
ALTER FUNCTION forward_round(text, delivery_outcome[], delivery_ref[], breaker_tally[], bigint[], integer,
                             smallint[], float8, integer, boolean, float8)
    SET citus.multi_shard_modify_mode = sequential;

-- The gateway's sessions see the coordinator's catalog without Citus's shard hiding: with it,
-- every scan of pg_class pays a per-row check of whether the relation is a shard, and asyncpg's
-- type introspection on each new connection (one pg_class scan per type) took 1.2-2.3 s instead
-- of ~0.1 s, long enough for the group commit's batches to miss their deadline under load. The
-- gateway reads the catalog only for its own tables and partitions; no shard of a distributed
-- table lives on the coordinator, and reference tables' coordinator placements are not
-- partitions, so nothing it lists changes.
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET citus.override_table_visibility = off', current_database());
END;
$$;

-- The deliveries view (for reading): Citus cannot plan a join, an ORDER BY or an IN over the
-- union of its two halves, each a join of distributed tables, so here each half is collected on
-- its own first (each is one query per shard, its joins on the lane). That reads every open and
-- every delivered delivery of the log's days for each query on the view: an operator's look, not
-- a hot path (the gateway itself never reads the view).
DO $$
BEGIN
    IF pg_get_viewdef('deliveries'::regclass) NOT LIKE '%MATERIALIZED%' THEN
        EXECUTE $v$
            CREATE OR REPLACE VIEW deliveries AS
            WITH open AS MATERIALIZED (SELECT * FROM deliveries_open),
                 done AS MATERIALIZED (SELECT * FROM deliveries_done)
            SELECT * FROM open
            UNION ALL
            SELECT * FROM done
        $v$;
    END IF;
END;
$$;

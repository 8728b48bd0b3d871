-- An enqueue does not NOTIFY in its own transaction. PostgreSQL serialises the commits of all
-- transactions that NOTIFY (PreCommit_Notify in src/backend/commands/async.c takes one
-- database-wide lock and holds it through the commit's WAL flush), so a NOTIFY per enqueued
-- request capped enqueues at one per WAL flush, and requests queued for the pool behind it.
-- The front ends wake the senders once their commit is done (gateway.outbound.wake); a
-- handler's reply NOTIFYs in the consumer's batch transaction (outbox_notify, one per batch).
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
DROP FUNCTION IF EXISTS outbox_notify();
-- The function's source is gone with it: it is no longer applied, nor recorded as applied.
DO $$
BEGIN
    IF to_regclass('schema_functions') IS NOT NULL THEN
        DELETE FROM schema_functions WHERE name = 'outbox_notify';
    END IF;
END;
$$;

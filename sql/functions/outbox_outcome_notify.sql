-- Trigger of outbox: a row a Graph-compatible request waits for (notify_outcome) announces each
-- state that ends a wait (gateway.outbound.outcomes.FINAL) on NOTIFY outbox_outcome, payload
-- '<id> <state> <wamid>' (the wamid empty until known), whichever statement made it (the
-- sender's results, a status webhook, the reconciler, a cancel). The waiters may be in any
-- process. 'pending' and 'sending' are not announced: no one waits for them, and a claim that
-- NOTIFYs would hold PostgreSQL's commit-serialising NOTIFY lock through its WAL flush.
-- The trigger is created here with its function: a migration cannot name a function that is
-- only applied after the last migration.
CREATE OR REPLACE FUNCTION outbox_outcome_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_outcome', NEW.id::text || ' ' || NEW.state || ' ' || coalesce(NEW.wamid, ''));
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS outbox_outcome_notify ON outbox;
CREATE TRIGGER outbox_outcome_notify
    AFTER UPDATE OF state ON outbox
    FOR EACH ROW WHEN (NEW.notify_outcome AND NEW.state IS DISTINCT FROM OLD.state
                       AND NEW.state IN ('accepted', 'failed', 'unknown', 'review', 'cancelled'))
    EXECUTE FUNCTION outbox_outcome_notify();

-- The naive consumer the benchmark compares against: one inbox row per transaction, claimed
-- with a row lock, and one round trip per statement per event. Same semantics as apply_batch
-- (exactly once, statuses only move the outbox forward), none of the batching. Its queue is
-- a to-do list of the staged rows' ids (the log's rows are never updated), from which a claim
-- deletes the row it takes; it records the rows it finished in a table of its own.

-- name: naive_setup
CREATE UNLOGGED TABLE IF NOT EXISTS bench_naive_done (id bigint PRIMARY KEY);
CREATE UNLOGGED TABLE IF NOT EXISTS bench_naive_todo (id bigint PRIMARY KEY);

-- name: naive_todo
INSERT INTO bench_naive_todo (id) SELECT id FROM webhook_inbox;

-- name: naive_claim_one
-- The first row of the to-do list no other loop holds, deleted as it is claimed (a rollback
-- puts it back): as a queue of one row per job claims, at a cost that does not grow with the
-- rows already done.
WITH claimed AS (
    DELETE FROM bench_naive_todo t
    WHERE t.id = (SELECT id FROM bench_naive_todo ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING t.id
)
SELECT w.id, w.source, w.body, w.delivery_id
FROM webhook_inbox w JOIN claimed c ON c.id = w.id;

-- name: naive_claim_key
INSERT INTO processed_webhook_events (event_key, inbox_id, event_day, subject) VALUES ($1, $2, $3, $4)
ON CONFLICT (event_key, event_day, subject) DO NOTHING
RETURNING event_key;

-- name: naive_insert_message
INSERT INTO inbound_messages
    (wamid, source, phone_number_id, sender, type, timestamp, contact_name, message, inbox_id, subject)
SELECT $1, $2, $3, $4, $5, to_timestamp($6), $7, $8, $9, $10
WHERE NOT EXISTS (SELECT 1 FROM inbound_messages WHERE wamid = $1 AND received_at > now() - interval '8 days');

-- name: naive_insert_status
INSERT INTO message_statuses
    (event_key, source, wamid, status, participant, recipient, timestamp, callback_data, errors, raw, inbox_id,
     subject)
VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7), $8, $9, $10, $11, $12);

-- name: naive_update_outbox
UPDATE outbox o SET
    state = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review') THEN 'accepted' ELSE o.state END,
    accepted_at = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review')
                       THEN coalesce(o.accepted_at, now()) ELSE o.accepted_at END,
    wamid = coalesce(o.wamid, $2),
    delivery_status = CASE WHEN delivery_rank($3) > delivery_rank(o.delivery_status)
                           THEN $3 ELSE o.delivery_status END,
    delivery_errors = CASE WHEN delivery_rank($3) > delivery_rank(o.delivery_status) AND $3 = 'failed'
                           THEN $4::jsonb ELSE o.delivery_errors END,
    updated_at = now()
WHERE o.id = coalesce(
    (SELECT id FROM outbox WHERE callback_data = $1),
    (SELECT id FROM outbox WHERE wamid = $2 ORDER BY id LIMIT 1));

-- name: naive_done
INSERT INTO bench_naive_done (id) VALUES ($1);

-- name: bench_reset
TRUNCATE webhook_inbox, processed_webhook_events, inbound_messages, message_statuses,
         account_errors, account_updates, bench_naive_done, bench_naive_todo;

-- name: bench_reset_outbox
UPDATE outbox SET state = 'sending', wamid = NULL, delivery_status = NULL, delivery_errors = NULL,
                  accepted_at = NULL;

-- name: bench_outbox_rows
SELECT count(*) FROM outbox;

-- name: bench_seed_outbox
INSERT INTO outbox (tenant, idem_key, callback_data, recipient, payload, state)
SELECT 'bench', 'k' || i, 'cb-' || i, '4915112345678', '{"type": "text"}'::jsonb, 'sending'
FROM generate_series(0, $1 - 1) AS i;

-- name: bench_check
SELECT (SELECT count(*) FROM processed_webhook_events) AS keys,
       (SELECT count(*) FROM inbound_messages) AS messages,
       (SELECT count(*) FROM message_statuses) AS statuses,
       (SELECT count(*) FROM outbox WHERE state = 'accepted' AND delivery_status = 'read') AS outbox_read,
       -- read by no cursor and not finished by the naive consumer
       (SELECT count(*) FROM inbox_unread() u
        WHERE NOT EXISTS (SELECT 1 FROM bench_naive_done d WHERE d.id = u.id)) AS not_done;

-- name: peer_reset
-- PGQueuer's tables (its own schema, installed by the peer run): an empty queue and log.
TRUNCATE pgqueuer, pgqueuer_log;

-- name: peer_left
SELECT count(*) FROM pgqueuer;

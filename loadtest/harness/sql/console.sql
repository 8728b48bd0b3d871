-- bench-console: fill the tables the console pages through, server-side, in the order their
-- keys grow (times and ids rise together, so each index is appended to, not written at
-- random). $1..$2 is the range of row numbers a chunk writes, $3 how many rows in all (the
-- time axis spans the last 14 days over them).

-- name: console_fill_partitions
SELECT count(*) FILTER (WHERE partition_ensure_day(t, d::date))
FROM unnest(ARRAY['webhook_inbox', 'inbound_messages', 'message_statuses', 'delivery_events',
                   'delivery_log']) AS t,
     generate_series(current_date - 15, current_date + 1, interval '1 day') AS d;

-- name: console_secondary_indexes
-- The indexes (other than those of constraints) of the filled tables, to drop before the fill
-- and build again after it: a build sorts once, where row-by-row inserts would touch a random
-- leaf page per row.
SELECT c.relname AS table, i.relname AS name,
       -- a partitioned table's index is built on every partition (its definition says ON ONLY)
       replace(pg_get_indexdef(x.indexrelid), ' ON ONLY ', ' ON ') AS def
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class c ON c.oid = x.indrelid
WHERE c.relname IN ('outbox', 'delivery_queue', 'delivery_events', 'delivery_log', 'dead_events')
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid);

-- name: console_fill_dead_events
INSERT INTO dead_events (inbox_id, position, path, event_key, kind, source, received_at, unit, context,
                         fragment, state, attempts, next_attempt_at, last_error)
SELECT n, 0, '/entry/0/changes/0/value/messages/0',
       CASE WHEN n % 100 < 99 THEN 'msg:wamid.D' || lpad(n::text, 9, '0') END,
       CASE WHEN n % 100 < 60 THEN 'message' WHEN n % 100 < 90 THEN 'status'
            WHEN n % 100 < 99 THEN 'bad' ELSE 'account_error' END,
       'meta', now() - interval '14 days' + (n::float8 / $3) * interval '14 days', 'message', '{}',
       convert_to('{"from":"4915100000001","id":"wamid.D' || lpad(n::text, 9, '0')
                  || '","timestamp":"1764460800","type":"text","text":{"body":"hello ' || n || '"}}', 'UTF8'),
       CASE WHEN n % 100 = 0 THEN 'retry' ELSE 'dead' END, 5,
       now() + interval '1 hour', 'handler orders.on_message: ValueError: no order ' || n
FROM generate_series($1::bigint, $2::bigint) AS n;

-- name: console_fill_inbox
-- Whole webhooks, every 10th moved aside dead (not JSON); the lanes' cursors are moved past
-- them all after the fill (console_fill_read).
WITH staged AS (
    INSERT INTO webhook_inbox (source, body, received_at)
    SELECT 'meta', convert_to('not json ' || n, 'UTF8'),
           now() - interval '14 days' + (n::float8 / $3) * interval '14 days'
    FROM generate_series($1::bigint, $2::bigint) AS n
    RETURNING id, received_at, source, body
)
INSERT INTO inbox_parked (inbox_id, received_at, source, body, state, attempts, last_error)
SELECT id, received_at, source, body, 'dead', 1, 'body is not JSON' FROM staged WHERE id % 10 = 0;

-- name: console_fill_inbox_today
-- Webhooks staged over the last hour, all read by the consumers (console_fill_read): a busy
-- day's partition, which no page may scan while the overview counts the few rows past the
-- cursors. Run once per group commit's worth of rows, each its own transaction (the log's
-- index and its statistics see as many transaction ids as a real day). ($3 as above: here
-- the time axis spans the hour.)
INSERT INTO webhook_inbox (source, body, received_at)
SELECT 'meta', convert_to(format('{"object":"whatsapp_business_account","entry":[{"id":"waba-1","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550001111","phone_number_id":"1111"},"contacts":[{"profile":{"name":"Customer %s"},"wa_id":"4915%s"}],"messages":[{"from":"4915%s","id":"wamid.T%s","timestamp":"%s","type":"text","text":{"body":"%s"}}]}}]}]}',
                                 n, lpad((n % 2000003)::text, 8, '0'), lpad((n % 2000003)::text, 8, '0'),
                                 lpad(n::text, 10, '0'), extract(epoch FROM now())::bigint, repeat('where is my order? ', 8)), 'UTF8'),
       now() - interval '1 hour' + (n::float8 / $3) * interval '1 hour'
FROM generate_series($1::bigint, $2::bigint) AS n;

-- name: console_fill_read
-- Every lane's cursor past every row staged so far, as consumers would have read them.
UPDATE inbox_lanes SET done_snap = pg_current_snapshot(), win_snap = NULL, pos_txid = NULL,
    pos_id = NULL, version = version + 1;

-- name: console_fill_outbox
-- 97 % accepted, 1 % failed, 0.5 % review, 0.5 % cancelled, 0.2 % unknown, 0.8 % pending;
-- a tenant with 0.1 % of the rows; about 2 M recipients.
INSERT INTO outbox (tenant, idem_key, callback_data, provider, phone_number_id, recipient, payload, state,
                    attempts, wamid, delivery_status, last_error, last_error_code, created_at, updated_at,
                    unknown_at, accepted_at)
SELECT CASE WHEN n % 1000 = 999 THEN 'tiny' ELSE (ARRAY['acme', 'globex', 'initech', 'umbrella'])[n % 4 + 1] END,
       'order-' || lpad(n::text, 10, '0'), 'cb-' || lpad(n::text, 10, '0'), 'meta', '1111',
       '4915' || lpad((n % 2000003)::text, 8, '0'),
       '{"type":"text","text":{"body":"Your order has shipped"}}'::jsonb, s.state,
       1, CASE WHEN s.state = 'accepted' THEN 'wamid.O' || lpad(n::text, 10, '0') END,
       CASE WHEN s.state = 'accepted' THEN 'delivered' END,
       CASE WHEN s.state IN ('failed', 'review', 'unknown') THEN 'read timeout' END,
       CASE WHEN s.state = 'failed' THEN 131026 END, t.at, t.at,
       CASE WHEN s.state = 'unknown' THEN t.at END, CASE WHEN s.state = 'accepted' THEN t.at END
FROM generate_series($1::bigint, $2::bigint) AS n
CROSS JOIN LATERAL (SELECT now() - interval '14 days' + (n::float8 / $3) * interval '14 days' AS at) t
CROSS JOIN LATERAL (SELECT CASE WHEN n % 1000 < 970 THEN 'accepted' WHEN n % 1000 < 980 THEN 'failed'
                                WHEN n % 1000 < 985 THEN 'review' WHEN n % 1000 < 990 THEN 'cancelled'
                                WHEN n % 1000 < 992 THEN 'unknown' ELSE 'pending' END AS state) s;

-- name: console_fill_destinations
INSERT INTO destinations (name, url, events, secret)
SELECT 'dest' || i, 'https://receiver.example/hooks/' || i, '{message,status}',
       'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
FROM generate_series(1, 4) AS i
ON CONFLICT (name) DO NOTHING;

-- name: console_fill_deliveries
-- Over 4 destinations: 98 % delivered (the log), 1.5 % failed, 0.5 % pending (the queue); an
-- event (its body) each.
WITH src AS (
    SELECT n, d.id AS destination_id, t.at, (t.at AT TIME ZONE 'UTC')::date AS day, (n % 32)::smallint AS lane,
           s.state
    FROM generate_series($1::bigint, $2::bigint) AS n
    JOIN destinations d ON d.name = 'dest' || (n % 4 + 1)
    CROSS JOIN LATERAL (SELECT now() - interval '14 days' + (n::float8 / $3) * interval '14 days' AS at) t
    CROSS JOIN LATERAL (SELECT CASE WHEN n % 1000 < 980 THEN 'delivered' WHEN n % 1000 < 995 THEN 'failed'
                                    ELSE 'pending' END AS state) s
), ev AS (
    INSERT INTO delivery_events (id, day, lane, received_at, event_key, kind, body)
    SELECT n, day, lane, at, 'msg:wamid.V' || lpad(n::text, 10, '0'), 'message', '{}'::bytea FROM src
), queued AS (
    INSERT INTO delivery_queue (destination_id, event_id, received_at, due, window_start, event_day, attempts,
                                lane, last_status, failed, last_error)
    SELECT destination_id, n, at, at, at, day, 1, lane, CASE WHEN state = 'failed' THEN 500 END,
           state = 'failed', CASE WHEN state = 'failed' THEN 'HTTP 500' END
    FROM src WHERE state <> 'delivered'
)
INSERT INTO delivery_log (day, at, destination_id, event_id, received_at, event_day, attempt, lane, status,
                          outcome)
SELECT day, at, destination_id, n, at, day, 1, lane, 200, 'delivered' FROM src WHERE state = 'delivered';

-- name: console_fill_inbound
INSERT INTO inbound_messages (wamid, source, phone_number_id, sender, type, timestamp, contact_name, message,
                              inbox_id, received_at, subject)
SELECT 'wamid.I' || lpad(n::text, 10, '0'), 'meta', '1111', '4915' || lpad((n % 100003)::text, 8, '0'),
       'text', t.at, 'Customer ' || n, '{"type":"text","text":{"body":"where is my order?"}}'::jsonb, n, t.at,
       'wamid.I' || lpad(n::text, 10, '0')
FROM generate_series($1::bigint, $2::bigint) AS n
CROSS JOIN LATERAL (SELECT now() - interval '14 days' + (n::float8 / $3) * interval '14 days' AS at) t;

-- name: console_fill_audit
INSERT INTO operator_actions (actor, via, action, target, rows, outcome, at)
SELECT (ARRAY['alice', 'bob', 'carol'])[n % 3 + 1], 'console', 'dead.replay', 'E' || n, 1, 'replayed 1 event(s)',
       now() - interval '14 days' + (n::float8 / $3) * interval '14 days'
FROM generate_series($1::bigint, $2::bigint) AS n;

-- name: console_pick_dead
-- A dead event from the middle of the table (its page, and the cursor of a page deep inside).
SELECT id, received_at FROM dead_events WHERE id >= (SELECT max(id) / 2 FROM dead_events) AND state = 'dead'
ORDER BY id LIMIT 1;

-- name: console_pick_send
SELECT id, tenant, idem_key, recipient, wamid FROM outbox
WHERE id >= (SELECT max(id) / 2 FROM outbox) AND state = 'accepted' ORDER BY id LIMIT 1;

-- name: console_pick_delivery
-- (Event n went to destination dest<n % 4 + 1>.)
SELECT d.name, e.received_at, e.id FROM delivery_events e JOIN destinations d ON d.name = 'dest' || (e.id % 4 + 1)
WHERE e.id >= (SELECT max(id) / 2 FROM delivery_events) ORDER BY e.id LIMIT 1;

-- name: console_pick_message
SELECT id, wamid, sender FROM inbound_messages
WHERE id >= (SELECT max(id) / 2 FROM inbound_messages) ORDER BY id LIMIT 1;

-- name: console_pick_statuses
-- A few statuses of the picked send, for its story.
INSERT INTO message_statuses (event_key, wamid, status, recipient, timestamp, raw, subject)
SELECT 'status:' || $1 || ':' || s || ':', $1, s, '4915100000001', now(), '{}'::jsonb, $1
FROM unnest(ARRAY['sent', 'delivered', 'read']) AS s;

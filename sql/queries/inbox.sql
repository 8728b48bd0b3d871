-- webhook_inbox: staging by the ingest edge, claims and the batch statement of the consumers,
-- dead letters. processed_webhook_events and the side-effect tables are written by inbox_apply_batch.

-- name: inbox_insert_batch
-- One statement per group-commit batch, rows in arrival order.
INSERT INTO webhook_inbox (source, body, delivery_id)
SELECT source, body, delivery_id
FROM unnest($1::text[], $2::bytea[], $3::text[]) WITH ORDINALITY AS t(source, body, delivery_id, n)
ORDER BY n;

-- name: inbox_claim_batch
-- Due pending rows, locked for this transaction; other consumers skip them. Bodies are
-- read only up to a byte budget ($2; the first row always), so a backlog of 3 MB payloads
-- cannot make one batch huge: rows past the budget stay pending and are unlocked at COMMIT.
-- The join carries received_at (the partition key) so each row is read from its partition.
-- Each row also says how many rows the claim locked: more than it returned means the budget
-- left some (more are due at once).
-- $3 (NULL: none) is a lower bound of every pending row's next_attempt_at (inbox_due_from):
-- the scan of webhook_inbox_due starts there, past the entries that rows done since the last
-- vacuum left dead at the head of the index, which every claim would otherwise walk again.
WITH claimed AS (
    SELECT id, received_at, next_attempt_at, octet_length(body) AS size
    FROM webhook_inbox
    WHERE state = 'pending' AND next_attempt_at >= coalesce($3, '-infinity'::timestamptz)
      AND next_attempt_at <= clock_timestamp()
    ORDER BY next_attempt_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), budget AS (
    SELECT id, received_at, next_attempt_at, sum(size) OVER (ORDER BY next_attempt_at, id) - size AS before
    FROM claimed
)
SELECT w.id, w.source, w.body, w.delivery_id, w.attempts, (SELECT count(*) FROM claimed) AS locked
FROM budget b JOIN webhook_inbox w ON w.id = b.id AND w.received_at = b.received_at
WHERE b.before = 0 OR b.before + octet_length(w.body) <= $2
ORDER BY b.next_attempt_at, b.id;

-- name: inbox_due_from
-- The bound a claim starts from ($3 above): the oldest pending row's next_attempt_at, at most
-- a second ago. Read on the due index from its head (this walks the dead entries once, not
-- once per claim). A row is written pending with a next_attempt_at of its transaction's start
-- or later (insert, defer, replay, a failed attempt), so only a row whose insert took longer
-- than the second to commit can fall below the bound, and the next reading sees it.
SELECT least(min(next_attempt_at), clock_timestamp() - interval '1 second')
FROM webhook_inbox WHERE state = 'pending';

-- name: inbox_claim_row
-- One row again, for the one-by-one fallback after a batch failed.
SELECT id, source, body, delivery_id, attempts
FROM webhook_inbox
WHERE id = $1 AND state = 'pending'
FOR UPDATE SKIP LOCKED;

-- name: inbox_claim_due_row
-- One row alone, if it is still pending and due (a row that headed claims that committed
-- nothing: gateway/inbound/consumer.py).
SELECT id, source, body, delivery_id, attempts
FROM webhook_inbox
WHERE id = $1 AND state = 'pending' AND next_attempt_at <= clock_timestamp()
FOR UPDATE SKIP LOCKED;

-- name: inbox_stall_attempt
-- A row that failed alone where nothing could be recorded: one attempt, in a transaction of
-- its own; due again after $3 seconds, or dead at $2 attempts. Returns its state and attempts.
UPDATE webhook_inbox SET
    attempts = attempts + 1,
    state = CASE WHEN attempts + 1 >= $2 THEN 'dead' ELSE state END,
    next_attempt_at = clock_timestamp() + make_interval(secs => $3),
    last_error = $4
WHERE id = $1 AND state = 'pending'
RETURNING state, attempts;

-- name: inbox_ensure_partition
-- Today's and tomorrow's partitions (UTC) of a table a row found none in, made on the spot
-- (the job makes them ahead; ingest and consumers never depend on it having run). Whether
-- one was made.
SELECT coalesce(bool_or(partition_ensure_day($1, d::date)), false)
FROM generate_series((clock_timestamp() AT TIME ZONE 'UTC')::date,
                     (clock_timestamp() AT TIME ZONE 'UTC')::date + 1, interval '1 day') AS d;

-- name: inbox_apply_batch
-- handle_once for a whole batch in one statement. The keys go into
-- processed_webhook_events first; only keys that were newly inserted (RETURNING) get their
-- side effects, and the inbox rows are marked done, all in the caller's transaction: a
-- crash rolls back keys and effects together, a redelivery finds its key and does nothing.
-- Keys are inserted and outbox rows locked in sorted order so that two consumers touching
-- the same keys or rows wait for each other instead of deadlocking.
-- A key lives in the partition of its event's day ($11, gateway/core/events.py: event_day):
-- a redelivery computes the same day, so ON CONFLICT meets the key it stored before.
-- $1 keys, $2 their inbox ids, $3 messages, $4 statuses, $5 account errors,
-- $6 account updates (jsonb arrays), $7 inbox ids done, $8/$9 inbox ids parked + why,
-- $10 forwards (JSON text of an array: key, kind, conversation, envelope, inbox_id per event).
-- $11 the keys' event days, $12 their subjects (gateway/core/events.py: subject_of, a pure
-- function of the key: a redelivery brings the same one). The side-effect rows take the
-- subject of their key from `fresh`. $13 the phone number/BSUID pairs the events show
-- (jsonb array: phone_number_id, user_id, wa_id, parent_user_id, username).
WITH ev AS (
    SELECT key, inbox_id, day, subject
    FROM unnest($1::text[], $2::bigint[], $11::date[], $12::text[]) AS e(key, inbox_id, day, subject)
), fresh AS (
    INSERT INTO processed_webhook_events (event_key, inbox_id, event_day, subject)
    SELECT key, inbox_id, day, subject FROM ev ORDER BY key, day
    ON CONFLICT (event_key, event_day, subject) DO NOTHING
    RETURNING event_key, subject
), msg AS (
    SELECT m.*, fresh.subject
    FROM jsonb_to_recordset($3::jsonb) AS m(
        key text, source text, wamid text, phone_number_id text, sender text, type text,
        ts bigint, contact_name text, message jsonb, inbox_id bigint, user_id text,
        parent_user_id text, username text, waba_id text, display_phone_number text, contact jsonb,
        media_id text, mime_type text)
    JOIN fresh ON fresh.event_key = m.key
), ins_msg AS (
    INSERT INTO inbound_messages
        (wamid, source, phone_number_id, sender, type, timestamp, contact_name, message, inbox_id, subject,
         user_id, parent_user_id, username, waba_id, display_phone_number, contact)
    SELECT DISTINCT ON (wamid)
           wamid, source, phone_number_id, sender, type, to_timestamp(ts), contact_name, message, inbox_id,
           subject, user_id, parent_user_id, username, waba_id, display_phone_number, contact
    FROM msg
    -- wamid cannot be UNIQUE across day partitions: skip one recorded in the last 8 days
    -- (Meta's redelivery window); the dedup key is what makes each event count once.
    -- A probe of the wamid index per message (LIMIT keeps the planner from turning it into
    -- an anti-join: with stale statistics it hashed 8 days of inbound_messages per batch).
    WHERE (SELECT 1 FROM inbound_messages i
           WHERE i.wamid = msg.wamid AND i.received_at > now() - interval '8 days'
           LIMIT 1) IS NULL
    ORDER BY wamid
    RETURNING 1
), ins_media AS (
    -- The media of inbound messages and the number they came to (GET /v1/media/{id}).
    INSERT INTO media (media_id, phone_number_id, origin, mime_type, wamid)
    SELECT DISTINCT ON (media_id) media_id, phone_number_id, 'inbound', mime_type, wamid
    FROM msg
    WHERE media_id IS NOT NULL AND phone_number_id IS NOT NULL
    ORDER BY media_id
    ON CONFLICT (media_id) DO NOTHING
    RETURNING 1
), st AS (
    -- caller: the send API caller's biz_opaque_callback_data of the outbox row the status names.
    SELECT s.*, delivery_rank(s.status) AS rank, fresh.subject,
           (SELECT o.biz_opaque_callback_data FROM outbox o WHERE o.callback_data = s.callback_data)
               AS caller
    FROM jsonb_to_recordset($4::jsonb) AS s(
        key text, source text, wamid text, status text, participant text, recipient text,
        ts bigint, callback_data text, errors jsonb, raw jsonb, inbox_id bigint,
        recipient_user_id text, recipient_parent_user_id text, recipient_username text,
        phone_number_id text, waba_id text, display_phone_number text, contact jsonb)
    JOIN fresh ON fresh.event_key = s.key
), ins_st AS (
    INSERT INTO message_statuses
        (event_key, source, wamid, status, participant, recipient, timestamp, callback_data,
         errors, raw, inbox_id, subject, recipient_user_id, recipient_parent_user_id,
         recipient_username, phone_number_id, waba_id, display_phone_number, contact,
         biz_opaque_callback_data)
    SELECT key, source, wamid, status, participant, recipient, to_timestamp(ts), callback_data,
           errors, raw, inbox_id, subject, recipient_user_id, recipient_parent_user_id,
           recipient_username, phone_number_id, waba_id, display_phone_number, contact, caller
    FROM st
    RETURNING 1
), ids AS (
    -- The phone number/BSUID pairs of the batch, one row per (number, BSUID): the latest pair
    -- in the batch wins, in key order (two consumers upserting the same rows wait for each
    -- other instead of deadlocking). A row already up to date is left alone unless it was
    -- last seen an hour ago, so a busy customer does not rewrite it with every message.
    INSERT INTO customer_ids AS c (phone_number_id, user_id, wa_id, parent_user_id, username)
    SELECT DISTINCT ON (l.phone_number_id, l.user_id)
           l.phone_number_id, l.user_id, l.wa_id, l.parent_user_id, l.username
    FROM ROWS FROM (jsonb_to_recordset($13::jsonb) AS (
            phone_number_id text, user_id text, wa_id text, parent_user_id text, username text))
        WITH ORDINALITY AS l(phone_number_id, user_id, wa_id, parent_user_id, username, n)
    ORDER BY l.phone_number_id, l.user_id, l.n DESC
    ON CONFLICT (phone_number_id, user_id) DO UPDATE SET
        wa_id = coalesce(excluded.wa_id, c.wa_id),
        parent_user_id = coalesce(excluded.parent_user_id, c.parent_user_id),
        username = coalesce(excluded.username, c.username),
        seen_at = now()
    WHERE c.wa_id IS DISTINCT FROM coalesce(excluded.wa_id, c.wa_id)
       OR c.parent_user_id IS DISTINCT FROM coalesce(excluded.parent_user_id, c.parent_user_id)
       OR c.username IS DISTINCT FROM coalesce(excluded.username, c.username)
       OR c.seen_at < now() - interval '1 hour'
    RETURNING 1
), hit AS (
    -- The outbox row named by biz_opaque_callback_data, else the one that has the wamid.
    SELECT coalesce(
               (SELECT o.id FROM outbox o WHERE o.callback_data = st.callback_data),
               (SELECT o.id FROM outbox o WHERE o.wamid = st.wamid ORDER BY o.id LIMIT 1)
           ) AS outbox_id,
           st.wamid, st.status, st.rank, st.errors
    FROM st
), best AS (
    -- Several statuses for one row in one batch: the furthest one wins.
    SELECT DISTINCT ON (outbox_id) outbox_id, wamid, status, rank, errors
    FROM hit
    WHERE outbox_id IS NOT NULL
    ORDER BY outbox_id, rank DESC
), locked AS (
    SELECT o.id FROM outbox o JOIN best ON best.outbox_id = o.id ORDER BY o.id FOR UPDATE OF o
), upd AS (
    -- A status proves the provider accepted the send, whatever we thought: a row still
    -- pending/sending/unknown/review becomes accepted (so it is never sent again).
    -- delivery_status only moves forward (delivery_rank); failed keeps its errors.
    UPDATE outbox o SET
        state = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review')
                     THEN 'accepted' ELSE o.state END,
        accepted_at = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review')
                           THEN coalesce(o.accepted_at, now()) ELSE o.accepted_at END,
        wamid = coalesce(o.wamid, b.wamid),
        delivery_status = CASE WHEN b.rank > delivery_rank(o.delivery_status)
                               THEN b.status ELSE o.delivery_status END,
        delivery_errors = CASE WHEN b.rank > delivery_rank(o.delivery_status) AND b.status = 'failed'
                               THEN b.errors ELSE o.delivery_errors END,
        updated_at = now()
    FROM best b JOIN locked l ON l.id = b.outbox_id
    WHERE o.id = b.outbox_id
    RETURNING 1
), ins_err AS (
    INSERT INTO account_errors (event_key, waba_id, phone_number_id, field, errors, raw, inbox_id, subject)
    SELECT a.key, a.waba_id, a.phone_number_id, a.field, a.errors, a.raw, a.inbox_id, fresh.subject
    FROM jsonb_to_recordset($5::jsonb) AS a(
        key text, waba_id text, phone_number_id text, field text, errors jsonb, raw jsonb, inbox_id bigint)
    JOIN fresh ON fresh.event_key = a.key
    RETURNING 1
), ins_upd AS (
    INSERT INTO account_updates (event_key, waba_id, field, value, inbox_id, subject)
    SELECT u.key, u.waba_id, u.field, u.value, u.inbox_id, fresh.subject
    FROM jsonb_to_recordset($6::jsonb) AS u(
        key text, waba_id text, field text, value jsonb, inbox_id bigint)
    JOIN fresh ON fresh.event_key = u.key
    RETURNING 1
), done AS (
    UPDATE webhook_inbox SET state = 'done', processed_at = now()
    WHERE id = ANY($7::bigint[])
    RETURNING 1
), parked AS (
    -- By id, as `done` (a join with the unnested ids hashed every partition of the inbox when
    -- the planner's estimates were stale); the reason is looked up per parked row, a rare one.
    UPDATE webhook_inbox w SET state = 'dead', attempts = w.attempts + 1,
        last_error = (SELECT d.why FROM unnest($8::bigint[], $9::text[]) AS d(id, why) WHERE d.id = w.id LIMIT 1)
    WHERE w.id = ANY($8::bigint[])
    RETURNING 1
), fwd_in AS (
    -- The transactional outbox towards downstream (docs/forwarding.md, "Storage"): each fresh
    -- event that an enabled destination wants is appended to delivery_events once, its body
    -- rendered once per format the destinations want, and queued for each of them in
    -- delivery_queue, all committed with the event's key or not at all. A redelivered event is
    -- not fresh, so it is never queued twice. $10 is text, parsed only when some destination is
    -- enabled: without destinations the consumers pay nothing here but sending the text.
    SELECT DISTINCT ON (f.key) f.key, f.kind, f.conversation, f.envelope, f.inbox_id, f.number, f.n,
           fresh.subject,
           -- A status of a send of ours carries the send API caller's biz_opaque_callback_data
           -- (tracker: JSON null when it gave none; no row when the status is not of a send of ours).
           (SELECT coalesce(to_jsonb(o.biz_opaque_callback_data), 'null'::jsonb)
            FROM outbox o WHERE f.callback IS NOT NULL AND o.callback_data = f.callback) AS tracker
    FROM ROWS FROM (jsonb_to_recordset(
            CASE WHEN EXISTS (SELECT 1 FROM destinations WHERE enabled) THEN $10::text::jsonb
                 ELSE '[]'::jsonb END) AS (
        key text, kind text, conversation text, envelope jsonb, inbox_id bigint, callback text,
        number text))
        WITH ORDINALITY AS f(key, kind, conversation, envelope, inbox_id, callback, number, n)
    JOIN fresh ON fresh.event_key = f.key
    ORDER BY f.key, f.n
), fwd_want AS (
    -- Which destinations want which event: its kind; a destination limited to numbers only
    -- events of those numbers; a Meta-format one only events that came from Meta.
    SELECT f.n, d.id AS destination_id, d.format, d.ordered
    FROM fwd_in f
    JOIN destinations d ON d.enabled AND f.kind = ANY (d.events)
                       AND (d.numbers IS NULL OR f.number = ANY (d.numbers))
                       AND (d.format = 'standard' OR f.envelope->>'source' = 'meta')
), fwd_ev AS (
    -- In the batch's arrival order, so event ids (the order of a customer's deliveries to a
    -- destination with --ordered) follow it. received_at: a lookup by id per event, not a join
    -- (with stale statistics, as after a burst, the planner hashed the whole webhook_inbox for
    -- every batch); first in the last day's partitions only (pruned when the statement starts),
    -- then, for an older row (a backlog, a replayed webhook), in every partition.
    INSERT INTO delivery_events (lane, received_at, event_key, kind, conversation, body, meta_body)
    SELECT delivery_lane(f.conversation, f.subject),
           coalesce((SELECT w.received_at FROM webhook_inbox w
                     WHERE w.id = f.inbox_id AND w.received_at >= now() - interval '1 day'
                       AND w.received_at <= now()),
                    (SELECT w.received_at FROM webhook_inbox w WHERE w.id = f.inbox_id), now()),
           f.key, f.kind, f.conversation,
           CASE WHEN EXISTS (SELECT 1 FROM fwd_want w WHERE w.n = f.n AND w.format = 'standard')
                THEN convert_to(CASE WHEN f.tracker IS NULL THEN f.envelope
                                     ELSE jsonb_set(f.envelope, '{data,biz_opaque_callback_data}', f.tracker)
                                END::text, 'UTF8') END,
           CASE WHEN EXISTS (SELECT 1 FROM fwd_want w WHERE w.n = f.n AND w.format = 'meta')
                THEN convert_to(meta_webhook(f.envelope, f.tracker)::text, 'UTF8') END
    FROM fwd_in f
    WHERE EXISTS (SELECT 1 FROM fwd_want w WHERE w.n = f.n)
    ORDER BY f.n
    RETURNING id, day, lane, received_at, event_key, conversation
), fwd AS (
    INSERT INTO delivery_queue (destination_id, event_id, received_at, conv, event_day, lane)
    SELECT w.destination_id, e.id, e.received_at,
           CASE WHEN w.ordered THEN delivery_conversation(e.conversation) END, e.day, e.lane
    FROM fwd_ev e
    JOIN fwd_in f ON f.key = e.event_key
    JOIN fwd_want w ON w.n = f.n
    ORDER BY w.destination_id, e.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM fresh) AS fresh,
       (SELECT count(*) FROM msg) AS messages,
       (SELECT count(*) FROM st) AS statuses,
       (SELECT count(*) FROM ins_err) AS account_errors,
       (SELECT count(*) FROM ins_upd) AS account_updates,
       (SELECT count(*) FROM upd) AS outbox_updated,
       (SELECT count(*) FROM ins_msg) AS messages_inserted,
       (SELECT count(*) FROM ins_st) AS statuses_inserted,
       (SELECT count(*) FROM done) AS done,
       (SELECT count(*) FROM parked) AS parked,
       (SELECT count(*) FROM fwd) AS deliveries,
       (SELECT count(*) FROM ids) AS identities,
       (SELECT coalesce(array_agg(event_key), '{}') FROM fresh) AS fresh_keys,
       (SELECT coalesce(jsonb_object_agg(key, caller), '{}') FROM st WHERE caller IS NOT NULL) AS callers;

-- name: inbox_defer
-- The system failed while these rows were being processed (in the transaction that still
-- holds their locks): due again after $2 seconds, the error kept, no attempt counted.
UPDATE webhook_inbox SET
    next_attempt_at = clock_timestamp() + make_interval(secs => $2),
    last_error = $3
WHERE id = ANY($1::bigint[]) AND state = 'pending';

-- name: inbox_notify
SELECT pg_notify('webhook_inbox', '');

-- name: inbox_dead_list
-- $1 limit, $2 since, $3 until (received_at; NULL: open).
SELECT id, source, received_at, delivery_id, attempts, octet_length(body) AS bytes, last_error
FROM webhook_inbox
WHERE state = 'dead'
  AND ($2::timestamptz IS NULL OR received_at >= $2)
  AND ($3::timestamptz IS NULL OR received_at < $3)
ORDER BY id
LIMIT $1;

-- name: inbox_dead_count
SELECT count(*) FROM webhook_inbox
WHERE state = 'dead'
  AND ($1::timestamptz IS NULL OR received_at >= $1)
  AND ($2::timestamptz IS NULL OR received_at < $2);

-- name: inbox_get
SELECT id, source, received_at, delivery_id, state, attempts, body, last_error, processed_at
FROM webhook_inbox WHERE id = $1;

-- name: inbox_dead_replay
-- Dead rows back to pending with a fresh attempt budget; $1 NULL means every dead row,
-- $2/$3 a received_at range (NULL: open).
UPDATE webhook_inbox SET state = 'pending', attempts = 0, next_attempt_at = clock_timestamp()
WHERE state = 'dead' AND ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
  AND ($2::timestamptz IS NULL OR received_at >= $2)
  AND ($3::timestamptz IS NULL OR received_at < $3)
RETURNING id;

-- name: inbox_depth
-- Pending rows on the claim index, counted up to a cap ($1): bounded work every scrape.
SELECT count(*) FROM (SELECT FROM webhook_inbox WHERE state = 'pending' LIMIT $1) x;

-- name: inbox_lag
-- Age in seconds of the oldest pending row (0 when none), due or deferred: a row put off
-- because the database is failing is lag, and the alert on it must fire.
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(received_at)), 0)::float8
FROM webhook_inbox
WHERE state = 'pending';

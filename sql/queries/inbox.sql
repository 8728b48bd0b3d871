-- webhook_inbox: staging by the ingest edge, claims and the batch statement of the consumers,
-- dead letters. processed_webhook_events and the side-effect tables are written by inbox_apply_batch.

-- name: inbox_insert_batch
-- One statement per group-commit batch, rows in arrival order, all in lane $4. The lane comes
-- from its inbox_lanes row: on Citus that table is colocated with webhook_inbox, so the
-- statement reads and writes one shard on one worker and commits without two-phase commit (an
-- INSERT ... SELECT from unnest alone, or inside a CTE, makes the coordinator a second
-- participant; so does RETURNING). A worker's COMMIT that fails is then only a WARNING, which
-- the committer reads (docs/scaling.md). On Citus the table's NOTIFY trigger is gone (it would
-- run on the worker, where no consumer listens): the committer sends inbox_notify after the commit.
INSERT INTO webhook_inbox (lane, source, body, delivery_id)
SELECT l.lane, t.source, t.body, t.delivery_id
FROM inbox_lanes l,
     unnest($1::text[], $2::bytea[], $3::text[]) WITH ORDINALITY AS t(source, body, delivery_id, n)
WHERE l.lane = $4::smallint
ORDER BY t.n;

-- name: inbox_insert_spread
-- Bulk loads (benchmarks, tools): rows in arrival order, each in lane id % 32 (the column's
-- default), one statement.
INSERT INTO webhook_inbox (source, body, delivery_id)
SELECT source, body, delivery_id
FROM unnest($1::text[], $2::bytea[], $3::text[]) WITH ORDINALITY AS t(source, body, delivery_id, n)
ORDER BY n;

-- name: inbox_read
-- The next rows of a set of lanes (gateway/core/lanes.py), in (txid, id) order: each lane's
-- rows of transactions not visible in its done snapshot, visible in its window's snapshot
-- (a lane without a window: its snapshot now), and past its position in that window. A lane's
-- snapshot now is this statement's, or on Citus its head's (inbox_heads: every number up to
-- the head is visible, none after; the rows' txids are the lane's own numbers there). Bodies
-- are read only up to a byte budget ($11; the first row always), so a backlog of 3 MB payloads
-- cannot make one batch huge.
-- $1 the lanes; per lane, at its number + 1: $2 done snapshots, $3 windows (NULL: none),
-- $4/$5 positions (txid, id; NULL without a window); ($6, $7) a key every unread row is past,
-- but for the rows of transactions $8 (running when a done snapshot was taken); $9 most rows.
-- Each row carries the lanes' snapshots now (per lane at lane + 1 on Citus; one PostgreSQL:
-- the statement's, once) and how many rows the limit let through (more than returned: the
-- budget cut the batch).
-- The two scans walk webhook_inbox_log from where unread rows start, never the rows read
-- before, and stop at the limit: a merge of the day partitions' index scans in order (the
-- caller turns enable_sort off for this statement: a sort would read the whole backlog to
-- find its first rows, which a generic plan's guess at the filters' selectivity invites).
-- The lanes' equality (on every scan of webhook_inbox) keeps the read on their shard on Citus
-- (a consumer reads the lanes of one shard at a time: inbox_lanes.shard): the statement runs
-- whole on that worker, the heads read in the same snapshot as the rows.
WITH heads AS MATERIALIZED (
    SELECT h.lane, ((h.seq + 1)::text || ':' || (h.seq + 1)::text || ':')::pg_snapshot AS snap
    FROM inbox_heads h WHERE h.lane = ANY ($1::smallint[])
), a AS MATERIALIZED (
    SELECT $2::text[]::pg_snapshot[] AS dones, $3::text[]::pg_snapshot[] AS wins,
           $4::bigint[]::text[]::xid8[] AS ptx, $5::bigint[] AS pid,
           -- per lane at lane + 1 (NULL without heads: one PostgreSQL), else this statement's
           CASE WHEN EXISTS (SELECT 1 FROM heads)
                THEN ARRAY(SELECT h.snap FROM generate_series(0, 31) AS g(lane)
                           LEFT JOIN heads h ON h.lane = g.lane ORDER BY g.lane) END AS heads,
           pg_current_snapshot() AS now
), r AS (
    (SELECT w.id, w.received_at, w.txid, w.lane, octet_length(w.body) AS size
     FROM webhook_inbox w
     WHERE w.txid >= $6::bigint::text::xid8 AND (w.txid, w.id) > ($6::bigint::text::xid8, $7::bigint)
       AND w.lane = ANY ($1::smallint[])
       AND NOT pg_visible_in_snapshot(w.txid, ((SELECT dones FROM a))[w.lane + 1])
       AND pg_visible_in_snapshot(w.txid, coalesce(((SELECT wins FROM a))[w.lane + 1], ((SELECT heads FROM a))[w.lane + 1], (SELECT now FROM a)))
       AND (((SELECT wins FROM a))[w.lane + 1] IS NULL
            OR (w.txid, w.id) > (((SELECT ptx FROM a))[w.lane + 1], ((SELECT pid FROM a))[w.lane + 1]))
     ORDER BY w.txid, w.id
     LIMIT $9)
    UNION ALL
    (SELECT w.id, w.received_at, w.txid, w.lane, octet_length(w.body) AS size
     FROM webhook_inbox w
     WHERE w.txid = ANY ($8::bigint[]::text[]::xid8[])
       AND (w.txid, w.id) <= ($6::bigint::text::xid8, $7::bigint)
       AND w.lane = ANY ($1::smallint[])
       AND NOT pg_visible_in_snapshot(w.txid, ((SELECT dones FROM a))[w.lane + 1])
       AND pg_visible_in_snapshot(w.txid, coalesce(((SELECT wins FROM a))[w.lane + 1], ((SELECT heads FROM a))[w.lane + 1], (SELECT now FROM a)))
       AND ((SELECT wins FROM a))[w.lane + 1] IS NULL
     ORDER BY w.txid, w.id
     LIMIT $9)
), picked AS (
    SELECT r.id, r.received_at, r.txid, r.lane, r.size FROM r ORDER BY r.txid, r.id LIMIT $9
), budget AS (
    SELECT p.*, sum(p.size) OVER (ORDER BY p.txid, p.id) - p.size AS before FROM picked p
)
SELECT w.id, w.txid::text::bigint AS txid, w.lane, w.source, w.body, w.delivery_id,
       (SELECT coalesce(heads::text[], ARRAY[now::text]) FROM a) AS snapshots,
       (SELECT count(*) FROM picked) AS taken
FROM budget b
-- Each body by its primary key, a lookup per row picked (LIMIT keeps the planner from
-- flattening it into a join, which the lanes' filter, there for Citus's routing, would make
-- a hash join over every partition).
CROSS JOIN LATERAL (
    SELECT x.id, x.txid, x.lane, x.source, x.body, x.delivery_id FROM webhook_inbox x
    WHERE x.id = b.id AND x.received_at = b.received_at AND x.lane = b.lane
      AND x.lane = ANY ($1::smallint[])
    LIMIT 1
) w
WHERE b.before = 0 OR b.before + b.size <= $10
ORDER BY b.txid, b.id;

-- name: inbox_read_mode
-- The consumer's read plans without sorts (see inbox_read) and without seq scans (its bodies
-- are read by primary key, row by row: a generic plan made while today's partition was small
-- would scan the whole partition for each row once it has grown), and its transaction may not
-- sit idle past $1 milliseconds (see gateway/inbound/consumer.py). $2: for the transaction
-- (true), or for the session (false: the connection a consumer loop keeps from batch to batch,
-- set once; the pool's reset, RESET ALL, puts the defaults back when it is given back).
SELECT set_config('enable_sort', 'off', $2), set_config('enable_seqscan', 'off', $2),
       set_config('idle_in_transaction_session_timeout', $1, $2);

-- name: inbox_advance
-- The lanes' cursors moved on their own (windows a read found empty): member $1, $2 as for
-- inbox_advance.
SELECT inbox_advance($1, $2::jsonb);

-- name: inbox_get_row
-- One row again by id, for a row taken alone or moved aside.
SELECT id, txid::text::bigint AS txid, lane, source, body, delivery_id, received_at
FROM webhook_inbox WHERE id = $1;

-- name: lanes_cursors
-- The cursors of lanes $1 that member $2 owns.
SELECT lane, shard, version, done_snap::text AS done, win_snap::text AS win,
       pos_txid::text::bigint AS pos_txid, pos_id
FROM inbox_lanes WHERE lane = ANY ($1::smallint[]) AND owner = $2
ORDER BY lane;

-- name: lanes_member_beat
-- Member $1 is alive; its connection is this one (a member whose backend is gone has died).
-- A member new to the table tells the others (NOTIFY webhook_inbox 'lanes'), so that they make
-- room for it at once rather than at their next renewal.
-- (Identical notifications of one transaction are delivered once.)
WITH beat AS (
    INSERT INTO consumer_members (member, pid, backend_start, seen_at)
    SELECT $1, pg_backend_pid(), a.backend_start, clock_timestamp()
    FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
    ON CONFLICT (member) DO UPDATE SET pid = excluded.pid, backend_start = excluded.backend_start,
                                       seen_at = excluded.seen_at
    RETURNING xmax = 0 AS new
)
SELECT pg_notify('webhook_inbox', 'lanes') FROM beat WHERE new;

-- name: lanes_members
-- The live members: seen within $1 seconds and their connection still open; the others'
-- rows go.
WITH live AS (
    SELECT m.member FROM consumer_members m
    WHERE m.seen_at > clock_timestamp() - make_interval(secs => $1)
      -- (backend_start is hidden from a role that may not see another role's sessions: then
      -- the pid alone says it)
      AND EXISTS (SELECT 1 FROM pg_stat_activity a
                  WHERE a.pid = m.pid AND coalesce(a.backend_start = m.backend_start, true))
), gone AS (
    DELETE FROM consumer_members m WHERE m.member NOT IN (SELECT member FROM live)
      AND m.seen_at < clock_timestamp() - make_interval(secs => $1 * 10)
)
SELECT member FROM live ORDER BY member;

-- name: lanes_shards
SELECT lane, shard FROM inbox_lanes ORDER BY lane;

-- name: lanes_lease
-- Member $1 keeps the lanes $2 it is assigned and may take (free, its own, leased past their
-- time, or held by a member that is not among the live ones $3), each leased for $4 seconds;
-- lanes it owns that are not in $2 are let go. Returns every lane it owns after this, with
-- its cursor, and a row of NULLs when it owns none. (The clock is read once, in a sub-select:
-- Citus refuses volatile functions in an UPDATE of a distributed table, and NOTIFY in its
-- RETURNING; the NOTIFY is on the left of a LEFT JOIN so that it runs whatever was taken.)
WITH clock AS (
    SELECT clock_timestamp() AS now, clock_timestamp() + make_interval(secs => $4) AS until
), let_go AS (
    -- Lanes let go: the member they are assigned to may take them now (one NOTIFY).
    UPDATE inbox_lanes SET owner = NULL, lease_until = NULL
    WHERE owner = $1 AND NOT (lane = ANY ($2::smallint[]))
    RETURNING lane
), took AS (
    UPDATE inbox_lanes l SET owner = $1, lease_until = c.until
    FROM clock c
    WHERE l.lane = ANY ($2::smallint[])
      AND (l.owner IS NULL OR l.owner = $1 OR l.lease_until < c.now OR NOT (l.owner = ANY ($3::text[])))
    RETURNING l.lane, l.shard, l.version, l.done_snap, l.win_snap, l.pos_txid, l.pos_id
)
SELECT k.lane, k.shard, k.version, k.done_snap::text AS done, k.win_snap::text AS win,
       k.pos_txid::text::bigint AS pos_txid, k.pos_id
FROM (SELECT count(*) FROM (SELECT pg_notify('webhook_inbox', 'lanes')::text FROM let_go LIMIT 1) n) told
LEFT JOIN took k ON true
ORDER BY k.lane;

-- name: lanes_release
-- Member $1 lets its lanes go and stays a member; the others are told.
WITH freed AS (
    UPDATE inbox_lanes SET owner = NULL, lease_until = NULL WHERE owner = $1 RETURNING lane
)
SELECT pg_notify('webhook_inbox', 'lanes') FROM freed;

-- name: lanes_leave
-- Member $1 stops: its lanes are free at once, its row goes, and the others are told.
-- (consumer_members stays on the coordinator on Citus: its rows name the coordinator's
-- sessions.)
WITH freed AS (
    UPDATE inbox_lanes SET owner = NULL, lease_until = NULL WHERE owner = $1
), gone AS (
    DELETE FROM consumer_members WHERE member = $1 RETURNING member
)
SELECT pg_notify('webhook_inbox', 'lanes') FROM gone;

-- name: lanes_state
-- Every lane: owner, lease and how far behind its cursor is (for `gateway lanes` and tests).
SELECT l.lane, l.shard, l.owner, l.lease_until, l.version, l.advanced_at,
       l.done_snap::text AS done, l.win_snap::text AS win
FROM inbox_lanes l ORDER BY l.lane;

-- name: inbox_parked_state
SELECT state FROM inbox_parked WHERE inbox_id = $1;

-- name: inbox_parked_claim
-- Whole webhooks moved aside and due again, locked for this transaction.
SELECT p.inbox_id AS id, p.source, p.body, p.delivery_id, p.attempts
FROM inbox_parked p
WHERE p.state = 'retry' AND p.next_attempt_at <= clock_timestamp()
ORDER BY p.next_attempt_at, p.inbox_id
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: inbox_parked_due
-- Whether any whole webhook is due again, without a lock (as dead_events_due, for Citus).
SELECT EXISTS (SELECT 1 FROM inbox_parked WHERE state = 'retry' AND next_attempt_at <= clock_timestamp());

-- name: inbox_parked_attempt
-- A whole webhook failed again where nothing else could be recorded (or could not be stored
-- as events): one attempt; due again after $3 seconds, dead at $2 attempts. Its state.
-- (The clock is read in a sub-select, here and below: Citus refuses volatile functions in an
-- UPDATE of a reference table.)
UPDATE inbox_parked p SET
    attempts = p.attempts + 1,
    state = CASE WHEN p.attempts + 1 >= $2 THEN 'dead' ELSE 'retry' END,
    next_attempt_at = c.due,
    last_error = $4,
    updated_at = c.now
FROM (SELECT clock_timestamp() AS now, clock_timestamp() + make_interval(secs => $3) AS due) c
WHERE p.inbox_id = $1 AND p.state = 'retry'
RETURNING p.state, p.attempts;

-- name: inbox_parked_defer
-- The system failed while these were retried: due again after $2 seconds, no attempt counted.
UPDATE inbox_parked p SET next_attempt_at = c.due, last_error = $3, updated_at = c.now
FROM (SELECT clock_timestamp() AS now, clock_timestamp() + make_interval(secs => $2) AS due) c
WHERE p.inbox_id = ANY ($1::bigint[]) AND p.state = 'retry';

-- name: inbox_move_aside
-- Row $1 of the log, which failed where nothing could be recorded, moves aside to be retried
-- on its own (dead at once when $2 attempts allow no retry) with error $5, due in $6 seconds,
-- and its lane's cursor passes it (member $3, the cursor's advance $4: inbox_advance).
WITH moved AS (
    INSERT INTO inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts,
                              last_error, next_attempt_at)
    SELECT w.id, w.received_at, w.source, w.delivery_id, w.body,
           CASE WHEN $2 <= 1 THEN 'dead' ELSE 'retry' END, 1, $5,
           clock_timestamp() + make_interval(secs => $6)
    FROM webhook_inbox w WHERE w.id = $1
    ON CONFLICT (inbox_id) DO NOTHING
    RETURNING state
)
SELECT (SELECT state FROM moved) AS state, inbox_advance($3, $4::jsonb) AS advanced;

-- name: inbox_apply_batch
-- handle_once for a whole batch in one statement. The keys go into
-- processed_webhook_events first; only keys that were newly inserted (RETURNING) get their
-- side effects, rows that are no payload move aside dead, and the lanes' cursors pass the
-- batch (inbox_advance: only while this consumer still owns them as it read them), all in
-- the caller's transaction: a crash rolls back keys, effects and cursors together, a
-- redelivery finds its key and does nothing, a re-read batch finds its keys.
-- Keys are inserted and outbox rows locked in sorted order so that two consumers touching
-- the same keys or rows wait for each other instead of deadlocking.
-- A key lives in the partition of its event's day ($10, gateway/core/events.py: event_day):
-- a redelivery computes the same day, so ON CONFLICT meets the key it stored before.
-- $1 keys, $2 their inbox ids, $3 messages, $4 statuses, $5 account errors,
-- $6 account updates (jsonb arrays), $7/$8 inbox ids moved aside + why,
-- $9 forwards (JSON text of an array: key, kind, conversation, envelope, inbox_id per event;
-- NULL: the consumer sent none, believing no destination enabled, and if one is, the statement
-- fails with SQLSTATE GWF01, forwards_withheld, for the consumer to send the batch again with them).
-- $10 the keys' event days, $11 their subjects (gateway/core/events.py: subject_of, a pure
-- function of the key: a redelivery brings the same one). The side-effect rows take the
-- subject of their key from `fresh`. $12 the phone number/BSUID pairs the events show
-- (jsonb array: phone_number_id, user_id, wa_id, parent_user_id, username). $13 the member
-- that owns the lanes, $14 their cursors' advance (NULL: none; inbox_advance).
WITH ev AS (
    SELECT key, inbox_id, day, subject
    FROM unnest($1::text[], $2::bigint[], $10::date[], $11::text[]) AS e(key, inbox_id, day, subject)
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
    FROM ROWS FROM (jsonb_to_recordset($12::jsonb) AS (
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
    -- Only the rows the status changes: a report no further than the row's, for a send
    -- accepted with its wamid (Meta's reports arrive out of order), would write a new row
    -- version, or at least a row lock, for nothing. FOR UPDATE checks the condition again on
    -- the row's latest version when another transaction changed it meanwhile.
    SELECT o.id FROM outbox o JOIN best ON best.outbox_id = o.id
    WHERE o.state IN ('pending', 'sending', 'unknown', 'review') OR o.wamid IS NULL
       OR best.rank > delivery_rank(o.delivery_status)
    ORDER BY o.id FOR UPDATE OF o
), upd AS (
    -- A status proves the provider accepted the send, whatever we thought: a row still
    -- pending/sending/unknown/review becomes accepted (so it is never sent again).
    -- delivery_status only moves forward (delivery_rank); failed keeps its errors.
    -- updated_at is when the send's own state last changed (retention and the review list
    -- read it through indexes): a delivery report alone leaves it, so the update changes no
    -- indexed column and is written heap-only, without an entry in each of outbox's twelve
    -- indexes (about a third of a 1 000-event batch's execution when every report did).
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
        updated_at = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review') OR o.wamid IS NULL
                          THEN now() ELSE o.updated_at END
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
), parked AS (
    -- Whole webhooks that are no payload (not JSON, no known shape): moved aside dead with
    -- their bytes and reason, for an operator (each id once in $7).
    INSERT INTO inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts, last_error)
    SELECT w.id, w.received_at, w.source, w.delivery_id, w.body, 'dead', 1, d.why
    FROM unnest($7::bigint[], $8::text[]) AS d(id, why)
    JOIN webhook_inbox w ON w.id = d.id
    ON CONFLICT (inbox_id) DO UPDATE SET state = 'dead', attempts = inbox_parked.attempts + 1,
        last_error = excluded.last_error, updated_at = clock_timestamp()
    RETURNING 1
), fwd_in AS (
    -- The transactional outbox towards downstream (docs/forwarding.md, "Storage"): each fresh
    -- event that an enabled destination wants is appended to delivery_events once, its body
    -- rendered once per format the destinations want, and queued for each of them in
    -- delivery_queue, all committed with the event's key or not at all. A redelivered event is
    -- not fresh, so it is never queued twice. $9 is text, parsed only when some destination is
    -- enabled; without destinations the consumer sends none (NULL), which an enabled
    -- destination refuses (forwards_withheld: the consumer applies the batch again with them).
    -- While destinations take its events the consumer sends each event's bodies rendered (body,
    -- meta_body); otherwise, and for a status naming a callback, the envelope they are
    -- rendered from here (gateway.core.envelope.forward_row).
    SELECT DISTINCT ON (f.key) f.key, f.kind, f.conversation, f.source, f.body, f.meta_body,
           f.envelope, f.inbox_id, f.number, f.n, fresh.subject,
           -- A status of a send of ours carries the send API caller's biz_opaque_callback_data
           -- (tracker: JSON null when it gave none; no row when the status is not of a send of ours).
           (SELECT coalesce(to_jsonb(o.biz_opaque_callback_data), 'null'::jsonb)
            FROM outbox o WHERE f.callback IS NOT NULL AND o.callback_data = f.callback) AS tracker
    FROM ROWS FROM (jsonb_to_recordset(
            CASE WHEN EXISTS (SELECT 1 FROM destinations WHERE enabled)
                 THEN coalesce($9::text, forwards_withheld())::jsonb
                 ELSE '[]'::jsonb END) AS (
        key text, kind text, conversation text, source text, body text, meta_body text,
        envelope jsonb, inbox_id bigint, callback text, number text))
        WITH ORDINALITY AS f(key, kind, conversation, source, body, meta_body, envelope, inbox_id,
                             callback, number, n)
    JOIN fresh ON fresh.event_key = f.key
    ORDER BY f.key, f.n
), fwd_want AS MATERIALIZED (
    -- One row per event some destination wants, carrying all the rows below are written from:
    -- which destinations want it (its kind; a destination limited to numbers only events of
    -- those numbers; a Meta-format one only events that came from Meta) as arrays, in which
    -- formats, and the id of its delivery_events row, drawn in the batch's arrival order (the
    -- subquery's, kept by OFFSET 0) so that event ids (the order of a customer's deliveries to
    -- a destination with --ordered) follow it. The inserts read this CTE alone, joined to
    -- nothing: as joins of CTEs, whose sizes the planner guesses, a batch of n events scanned
    -- the wanted rows once per event (n x 2n rows, ~0.3 s of a 1 000-event batch's 0.4 s).
    -- received_at: a lookup by id per event, not a join (with stale statistics, as after a
    -- burst, the planner hashed the whole webhook_inbox for every batch); first in the last
    -- day's partitions only (pruned when the statement starts), then, for an older row (a
    -- backlog, a replayed webhook), in every partition.
    SELECT nextval('delivery_events_id_seq') AS id, s.*
    FROM (
        SELECT f.*, w.dests, w.ordered, w.standard, w.meta, (now() AT TIME ZONE 'UTC')::date AS day,
               delivery_lane(f.conversation, f.subject) AS lane,
               coalesce((SELECT x.received_at FROM webhook_inbox x
                         WHERE x.id = f.inbox_id AND x.received_at >= now() - interval '1 day'
                           AND x.received_at <= now()),
                        (SELECT x.received_at FROM webhook_inbox x WHERE x.id = f.inbox_id), now()) AS received_at
        FROM fwd_in f
        CROSS JOIN LATERAL (
            SELECT array_agg(d.id) AS dests, array_agg(d.ordered) AS ordered,
                   bool_or(d.format = 'standard') AS standard, bool_or(d.format = 'meta') AS meta
            FROM destinations d
            WHERE d.enabled AND f.kind = ANY (d.events)
              AND (d.numbers IS NULL OR f.number = ANY (d.numbers))
              AND (d.format = 'standard' OR f.source = 'meta')
        ) w
        WHERE w.dests IS NOT NULL
        ORDER BY f.n
        OFFSET 0
    ) s
), fwd_ev AS (
    INSERT INTO delivery_events (id, day, lane, received_at, event_key, kind, conversation, body, meta_body)
    SELECT f.id, f.day, f.lane, f.received_at, f.key, f.kind, f.conversation,
           -- The bodies the consumer rendered, else (a status that names a callback: it came
           -- with its envelope) rendered here with the tracker the outbox has for it.
           CASE WHEN f.standard
                THEN coalesce(convert_to(f.body, 'UTF8'),
                              convert_to(CASE WHEN f.tracker IS NULL THEN f.envelope
                                              ELSE jsonb_set(f.envelope, '{data,biz_opaque_callback_data}', f.tracker)
                                         END::text, 'UTF8')) END,
           CASE WHEN f.meta
                THEN coalesce(convert_to(f.meta_body, 'UTF8'),
                              convert_to(meta_webhook(f.envelope, f.tracker)::text, 'UTF8')) END
    FROM fwd_want f
    ORDER BY f.id
), fwd AS (
    INSERT INTO delivery_queue (destination_id, event_id, received_at, conv, event_day, lane)
    SELECT d.destination_id, f.id, f.received_at,
           CASE WHEN d.ordered THEN delivery_conversation(f.conversation) END, f.day, f.lane
    FROM fwd_want f CROSS JOIN LATERAL unnest(f.dests, f.ordered) AS d(destination_id, ordered)
    ORDER BY d.destination_id, f.id
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
       (SELECT count(*) FROM parked) AS parked,
       (SELECT count(*) FROM fwd) AS deliveries,
       (SELECT count(*) FROM ids) AS identities,
       (SELECT coalesce(array_agg(event_key), '{}') FROM fresh) AS fresh_keys,
       (SELECT coalesce(jsonb_object_agg(key, caller), '{}') FROM st WHERE caller IS NOT NULL) AS callers,
       CASE WHEN $14::jsonb IS NULL THEN 0 ELSE inbox_advance($13, $14::jsonb) END AS advanced;

-- name: inbox_apply_batch_steps
-- inbox_apply_batch on Citus: the same arguments and result (sql/functions/inbox_apply_batch_steps.sql).
SELECT * FROM inbox_apply_batch_steps($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);

-- name: inbox_notify
SELECT pg_notify('webhook_inbox', '');

-- name: inbox_dead_list
-- Whole webhooks parked dead. $1 limit, $2 since, $3 until (received_at; NULL: open).
SELECT inbox_id AS id, source, received_at, delivery_id, attempts, octet_length(body) AS bytes, last_error
FROM inbox_parked
WHERE state = 'dead'
  AND ($2::timestamptz IS NULL OR received_at >= $2)
  AND ($3::timestamptz IS NULL OR received_at < $3)
ORDER BY inbox_id
LIMIT $1;

-- name: inbox_dead_count
SELECT count(*) FROM inbox_parked
WHERE state = 'dead'
  AND ($1::timestamptz IS NULL OR received_at >= $1)
  AND ($2::timestamptz IS NULL OR received_at < $2);

-- name: inbox_get
-- One staged webhook, body included, and what became of it: 'dead' or 'retry' (moved aside),
-- 'pending' (no cursor has read it), else 'done'. A parked webhook is found even once its
-- day partition is gone.
WITH w AS (
    SELECT id, source, received_at, delivery_id, body FROM webhook_inbox WHERE id = $1
), p AS (
    SELECT inbox_id, source, received_at, delivery_id, body, state, attempts, last_error, updated_at
    FROM inbox_parked WHERE inbox_id = $1
)
SELECT coalesce(w.id, p.inbox_id) AS id, coalesce(w.source, p.source) AS source,
       coalesce(w.received_at, p.received_at) AS received_at,
       coalesce(w.delivery_id, p.delivery_id) AS delivery_id,
       coalesce(CASE WHEN p.state IN ('dead', 'retry') THEN p.state END,
                CASE WHEN EXISTS (SELECT 1 FROM inbox_unread() u WHERE u.id = $1) THEN 'pending' END,
                'done') AS state,
       coalesce(p.attempts, 0) AS attempts, coalesce(w.body, p.body) AS body, p.last_error,
       CASE WHEN p.state = 'done' THEN p.updated_at END AS processed_at
FROM w FULL JOIN p ON true;

-- name: inbox_dead_replay
-- Dead whole webhooks due again with a fresh attempt budget; $1 NULL means every dead one,
-- $2/$3 a received_at range (NULL: open).
UPDATE inbox_parked p SET state = 'retry', attempts = 0, next_attempt_at = c.now, updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE p.state = 'dead' AND ($1::bigint[] IS NULL OR p.inbox_id = ANY($1::bigint[]))
  AND ($2::timestamptz IS NULL OR p.received_at >= $2)
  AND ($3::timestamptz IS NULL OR p.received_at < $3)
RETURNING p.inbox_id AS id;

-- name: inbox_parked_done
-- Whole webhooks a retry or a replay processed (kept for the record, then purged); one the
-- retry found to be no payload again stays dead.
UPDATE inbox_parked p SET state = 'done', updated_at = c.now
FROM (SELECT clock_timestamp() AS now) c
WHERE p.inbox_id = ANY ($1::bigint[]) AND p.state = 'retry';

-- name: inbox_depth
-- Rows no cursor has read yet, and whole webhooks waiting for a retry, counted up to a cap
-- ($1): bounded work every scrape, whatever the session (inbox_pending_count).
SELECT inbox_pending_count($1);

-- name: inbox_lag
-- Age in seconds of the oldest webhook not processed yet (0 when none): the oldest unread row
-- (inbox_oldest_unread), or one moved aside and waiting for a retry (a webhook
-- put off because the database is failing is lag, and the alert on it must fire).
SELECT coalesce(extract(epoch FROM clock_timestamp() - least(
           inbox_oldest_unread(),
           (SELECT min(received_at) FROM inbox_parked WHERE state = 'retry'))), 0)::float8;

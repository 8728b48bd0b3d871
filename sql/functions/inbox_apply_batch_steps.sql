-- The consumers' batch on Citus: what inbox_apply_batch (sql/queries/inbox.sql, which says
-- what each part does and why) does in one statement, as a sequence of statements in the
-- caller's transaction, because Citus cannot plan that statement: its correlated subqueries
-- over distributed tables inside data-modifying CTEs. Here each look-up is done once into an
-- array or a JSON map (the outbox rows the statuses name, the wamids already recorded, the
-- webhooks' receipt times) and the writes join those. Same arguments, same result row;
-- gateway.store.inbox.apply_plan runs it when the database is a Citus coordinator. The batch
-- is one distributed transaction (keys on the shards of their subjects, cursors on the lanes'
-- shards, deliveries on the customers' lanes). Citus needs the arguments' values to plan each
-- statement (custom plans). Times are read once into variables: Citus refuses volatile
-- functions, and stable ones over columns, in writes to distributed tables; delivery ranks are
-- spelled out (Citus deparses the inlined delivery_rank's CASE wrongly for the worker).
CREATE OR REPLACE FUNCTION inbox_apply_batch_steps(
    p_keys text[], p_inbox bigint[], p_messages jsonb, p_statuses jsonb, p_errors jsonb,
    p_updates jsonb, p_parked bigint[], p_parked_why text[], p_forwards text, p_days date[],
    p_subjects text[], p_links jsonb, p_member text, p_advance jsonb)
RETURNS TABLE (fresh bigint, messages bigint, statuses bigint, account_errors bigint,
               account_updates bigint, outbox_updated bigint, messages_inserted bigint,
               statuses_inserted bigint, parked bigint, deliveries bigint, identities bigint,
               fresh_keys text[], callers jsonb, advanced integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    f_keys text[];
    keys_sql text;
    f_subjects text[];
    v_now timestamptz := now();
    v_clock timestamptz := clock_timestamp();
    v_hour_ago timestamptz := now() - interval '1 hour';
    v_8_days_ago timestamptz := now() - interval '8 days';
    seen text[];
    cb jsonb;
    n_msg bigint; n_msg_ins bigint; n_st bigint; n_st_ins bigint; n_err bigint; n_upd bigint;
    n_out bigint; n_parked bigint; n_fwd bigint := 0; n_ids bigint; n_adv integer := 0;
    fw jsonb;
    ev_ids bigint[]; ev_days date[]; ev_lanes smallint[]; ev_received timestamptz[]; ev_keys text[];
    ev_convs text[];
    wanted jsonb;
    recv jsonb;
BEGIN
    -- keys: only those newly inserted get side effects. Written as one multi-row VALUES list
    -- (every value quoted by format's %L): Citus sends each shard its rows directly, where an
    -- INSERT ... SELECT from the arrays goes through intermediate results on every worker
    -- (~10 ms against ~140 ms for 100 keys on two workers).
    SELECT string_agg(format('(%L, %s, %L, %L)', e.key, e.inbox_id, e.day, e.subject), ', '
                      ORDER BY e.key, e.day)
    INTO keys_sql
    FROM unnest(p_keys, p_inbox, p_days, p_subjects) AS e(key, inbox_id, day, subject);
    IF keys_sql IS NULL THEN
        f_keys := '{}';
        f_subjects := '{}';
    ELSE
        EXECUTE 'WITH ins AS (INSERT INTO processed_webhook_events (event_key, inbox_id, event_day, subject)'
                || ' VALUES ' || keys_sql
                || ' ON CONFLICT (event_key, event_day, subject) DO NOTHING RETURNING event_key, subject)'
                || ' SELECT coalesce(array_agg(event_key), ''{}''), coalesce(array_agg(subject), ''{}'') FROM ins'
        INTO f_keys, f_subjects;
    END IF;

    -- messages (a wamid recorded in the last 8 days is skipped). A step with nothing to do is
    -- not run: on Citus each of these reads or writes every shard (or, for a reference table,
    -- every node) even for no rows.
    SELECT count(*) INTO n_msg
    FROM jsonb_to_recordset(p_messages) AS m(key text) WHERE m.key = ANY (f_keys);
    seen := '{}';
    IF n_msg > 0 THEN
        SELECT coalesce(array_agg(DISTINCT i.wamid), '{}') INTO seen
        FROM inbound_messages i
        WHERE i.wamid = ANY (ARRAY(SELECT m.wamid FROM jsonb_to_recordset(p_messages) AS m(key text, wamid text)
                                   WHERE m.key = ANY (f_keys)))
          AND i.received_at > v_8_days_ago;
    END IF;
    -- The event tables are written as VALUES lists (insert_values, values_list: a worker's error
    -- keeps its SQLSTATE, and each shard gets its rows directly); jsonb values go as their text,
    -- which the column parses back (a JSON string value would otherwise lose its quotes).
    SELECT insert_values(
               'inbound_messages (wamid, source, phone_number_id, sender, type, timestamp, contact_name,'
               ' message, inbox_id, subject, user_id, parent_user_id, username, waba_id, display_phone_number,'
               ' contact)',
               json_agg(x ORDER BY x.wamid))
    INTO n_msg_ins
    FROM (SELECT DISTINCT ON (m.wamid)
                 m.wamid, m.source, m.phone_number_id, m.sender, m.type, to_timestamp(m.ts) AS ts, m.contact_name,
                 m.message::text, m.inbox_id, f.subject, m.user_id, m.parent_user_id, m.username, m.waba_id,
                 m.display_phone_number, m.contact::text
          FROM jsonb_to_recordset(p_messages) AS m(
              key text, source text, wamid text, phone_number_id text, sender text, type text,
              ts bigint, contact_name text, message jsonb, inbox_id bigint, user_id text,
              parent_user_id text, username text, waba_id text, display_phone_number text, contact jsonb)
          JOIN unnest(f_keys, f_subjects) AS f(key, subject) ON f.key = m.key
          WHERE NOT (m.wamid = ANY (seen))
          ORDER BY m.wamid) x;
    PERFORM insert_values(
                'media (media_id, phone_number_id, origin, mime_type, wamid)',
                json_agg(x ORDER BY x.media_id), 'ON CONFLICT (media_id) DO NOTHING')
    FROM (SELECT DISTINCT ON (m.media_id) m.media_id, m.phone_number_id, 'inbound' AS origin, m.mime_type, m.wamid
          FROM jsonb_to_recordset(p_messages) AS m(key text, wamid text, phone_number_id text,
                                                   media_id text, mime_type text)
          WHERE m.key = ANY (f_keys) AND m.media_id IS NOT NULL AND m.phone_number_id IS NOT NULL
          ORDER BY m.media_id) x;

    -- the send API callers' biz_opaque_callback_data of the outbox rows statuses name
    -- callback_data -> the caller's value (JSON null: none given); absent: not a send of ours
    SELECT count(*) INTO n_st
    FROM jsonb_to_recordset(p_statuses) AS s(key text) WHERE s.key = ANY (f_keys);
    cb := '{}';
    IF n_st > 0 OR p_forwards IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(o.callback_data, coalesce(to_jsonb(o.biz_opaque_callback_data), 'null'::jsonb)), '{}')
        INTO cb
        FROM outbox o
        WHERE o.callback_data = ANY (ARRAY(
            SELECT s.callback_data FROM jsonb_to_recordset(p_statuses) AS s(key text, callback_data text)
            WHERE s.key = ANY (f_keys) AND s.callback_data IS NOT NULL
            UNION
            SELECT f.callback FROM jsonb_to_recordset(coalesce(p_forwards, '[]')::jsonb) AS f(key text, callback text)
            WHERE f.key = ANY (f_keys) AND f.callback IS NOT NULL));
    END IF;
    SELECT insert_values(
               'message_statuses (event_key, source, wamid, status, participant, recipient, timestamp,'
               ' callback_data, errors, raw, inbox_id, subject, recipient_user_id, recipient_parent_user_id,'
               ' recipient_username, phone_number_id, waba_id, display_phone_number, contact,'
               ' biz_opaque_callback_data)',
               json_agg(x))
    INTO n_st_ins
    FROM (SELECT s.key, s.source, s.wamid, s.status, s.participant, s.recipient, to_timestamp(s.ts) AS ts,
                 s.callback_data, s.errors::text, s.raw::text, s.inbox_id, f.subject, s.recipient_user_id,
                 s.recipient_parent_user_id, s.recipient_username, s.phone_number_id, s.waba_id,
                 s.display_phone_number, s.contact::text, cb->>s.callback_data AS tracker
          FROM jsonb_to_recordset(p_statuses) AS s(
              key text, source text, wamid text, status text, participant text, recipient text,
              ts bigint, callback_data text, errors jsonb, raw jsonb, inbox_id bigint,
              recipient_user_id text, recipient_parent_user_id text, recipient_username text,
              phone_number_id text, waba_id text, display_phone_number text, contact jsonb)
          JOIN unnest(f_keys, f_subjects) AS f(key, subject) ON f.key = s.key) x;

    -- customer identities (reference table): the latest pair of the batch per (number, BSUID).
    -- A VALUES list too, its times spelled as literals: Citus sends this statement to every
    -- node, and one with the function's variables as parameters failed there ("could not
    -- determine data type of parameter $1").
    SELECT insert_values(
               'customer_ids AS c (phone_number_id, user_id, wa_id, parent_user_id, username)',
               json_agg(x ORDER BY x.phone_number_id, x.user_id),
               format('ON CONFLICT (phone_number_id, user_id) DO UPDATE SET'
                      '     wa_id = coalesce(excluded.wa_id, c.wa_id),'
                      '     parent_user_id = coalesce(excluded.parent_user_id, c.parent_user_id),'
                      '     username = coalesce(excluded.username, c.username),'
                      '     seen_at = %L'
                      ' WHERE c.wa_id IS DISTINCT FROM coalesce(excluded.wa_id, c.wa_id)'
                      '    OR c.parent_user_id IS DISTINCT FROM coalesce(excluded.parent_user_id, c.parent_user_id)'
                      '    OR c.username IS DISTINCT FROM coalesce(excluded.username, c.username)'
                      '    OR c.seen_at < %L',
                      v_now, v_hour_ago))
    INTO n_ids
    FROM (SELECT DISTINCT ON (l.phone_number_id, l.user_id)
                 l.phone_number_id, l.user_id, l.wa_id, l.parent_user_id, l.username
          FROM ROWS FROM (jsonb_to_recordset(p_links) AS (
                  phone_number_id text, user_id text, wa_id text, parent_user_id text, username text))
              WITH ORDINALITY AS l(phone_number_id, user_id, wa_id, parent_user_id, username, n)
          ORDER BY l.phone_number_id, l.user_id, l.n DESC) x;

    -- outbox rows the statuses prove accepted (outbox is on one shard: one router statement);
    -- a delivery report alone leaves updated_at, as inbox_apply_batch says
    n_out := 0;
    IF n_st > 0 THEN
    WITH st AS (
        SELECT s.*, coalesce(array_position(ARRAY['sent', 'delivered', 'read', 'played', 'failed'], s.status), 0) AS rank
        FROM jsonb_to_recordset(p_statuses::jsonb) AS s(key text, wamid text, status text, callback_data text, errors jsonb)
        WHERE s.key = ANY (f_keys::text[])
    ), hit AS (
        SELECT coalesce(
                   (SELECT o.id FROM outbox o WHERE o.callback_data = st.callback_data),
                   (SELECT o.id FROM outbox o WHERE o.wamid = st.wamid ORDER BY o.id LIMIT 1)
               ) AS outbox_id, st.wamid, st.status, st.rank, st.errors
        FROM st
    ), best AS (
        SELECT DISTINCT ON (outbox_id) outbox_id, wamid, status, rank, errors
        FROM hit WHERE outbox_id IS NOT NULL ORDER BY outbox_id, rank DESC
    ), locked AS (
        -- Only the rows the status changes (as in the batch statement, sql/queries/inbox.sql).
        SELECT o.id FROM outbox o JOIN best ON best.outbox_id = o.id
        WHERE o.state IN ('pending', 'sending', 'unknown', 'review') OR o.wamid IS NULL
           OR best.rank > coalesce(array_position(ARRAY['sent', 'delivered', 'read', 'played', 'failed'], o.delivery_status), 0)
        ORDER BY o.id FOR UPDATE OF o
    )
    UPDATE outbox o SET
        state = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review') THEN 'accepted' ELSE o.state END,
        accepted_at = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review')
                           THEN coalesce(o.accepted_at, v_now::timestamptz) ELSE o.accepted_at END,
        wamid = coalesce(o.wamid, b.wamid),
        delivery_status = CASE WHEN b.rank > coalesce(array_position(ARRAY['sent', 'delivered', 'read', 'played', 'failed'], o.delivery_status), 0) THEN b.status ELSE o.delivery_status END,
        delivery_errors = CASE WHEN b.rank > coalesce(array_position(ARRAY['sent', 'delivered', 'read', 'played', 'failed'], o.delivery_status), 0) AND b.status = 'failed'
                               THEN b.errors ELSE o.delivery_errors END,
        updated_at = CASE WHEN o.state IN ('pending', 'sending', 'unknown', 'review') OR o.wamid IS NULL
                          THEN v_now::timestamptz ELSE o.updated_at END
    FROM best b JOIN locked l ON l.id = b.outbox_id
    WHERE o.id = b.outbox_id;
    GET DIAGNOSTICS n_out = ROW_COUNT;
    END IF;

    SELECT insert_values(
               'account_errors (event_key, waba_id, phone_number_id, field, errors, raw, inbox_id, subject)',
               json_agg(x))
    INTO n_err
    FROM (SELECT a.key, a.waba_id, a.phone_number_id, a.field, a.errors::text, a.raw::text, a.inbox_id, f.subject
          FROM jsonb_to_recordset(p_errors) AS a(
              key text, waba_id text, phone_number_id text, field text, errors jsonb, raw jsonb, inbox_id bigint)
          JOIN unnest(f_keys, f_subjects) AS f(key, subject) ON f.key = a.key) x;
    SELECT insert_values('account_updates (event_key, waba_id, field, value, inbox_id, subject)', json_agg(x))
    INTO n_upd
    FROM (SELECT u.key, u.waba_id, u.field, u.value::text, u.inbox_id, f.subject
          FROM jsonb_to_recordset(p_updates) AS u(key text, waba_id text, field text, value jsonb, inbox_id bigint)
          JOIN unnest(f_keys, f_subjects) AS f(key, subject) ON f.key = u.key) x;

    -- whole webhooks that are no payload: moved aside dead (the bodies read first: inbox_parked
    -- is a reference table, written on every node from a VALUES list)
    n_parked := 0;
    IF cardinality(p_parked) > 0 THEN
        -- (objects built on the workers: Citus cannot ship a whole row of a distributed table)
        SELECT insert_values(
                   'inbox_parked (inbox_id, received_at, source, delivery_id, body, state, attempts, last_error)',
                   json_agg(json_build_object('id', w.id, 'received_at', w.received_at, 'source', w.source,
                                              'delivery_id', w.delivery_id, 'body', w.body, 'state', 'dead',
                                              'attempts', 1, 'why', d.why) ORDER BY w.id),
                   'ON CONFLICT (inbox_id) DO UPDATE SET state = ''dead'', attempts = inbox_parked.attempts + 1,'
                   ' last_error = excluded.last_error, updated_at = excluded.updated_at')
        INTO n_parked
        FROM webhook_inbox w JOIN unnest(p_parked, p_parked_why) AS d(id, why) ON d.id = w.id
        WHERE w.id = ANY (p_parked);
    END IF;

    -- deliveries: the events an enabled destination wants, their bodies once per format (a
    -- consumer of the release before renders none and sends no source: its envelope has both).
    -- No forwards (NULL) while a destination is enabled: refused by forwards_withheld.
    IF p_forwards IS NULL AND cardinality(f_keys) > 0 AND EXISTS (SELECT 1 FROM destinations WHERE enabled) THEN
        PERFORM forwards_withheld();
    END IF;
    IF EXISTS (SELECT 1 FROM destinations WHERE enabled) AND p_forwards IS NOT NULL THEN
        fw := p_forwards::jsonb;
        SELECT coalesce(jsonb_object_agg(w.id::text, w.received_at), '{}') INTO recv
        FROM webhook_inbox w
        WHERE w.id = ANY (ARRAY(SELECT f.inbox_id FROM jsonb_to_recordset(fw) AS f(key text, inbox_id bigint)
                                WHERE f.key = ANY (f_keys)));
        WITH fwd_in AS (
            SELECT DISTINCT ON (f.key) f.key, f.kind, f.conversation, f.source, f.body, f.meta_body,
                   f.envelope, f.inbox_id, f.number, f.n, fk.subject,
                   CASE WHEN f.callback IS NOT NULL THEN cb->f.callback END AS tracker_known
            FROM ROWS FROM (jsonb_to_recordset(fw) AS (
                key text, kind text, conversation text, source text, body text, meta_body text,
                envelope jsonb, inbox_id bigint, callback text, number text))
                WITH ORDINALITY AS f(key, kind, conversation, source, body, meta_body, envelope, inbox_id,
                                     callback, number, n)
            JOIN unnest(f_keys, f_subjects) AS fk(key, subject) ON fk.key = f.key
            ORDER BY f.key, f.n
        ), want AS (
            -- per event, the destinations that want it (a JSON array: the queue's insert looks
            -- them up by key) and the formats they want, as columns: as a set of (event,
            -- destination) rows tested per event, a batch of n events read 2n rows n times
            SELECT f.*, w.standard, w.meta, w.dests
            FROM fwd_in f
            CROSS JOIN LATERAL (
                SELECT bool_or(d.format = 'standard') AS standard, bool_or(d.format = 'meta') AS meta,
                       jsonb_agg(jsonb_build_object('id', d.id, 'ordered', d.ordered)) AS dests
                FROM destinations d
                WHERE d.enabled AND f.kind = ANY (d.events)
                  AND (d.numbers IS NULL OR f.number = ANY (d.numbers))
                  AND (d.format = 'standard' OR coalesce(f.source, f.envelope->>'source') = 'meta')
            ) w
            WHERE w.standard IS NOT NULL
        ), ev AS (
            INSERT INTO delivery_events (lane, received_at, event_key, kind, conversation, body, meta_body)
            SELECT delivery_lane(f.conversation, f.subject),
                   coalesce((recv->>f.inbox_id::text)::timestamptz, v_now),
                   f.key, f.kind, f.conversation,
                   -- the consumer's bodies, else (a status naming a callback) rendered here
                   CASE WHEN f.standard
                        THEN coalesce(convert_to(f.body, 'UTF8'),
                                      convert_to(CASE WHEN f.tracker_known IS NULL THEN f.envelope
                                                      ELSE jsonb_set(f.envelope, '{data,biz_opaque_callback_data}', f.tracker_known)
                                                 END::text, 'UTF8')) END,
                   CASE WHEN f.meta
                        THEN coalesce(convert_to(f.meta_body, 'UTF8'),
                                      convert_to(meta_webhook(f.envelope, f.tracker_known)::text, 'UTF8')) END
            FROM want f
            ORDER BY f.n
            RETURNING id, day, lane, received_at, event_key, conversation
        )
        SELECT array_agg(id), array_agg(day), array_agg(lane), array_agg(received_at), array_agg(event_key),
               array_agg(conversation), (SELECT jsonb_object_agg(w.key, w.dests) FROM want w)
        INTO ev_ids, ev_days, ev_lanes, ev_received, ev_keys, ev_convs, wanted FROM ev;
        IF ev_ids IS NOT NULL THEN
            -- each event's destinations looked up by key in the map, not joined: a join of two
            -- function scans read the batch's events once per event
            INSERT INTO delivery_queue (destination_id, event_id, received_at, conv, event_day, lane)
            SELECT (d->>'id')::bigint, e.id, e.received_at,
                   CASE WHEN (d->>'ordered')::boolean THEN delivery_conversation(e.conv) END, e.day, e.lane
            FROM unnest(ev_ids, ev_days, ev_lanes, ev_received, ev_keys, ev_convs)
                     AS e(id, day, lane, received_at, key, conv)
            CROSS JOIN LATERAL jsonb_array_elements(wanted->e.key) AS d
            ORDER BY (d->>'id')::bigint, e.id;
            GET DIAGNOSTICS n_fwd = ROW_COUNT;
        END IF;
    END IF;

    IF p_advance IS NOT NULL THEN
        n_adv := inbox_advance(p_member, p_advance);
    END IF;
    RETURN QUERY SELECT cardinality(f_keys)::bigint, n_msg, n_st, n_err, n_upd, n_out, n_msg_ins, n_st_ins,
                        n_parked, n_fwd, n_ids, f_keys,
                        coalesce((SELECT jsonb_object_agg(s.key, cb->>s.callback_data)
                                  FROM jsonb_to_recordset(p_statuses) AS s(key text, callback_data text)
                                  WHERE s.key = ANY (f_keys) AND cb->>s.callback_data IS NOT NULL), '{}'),
                        n_adv;
END;
$fn$;

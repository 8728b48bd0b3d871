-- The current schema: what a fresh `gateway migrate` leaves (sql/migrations, then
-- sql/functions), as pg_dump --schema-only shows it. Generated for reading; never applied.
-- Do not edit: after a schema change regenerate it with `make schema` and review the diff
-- (tests/integration/test_migrations.py fails while it is stale). Day partitions
-- (<table>_pYYYYMMDD) are left out: they follow the calendar.

--
-- TYPE: breaker_tally
--

CREATE TYPE public.breaker_tally AS (
	destination_id bigint,
	ok boolean,
	fails integer
);


--
-- TYPE: delivery_outcome
--

CREATE TYPE public.delivery_outcome AS (
	destination_id bigint,
	event_id bigint,
	state text,
	delay_s double precision,
	status integer,
	error text
);


--
-- TYPE: delivery_ref
--

CREATE TYPE public.delivery_ref AS (
	destination_id bigint,
	event_id bigint
);


--
-- FUNCTION: claim_reply(text, text)
--

CREATE FUNCTION public.claim_reply(p_inbound_wamid text, p_claimed_by text) RETURNS boolean
    LANGUAGE sql
    AS $$
    SELECT NOT EXISTS (SELECT 1 FROM reply_claim(p_inbound_wamid, p_claimed_by, NULL, NULL, false));
$$;


--
-- FUNCTION: deliveries_notify()
--

CREATE FUNCTION public.deliveries_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify('deliveries', coalesce(current_setting('gateway.forwarder', true), ''));
    END IF;
    RETURN NULL;
END;
$$;


--
-- FUNCTION: delivery_conversation(text)
--

CREATE FUNCTION public.delivery_conversation(conversation text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN conversation <> '' THEN hashtextextended(conversation, 0) END;
$$;


--
-- FUNCTION: delivery_lane(text, text)
--

CREATE FUNCTION public.delivery_lane(conversation text, subject text) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (hashtextextended(coalesce(nullif(conversation, ''), subject), 0) & 31)::smallint;
$$;


--
-- FUNCTION: delivery_rank(text)
--

CREATE FUNCTION public.delivery_rank(status text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE status
        WHEN 'sent' THEN 1
        WHEN 'delivered' THEN 2
        WHEN 'read' THEN 3
        WHEN 'played' THEN 4
        WHEN 'failed' THEN 5
        ELSE 0
    END;
$$;


--
-- FUNCTION: delivery_webhook_id(text, text)
--

CREATE FUNCTION public.delivery_webhook_id(destination text, event_key text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT 'wh_' || left(encode(sha256(convert_to(destination || '/' || event_key, 'UTF8')), 'hex'), 32);
$$;


--
-- FUNCTION: event_subject(text)
--

CREATE FUNCTION public.event_subject(event_key text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $_$
    SELECT CASE
        WHEN event_key LIKE 'msg:%' OR event_key LIKE 'evt:%' THEN substr(event_key, 5)
        -- The wamid is everything between 'status:' and the last two ':' (status, participant).
        WHEN event_key ~ '^status:.*:[^:]*:[^:]*$' THEN substring(event_key FROM '^status:(.*):[^:]*:[^:]*$')
        ELSE event_key
    END;
$_$;


--
-- FUNCTION: forward_round(text, public.delivery_outcome[], public.delivery_ref[], public.breaker_tally[], bigint[], integer, smallint[], double precision, integer, boolean, double precision)
--

CREATE FUNCTION public.forward_round(p_forwarder text, p_outcomes public.delivery_outcome[], p_held public.delivery_ref[], p_tallies public.breaker_tally[], p_gone bigint[], p_limit integer, p_lanes smallint[], p_lease_s double precision, p_breaker_failures integer, p_housekeeping boolean, p_cooldown_s double precision) RETURNS TABLE(kind text, destination_id bigint, event_id bigint, event_key text, body bytea, attempts integer, received_at double precision, window_start double precision, destination text, url text, secret text, previous_secret text, ordered boolean, meta boolean, old_state text, new_state text, lane smallint)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    -- what this round claims (its queue rows, in claim order), and their events' days
    c_rows delivery_queue[] := '{}';
    c_days date[] := '{}';
    -- the round's clock, read once after the lock: a Citus coordinator refuses volatile
    -- functions in its UPDATEs and DELETEs, and plans the variable as a constant
    v_now timestamptz;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true), pg_advisory_xact_lock(28832985044316772);
    v_now := clock_timestamp();

    -- Outcomes: a delivered one leaves the queue, any other is updated; each is logged.
    IF cardinality(p_outcomes) > 0 THEN
        WITH mine AS (
            SELECT o.*, v_now + make_interval(secs => o.delay_s) AS next_due FROM unnest(p_outcomes) AS o
            WHERE (o.destination_id, o.event_id) IN (
                SELECT l.destination_id, h.id
                FROM delivery_leases l CROSS JOIN LATERAL unnest(l.ids) AS h(id)
                WHERE l.forwarder = p_forwarder)
        ), sent AS (
            DELETE FROM delivery_queue q USING mine m
            WHERE m.state = 'delivered' AND q.destination_id = m.destination_id AND q.event_id = m.event_id
              AND (p_lanes IS NULL OR q.lane = ANY (p_lanes))
            RETURNING q.destination_id, q.event_id, q.received_at, q.event_day, q.lane,
                      q.attempts + 1 AS attempt, m.state, m.status, m.error
        ), kept AS (
            UPDATE delivery_queue q SET
                attempts = q.attempts + 1,
                due = CASE WHEN m.state = 'pending' THEN m.next_due ELSE q.due END,
                failed = m.state = 'failed',
                last_status = m.status,
                last_error = m.error
            FROM mine m
            WHERE m.state <> 'delivered' AND q.destination_id = m.destination_id AND q.event_id = m.event_id
              AND (p_lanes IS NULL OR q.lane = ANY (p_lanes))
            RETURNING q.destination_id, q.event_id, q.received_at, q.event_day, q.lane, q.attempts AS attempt,
                      m.state, m.status, m.error
        )
        INSERT INTO delivery_log
            (day, at, destination_id, event_id, received_at, event_day, attempt, lane, status, outcome, error)
        SELECT (now() AT TIME ZONE 'UTC')::date, now(), w.destination_id, w.event_id, w.received_at,
               w.event_day, w.attempt, w.lane, w.status, w.state, w.error
        FROM (SELECT * FROM sent UNION ALL SELECT * FROM kept) w;
    END IF;

    -- Breakers: only rows whose count or state changes are written (the common all-2xx round
    -- writes none).
    IF cardinality(p_tallies) > 0 THEN
        RETURN QUERY
        WITH n AS (
            SELECT d.id, d.breaker_state AS old, d.consecutive_failures AS old_fails, t.ok,
                   t.fails AS new_fails,
                   CASE WHEN t.ok THEN t.fails ELSE d.consecutive_failures + t.fails END AS fails
            FROM unnest(p_tallies) AS t JOIN destinations d ON d.id = t.destination_id
        ), s AS (
            SELECT n.*,
                   CASE WHEN n.fails >= p_breaker_failures OR (n.old = 'half_open' AND n.new_fails > 0) THEN 'open'
                        -- An open breaker is closed only by its half-open probe: a 2xx now comes
                        -- from a request sent before it opened and says little (else it flaps).
                        WHEN n.ok AND n.old <> 'open' THEN 'closed'
                        ELSE n.old END AS state
            FROM n
        ), brk AS (
            UPDATE destinations d SET
                consecutive_failures = s.fails,
                breaker_state = s.state,
                breaker_changed_at = CASE WHEN s.state <> s.old THEN v_now ELSE d.breaker_changed_at END
            FROM s
            WHERE d.id = s.id AND (s.state <> s.old OR s.fails <> s.old_fails)
            RETURNING d.name, s.old, s.state AS new
        )
        SELECT 'breaker'::text, NULL::bigint, NULL::bigint, NULL::text, NULL::bytea, NULL::int, NULL::float8,
               NULL::float8, brk.name, NULL::text, NULL::text, NULL::text, NULL::boolean, NULL::boolean,
               brk.old, brk.new, NULL::smallint
        FROM brk WHERE brk.old <> brk.new;
    END IF;
    -- Destinations that answered 410 Gone: disabled (no breaker count); nothing more is claimed
    -- for them.
    IF cardinality(p_gone) > 0 THEN
        RETURN QUERY
        UPDATE destinations SET enabled = false, updated_at = now()
        WHERE id = ANY (p_gone) AND enabled
        RETURNING 'disabled'::text, NULL::bigint, NULL::bigint, NULL::text, NULL::bytea, NULL::int,
                  NULL::float8, NULL::float8, name, NULL::text, NULL::text, NULL::text, NULL::boolean,
                  NULL::boolean, NULL::text, NULL::text, NULL::smallint;
    END IF;

    -- The claim: with the breakers as this round left them; the leases as they were before it
    -- (what this round finished is still held there: its room is given back). None without a
    -- destination that may be sent to (on Citus the claim is a query on a worker).
    IF p_limit > 0 AND EXISTS (SELECT 1 FROM destinations WHERE enabled AND breaker_state <> 'open') THEN
        WITH leased AS (
            SELECT l.forwarder, l.destination_id, h.id
            FROM delivery_leases l CROSS JOIN LATERAL unnest(l.ids) AS h(id)
        ), held AS (
            SELECT x.destination_id, count(*)::int AS n,
                   count(*) FILTER (WHERE x.forwarder = p_forwarder AND (x.destination_id, x.id) IN (
                       SELECT o.destination_id, o.event_id FROM unnest(p_outcomes) AS o))::int AS freed
            FROM leased x GROUP BY x.destination_id
        ), dest AS (
            SELECT d.id, d.due_from,
                   CASE WHEN d.breaker_state = 'half_open' THEN 1 ELSE d.max_in_flight END
                   - coalesce(h.n, 0) + coalesce(h.freed, 0) AS room
            FROM destinations d LEFT JOIN held h ON h.destination_id = d.id
            WHERE d.enabled AND d.breaker_state <> 'open'
        ), picked AS (
            SELECT c.*
            FROM dest
            CROSS JOIN LATERAL (
                SELECT q, q.event_id, q.event_day, q.due
                FROM delivery_queue q
                WHERE q.destination_id = dest.id
                  AND NOT q.failed
                  AND q.due >= dest.due_from  -- past the dead index entries (see above)
                  AND q.due <= v_now
                  AND (p_lanes IS NULL OR q.lane = ANY (p_lanes))
                  -- held ones: in flight, or finished in this round
                  AND (q.destination_id, q.event_id) NOT IN (SELECT x.destination_id, x.id FROM leased x)
                  AND (q.conv IS NULL OR NOT EXISTS (
                        SELECT 1 FROM delivery_queue e
                        WHERE e.destination_id = q.destination_id
                          -- a conversation's deliveries share a lane (named for Citus's pruning)
                          AND e.lane = q.lane AND (p_lanes IS NULL OR e.lane = ANY (p_lanes))
                          AND e.conv = q.conv
                          AND e.event_id < q.event_id
                          AND NOT e.failed))
                ORDER BY q.due, q.event_id
                LIMIT least(dest.room, p_limit)
                FOR UPDATE OF q SKIP LOCKED
            ) c
            WHERE dest.room > 0
            ORDER BY c.due, c.event_id
            LIMIT p_limit
        )
        SELECT coalesce(array_agg(p.q ORDER BY p.due, p.event_id), '{}'),
               coalesce(array_agg(DISTINCT p.event_day), '{}')
        INTO c_rows, c_days
        FROM picked p;
    END IF;

    -- The forwarder's leases: what it still holds (p_held: a delivery it does not name, a claim
    -- whose answer it never got, is dropped and due again), less what it finished, and what it
    -- claimed; every lease of this forwarder renewed, an empty one too. Only what its lease
    -- still held is kept: a lease that ran out was deleted, and its deliveries may be another
    -- forwarder's now. The four sets are told apart by one grouping of their union (a hash or
    -- a sort, linear whatever the plan): as joins, a generic plan (which guesses 10 rows for
    -- an array parameter) unnested the lease's array once per held delivery, leases x held
    -- pairs, 25 ms a round at 300 held. Written only when the round
    -- changes what the forwarder holds or a lease has used a tenth of its time: an idle round
    -- reads and writes nothing (delivery_leases is a reference table on Citus, where a write,
    -- even of no rows, is a two-phase commit on every node).
    IF cardinality(p_outcomes) > 0 OR cardinality(c_rows) > 0 OR EXISTS (
        SELECT 1 FROM delivery_leases l0
        WHERE l0.forwarder = p_forwarder
          AND (l0.lease_until < v_now + make_interval(secs => 0.9 * p_lease_s)
               OR EXISTS (SELECT 1 FROM unnest(l0.ids) AS h(id)
                          WHERE (l0.destination_id, h.id) NOT IN (SELECT x.destination_id, x.event_id
                                                                  FROM unnest(p_held) x)))
    ) THEN
        INSERT INTO delivery_leases AS l (forwarder, destination_id, ids, lease_until)
        SELECT p_forwarder, k.destination_id, coalesce(array_agg(k.id) FILTER (WHERE k.id IS NOT NULL), '{}'),
               v_now + make_interval(secs => p_lease_s)
        FROM (
            SELECT t.destination_id, t.id
            FROM (
                SELECT l0.destination_id, h.id, 0 AS src
                FROM delivery_leases l0 CROSS JOIN LATERAL unnest(l0.ids) AS h(id)
                WHERE l0.forwarder = p_forwarder
                UNION ALL SELECT x.destination_id, x.event_id, 1 FROM unnest(p_held) x
                UNION ALL SELECT o.destination_id, o.event_id, 2 FROM unnest(p_outcomes) o
                UNION ALL SELECT x.destination_id, x.event_id, 3 FROM unnest(c_rows) x
            ) t(destination_id, id, src)
            GROUP BY t.destination_id, t.id
            -- leased, still held and not finished; or claimed now
            HAVING (bool_or(t.src = 0) AND bool_or(t.src = 1) AND NOT bool_or(t.src = 2)) OR bool_or(t.src = 3)
            UNION ALL
            SELECT l1.destination_id, NULL FROM delivery_leases l1 WHERE l1.forwarder = p_forwarder
        ) k(destination_id, id)
        GROUP BY k.destination_id
        ON CONFLICT (forwarder, destination_id)
            DO UPDATE SET ids = excluded.ids, lease_until = excluded.lease_until;
    END IF;
    -- Then the claimed deliveries with their bodies (none claimed: no statement): delivery_events
    -- is read in the partitions of the claim's days only (c_days, a parameter: pruned when the
    -- statement starts, instead of an index probe into every day per delivery).
    IF cardinality(c_rows) > 0 THEN
    RETURN QUERY
    SELECT 'claimed'::text, c.destination_id, c.event_id, e.event_key,
           CASE WHEN d.format = 'meta' THEN e.meta_body ELSE e.body END, c.attempts + 1,
           extract(epoch FROM c.received_at)::float8, extract(epoch FROM c.window_start)::float8,
           d.name, d.url, d.secret,
           -- during a rotation's grace period, signed with the previous secret too (a
           -- Meta-format receiver verifies one signature: its secret switches at once)
           CASE WHEN d.format = 'standard' AND d.previous_secret_until > v_now
                THEN d.previous_secret END,
           d.ordered, d.format = 'meta', NULL::text, NULL::text, c.lane
    FROM unnest(c_rows) WITH ORDINALITY AS c
    JOIN destinations d ON d.id = c.destination_id
    -- One primary-key probe per claimed delivery, whatever the statistics say: as a plain
    -- join, a plan made before the first ANALYZE of a day's partition (a new database's
    -- first minute, each new day's first minute) read the whole partition in every round.
    LEFT JOIN LATERAL (
        SELECT e.event_key, e.body, e.meta_body
        FROM delivery_events e
        WHERE e.id = c.event_id AND e.day = c.event_day AND e.lane = c.lane AND e.day = ANY (c_days)
          AND (p_lanes IS NULL OR e.lane = ANY (p_lanes))
        LIMIT 1
    ) e ON true
    ORDER BY c.ordinality;
    END IF;

    -- Housekeeping writes only what changes (the same reason: reference tables on Citus).
    IF p_housekeeping THEN
        IF EXISTS (SELECT 1 FROM delivery_leases WHERE lease_until < v_now) THEN
            DELETE FROM delivery_leases WHERE lease_until < v_now;
        END IF;
        -- Lowered whenever it must be; raised only by more than a second (not a write of
        -- every destination row twice a second for nothing). With no destination, no statement.
        IF NOT EXISTS (SELECT 1 FROM destinations WHERE enabled) THEN
            NULL;
        ELSIF p_lanes IS NULL THEN
            UPDATE destinations d SET due_from = b.due_from
            FROM (
                SELECT x.id, least(
                           (SELECT min(q.due) FROM delivery_queue q WHERE q.destination_id = x.id AND NOT q.failed),
                           v_now - interval '10 seconds') AS due_from
                FROM destinations x WHERE x.enabled
            ) b
            WHERE d.id = b.id
              AND (b.due_from < d.due_from OR b.due_from > d.due_from + interval '1 second');
        ELSE
            -- A round of some lanes (a Citus coordinator's, one shard's lanes): the bound is
            -- still every lane's, and a query correlated per destination over a distributed
            -- table is refused there: one aggregate over the queue (each shard's minima).
            -- (Nor may it add an interval to a column, a STABLE function there: the difference
            -- of two timestamps is immutable.)
            UPDATE destinations d SET due_from = b.due_from
            FROM (
                SELECT x.id, least(m.due, v_now - interval '10 seconds') AS due_from
                FROM destinations x
                LEFT JOIN (SELECT q.destination_id, min(q.due) AS due FROM delivery_queue q
                           WHERE NOT q.failed GROUP BY q.destination_id) m ON m.destination_id = x.id
                WHERE x.enabled
            ) b
            WHERE d.id = b.id
              AND (b.due_from < d.due_from OR b.due_from - d.due_from > interval '1 second');
        END IF;
        IF EXISTS (SELECT 1 FROM destinations WHERE breaker_state = 'open'
                   AND breaker_changed_at <= v_now - make_interval(secs => p_cooldown_s)) THEN
        RETURN QUERY
        UPDATE destinations SET breaker_state = 'half_open', breaker_changed_at = now()
        WHERE breaker_state = 'open'
          AND breaker_changed_at <= v_now - make_interval(secs => p_cooldown_s)
        RETURNING 'half_open'::text, NULL::bigint, NULL::bigint, NULL::text, NULL::bytea, NULL::int,
                  NULL::float8, NULL::float8, name, NULL::text, NULL::text, NULL::text, NULL::boolean,
                  NULL::boolean, 'open'::text, 'half_open'::text, NULL::smallint;
        END IF;
    END IF;
END
$$;


--
-- FUNCTION: forwards_withheld()
--

CREATE FUNCTION public.forwards_withheld() RETURNS text
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'a batch came without forwards while a destination is enabled'
        USING ERRCODE = 'GWF01';
END
$$;


--
-- FUNCTION: inbound_messages_notify()
--

CREATE FUNCTION public.inbound_messages_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    top bigint;
BEGIN
    SELECT max(id) INTO top FROM new_rows;
    IF top IS NOT NULL THEN
        PERFORM pg_notify('inbound_messages', top::text);
    END IF;
    RETURN NULL;
END;
$$;


--
-- FUNCTION: inbox_advance(text, jsonb)
--

CREATE FUNCTION public.inbox_advance(member text, cursors jsonb) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    moved integer;
BEGIN
    UPDATE inbox_lanes l SET
        done_snap = c.done::pg_snapshot,
        win_snap = c.win::pg_snapshot,
        pos_txid = c.pos_txid::text::xid8,
        pos_id = c.pos_id,
        version = l.version + 1,
        advanced_at = t.now
    FROM jsonb_to_recordset(cursors) AS c(lane smallint, version bigint, done text, win text,
                                          pos_txid bigint, pos_id bigint),
         -- (the clock read in a sub-select: Citus refuses a volatile function in an UPDATE of
         -- a distributed table)
         (SELECT clock_timestamp() AS now) t
    WHERE l.lane = c.lane AND l.owner = member AND l.version = c.version;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved <> jsonb_array_length(cursors) THEN
        RAISE EXCEPTION 'lane cursor moved or lane taken over (% of % lanes still as read by %)',
            moved, jsonb_array_length(cursors), member
            USING ERRCODE = 'GWL01';
    END IF;
    RETURN moved;
END;
$$;


--
-- FUNCTION: inbox_apply_batch_steps(text[], bigint[], jsonb, jsonb, jsonb, jsonb, bigint[], text[], text, date[], text[], jsonb, text, jsonb)
--

CREATE FUNCTION public.inbox_apply_batch_steps(p_keys text[], p_inbox bigint[], p_messages jsonb, p_statuses jsonb, p_errors jsonb, p_updates jsonb, p_parked bigint[], p_parked_why text[], p_forwards text, p_days date[], p_subjects text[], p_links jsonb, p_member text, p_advance jsonb) RETURNS TABLE(fresh bigint, messages bigint, statuses bigint, account_errors bigint, account_updates bigint, outbox_updated bigint, messages_inserted bigint, statuses_inserted bigint, parked bigint, deliveries bigint, identities bigint, fresh_keys text[], callers jsonb, advanced integer)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    AS $_$
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
$_$;


--
-- FUNCTION: inbox_oldest_unread()
--

CREATE FUNCTION public.inbox_oldest_unread() RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    SET enable_sort TO 'off'
    AS $$
    WITH c AS MATERIALIZED (
        SELECT array_agg(l.done_snap ORDER BY l.lane) AS dones,
               array_agg(l.win_snap ORDER BY l.lane) AS wins,
               array_agg(l.pos_txid ORDER BY l.lane) AS ptx,
               array_agg(l.pos_id ORDER BY l.lane) AS pid
        FROM inbox_lanes l
    ), s AS MATERIALIZED (
        SELECT k.t, k.i FROM (
            SELECT CASE WHEN l.win_snap IS NOT NULL THEN l.pos_txid
                        ELSE (pg_snapshot_xmax(l.done_snap)::text::numeric - 1)::text::xid8 END AS t,
                   CASE WHEN l.win_snap IS NOT NULL THEN l.pos_id ELSE 9223372036854775807 END AS i
            FROM inbox_lanes l) k
        ORDER BY k.t, k.i LIMIT 1
    ), x AS MATERIALIZED (
        SELECT coalesce(array_agg(DISTINCT r), '{}') AS running
        FROM inbox_lanes l, pg_snapshot_xip(l.done_snap) AS r
        WHERE l.win_snap IS NULL AND r <= (SELECT t FROM s)
    )
    SELECT min(f.received_at) FROM (
        (SELECT w.received_at FROM webhook_inbox w
         -- (the txid bound is the index's; a row comparison against sub-selects is not)
         WHERE w.txid >= (SELECT t FROM s) AND (w.txid, w.id) > ((SELECT t FROM s), (SELECT i FROM s))
           AND NOT pg_visible_in_snapshot(w.txid, ((SELECT dones FROM c))[w.lane + 1])
           AND NOT (((SELECT wins FROM c))[w.lane + 1] IS NOT NULL
                    AND pg_visible_in_snapshot(w.txid, ((SELECT wins FROM c))[w.lane + 1])
                    AND (w.txid, w.id) <= (((SELECT ptx FROM c))[w.lane + 1], ((SELECT pid FROM c))[w.lane + 1]))
         ORDER BY w.txid, w.id LIMIT 1)
        UNION ALL
        (SELECT w.received_at FROM webhook_inbox w
         WHERE w.txid = ANY ((SELECT running FROM x)::xid8[])
           AND (w.txid, w.id) <= ((SELECT t FROM s), (SELECT i FROM s))
           AND NOT pg_visible_in_snapshot(w.txid, ((SELECT dones FROM c))[w.lane + 1])
         ORDER BY w.txid, w.id LIMIT 1)
    ) f;
$$;


--
-- FUNCTION: inbox_pending_count(bigint)
--

CREATE FUNCTION public.inbox_pending_count(cap bigint) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN (SELECT count(*) FROM (SELECT 1 FROM inbox_unprocessed() u WHERE u.state = 'pending' LIMIT cap) x);
END;
$$;


--
-- FUNCTION: inbox_row_states(timestamp with time zone, timestamp with time zone)
--

CREATE FUNCTION public.inbox_row_states(since timestamp with time zone DEFAULT '-infinity'::timestamp with time zone, until timestamp with time zone DEFAULT 'infinity'::timestamp with time zone) RETURNS TABLE(id bigint, received_at timestamp with time zone, state text)
    LANGUAGE sql STABLE
    AS $$
    SELECT w.id, w.received_at,
           CASE WHEN p.state IN ('retry', 'dead') THEN p.state
                WHEN u.id IS NOT NULL THEN 'pending'
                ELSE 'done' END
    FROM webhook_inbox w
    LEFT JOIN inbox_parked p ON p.inbox_id = w.id
    LEFT JOIN (SELECT u.id FROM inbox_unread() u) u ON u.id = w.id
    WHERE w.received_at >= since AND w.received_at < until;
$$;


--
-- FUNCTION: inbox_unprocessed()
--

CREATE FUNCTION public.inbox_unprocessed() RETURNS TABLE(id bigint, received_at timestamp with time zone, state text)
    LANGUAGE sql STABLE
    AS $$
    SELECT u.id, u.received_at, 'pending' FROM inbox_unread() u
    WHERE NOT EXISTS (SELECT 1 FROM inbox_parked p WHERE p.inbox_id = u.id)
    UNION ALL
    SELECT p.inbox_id, p.received_at, CASE p.state WHEN 'retry' THEN 'pending' ELSE 'dead' END
    FROM inbox_parked p WHERE p.state IN ('retry', 'dead');
$$;


--
-- FUNCTION: inbox_unprocessed_latest()
--

CREATE FUNCTION public.inbox_unprocessed_latest() RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN (SELECT max(u.received_at) FROM inbox_unprocessed() u);
END;
$$;


--
-- FUNCTION: inbox_unread()
--

CREATE FUNCTION public.inbox_unread() RETURNS TABLE(id bigint, received_at timestamp with time zone, lane smallint, txid xid8)
    LANGUAGE sql STABLE
    AS $$
    SELECT w.id, w.received_at, w.lane, w.txid
    FROM (
        SELECT w.id, w.received_at, w.lane, w.txid FROM webhook_inbox w
        WHERE w.txid >= (SELECT min(pg_snapshot_xmax(l.done_snap)) FROM inbox_lanes l)
        UNION ALL
        SELECT w.id, w.received_at, w.lane, w.txid FROM webhook_inbox w
        WHERE w.txid = ANY (ARRAY(SELECT x FROM inbox_lanes l, pg_snapshot_xip(l.done_snap) AS x))
          AND w.txid < (SELECT min(pg_snapshot_xmax(l.done_snap)) FROM inbox_lanes l)
    ) w
    WHERE NOT EXISTS (
        SELECT 1 FROM inbox_lanes c
        WHERE c.lane = w.lane
          AND (pg_visible_in_snapshot(w.txid, c.done_snap)
               OR (c.win_snap IS NOT NULL AND pg_visible_in_snapshot(w.txid, c.win_snap)
                   AND (w.txid, w.id) <= (c.pos_txid, c.pos_id))));
$$;


--
-- FUNCTION: insert_values(text, json, text)
--

CREATE FUNCTION public.insert_values(p_into text, p_rows json, p_tail text DEFAULT ''::text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_values text := values_list(p_rows);
    n bigint := 0;
BEGIN
    IF v_values IS NOT NULL THEN
        EXECUTE 'INSERT INTO ' || p_into || ' VALUES ' || v_values || ' ' || p_tail;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN n;
END;
$$;


--
-- FUNCTION: meta_webhook(jsonb, jsonb)
--

CREATE FUNCTION public.meta_webhook(envelope jsonb, tracker jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT CASE WHEN envelope->>'source' = 'meta' THEN jsonb_build_object(
    'object', 'whatsapp_business_account',
    'entry', jsonb_build_array(jsonb_build_object(
        'id', envelope->'data'->'waba_id',
        'changes', jsonb_build_array(
            CASE envelope->>'type'
            WHEN 'message.received' THEN jsonb_build_object('field', 'messages', 'value',
                jsonb_build_object(
                    'messaging_product', 'whatsapp',
                    'metadata', jsonb_strip_nulls(jsonb_build_object(
                        'display_phone_number', envelope->'data'->'display_phone_number',
                        'phone_number_id', envelope->'data'->'phone_number_id')))
                || CASE WHEN jsonb_typeof(envelope->'data'->'contact') = 'object'
                        THEN jsonb_build_object('contacts', jsonb_build_array(envelope->'data'->'contact'))
                        ELSE '{}'::jsonb END
                || jsonb_build_object('messages', jsonb_build_array(envelope->'raw')))
            WHEN 'message.status' THEN jsonb_build_object('field', 'messages', 'value',
                jsonb_build_object(
                    'messaging_product', 'whatsapp',
                    'metadata', jsonb_strip_nulls(jsonb_build_object(
                        'display_phone_number', envelope->'data'->'display_phone_number',
                        'phone_number_id', envelope->'data'->'phone_number_id')))
                || CASE WHEN jsonb_typeof(envelope->'data'->'contact') = 'object'
                        THEN jsonb_build_object('contacts', jsonb_build_array(envelope->'data'->'contact'))
                        ELSE '{}'::jsonb END
                || jsonb_build_object('statuses', jsonb_build_array(
                    -- (the status object is spelled out in each branch: a sub-SELECT computing it
                    -- once would keep this function from being inlined into the statements that
                    -- call it, and a call per event costs more than the expression)
                    CASE WHEN tracker IS NULL THEN
                             CASE WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_user_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_user_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              ELSE envelope->'raw' END
                         WHEN jsonb_typeof(tracker) = 'null' THEN
                             (CASE WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_user_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_user_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              ELSE envelope->'raw' END) - 'biz_opaque_callback_data'
                         ELSE jsonb_set(CASE WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              WHEN jsonb_typeof(envelope->'raw'->'recipient_participant_user_id') = 'array'
                              THEN jsonb_set(envelope->'raw', '{recipient_participant_user_id}',
                                             jsonb_build_array(envelope->'data'->'participant'))
                              ELSE envelope->'raw' END,
                                        '{biz_opaque_callback_data}', tracker) END)))
            ELSE jsonb_build_object('field', envelope->'data'->'field', 'value', envelope->'raw')
            END))))
END
$$;


--
-- FUNCTION: outbox_attempts_record()
--

CREATE FUNCTION public.outbox_attempts_record() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO outbox_attempts (outbox_id, sent_at, outcome, code, error, wamid)
    SELECT n.id, o.sending_at, n.state, n.last_error_code, n.last_error, n.wamid
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state = 'sending' AND n.state <> 'sending';
    RETURN NULL;
END;
$$;


--
-- FUNCTION: outbox_outcome_notify()
--

CREATE FUNCTION public.outbox_outcome_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('outbox_outcome', NEW.id::text || ' ' || NEW.state || ' ' || coalesce(NEW.wamid, ''));
    RETURN NULL;
END;
$$;


--
-- FUNCTION: partition_blocker(text, interval)
--

CREATE FUNCTION public.partition_blocker(rel text, held interval, OUT pid integer, OUT since timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE
    AS $$
    SELECT a.pid, a.xact_start
    FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.granted AND a.pid <> pg_backend_pid()
      AND a.xact_start < now() - held
      AND (l.relation = rel::regclass
           OR l.relation IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = rel::regclass))
    ORDER BY a.xact_start
    LIMIT 1;
$$;


--
-- FUNCTION: partition_days(text)
--

CREATE FUNCTION public.partition_days(parent text) RETURNS SETOF date
    LANGUAGE sql STABLE
    AS $_$
    SELECT to_date(right(c.relname, 8), 'YYYYMMDD') AS day
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
      AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
    ORDER BY day;
$_$;


--
-- FUNCTION: partition_ensure_day(text, date)
--

CREATE FUNCTION public.partition_ensure_day(parent text, day date) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    child text := parent || '_p' || to_char(day, 'YYYYMMDD');
    keycol text;
    keytype text;
    lo text;
    hi text;
    def regclass;
BEGIN
    IF to_regclass(child) IS NOT NULL THEN
        RETURN false;
    END IF;
    SELECT a.attname, format_type(a.atttypid, a.atttypmod), nullif(p.partdefid, 0)::regclass
    INTO keycol, keytype, def
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
    IF def IS NOT NULL THEN
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', def);
        EXECUTE format('WITH moved AS (DELETE FROM %s WHERE %I >= %s AND %I < %s RETURNING *) '
                       'INSERT INTO %I SELECT * FROM moved', def, keycol, lo, keycol, hi, child);
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', parent, child, lo, hi);
    RETURN true;
END;
$$;


--
-- FUNCTION: partition_has_default(text)
--

CREATE FUNCTION public.partition_has_default(parent text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce((SELECT partdefid <> 0 FROM pg_partitioned_table WHERE partrelid = parent::regclass), false);
$$;


--
-- FUNCTION: partition_oldest_before(text, date)
--

CREATE FUNCTION public.partition_oldest_before(parent text, cutoff date, OUT name text, OUT detach_pending boolean) RETURNS record
    LANGUAGE sql STABLE
    AS $_$
    SELECT c.relname::text, i.inhdetachpending
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent::regclass
      AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
      AND to_date(right(c.relname, 8), 'YYYYMMDD') < cutoff
    ORDER BY c.relname
    LIMIT 1;
$_$;


--
-- FUNCTION: reply_claim(text, text, text, text, boolean)
--

CREATE FUNCTION public.reply_claim(p_wamid text, p_bot text, p_tenant text, p_key text, p_per_bot boolean) RETURNS TABLE(holder_tenant text, holder_bot text, holder_key text)
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1735881328, hashtext(p_wamid));
    RETURN QUERY
        SELECT c.tenant, c.claimed_by, c.idem_key
        FROM reply_claims c
        WHERE c.inbound_wamid = p_wamid
          AND (NOT p_per_bot OR c.tenant IS DISTINCT FROM p_tenant OR c.claimed_by = p_bot)
        ORDER BY c.claimed_at
        LIMIT 1;
    IF NOT FOUND THEN
        INSERT INTO reply_claims (inbound_wamid, claimed_by, tenant, idem_key)
        VALUES (p_wamid, p_bot, p_tenant, p_key);
    END IF;
END;
$$;


--
-- FUNCTION: values_list(json)
--

CREATE FUNCTION public.values_list(p_rows json) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT string_agg(
               '(' || (SELECT string_agg(quote_nullable(c.value), ', ' ORDER BY c.n)
                       FROM json_each_text(r.value) WITH ORDINALITY AS c(key, value, n)) || ')',
               ', ' ORDER BY r.n)
    FROM json_array_elements(p_rows) WITH ORDINALITY AS r(value, n)
$$;


--
-- FUNCTION: webhook_inbox_notify()
--

CREATE FUNCTION public.webhook_inbox_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('webhook_inbox', '');
    RETURN NULL;
END;
$$;


--
-- TABLE: account_errors
--

CREATE TABLE public.account_errors (
    id bigint NOT NULL,
    event_key text NOT NULL,
    waba_id text,
    phone_number_id text,
    field text NOT NULL,
    errors jsonb NOT NULL,
    raw jsonb NOT NULL,
    inbox_id bigint,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    subject text NOT NULL
)
PARTITION BY RANGE (recorded_at);


--
-- SEQUENCE: account_errors_id_seq
--

ALTER TABLE public.account_errors ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.account_errors_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: account_updates
--

CREATE TABLE public.account_updates (
    id bigint NOT NULL,
    event_key text NOT NULL,
    waba_id text,
    field text NOT NULL,
    value jsonb,
    inbox_id bigint,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    subject text NOT NULL
)
PARTITION BY RANGE (recorded_at);


--
-- SEQUENCE: account_updates_id_seq
--

ALTER TABLE public.account_updates ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.account_updates_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: consumer_members
--

CREATE TABLE public.consumer_members (
    member text NOT NULL,
    pid integer NOT NULL,
    backend_start timestamp with time zone NOT NULL,
    seen_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- TABLE: customer_ids
--

CREATE TABLE public.customer_ids (
    phone_number_id text NOT NULL,
    user_id text NOT NULL,
    wa_id text,
    parent_user_id text,
    username text,
    first_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- TABLE: dead_events
--

CREATE TABLE public.dead_events (
    id bigint NOT NULL,
    inbox_id bigint NOT NULL,
    "position" integer NOT NULL,
    path text NOT NULL,
    event_key text,
    kind text NOT NULL,
    source text NOT NULL,
    received_at timestamp with time zone NOT NULL,
    unit text NOT NULL,
    context jsonb DEFAULT '{}'::jsonb NOT NULL,
    fragment bytea NOT NULL,
    state text DEFAULT 'retry'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    deferrals integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    last_error text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT dead_events_state_check CHECK ((state = ANY (ARRAY['retry'::text, 'dead'::text, 'done'::text])))
);


--
-- SEQUENCE: dead_events_id_seq
--

ALTER TABLE public.dead_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.dead_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: delivery_events
--

CREATE TABLE public.delivery_events (
    id bigint NOT NULL,
    day date DEFAULT ((now() AT TIME ZONE 'UTC'::text))::date NOT NULL,
    lane smallint NOT NULL,
    received_at timestamp with time zone NOT NULL,
    event_key text NOT NULL,
    kind text NOT NULL,
    conversation text DEFAULT ''::text NOT NULL,
    body bytea,
    meta_body bytea,
    CONSTRAINT delivery_events_kind_check CHECK ((kind = ANY (ARRAY['message'::text, 'status'::text, 'account'::text]))),
    CONSTRAINT delivery_events_lane_check CHECK (((lane >= 0) AND (lane <= 31)))
)
PARTITION BY RANGE (day);
ALTER TABLE ONLY public.delivery_events ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE ONLY public.delivery_events ALTER COLUMN meta_body SET STORAGE EXTERNAL;


--
-- TABLE: delivery_log
--

CREATE TABLE public.delivery_log (
    day date NOT NULL,
    at timestamp with time zone NOT NULL,
    destination_id bigint NOT NULL,
    event_id bigint NOT NULL,
    received_at timestamp with time zone NOT NULL,
    event_day date NOT NULL,
    attempt integer NOT NULL,
    lane smallint NOT NULL,
    status smallint,
    outcome text NOT NULL,
    error text,
    CONSTRAINT delivery_log_outcome_check CHECK ((outcome = ANY (ARRAY['delivered'::text, 'pending'::text, 'failed'::text])))
)
PARTITION BY RANGE (day);


--
-- TABLE: delivery_queue
--

CREATE TABLE public.delivery_queue (
    destination_id bigint NOT NULL,
    event_id bigint NOT NULL,
    received_at timestamp with time zone NOT NULL,
    due timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    window_start timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    conv bigint,
    event_day date NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    lane smallint NOT NULL,
    last_status smallint,
    failed boolean DEFAULT false NOT NULL,
    last_error text,
    CONSTRAINT delivery_queue_lane_check CHECK (((lane >= 0) AND (lane <= 31)))
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='5000', autovacuum_vacuum_insert_scale_factor='0', autovacuum_vacuum_insert_threshold='20000');


--
-- TABLE: destinations
--

CREATE TABLE public.destinations (
    id bigint NOT NULL,
    name text NOT NULL,
    url text NOT NULL,
    events text[] NOT NULL,
    secret text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    max_in_flight integer DEFAULT 16 NOT NULL,
    ordered boolean DEFAULT false NOT NULL,
    breaker_state text DEFAULT 'closed'::text NOT NULL,
    consecutive_failures integer DEFAULT 0 NOT NULL,
    breaker_changed_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    previous_secret text,
    previous_secret_until timestamp with time zone,
    due_from timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    numbers text[],
    tenant text,
    format text DEFAULT 'standard'::text NOT NULL,
    CONSTRAINT destinations_breaker_state_check CHECK ((breaker_state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text]))),
    CONSTRAINT destinations_events_check CHECK (((cardinality(events) > 0) AND (events <@ ARRAY['message'::text, 'status'::text, 'account'::text]))),
    CONSTRAINT destinations_format_check CHECK ((format = ANY (ARRAY['standard'::text, 'meta'::text]))),
    CONSTRAINT destinations_max_in_flight_check CHECK (((max_in_flight >= 1) AND (max_in_flight <= 10000))),
    CONSTRAINT destinations_name_check CHECK ((name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'::text)),
    CONSTRAINT destinations_previous_secret_check CHECK (((previous_secret <> ''::text) AND ((format = 'meta'::text) OR (previous_secret ~~ 'whsec\_%'::text)))),
    CONSTRAINT destinations_previous_secret_until_check CHECK (((previous_secret IS NULL) = (previous_secret_until IS NULL))),
    CONSTRAINT destinations_secret_check CHECK (((secret <> ''::text) AND ((format = 'meta'::text) OR (secret ~~ 'whsec\_%'::text))))
);


--
-- VIEW: deliveries_done
--

CREATE VIEW public.deliveries_done AS
 SELECT l.event_id AS id,
    l.destination_id,
    e.event_key,
    ('wh_'::text || "left"(encode(sha256(convert_to(((d.name || '/'::text) || e.event_key), 'UTF8'::name)), 'hex'::text), 32)) AS webhook_id,
    e.kind,
    e.conversation,
    (convert_from(
        CASE
            WHEN (d.format = 'meta'::text) THEN e.meta_body
            ELSE e.body
        END, 'UTF8'::name))::jsonb AS envelope,
    'delivered'::text AS state,
    l.attempt AS attempts,
    l.at AS next_attempt_at,
    l.received_at,
    NULL::timestamp with time zone AS window_start,
    (l.status)::integer AS last_status,
    l.error AS last_error,
    l.at AS delivered_at,
    l.lane,
    public.event_subject(e.event_key) AS subject
   FROM ((public.delivery_log l
     JOIN public.destinations d ON ((d.id = l.destination_id)))
     JOIN public.delivery_events e ON (((e.id = l.event_id) AND (e.day = l.event_day) AND (e.lane = l.lane) AND (e.received_at = l.received_at))))
  WHERE ((l.outcome = 'delivered'::text) AND (NOT (EXISTS ( SELECT 1
           FROM public.delivery_queue q
          WHERE ((q.destination_id = l.destination_id) AND (q.event_id = l.event_id) AND (q.lane = l.lane))))) AND (NOT (EXISTS ( SELECT 1
           FROM public.delivery_log n
          WHERE ((n.destination_id = l.destination_id) AND (n.lane = l.lane) AND (n.outcome = 'delivered'::text) AND (n.received_at = l.received_at) AND (n.event_id = l.event_id) AND (ROW(n.at, n.day) > ROW(l.at, l.day)))))));


--
-- VIEW: deliveries_open
--

CREATE VIEW public.deliveries_open AS
 SELECT q.event_id AS id,
    q.destination_id,
    e.event_key,
    ('wh_'::text || "left"(encode(sha256(convert_to(((d.name || '/'::text) || e.event_key), 'UTF8'::name)), 'hex'::text), 32)) AS webhook_id,
    e.kind,
    e.conversation,
    (convert_from(
        CASE
            WHEN (d.format = 'meta'::text) THEN e.meta_body
            ELSE e.body
        END, 'UTF8'::name))::jsonb AS envelope,
        CASE
            WHEN q.failed THEN 'failed'::text
            ELSE 'pending'::text
        END AS state,
    q.attempts,
    q.due AS next_attempt_at,
    q.received_at,
    q.window_start,
    (q.last_status)::integer AS last_status,
    q.last_error,
    NULL::timestamp with time zone AS delivered_at,
    q.lane,
    public.event_subject(e.event_key) AS subject
   FROM ((public.delivery_queue q
     JOIN public.destinations d ON ((d.id = q.destination_id)))
     JOIN public.delivery_events e ON (((e.id = q.event_id) AND (e.day = q.event_day) AND (e.lane = q.lane))));


--
-- VIEW: deliveries
--

CREATE VIEW public.deliveries AS
 SELECT deliveries_open.id,
    deliveries_open.destination_id,
    deliveries_open.event_key,
    deliveries_open.webhook_id,
    deliveries_open.kind,
    deliveries_open.conversation,
    deliveries_open.envelope,
    deliveries_open.state,
    deliveries_open.attempts,
    deliveries_open.next_attempt_at,
    deliveries_open.received_at,
    deliveries_open.window_start,
    deliveries_open.last_status,
    deliveries_open.last_error,
    deliveries_open.delivered_at,
    deliveries_open.lane,
    deliveries_open.subject
   FROM public.deliveries_open
UNION ALL
 SELECT deliveries_done.id,
    deliveries_done.destination_id,
    deliveries_done.event_key,
    deliveries_done.webhook_id,
    deliveries_done.kind,
    deliveries_done.conversation,
    deliveries_done.envelope,
    deliveries_done.state,
    deliveries_done.attempts,
    deliveries_done.next_attempt_at,
    deliveries_done.received_at,
    deliveries_done.window_start,
    deliveries_done.last_status,
    deliveries_done.last_error,
    deliveries_done.delivered_at,
    deliveries_done.lane,
    deliveries_done.subject
   FROM public.deliveries_done;


--
-- SEQUENCE: delivery_events_id_seq
--

ALTER TABLE public.delivery_events ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.delivery_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: delivery_leases
--

CREATE TABLE public.delivery_leases (
    forwarder text NOT NULL,
    destination_id bigint NOT NULL,
    ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    lease_until timestamp with time zone NOT NULL
);
ALTER TABLE ONLY public.delivery_leases ALTER COLUMN ids SET STORAGE EXTERNAL;


--
-- SEQUENCE: destinations_id_seq
--

ALTER TABLE public.destinations ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.destinations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: event_fragments
--

CREATE TABLE public.event_fragments (
    event_key text NOT NULL,
    inbox_id bigint NOT NULL,
    path text NOT NULL,
    fragment bytea NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    subject text NOT NULL
);


--
-- TABLE: idempotency_keys
--

CREATE TABLE public.idempotency_keys (
    tenant text NOT NULL,
    key text NOT NULL,
    fingerprint text NOT NULL,
    state text DEFAULT 'in_progress'::text NOT NULL,
    response_status integer,
    response_headers jsonb,
    response_body bytea,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    locked_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT idempotency_keys_state_check CHECK ((state = ANY (ARRAY['in_progress'::text, 'done'::text])))
);


--
-- TABLE: inbound_messages
--

CREATE TABLE public.inbound_messages (
    id bigint NOT NULL,
    wamid text NOT NULL,
    source text DEFAULT 'meta'::text NOT NULL,
    phone_number_id text,
    sender text,
    type text,
    "timestamp" timestamp with time zone,
    contact_name text,
    message jsonb NOT NULL,
    inbox_id bigint,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    subject text NOT NULL,
    user_id text,
    parent_user_id text,
    username text,
    waba_id text,
    display_phone_number text,
    contact jsonb
)
PARTITION BY RANGE (received_at);


--
-- SEQUENCE: inbound_messages_id_seq
--

ALTER TABLE public.inbound_messages ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.inbound_messages_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: inbox_heads
--

CREATE TABLE public.inbox_heads (
    lane smallint NOT NULL,
    seq bigint NOT NULL,
    CONSTRAINT inbox_heads_lane_check CHECK (((lane >= 0) AND (lane <= 31))),
    CONSTRAINT inbox_heads_seq_check CHECK ((seq >= 3))
);


--
-- TABLE: inbox_lanes
--

CREATE TABLE public.inbox_lanes (
    lane smallint NOT NULL,
    shard integer DEFAULT 0 NOT NULL,
    owner text,
    lease_until timestamp with time zone,
    done_snap pg_snapshot NOT NULL,
    win_snap pg_snapshot,
    pos_txid xid8,
    pos_id bigint,
    version bigint DEFAULT 0 NOT NULL,
    advanced_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT inbox_lanes_check CHECK ((((win_snap IS NULL) = (pos_txid IS NULL)) AND ((pos_txid IS NULL) = (pos_id IS NULL)))),
    CONSTRAINT inbox_lanes_lane_check CHECK (((lane >= 0) AND (lane <= 31)))
);


--
-- TABLE: inbox_parked
--

CREATE TABLE public.inbox_parked (
    inbox_id bigint NOT NULL,
    received_at timestamp with time zone NOT NULL,
    source text NOT NULL,
    delivery_id text,
    body bytea NOT NULL,
    state text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    last_error text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT inbox_parked_state_check CHECK ((state = ANY (ARRAY['retry'::text, 'dead'::text, 'done'::text])))
);


--
-- TABLE: maintenance_passes
--

CREATE TABLE public.maintenance_passes (
    job text NOT NULL,
    last_ok_at timestamp with time zone,
    last_failed_at timestamp with time zone,
    last_error text,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- TABLE: media
--

CREATE TABLE public.media (
    media_id text NOT NULL,
    phone_number_id text NOT NULL,
    origin text NOT NULL,
    tenant text,
    mime_type text,
    wamid text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT media_origin_check CHECK ((origin = ANY (ARRAY['inbound'::text, 'upload'::text])))
);


--
-- TABLE: message_statuses
--

CREATE TABLE public.message_statuses (
    id bigint NOT NULL,
    event_key text NOT NULL,
    source text DEFAULT 'meta'::text NOT NULL,
    wamid text NOT NULL,
    status text NOT NULL,
    participant text DEFAULT ''::text NOT NULL,
    recipient text,
    "timestamp" timestamp with time zone,
    callback_data text,
    errors jsonb,
    raw jsonb NOT NULL,
    inbox_id bigint,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    subject text NOT NULL,
    recipient_user_id text,
    recipient_parent_user_id text,
    recipient_username text,
    phone_number_id text,
    waba_id text,
    display_phone_number text,
    contact jsonb,
    biz_opaque_callback_data text
)
PARTITION BY RANGE (recorded_at);


--
-- SEQUENCE: message_statuses_id_seq
--

ALTER TABLE public.message_statuses ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.message_statuses_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: operator_actions
--

CREATE TABLE public.operator_actions (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    actor text NOT NULL,
    via text NOT NULL,
    action text NOT NULL,
    target text DEFAULT ''::text NOT NULL,
    params jsonb DEFAULT '{}'::jsonb NOT NULL,
    rows bigint DEFAULT 0 NOT NULL,
    outcome text DEFAULT ''::text NOT NULL,
    CONSTRAINT operator_actions_via_check CHECK ((via = ANY (ARRAY['console'::text, 'cli'::text])))
);


--
-- SEQUENCE: operator_actions_id_seq
--

ALTER TABLE public.operator_actions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.operator_actions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: outbox
--

CREATE TABLE public.outbox (
    id bigint NOT NULL,
    tenant text NOT NULL,
    idem_key text NOT NULL,
    callback_data text NOT NULL,
    provider text DEFAULT 'meta'::text NOT NULL,
    phone_number_id text DEFAULT ''::text NOT NULL,
    recipient text NOT NULL,
    payload jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    unknown_policy text DEFAULT 'review'::text NOT NULL,
    resent boolean DEFAULT false NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    last_error text,
    last_error_code integer,
    wamid text,
    delivery_status text,
    delivery_errors jsonb,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    sending_at timestamp with time zone,
    unknown_at timestamp with time zone,
    accepted_at timestamp with time zone,
    biz_opaque_callback_data text,
    fingerprint text,
    generation integer DEFAULT 0 NOT NULL,
    ambiguous_at timestamp with time zone,
    retry_until timestamp with time zone,
    notify_outcome boolean DEFAULT false NOT NULL,
    provider_error jsonb,
    CONSTRAINT outbox_provider_check CHECK ((provider = ANY (ARRAY['meta'::text, 'tenashi'::text]))),
    CONSTRAINT outbox_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'sending'::text, 'accepted'::text, 'unknown'::text, 'failed'::text, 'review'::text, 'cancelled'::text]))),
    CONSTRAINT outbox_unknown_policy_check CHECK ((unknown_policy = ANY (ARRAY['resend'::text, 'review'::text])))
);


--
-- TABLE: outbox_attempts
--

CREATE TABLE public.outbox_attempts (
    outbox_id bigint NOT NULL,
    sent_at timestamp with time zone,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    outcome text NOT NULL,
    code integer,
    error text,
    wamid text
);


--
-- SEQUENCE: outbox_id_seq
--

ALTER TABLE public.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE: processed_webhook_events
--

CREATE TABLE public.processed_webhook_events (
    event_key text NOT NULL,
    inbox_id bigint,
    processed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    event_day date NOT NULL,
    subject text NOT NULL
)
PARTITION BY RANGE (event_day);


--
-- TABLE: processed_webhook_events_default
--

CREATE TABLE public.processed_webhook_events_default (
    event_key text CONSTRAINT processed_webhook_events_event_key_not_null NOT NULL,
    inbox_id bigint,
    processed_at timestamp with time zone DEFAULT clock_timestamp() CONSTRAINT processed_webhook_events_processed_at_not_null NOT NULL,
    event_day date CONSTRAINT processed_webhook_events_event_day_not_null NOT NULL,
    subject text CONSTRAINT processed_webhook_events_subject_not_null NOT NULL
);


--
-- TABLE: processed_webhook_events_untimed
--

CREATE TABLE public.processed_webhook_events_untimed (
    event_key text CONSTRAINT processed_webhook_events_event_key_not_null NOT NULL,
    inbox_id bigint,
    processed_at timestamp with time zone DEFAULT clock_timestamp() CONSTRAINT processed_webhook_events_processed_at_not_null NOT NULL,
    event_day date CONSTRAINT processed_webhook_events_event_day_not_null NOT NULL,
    subject text CONSTRAINT processed_webhook_events_subject_not_null NOT NULL
);


--
-- TABLE: reply_claims
--

CREATE TABLE public.reply_claims (
    inbound_wamid text NOT NULL,
    claimed_by text NOT NULL,
    claimed_at timestamp with time zone DEFAULT now() NOT NULL,
    tenant text,
    idem_key text
);


--
-- TABLE: schema_functions
--

CREATE TABLE public.schema_functions (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- TABLE: schema_migrations
--

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- TABLE: send_breakers
--

CREATE TABLE public.send_breakers (
    scope text NOT NULL,
    provider text NOT NULL,
    key text NOT NULL,
    state text NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    code integer,
    error text,
    opened_at timestamp with time zone,
    retry_at double precision,
    probe_id bigint,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT send_breakers_scope_check CHECK ((scope = ANY (ARRAY['number'::text, 'token'::text]))),
    CONSTRAINT send_breakers_state_check CHECK ((state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text])))
);


--
-- TABLE: send_pacing
--

CREATE TABLE public.send_pacing (
    key text NOT NULL,
    at double precision NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- TABLE: webhook_inbox
--

CREATE TABLE public.webhook_inbox (
    id bigint NOT NULL,
    source text NOT NULL,
    body bytea NOT NULL,
    received_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    delivery_id text,
    lane smallint NOT NULL,
    txid xid8 DEFAULT pg_current_xact_id(),
    CONSTRAINT webhook_inbox_lane_check CHECK (((lane >= 0) AND (lane <= 31))),
    CONSTRAINT webhook_inbox_source_check CHECK ((source = ANY (ARRAY['meta'::text, 'tenashi'::text])))
)
PARTITION BY RANGE (received_at);


--
-- SEQUENCE: webhook_inbox_id_seq
--

ALTER TABLE public.webhook_inbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.webhook_inbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- TABLE ATTACH: processed_webhook_events_default
--

ALTER TABLE ONLY public.processed_webhook_events ATTACH PARTITION public.processed_webhook_events_default DEFAULT;


--
-- TABLE ATTACH: processed_webhook_events_untimed
--

ALTER TABLE ONLY public.processed_webhook_events ATTACH PARTITION public.processed_webhook_events_untimed FOR VALUES FROM (MINVALUE) TO ('1970-01-02');


--
-- DEFAULT: webhook_inbox lane
--

ALTER TABLE ONLY public.webhook_inbox ALTER COLUMN lane SET DEFAULT ((currval('public.webhook_inbox_id_seq'::regclass) % (32)::bigint))::smallint;


--
-- CONSTRAINT: account_errors account_errors_pkey
--

ALTER TABLE ONLY public.account_errors
    ADD CONSTRAINT account_errors_pkey PRIMARY KEY (id, recorded_at, subject);


--
-- CONSTRAINT: account_updates account_updates_pkey
--

ALTER TABLE ONLY public.account_updates
    ADD CONSTRAINT account_updates_pkey PRIMARY KEY (id, recorded_at, subject);


--
-- CONSTRAINT: consumer_members consumer_members_pkey
--

ALTER TABLE ONLY public.consumer_members
    ADD CONSTRAINT consumer_members_pkey PRIMARY KEY (member);


--
-- CONSTRAINT: customer_ids customer_ids_pkey
--

ALTER TABLE ONLY public.customer_ids
    ADD CONSTRAINT customer_ids_pkey PRIMARY KEY (phone_number_id, user_id);


--
-- CONSTRAINT: dead_events dead_events_pkey
--

ALTER TABLE ONLY public.dead_events
    ADD CONSTRAINT dead_events_pkey PRIMARY KEY (id);


--
-- CONSTRAINT: delivery_events delivery_events_pkey
--

ALTER TABLE ONLY public.delivery_events
    ADD CONSTRAINT delivery_events_pkey PRIMARY KEY (id, day, lane);


--
-- CONSTRAINT: delivery_leases delivery_leases_pkey
--

ALTER TABLE ONLY public.delivery_leases
    ADD CONSTRAINT delivery_leases_pkey PRIMARY KEY (forwarder, destination_id);


--
-- CONSTRAINT: delivery_queue delivery_queue_pkey
--

ALTER TABLE ONLY public.delivery_queue
    ADD CONSTRAINT delivery_queue_pkey PRIMARY KEY (destination_id, event_id, lane);


--
-- CONSTRAINT: destinations destinations_name_key
--

ALTER TABLE ONLY public.destinations
    ADD CONSTRAINT destinations_name_key UNIQUE (name);


--
-- CONSTRAINT: destinations destinations_pkey
--

ALTER TABLE ONLY public.destinations
    ADD CONSTRAINT destinations_pkey PRIMARY KEY (id);


--
-- CONSTRAINT: event_fragments event_fragments_pkey
--

ALTER TABLE ONLY public.event_fragments
    ADD CONSTRAINT event_fragments_pkey PRIMARY KEY (event_key, subject);


--
-- CONSTRAINT: idempotency_keys idempotency_keys_pkey
--

ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (tenant, key);


--
-- CONSTRAINT: inbound_messages inbound_messages_pkey
--

ALTER TABLE ONLY public.inbound_messages
    ADD CONSTRAINT inbound_messages_pkey PRIMARY KEY (id, received_at, subject);


--
-- CONSTRAINT: inbox_heads inbox_heads_pkey
--

ALTER TABLE ONLY public.inbox_heads
    ADD CONSTRAINT inbox_heads_pkey PRIMARY KEY (lane);


--
-- CONSTRAINT: inbox_lanes inbox_lanes_pkey
--

ALTER TABLE ONLY public.inbox_lanes
    ADD CONSTRAINT inbox_lanes_pkey PRIMARY KEY (lane);


--
-- CONSTRAINT: inbox_parked inbox_parked_pkey
--

ALTER TABLE ONLY public.inbox_parked
    ADD CONSTRAINT inbox_parked_pkey PRIMARY KEY (inbox_id);


--
-- CONSTRAINT: maintenance_passes maintenance_passes_pkey
--

ALTER TABLE ONLY public.maintenance_passes
    ADD CONSTRAINT maintenance_passes_pkey PRIMARY KEY (job);


--
-- CONSTRAINT: media media_pkey
--

ALTER TABLE ONLY public.media
    ADD CONSTRAINT media_pkey PRIMARY KEY (media_id);


--
-- CONSTRAINT: message_statuses message_statuses_pkey
--

ALTER TABLE ONLY public.message_statuses
    ADD CONSTRAINT message_statuses_pkey PRIMARY KEY (id, recorded_at, subject);


--
-- CONSTRAINT: operator_actions operator_actions_pkey
--

ALTER TABLE ONLY public.operator_actions
    ADD CONSTRAINT operator_actions_pkey PRIMARY KEY (id);


--
-- CONSTRAINT: outbox outbox_callback_data_key
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_callback_data_key UNIQUE (callback_data);


--
-- CONSTRAINT: outbox outbox_pkey
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);


--
-- CONSTRAINT: outbox outbox_tenant_idem_key_key
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_tenant_idem_key_key UNIQUE (tenant, idem_key);


--
-- CONSTRAINT: processed_webhook_events processed_webhook_events_pkey
--

ALTER TABLE ONLY public.processed_webhook_events
    ADD CONSTRAINT processed_webhook_events_pkey PRIMARY KEY (event_key, event_day, subject);


--
-- CONSTRAINT: processed_webhook_events_default processed_webhook_events_default_pkey
--

ALTER TABLE ONLY public.processed_webhook_events_default
    ADD CONSTRAINT processed_webhook_events_default_pkey PRIMARY KEY (event_key, event_day, subject);


--
-- CONSTRAINT: processed_webhook_events_untimed processed_webhook_events_untimed_pkey
--

ALTER TABLE ONLY public.processed_webhook_events_untimed
    ADD CONSTRAINT processed_webhook_events_untimed_pkey PRIMARY KEY (event_key, event_day, subject);


--
-- CONSTRAINT: reply_claims reply_claims_pkey
--

ALTER TABLE ONLY public.reply_claims
    ADD CONSTRAINT reply_claims_pkey PRIMARY KEY (inbound_wamid, claimed_by);


--
-- CONSTRAINT: schema_functions schema_functions_pkey
--

ALTER TABLE ONLY public.schema_functions
    ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (name);


--
-- CONSTRAINT: schema_migrations schema_migrations_pkey
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- CONSTRAINT: send_breakers send_breakers_pkey
--

ALTER TABLE ONLY public.send_breakers
    ADD CONSTRAINT send_breakers_pkey PRIMARY KEY (scope, provider, key);


--
-- CONSTRAINT: send_pacing send_pacing_pkey
--

ALTER TABLE ONLY public.send_pacing
    ADD CONSTRAINT send_pacing_pkey PRIMARY KEY (key);


--
-- CONSTRAINT: webhook_inbox webhook_inbox_pkey
--

ALTER TABLE ONLY public.webhook_inbox
    ADD CONSTRAINT webhook_inbox_pkey PRIMARY KEY (id, received_at, lane);


--
-- INDEX: customer_ids_parent
--

CREATE INDEX customer_ids_parent ON public.customer_ids USING btree (phone_number_id, parent_user_id, seen_at) WHERE (parent_user_id IS NOT NULL);


--
-- INDEX: customer_ids_wa_id
--

CREATE INDEX customer_ids_wa_id ON public.customer_ids USING btree (phone_number_id, wa_id, seen_at) WHERE (wa_id IS NOT NULL);


--
-- INDEX: dead_events_done
--

CREATE INDEX dead_events_done ON public.dead_events USING btree (updated_at) WHERE (state = 'done'::text);


--
-- INDEX: dead_events_due
--

CREATE INDEX dead_events_due ON public.dead_events USING btree (next_attempt_at, id) WHERE (state = 'retry'::text);


--
-- INDEX: dead_events_item
--

CREATE UNIQUE INDEX dead_events_item ON public.dead_events USING btree (inbox_id, path, md5(COALESCE(event_key, ''::text)));


--
-- INDEX: dead_events_open
--

CREATE INDEX dead_events_open ON public.dead_events USING btree (state, received_at, id) WHERE (state <> 'done'::text);


--
-- INDEX: dead_events_open_kind
--

CREATE INDEX dead_events_open_kind ON public.dead_events USING btree (state, kind, received_at, id) WHERE (state <> 'done'::text);


--
-- INDEX: dead_events_received
--

CREATE INDEX dead_events_received ON public.dead_events USING btree (received_at);


--
-- INDEX: delivery_events_key
--

CREATE INDEX delivery_events_key ON ONLY public.delivery_events USING btree (event_key);


--
-- INDEX: delivery_log_delivered
--

CREATE INDEX delivery_log_delivered ON ONLY public.delivery_log USING btree (destination_id, received_at, event_id) WHERE (outcome = 'delivered'::text);


--
-- INDEX: delivery_queue_conversation
--

CREATE INDEX delivery_queue_conversation ON public.delivery_queue USING btree (destination_id, conv, event_id) WHERE (conv IS NOT NULL);


--
-- INDEX: delivery_queue_due
--

CREATE INDEX delivery_queue_due ON public.delivery_queue USING btree (destination_id, due, event_id) WHERE (NOT failed);


--
-- INDEX: delivery_queue_failed
--

CREATE INDEX delivery_queue_failed ON public.delivery_queue USING btree (destination_id, received_at, event_id) WHERE failed;


--
-- INDEX: delivery_queue_received
--

CREATE INDEX delivery_queue_received ON public.delivery_queue USING btree (destination_id, received_at, event_id);


--
-- INDEX: event_fragments_recorded_at
--

CREATE INDEX event_fragments_recorded_at ON public.event_fragments USING btree (recorded_at);


--
-- INDEX: idempotency_keys_expires
--

CREATE INDEX idempotency_keys_expires ON public.idempotency_keys USING btree (expires_at);


--
-- INDEX: inbound_messages_wamid
--

CREATE INDEX inbound_messages_wamid ON ONLY public.inbound_messages USING btree (wamid);


--
-- INDEX: inbox_parked_done
--

CREATE INDEX inbox_parked_done ON public.inbox_parked USING btree (updated_at) WHERE (state = 'done'::text);


--
-- INDEX: inbox_parked_due
--

CREATE INDEX inbox_parked_due ON public.inbox_parked USING btree (next_attempt_at, inbox_id) WHERE (state = 'retry'::text);


--
-- INDEX: inbox_parked_open
--

CREATE INDEX inbox_parked_open ON public.inbox_parked USING btree (state, received_at, inbox_id) WHERE (state <> 'done'::text);


--
-- INDEX: media_created_at
--

CREATE INDEX media_created_at ON public.media USING btree (created_at);


--
-- INDEX: message_statuses_wamid
--

CREATE INDEX message_statuses_wamid ON ONLY public.message_statuses USING btree (wamid);


--
-- INDEX: operator_actions_action
--

CREATE INDEX operator_actions_action ON public.operator_actions USING btree (action, id);


--
-- INDEX: operator_actions_actor
--

CREATE INDEX operator_actions_actor ON public.operator_actions USING btree (actor, id);


--
-- INDEX: operator_actions_target
--

CREATE INDEX operator_actions_target ON public.operator_actions USING btree (target, id);


--
-- INDEX: outbox_attempts_row
--

CREATE INDEX outbox_attempts_row ON public.outbox_attempts USING btree (outbox_id, at);


--
-- INDEX: outbox_attention
--

CREATE INDEX outbox_attention ON public.outbox USING btree (state, id) WHERE (state = ANY (ARRAY['unknown'::text, 'review'::text, 'failed'::text, 'cancelled'::text]));


--
-- INDEX: outbox_due
--

CREATE INDEX outbox_due ON public.outbox USING btree (next_attempt_at, id) WHERE (state = 'pending'::text);


--
-- INDEX: outbox_open_by_recipient
--

CREATE INDEX outbox_open_by_recipient ON public.outbox USING btree (phone_number_id, recipient, id) WHERE (state = ANY (ARRAY['pending'::text, 'sending'::text, 'unknown'::text]));


--
-- INDEX: outbox_recipient
--

CREATE INDEX outbox_recipient ON public.outbox USING btree (recipient, id);


--
-- INDEX: outbox_review
--

CREATE INDEX outbox_review ON public.outbox USING btree (updated_at) WHERE (state = ANY (ARRAY['review'::text, 'failed'::text]));


--
-- INDEX: outbox_sending
--

CREATE INDEX outbox_sending ON public.outbox USING btree (sending_at) WHERE (state = 'sending'::text);


--
-- INDEX: outbox_terminal
--

CREATE INDEX outbox_terminal ON public.outbox USING btree (updated_at) WHERE (state = ANY (ARRAY['accepted'::text, 'failed'::text, 'cancelled'::text]));


--
-- INDEX: outbox_unknown
--

CREATE INDEX outbox_unknown ON public.outbox USING btree (unknown_at) WHERE (state = 'unknown'::text);


--
-- INDEX: outbox_wamid
--

CREATE INDEX outbox_wamid ON public.outbox USING btree (wamid) WHERE (wamid IS NOT NULL);


--
-- INDEX: processed_webhook_events_default_processed_at
--

CREATE INDEX processed_webhook_events_default_processed_at ON public.processed_webhook_events_default USING btree (processed_at);


--
-- INDEX: processed_webhook_events_processed_brin
--

CREATE INDEX processed_webhook_events_processed_brin ON ONLY public.processed_webhook_events USING brin (processed_at);


--
-- INDEX: processed_webhook_events_default_processed_at_idx
--

CREATE INDEX processed_webhook_events_default_processed_at_idx ON public.processed_webhook_events_default USING brin (processed_at);


--
-- INDEX: processed_webhook_events_untimed_processed_at
--

CREATE INDEX processed_webhook_events_untimed_processed_at ON public.processed_webhook_events_untimed USING btree (processed_at);


--
-- INDEX: processed_webhook_events_untimed_processed_at_idx
--

CREATE INDEX processed_webhook_events_untimed_processed_at_idx ON public.processed_webhook_events_untimed USING brin (processed_at);


--
-- INDEX: reply_claims_claimed_at
--

CREATE INDEX reply_claims_claimed_at ON public.reply_claims USING btree (claimed_at);


--
-- INDEX: send_pacing_at
--

CREATE INDEX send_pacing_at ON public.send_pacing USING btree (at);


--
-- INDEX: webhook_inbox_log
--

CREATE INDEX webhook_inbox_log ON ONLY public.webhook_inbox USING btree (txid, id) WHERE (txid IS NOT NULL);


--
-- INDEX ATTACH: processed_webhook_events_default_pkey
--

ALTER INDEX public.processed_webhook_events_pkey ATTACH PARTITION public.processed_webhook_events_default_pkey;


--
-- INDEX ATTACH: processed_webhook_events_default_processed_at_idx
--

ALTER INDEX public.processed_webhook_events_processed_brin ATTACH PARTITION public.processed_webhook_events_default_processed_at_idx;


--
-- INDEX ATTACH: processed_webhook_events_untimed_pkey
--

ALTER INDEX public.processed_webhook_events_pkey ATTACH PARTITION public.processed_webhook_events_untimed_pkey;


--
-- INDEX ATTACH: processed_webhook_events_untimed_processed_at_idx
--

ALTER INDEX public.processed_webhook_events_processed_brin ATTACH PARTITION public.processed_webhook_events_untimed_processed_at_idx;


--
-- TRIGGER: delivery_queue deliveries_notify
--

CREATE TRIGGER deliveries_notify AFTER INSERT ON public.delivery_queue REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.deliveries_notify();


--
-- TRIGGER: inbound_messages inbound_messages_notify
--

CREATE TRIGGER inbound_messages_notify AFTER INSERT ON public.inbound_messages REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.inbound_messages_notify();


--
-- TRIGGER: outbox outbox_attempts
--

CREATE TRIGGER outbox_attempts AFTER UPDATE ON public.outbox REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.outbox_attempts_record();


--
-- TRIGGER: outbox outbox_outcome_notify
--

CREATE TRIGGER outbox_outcome_notify AFTER UPDATE OF state ON public.outbox FOR EACH ROW WHEN ((new.notify_outcome AND (new.state IS DISTINCT FROM old.state) AND (new.state = ANY (ARRAY['accepted'::text, 'failed'::text, 'unknown'::text, 'review'::text, 'cancelled'::text])))) EXECUTE FUNCTION public.outbox_outcome_notify();


--
-- TRIGGER: webhook_inbox webhook_inbox_notify
--

CREATE TRIGGER webhook_inbox_notify AFTER INSERT ON public.webhook_inbox FOR EACH STATEMENT EXECUTE FUNCTION public.webhook_inbox_notify();


--
-- FK CONSTRAINT: delivery_leases delivery_leases_destination_id_fkey
--

ALTER TABLE ONLY public.delivery_leases
    ADD CONSTRAINT delivery_leases_destination_id_fkey FOREIGN KEY (destination_id) REFERENCES public.destinations(id) ON DELETE CASCADE;


--
-- FK CONSTRAINT: outbox_attempts outbox_attempts_outbox_id_fkey
--

ALTER TABLE ONLY public.outbox_attempts
    ADD CONSTRAINT outbox_attempts_outbox_id_fkey FOREIGN KEY (outbox_id) REFERENCES public.outbox(id) ON DELETE CASCADE;

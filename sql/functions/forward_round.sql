-- One forwarder round in one call and one round trip: write the outcomes of finished attempts
-- (a delivered one is deleted from delivery_queue, any other updated, every one appended to
-- delivery_log) and the breaker counts they imply, claim due deliveries, and record what the
-- forwarder (p_forwarder) now holds in its leases (delivery_leases: a claim writes no queue
-- row). Called by the query forward_round in sql/queries/deliveries.sql
-- (gateway.store.deliveries.cycle), with named arguments.
--
-- A function, because the round's snapshot must be taken after the lock: a VOLATILE plpgsql
-- function takes a new snapshot per statement, and one SELECT of it is one (implicit)
-- transaction. Rounds are serialised across forwarders by the advisory lock 0x666F72776172
-- ("forward"), so per-destination limits and half-open probes are exact however many
-- forwarders run. The round commits without waiting for the WAL flush: a crash of PostgreSQL
-- may forget its last few ms, i.e. a claim (the deliveries are due again), an outcome (the
-- lease runs out and the delivery is sent again with the same webhook-id, which the receiver
-- deduplicates) or a breaker count. At least once holds; the deliveries themselves are queued
-- by the consumers' synchronous commit.
--
-- Small statements, each run only when it has something to do (outcomes, breaker counts, a
-- claim), each planned once per connection (generic plans: their cost does not depend on the
-- arrays' values): a round's fixed cost is what keeps the database's share of a delivery small
-- at the rates people run, where a round carries a handful of deliveries. Planned without seq
-- scans: every row a round touches is found by an index, and a plan kept on the forwarder's
-- connection that was made while the queue or a day's partition was small would otherwise
-- scan it whole, per round or per delivery, as it grows until the next ANALYZE. Each statement sees
-- what the ones before it wrote: the claim sees the breakers as this round left them and the
-- queue without what this round delivered (a customer's next delivery to a destination with
-- --ordered is claimed in the round that records its predecessor), and counts the leases as
-- they were before the round, giving back the room this round's outcomes free.
--
-- p_outcomes: finished attempts (delivery_outcome: destination, event, the state it leaves the
-- delivery in, seconds to the next attempt, HTTP status, error). Only deliveries this
-- forwarder still holds are written: a lease that ran out was deleted and its deliveries may be
-- another forwarder's. p_tallies: per destination, any success and the failures after the last
-- one; p_breaker_failures the threshold: a success restarts the count and closes the breaker
-- unless it is open (then only its half-open probe closes it); N consecutive failures (or a
-- failed half-open probe) open it. A destination row is written only when its count or state
-- changes (the common all-2xx round touches none). p_gone: destinations that answered 410
-- Gone: disabled (no breaker count); nothing more is claimed for them.
-- Claim: due queued deliveries of enabled destinations whose breaker lets them through and
-- that no lease holds, at most (max_in_flight - held) per destination (1 when half-open),
-- p_limit in all, of the lanes p_lanes (NULL: every lane); with ordering, only the oldest open
-- delivery of each customer. A claim starts at its destination's due_from, a lower bound of
-- every queued delivery's due time: it skips the dead index entries delivered rows leave at
-- the head of delivery_queue_due until a vacuum. The forwarder's lease rows get what it holds
-- now and a lease of p_lease_s seconds; p_held names what it still holds (claimed, not yet
-- finished): its leases keep only those and what this round claims, so a claim whose answer
-- never reached it is due again.
-- With p_housekeeping, after the round, in the same transaction (so a lease is renewed before
-- leases are judged): the leases of dead forwarders are deleted, each destination's due_from
-- is recomputed (the oldest queued delivery's due time, at most 10 s back: a row is written
-- due at its write time or later, so only a transaction that took longer than that to commit
-- can fall below the bound, and the next recomputation sees it), and open breakers whose
-- cool-down (p_cooldown_s) has passed turn half-open.
--
-- With p_lanes, a round writes only the outcomes of deliveries in those lanes (the forwarder
-- passes each outcome in a round of its lane, and names the others in p_held): on a Citus
-- coordinator a round names the lanes of one shard of the lanes group, so its queue and event
-- statements are each planned on that shard alone (delivery_leases and destinations are
-- reference tables: writing them is a transaction on every node). The lower bound due_from is
-- recomputed over every lane either way. sql/citus/layout.sql plans the round's statements with
-- their values there (Citus needs them to prune; this file's generic plans are for one node).
--
-- Rows, told apart by kind:
--   'claimed'   a claimed delivery: destination_id .. meta (gateway.store.deliveries.Claimed;
--               times as Unix seconds; body NULL if its event's body is gone; lane: its
--               delivery's, for a forwarder that writes its outcome in a round of that lane);
--   'breaker'   a breaker transition of destination, old_state -> new_state;
--   'disabled'  destination answered 410 Gone and was disabled;
--   'half_open' destination's breaker turned half-open (housekeeping).
-- The signature is part of the function's identity: changing it needs the DROP.
DROP FUNCTION IF EXISTS forward_round(
    bigint[], text[], float8[], int[], text[], bigint[], bool[], int[], int, int, float8,
    bigint[], text, boolean, float8, bigint[]
);
DROP FUNCTION IF EXISTS forward_round(
    text, delivery_outcome[], delivery_ref[], breaker_tally[], bigint[], integer, smallint[], float8,
    integer, boolean, float8
);
CREATE FUNCTION forward_round(
    p_forwarder text,
    p_outcomes delivery_outcome[],
    p_held delivery_ref[],
    p_tallies breaker_tally[],
    p_gone bigint[],
    p_limit integer,
    p_lanes smallint[],
    p_lease_s float8,
    p_breaker_failures integer,
    p_housekeeping boolean,
    p_cooldown_s float8
) RETURNS TABLE (
    kind text, destination_id bigint, event_id bigint, event_key text, body bytea, attempts integer,
    received_at float8, window_start float8, destination text, url text, secret text,
    previous_secret text, ordered boolean, meta boolean, old_state text, new_state text, lane smallint
) LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
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
$fn$;

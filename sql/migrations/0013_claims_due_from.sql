-- Claims that skip the dead entries delivered rows leave at the head of deliveries_due (each
-- claim walked all of them until a vacuum: with a million, 57.5 us of PostgreSQL per delivery
-- instead of ~23 at 200 deliveries a round). A claim starts at its destination's due_from, a lower
-- bound of the next_attempt_at of every pending delivery that housekeeping recomputes (twice a
-- second): the oldest pending one's, but at most 10 s ago. A row is written with a
-- next_attempt_at of its write time or later (insert, retry, replay), so only a row whose
-- transaction took longer than those 10 s to commit can fall below the bound; the next
-- recomputation sees it (a delay of at most half a second, never a loss). Held (leased)
-- deliveries are pending, so the bound stays below them and below a dead forwarder's.
ALTER TABLE destinations ADD COLUMN due_from timestamptz NOT NULL DEFAULT '-infinity';

-- forward_round() as in 0012 (see 0011 for the whole round), with the claim's lower bound and
-- its recomputation in the housekeeping.
-- Superseded: the current source is sql/functions/forward_round.sql (this body is kept as released).
CREATE OR REPLACE FUNCTION forward_round(
    bigint[], text[], float8[], int[], text[], bigint[], bool[], int[], int, int, float8,
    bigint[], text, boolean, float8, bigint[]
) RETURNS TABLE (
    o_id bigint, o_webhook_id text, o_body text, o_attempts int, o_received_at float8,
    o_window_start float8, o_destination_id bigint, o_destination text, o_url text,
    o_secret text, o_ordered boolean, o_previous_secret text
) LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true), pg_advisory_xact_lock(28832985044316772);
    RETURN QUERY
    WITH r AS (
        SELECT * FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::int[], $5::text[])
            AS r(id, state, delay, status, error)
    ), leased AS (
        -- every forwarder's held deliveries, before this round
        SELECT l.forwarder, l.destination_id, h.id
        FROM delivery_leases l CROSS JOIN LATERAL unnest(l.ids) AS h(id)
    ), ok AS (
        SELECT r.*, x.destination_id FROM r JOIN leased x ON x.id = r.id AND x.forwarder = $13
    ), upd AS (
        UPDATE deliveries d SET
            state = ok.state,
            attempts = d.attempts + 1,
            next_attempt_at = CASE WHEN ok.state = 'pending'
                                   THEN clock_timestamp() + make_interval(secs => ok.delay)
                                   ELSE d.next_attempt_at END,
            last_status = ok.status,
            last_error = ok.error,
            delivered_at = CASE WHEN ok.state = 'delivered' THEN clock_timestamp() ELSE d.delivered_at END
        FROM ok
        -- "still pending", written so that it implies no partial index's predicate: only the
        -- primary key can serve this join (with stale statistics, as after a large backlog was
        -- queued, the planner once chose a skip scan of deliveries_due here, 150 µs a row).
        WHERE d.id = ok.id AND d.state NOT IN ('delivering', 'delivered', 'failed')
    ), held AS (
        -- per destination: held by any forwarder, and freed by this round's outcomes
        SELECT x.destination_id, count(*)::int AS n,
               count(*) FILTER (WHERE x.forwarder = $13 AND x.id IN (SELECT id FROM r))::int AS freed
        FROM leased x GROUP BY x.destination_id
    ), b0 AS (
        SELECT * FROM unnest($6::bigint[], $7::bool[], $8::int[]) AS b(id, ok, fails)
    ), b AS (
        -- with the destinations that answered 410 Gone ($12), which are disabled here
        SELECT coalesce(b0.id, g.id) AS id, coalesce(b0.ok, false) AS ok, coalesce(b0.fails, 0) AS fails,
               b0.id IS NOT NULL AS counted, g.id IS NOT NULL AS gone
        FROM b0 FULL JOIN unnest($12::bigint[]) AS g(id) ON g.id = b0.id
    ), n AS (
        SELECT d.id, d.breaker_state AS old, d.consecutive_failures AS old_fails, d.enabled AS was_enabled,
               b.ok, b.fails AS new_fails, b.counted, b.gone,
               CASE WHEN b.ok THEN b.fails ELSE d.consecutive_failures + b.fails END AS fails
        FROM destinations d JOIN b ON b.id = d.id
    ), s AS (
        SELECT n.*,
               CASE WHEN NOT n.counted THEN n.old
                    WHEN n.fails >= $9 OR (n.old = 'half_open' AND n.new_fails > 0) THEN 'open'
                    -- An open breaker is closed only by its half-open probe: a 2xx now comes from
                    -- a request sent before it opened and says little (else it flaps).
                    WHEN n.ok AND n.old <> 'open' THEN 'closed'
                    ELSE n.old END AS state
        FROM n
    ), brk AS (
        UPDATE destinations d SET
            consecutive_failures = s.fails,
            breaker_state = s.state,
            breaker_changed_at = CASE WHEN s.state <> s.old THEN now() ELSE d.breaker_changed_at END,
            enabled = d.enabled AND NOT s.gone,
            updated_at = CASE WHEN s.gone AND d.enabled THEN now() ELSE d.updated_at END
        FROM s
        WHERE d.id = s.id AND (s.state <> s.old OR s.fails <> s.old_fails OR (s.gone AND s.was_enabled))
        RETURNING d.name, s.old, s.state AS new, s.gone AND s.was_enabled AS disabled
    ), dest AS (
        SELECT d.id, d.name, d.url, d.secret, d.ordered,
               -- during a rotation's grace period, signed with the previous secret too
               CASE WHEN d.previous_secret_until > clock_timestamp() THEN d.previous_secret END
                   AS previous_secret,
               CASE WHEN coalesce(s.state, d.breaker_state) = 'half_open' THEN 1 ELSE d.max_in_flight END
               - coalesce(h.n, 0) + coalesce(h.freed, 0) AS room,
               d.due_from
        FROM destinations d LEFT JOIN s ON s.id = d.id LEFT JOIN held h ON h.destination_id = d.id
        WHERE d.enabled AND NOT coalesce(s.gone, false)
          AND coalesce(s.state, d.breaker_state) <> 'open' AND $10 > 0
    ), picked AS (
        SELECT c.*, dest.id AS destination_id, dest.name AS destination, dest.url, dest.secret,
               dest.ordered, dest.previous_secret
        FROM dest
        CROSS JOIN LATERAL (
            SELECT dl.id, dl.webhook_id, dl.envelope, dl.attempts, dl.received_at, dl.window_start,
                   dl.next_attempt_at
            FROM deliveries dl
            WHERE dl.destination_id = dest.id
              AND dl.state = 'pending'
              AND dl.next_attempt_at >= dest.due_from  -- past the dead entries (see above)
              AND dl.next_attempt_at <= clock_timestamp()
              -- held ones: in flight, or finished in this round (not yet visible as such)
              AND dl.id NOT IN (SELECT id FROM leased)
              AND (NOT dest.ordered OR dl.conversation = '' OR NOT EXISTS (
                    SELECT 1 FROM deliveries e
                    WHERE e.destination_id = dl.destination_id
                      AND e.conversation = dl.conversation
                      AND e.id < dl.id
                      AND e.state IN ('pending', 'delivering')))
            ORDER BY dl.next_attempt_at, dl.id
            LIMIT least(dest.room, $10)
            FOR UPDATE OF dl SKIP LOCKED
        ) c
        WHERE dest.room > 0
        ORDER BY c.next_attempt_at, c.id
        LIMIT $10
    ), lease AS (
        INSERT INTO delivery_leases AS l (forwarder, destination_id, ids, lease_until)
        SELECT $13, k.destination_id, coalesce(array_agg(k.id) FILTER (WHERE k.id IS NOT NULL), '{}'),
               clock_timestamp() + make_interval(secs => $11)
        FROM (
            SELECT x.destination_id, x.id FROM leased x
            -- what the forwarder still holds ($16): an id it does not name (a claim whose answer
            -- it never got: the round failed to reach it) is dropped, and due again. A semi-join,
            -- which is hashed: "= ANY ($16)" compared each held id with each of $16 (a generic
            -- plan's array is a parameter, and PostgreSQL hashes only constant arrays).
            WHERE x.forwarder = $13 AND x.id IN (SELECT unnest($16::bigint[]))
              AND x.id NOT IN (SELECT id FROM r)
            UNION ALL
            SELECT p.destination_id, p.id FROM picked p
            UNION ALL  -- every lease of this forwarder is renewed, an empty one too
            SELECT l0.destination_id, NULL FROM delivery_leases l0 WHERE l0.forwarder = $13
        ) k
        GROUP BY k.destination_id
        ON CONFLICT (forwarder, destination_id)
            DO UPDATE SET ids = excluded.ids, lease_until = excluded.lease_until
    )
    -- upd and lease run to completion unreferenced, as every data-modifying CTE does.
    SELECT p.id, p.webhook_id, p.envelope::text AS body, p.attempts + 1,
           extract(epoch FROM p.received_at)::float8 AS received_at,
           extract(epoch FROM p.window_start)::float8 AS window_start,
           p.destination_id, p.destination, p.url, p.secret, p.ordered, p.previous_secret
    FROM picked p
    UNION ALL
    SELECT NULL, old, new, NULL, NULL, NULL, NULL, name, NULL, NULL, NULL, NULL FROM brk WHERE old <> new
    UNION ALL
    SELECT NULL, 'enabled', 'gone', NULL, NULL, NULL, NULL, name, NULL, NULL, NULL, NULL FROM brk WHERE disabled;
    IF $14 THEN
        DELETE FROM delivery_leases WHERE lease_until < clock_timestamp();
        UPDATE deliveries SET state = 'pending', lease_until = NULL
        WHERE state = 'delivering' AND lease_until < clock_timestamp();
        -- Lowered whenever it must be; raised only by more than a second (not a write of
        -- every destination row twice a second for nothing).
        UPDATE destinations d SET due_from = b.due_from
        FROM (
            SELECT x.id, least(
                       (SELECT min(dl.next_attempt_at) FROM deliveries dl
                        WHERE dl.destination_id = x.id AND dl.state = 'pending'),
                       clock_timestamp() - interval '10 seconds') AS due_from
            FROM destinations x WHERE x.enabled
        ) b
        WHERE d.id = b.id
          AND (b.due_from < d.due_from OR b.due_from > d.due_from + interval '1 second');
        RETURN QUERY
        UPDATE destinations SET breaker_state = 'half_open', breaker_changed_at = now()
        WHERE breaker_state = 'open'
          AND breaker_changed_at <= clock_timestamp() - make_interval(secs => $15)
        RETURNING NULL::bigint, 'half_open'::text, NULL::text, NULL::int, NULL::float8,
                  NULL::float8, NULL::bigint, name, NULL::text, NULL::text, NULL::boolean, NULL::text;
    END IF;
END
$fn$;

-- Claims without row writes. A forwarder used to claim a delivery by updating its row to
-- 'delivering' (a new version of a wide row and an entry in every index), then update it
-- again with the outcome: two non-HOT updates per delivery, which made the database, not
-- HTTP, the forwarder's bottleneck. Now a claim is recorded once per round, per forwarder
-- and destination: the ids it holds, in one narrow row whose lease every round renews. A
-- delivery row is written once, with its outcome. A forwarder that dies stops renewing;
-- once its lease has run out, any forwarder's housekeeping deletes the row and its
-- deliveries are due again (at least once; the webhook-id lets a receiver deduplicate).
CREATE TABLE delivery_leases (
    -- host:pid:random, chosen by the forwarder at start (a restarted one holds nothing)
    forwarder      text        NOT NULL,
    destination_id bigint      NOT NULL REFERENCES destinations (id) ON DELETE CASCADE,
    ids            bigint[]    NOT NULL DEFAULT '{}',
    lease_until    timestamptz NOT NULL,
    PRIMARY KEY (forwarder, destination_id)
);
-- Every round rewrites the row: keep a few hundred ids (8 bytes each) inline and
-- uncompressed instead of compressing them into TOAST each time (pglz was 8 % of a round).
ALTER TABLE delivery_leases SET (toast_tuple_target = 8160);

-- Rows claimed the old way ('delivering') by a forwarder of an earlier version are still
-- released by the housekeeping when their lease_until passes.

-- One forwarder round in one round trip (it used to take three: BEGIN and the lock, the
-- round, COMMIT; each waits behind a busy event loop). A function, because the round's
-- snapshot must be taken after the lock: a VOLATILE plpgsql function takes a new snapshot
-- per statement, one SELECT of it is one (implicit) transaction.
--
-- Rounds are serialised across forwarders by the advisory lock 0x666F72776172 ("forward"),
-- so per-destination limits and half-open probes are exact however many forwarders run. The
-- round commits without waiting for the WAL flush: a crash of PostgreSQL may forget its
-- last few ms, i.e. a claim (the deliveries are due again), an outcome (the lease runs out
-- and the delivery is sent again with the same webhook-id, which the receiver deduplicates)
-- or a breaker count. At least once holds; the deliveries themselves are inserted by the
-- consumers' synchronous commit.
--
-- One forwarder round in one statement (after deliveries_cycle_begin): write the outcomes of
-- finished attempts and the breaker counts they imply, claim due deliveries, and record what
-- the forwarder ($13) now holds in its leases. Every part sees the same snapshot: the claim
-- counts every lease as it was before this round, gives back each destination the room
-- this round's outcomes free, and uses the breaker states this statement decides. (A
-- conversation's next delivery waits for the next round: in this snapshot its predecessor
-- is still pending. The forwarder runs that round at once.) Housekeeping
-- (deliveries_release_expired, destinations_half_open) runs after this statement, in the
-- same transaction, so a lease is renewed before leases are judged.
--
-- Outcomes: $1 ids, $2 new states, $3 seconds to the next attempt (pending only), $4 HTTP
-- statuses (NULL: no answer), $5 errors. Only deliveries this forwarder still holds are
-- written: a lease that ran out was deleted and its deliveries may be another forwarder's.
-- Breakers: $6 destination ids, $7 any success, $8 failures after the last success, $9 the
-- threshold: a success restarts the count and closes the breaker unless it is open (then only
-- its half-open probe closes it); N consecutive failures (or a failed half-open probe) open
-- it. A destination row is written only when its count or state changes (the common all-2xx
-- round touches none). $12: destinations that answered 410 Gone: disabled (no breaker
-- count); nothing more is claimed for them.
-- Claim: due pending deliveries of enabled destinations whose breaker lets them through and
-- that no lease holds, at most (max_in_flight - held) per destination (1 when half-open),
-- $10 in all; with ordering, only the oldest open delivery of each conversation. A claim
-- writes no delivery row (its attempt is counted with its outcome); the forwarder's lease
-- rows get the ids it holds now and a lease of $11 seconds.
-- Rows: each claimed delivery (the columns of gateway.store.deliveries.Claimed, in its
-- order; times as Unix seconds), then one row per breaker transition (id NULL; destination,
-- old state, new state in the destination, webhook_id and body columns), and one
-- (destination, 'enabled', 'gone') per destination this round disabled.
-- upd and lease run to completion unreferenced, as every data-modifying CTE does.
-- $16: the ids the forwarder still holds (claimed, not yet finished); its leases keep only
-- those (and what this round claims).
-- With $14 (housekeeping), after the round: the leases of dead forwarders are deleted (and
-- rows an earlier version marked 'delivering' released), and open breakers whose cool-down
-- ($15 seconds) has passed turn half-open, one row each (NULL, 'half_open', ..., name).
-- Superseded: the current source is sql/functions/forward_round.sql (this body is kept as released).
CREATE FUNCTION forward_round(
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
               - coalesce(h.n, 0) + coalesce(h.freed, 0) AS room
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
            -- it never got: the round failed to reach it) is dropped, and due again
            WHERE x.forwarder = $13 AND x.id = ANY ($16) AND x.id NOT IN (SELECT id FROM r)
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
        RETURN QUERY
        UPDATE destinations SET breaker_state = 'half_open', breaker_changed_at = now()
        WHERE breaker_state = 'open'
          AND breaker_changed_at <= clock_timestamp() - make_interval(secs => $15)
        RETURNING NULL::bigint, 'half_open'::text, NULL::text, NULL::int, NULL::float8,
                  NULL::float8, NULL::bigint, name, NULL::text, NULL::text, NULL::boolean, NULL::text;
    END IF;
END
$fn$;

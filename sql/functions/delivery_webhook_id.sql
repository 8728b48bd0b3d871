-- A delivery's webhook-id: 'wh_' + 32 hex of sha256('<destination name>/<event key>'), stable for
-- the pair (gateway.core.stdwebhooks.webhook_id computes the same; the forwarder does, for the
-- requests it sends). For operators' lists; the view deliveries (migration 0021) spells it out.
CREATE OR REPLACE FUNCTION delivery_webhook_id(destination text, event_key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'wh_' || left(encode(sha256(convert_to(destination || '/' || event_key, 'UTF8')), 'hex'), 32);
$$;

-- Delivery states only move forward. failed is terminal and kept with its errors; statuses
-- we do not know rank 0 and never move the state (they stay in the history).
CREATE OR REPLACE FUNCTION delivery_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status
        WHEN 'sent' THEN 1
        WHEN 'delivered' THEN 2
        WHEN 'read' THEN 3
        WHEN 'played' THEN 4
        WHEN 'failed' THEN 5
        ELSE 0
    END;
$$;

-- Rows (a JSON array of objects, each with its columns in the order of the INSERT's column list)
-- as the text of a multi-row VALUES list: every value a quoted literal (quote_nullable), a JSON
-- object or array as its JSON text, JSON null as NULL. inbox_apply_batch_steps writes the event
-- tables with it on Citus: there an INSERT ... SELECT goes through intermediate results on every
-- worker, and an error raised on a worker that way reaches the coordinator as internal_error
-- (XX000), its SQLSTATE lost; a VALUES list is sent to each shard as it is, and a violated
-- constraint or a trigger's exception keeps its SQLSTATE, which tells an event's own failure from
-- the database's (gateway/core/faults.py).
CREATE OR REPLACE FUNCTION values_list(p_rows json) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT string_agg(
               '(' || (SELECT string_agg(quote_nullable(c.value), ', ' ORDER BY c.n)
                       FROM json_each_text(r.value) WITH ORDINALITY AS c(key, value, n)) || ')',
               ', ' ORDER BY r.n)
    FROM json_array_elements(p_rows) WITH ORDINALITY AS r(value, n)
$$;

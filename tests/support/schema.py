"""A stable text description of the migrated schema, for the snapshot test."""

from __future__ import annotations

import asyncpg

# Day partitions (named by date) are left out: they come and go with the calendar. Their
# parents' partition keys and the fixed partitions (e.g. *_untimed) are listed.
SCHEMA_SQL = """
WITH day_partition AS (
    SELECT c.oid, c.relname FROM pg_class c
    WHERE c.relispartition AND c.relnamespace = 'public'::regnamespace AND c.relname ~ '_p[0-9]{8}$'
    UNION ALL
    SELECT i.indexrelid, ic.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
    JOIN pg_class ic ON ic.oid = i.indexrelid
    WHERE c.relispartition AND c.relname ~ '_p[0-9]{8}$'
)
SELECT 'table ' || c.table_name || '.' || c.column_name || ' ' || c.data_type
       || CASE WHEN c.is_nullable = 'NO' THEN ' not null' ELSE '' END
       || coalesce(' default ' || c.column_default, '') AS line
FROM information_schema.columns c
WHERE c.table_schema = 'public' AND c.table_name NOT IN (SELECT relname FROM day_partition)
UNION ALL
SELECT 'index ' || indexname || ': ' || indexdef FROM pg_indexes
WHERE schemaname = 'public' AND tablename NOT IN (SELECT relname FROM day_partition)
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  AND conrelid NOT IN (SELECT oid FROM day_partition)
UNION ALL
SELECT 'trigger ' || tgrelid::regclass || ' ' || tgname FROM pg_trigger
WHERE NOT tgisinternal AND tgrelid NOT IN (SELECT oid FROM day_partition)
UNION ALL
SELECT 'partitioned ' || partrelid::regclass || ' ' || pg_get_partkeydef(partrelid) FROM pg_partitioned_table
UNION ALL
SELECT 'partition ' || c.oid::regclass || ' of ' || i.inhparent::regclass || ' '
       || pg_get_expr(c.relpartbound, c.oid)
FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
WHERE c.relispartition AND c.relkind IN ('r', 'p') AND c.oid NOT IN (SELECT oid FROM day_partition)
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'options ' || c.oid::regclass || ' ' || array_to_string(c.reloptions, ',') FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.reloptions IS NOT NULL
  AND c.oid NOT IN (SELECT oid FROM day_partition)
UNION ALL
-- storage other than the type's default (e.g. a column kept out of line, uncompressed)
SELECT 'storage ' || a.attrelid::regclass || '.' || a.attname || ' ' || a.attstorage::text
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0
  AND NOT a.attisdropped AND a.attstorage <> t.typstorage AND c.oid NOT IN (SELECT oid FROM day_partition)
ORDER BY 1
"""


async def describe(conn: asyncpg.Connection) -> str:
    rows = await conn.fetch(SCHEMA_SQL)
    return "\n".join(r["line"] for r in rows) + "\n"

"""A stable text description of the migrated schema, for the snapshot test."""

from __future__ import annotations

import asyncpg

SCHEMA_SQL = """
SELECT 'table ' || c.table_name || '.' || c.column_name || ' ' || c.data_type
       || CASE WHEN c.is_nullable = 'NO' THEN ' not null' ELSE '' END
       || coalesce(' default ' || c.column_default, '') AS line
FROM information_schema.columns c
WHERE c.table_schema = 'public'
UNION ALL
SELECT 'index ' || indexname || ': ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger ' || tgrelid::regclass || ' ' || tgname FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'function ' || p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
ORDER BY 1
"""


async def describe(conn: asyncpg.Connection) -> str:
    rows = await conn.fetch(SCHEMA_SQL)
    return "\n".join(r["line"] for r in rows) + "\n"

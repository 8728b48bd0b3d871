import re

import pytest

from gateway.store.db import STATEMENT_CACHE_MAX_CHARS
from gateway.store.sqlfiles import functions, migrations, missing, parse_queries, present, queries

# A function a migration defines (its pg_temp helpers aside), and the mark above its body.
DEFINES = re.compile(r"^CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?!pg_temp\.)([a-z0-9_]+)", re.IGNORECASE)
SUPERSEDED = "-- Superseded: "
DROPPED_BY = re.compile(r"is dropped by (\d{4})_([a-z0-9_]+)")


def test_parse_queries_splits_named_sections() -> None:
    text = "-- preamble\n-- name: a\nSELECT 1;\n\n-- name: b_2\n-- why\nSELECT 2\n"
    assert parse_queries(text) == {"a": "SELECT 1", "b_2": "-- why\nSELECT 2"}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;", "defined twice"),
        ("-- name: a\n;\n", "is empty"),
    ],
)
def test_parse_queries_rejects(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_queries(text, "x.sql")


def test_repository_sql_loads() -> None:
    assert "inbox_insert_batch" in queries()
    ms = migrations()
    assert ms[0].version == 1
    assert [m.version for m in ms] == sorted({m.version for m in ms})


def test_the_manifest_names_every_sql_file_of_the_tree() -> None:
    from gateway.store.sql_manifest import FILES

    assert list(FILES) == present(), (
        "gateway/store/sql_manifest.py is stale; regenerate it: "
        "python -m gateway.store.sqlfiles > gateway/store/sql_manifest.py"
    )
    assert missing() == []


def test_every_function_body_in_a_migration_says_what_supersedes_it() -> None:
    """A released migration keeps the bodies it shipped with; the line above each names the
    current source in sql/functions/, or the migration that dropped the function."""
    sources = {f.name for f in functions()}
    by_version = {m.version: m for m in migrations()}
    wrong: list[str] = []
    for m in migrations():
        lines = m.sql.splitlines()
        for i, line in enumerate(lines):
            if not (d := DEFINES.match(line)):
                continue
            name, above = d.group(1), lines[i - 1] if i else ""
            if name in sources:
                ok = above.startswith(SUPERSEDED) and f"sql/functions/{name}.sql" in above
            else:
                drop = DROPPED_BY.search(above)
                dropper = by_version.get(int(drop.group(1))) if drop else None
                dropped = dropper is not None and f"DROP FUNCTION IF EXISTS {name}(" in dropper.sql
                ok = above.startswith(SUPERSEDED) and dropped
            if not ok:
                wrong.append(f"{m.version:04d}_{m.name}.sql line {i + 1}: {name}()")
    assert wrong == [], f"mark each with a comment line above it ({SUPERSEDED}...): {wrong}"


def test_every_query_is_short_enough_for_the_connections_statement_cache() -> None:
    # A longer one would be prepared and planned again at every call (gateway.store.db).
    longest = max(queries().items(), key=lambda kv: len(kv[1]))
    assert len(longest[1]) <= STATEMENT_CACHE_MAX_CHARS, longest[0]

import pytest

from gateway.store.sqlfiles import migrations, missing, parse_queries, present, queries


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

"""Named SQL queries, numbered migrations and the current source of each SQL function, loaded
once from ``sql/``."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
_FUNCTION = re.compile(r"[a-z0-9_]+\.sql")


def sql_dir() -> Path:
    """``sql/`` beside the package in a source tree, or inside it in a wheel."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "sql", package.parent / "sql"):
        if (candidate / "migrations").is_dir():
            return candidate
    raise FileNotFoundError("sql/ directory not found next to the gateway package")


def parse_queries(text: str, source: str = "<sql>") -> dict[str, str]:
    """Split a file of ``-- name: x`` sections into {name: sql}."""
    parts = _NAME.split(text)
    out: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sql = body.strip().rstrip(";").strip()
        if not sql:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in out:
            raise ValueError(f"{source}: query {name!r} defined twice")
        out[name] = sql
    return out


def load_queries(path: Path) -> dict[str, str]:
    """The named queries of one file (the load harness keeps its own beside it)."""
    return parse_queries(path.read_text(), path.name)


@cache
def queries() -> dict[str, str]:
    """Every named query in ``sql/queries/*.sql``; names are unique across files."""
    out: dict[str, str] = {}
    for path in sorted((sql_dir() / "queries").glob("*.sql")):
        for name, sql in parse_queries(path.read_text(), path.name).items():
            if name in out:
                raise ValueError(f"{path.name}: query {name!r} also defined in another file")
            out[name] = sql
    return out


def q(name: str) -> str:
    return queries()[name]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def migrations() -> tuple[Migration, ...]:
    found: list[Migration] = []
    for path in sorted((sql_dir() / "migrations").glob("*.sql")):
        m = _MIGRATION.fullmatch(path.name)
        if not m:
            raise ValueError(f"migration file {path.name!r} is not named NNNN_name.sql")
        found.append(Migration(int(m.group(1)), m.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations share a number: {versions}")
    return tuple(found)


@dataclass(frozen=True)
class Function:
    """The current source of one SQL function, ``sql/functions/<name>.sql``: what
    ``gateway migrate`` applies whenever its checksum differs from the one applied last.
    (Migrations keep the bodies they were released with; these files are what runs.)"""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@cache
def functions() -> tuple[Function, ...]:
    found: list[Function] = []
    for path in sorted((sql_dir() / "functions").glob("*.sql")):
        if not _FUNCTION.fullmatch(path.name):
            raise ValueError(f"function file {path.name!r} is not named <function>.sql")
        found.append(Function(path.stem, path.read_text()))
    return tuple(found)


@cache
def citus_layout() -> str:
    """``sql/citus/layout.sql``: the gateway's tables distributed on a Citus cluster (applied by
    ``gateway migrate --citus`` after the migrations and functions)."""
    return (sql_dir() / "citus" / "layout.sql").read_text()


def present() -> list[str]:
    """Every ``.sql`` file the code loads (``sql/{citus,functions,migrations,queries}/``), as a path
    relative to ``sql/``; ``sql/schema.sql`` is for reading only."""
    root = sql_dir()
    return sorted(str(path.relative_to(root)) for path in root.glob("*/*.sql"))


def missing() -> list[str]:
    """The files the manifest names that this installation lacks."""
    from gateway.store.sql_manifest import FILES

    try:
        root = sql_dir()
    except FileNotFoundError:
        return list(FILES)
    return [name for name in FILES if not (root / name).is_file()]


# The manifest's docstring, kept here: the command that regenerates the manifest writes over
# it (the shell empties the file before this module could read it there).
MANIFEST_DOC = """The files of ``sql/`` this code needs, checked before a process touches its database
(``gateway.store.sqlfiles.missing``): an image or wheel built without one of them fails at
start-up with the file's name instead of at its first query. A test keeps this list equal to the
tree; after adding or removing a file under sql/, regenerate it with
``python -m gateway.store.sqlfiles > gateway/store/sql_manifest.py``."""


def manifest_source(files: list[str]) -> str:
    """The text of ``gateway/store/sql_manifest.py`` for ``files``."""
    lines = "".join(f'    "{name}",\n' for name in files)
    return f'"""{MANIFEST_DOC}"""\n\nFILES: tuple[str, ...] = (\n{lines})\n'


if __name__ == "__main__":
    print(manifest_source(present()), end="")

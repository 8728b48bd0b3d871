"""An installation built without one of its SQL files (a .dockerignore line, a packaging slip)
refuses to start and names the file, instead of running until that file's first query."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.store.sqlfiles import sql_dir

REPO = Path(__file__).resolve().parents[2]


def install_copy(into: Path, without: str | None) -> Path:
    """The package and its sql/ copied as an image build would, minus one file."""
    shutil.copytree(REPO / "gateway", into / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(sql_dir(), into / "sql")
    if without:
        (into / "sql" / without).unlink()
    return into


def run(copy: Path, *args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(copy),
        "DATABASE_URL": dsn,
        "GATEWAY_DB_WAIT_S": "5",
        "GATEWAY_META_APP_SECRETS": "meta-secret-sql-files",
    }
    cmd = [sys.executable, "-m", "gateway", *args]
    return subprocess.run(cmd, env=env, cwd=copy, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("command", "without"),
    [
        (("migrate",), "queries/outbox.sql"),
        (("consume",), "functions/forward_round.sql"),
        (("serve",), "migrations/0005_destinations_deliveries.sql"),
    ],
)
async def test_a_missing_sql_file_stops_start_up_with_its_name(
    tmp_path: Path, db_dsn: str, command: tuple[str, ...], without: str
) -> None:
    got = run(install_copy(tmp_path, without), *command, dsn=db_dsn)
    assert got.returncode == 3, got.stderr
    assert without in got.stderr
    assert "lacks 1 of its SQL files" in got.stderr


async def test_the_same_copy_with_every_file_starts(tmp_path: Path, db_dsn: str) -> None:
    got = run(install_copy(tmp_path, None), "migrate", dsn=db_dsn)
    assert got.returncode == 0, got.stderr

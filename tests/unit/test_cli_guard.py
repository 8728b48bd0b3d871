"""Hostile command-line input and database errors end every command with one line that echoes
neither the value given nor a row (gateway.cli.guard). Every text argument of every command
is fed a trailing newline, a NUL and a 10 kB string; the arguments are found by walking the
parser, so a new one without a valid value below fails here first."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import asyncpg
import pytest

import gateway.cli
from gateway.cli import COMMANDS, build_parser, guard, main

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

# A valid value for every argument that takes one, by (command path, dest); each distinctive,
# so that the test can tell whether a message echoes it.
VALID: dict[str, str] = {
    "workers": "3",
    "action": "replay",  # dead
    "ids": "E12345",
    "since": "2026-11-30T08:00",
    "until": "2026-11-30T09:00",
    "limit": "17",
    "actor": "alice@oncall",
    "state": "failed",
    "key": "order-778899",
    "tenant": "acme-tenant",
    "scope": "number",
    "provider": "tenashi",
    "name": "crm-hooks",
    "url": "https://crm.example/hooks",
    "events": "message,status",
    "secret": SECRET,
    "format": "standard",
    "max_in_flight": "16",
    "numbers": "1111,2222",
    "grace_h": "12",
    "destination": "crm-hooks",
}
HOSTILE = {"newline": "{}\n", "nul": "{}\x00", "10kB": "{}" + "Z" * 10_000}


Command = tuple[tuple[str, ...], argparse.ArgumentParser]


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Command]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from commands(child, (*path, name))


def takes_value(a: argparse.Action) -> bool:
    return a.nargs != 0 and not isinstance(a, argparse._HelpAction | argparse._VersionAction)


def argv(
    path: tuple[str, ...], parser: argparse.ArgumentParser, dest: str | None = None, value: str = ""
) -> list[str]:
    """A valid command line of ``path`` giving every argument a value; ``dest`` gets ``value``."""
    positional: list[str] = []
    optional: list[str] = []
    for a in filter(takes_value, parser._actions):
        given = value if a.dest == dest else VALID[a.dest]
        if a.option_strings:
            optional += [a.option_strings[0], given]
        else:
            positional.append(given)
    return [*path, *positional, *optional]


CASES = [
    (path, a.dest, kind)
    for path, parser in commands(build_parser())
    for a in filter(takes_value, parser._actions)
    for kind in HOSTILE
]


def test_every_command_line_of_the_table_is_valid() -> None:
    for path, parser in commands(build_parser()):
        build_parser().parse_args(argv(path, parser))  # a KeyError: give the new argument a VALID value


@pytest.mark.parametrize(("path", "dest", "kind"), CASES, ids=[f"{' '.join(p)}:{d}:{k}" for p, d, k in CASES])
def test_a_hostile_text_argument_is_one_line_that_does_not_echo_it(
    path: tuple[str, ...], dest: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = dict(commands(build_parser()))[path]
    action = next(a for a in parser._actions if a.dest == dest)
    named = action.option_strings[0] if action.option_strings else str(action.metavar or dest)
    hostile = HOSTILE[kind].format(VALID[dest])
    with pytest.raises(SystemExit) as done:
        main(argv(path, parser, dest, hostile))  # refused before any command runs
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert f"argument {named}: " in err  # it names the argument...
    assert VALID[dest] not in err and "ZZZZ" not in err  # ...not what was given


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_database_error_of_any_command_is_one_line_without_the_row(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What PostgreSQL says about a CHECK violation: its DETAIL is the whole failing row."""
    row = f"(1, bot, https://crm.example/hooks, {{message}}, {SECRET}, t, 16)"
    refused = asyncpg.PostgresError.new(
        {
            "C": "23514",
            "M": 'new row for relation "destinations" violates check constraint "destinations_name_check"',
            "D": f"Failing row contains {row}.",
            "t": "destinations",
            "n": "destinations_name_check",
        }
    )

    def fails(*_args: object) -> int:
        raise refused

    help_text, _fn, add_args = COMMANDS[command]
    monkeypatch.setitem(COMMANDS, command, (help_text, fails, add_args))
    monkeypatch.setattr(gateway.cli.logs, "setup_logging", lambda *a, **k: None)
    path, parser = next((p, x) for p, x in commands(build_parser()) if p[0] == command)
    assert main(argv(path, parser)) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert "check violation" in err and "destinations_name_check" in err and "23514" in err
    assert 'new row for relation "destinations" violates' in err  # the message: names, no values
    assert SECRET not in err and "Failing row" not in err and "crm.example" not in err


def test_a_data_exception_s_message_is_left_out() -> None:
    """Class 22 messages can quote the value PostgreSQL could not take (a secret given where a
    number was due, say)."""
    refused = asyncpg.PostgresError.new(
        {"C": "22P02", "M": f'invalid input syntax for type integer: "{SECRET}"', "D": "x"}
    )
    line = guard.database_error(refused)
    assert "invalid text representation error" in line and "22P02" in line and SECRET not in line


@pytest.mark.parametrize(
    "exc", [ConnectionResetError(104, "reset"), TimeoutError(), asyncpg.InterfaceError("connection closed")]
)
def test_a_lost_connection_is_named_by_its_kind(exc: BaseException) -> None:
    line = guard.database_error(exc)
    assert line.startswith("the database connection failed") and type(exc).__name__ in line


def test_a_line_is_one_line_masked_and_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    guard.say("a\nb\x00c " + SECRET + " " + "x" * 5000, secrets=[SECRET])
    err = capsys.readouterr().err
    assert err.startswith("a b c *** x") and len(err.splitlines()) == 1
    assert len(err) <= guard.MAX_LINE + 1 and SECRET not in err
